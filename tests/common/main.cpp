// Entry point of autosp-tests and autosp-cuda-emulation-tests.
#include "common/catch_session.h"

int main(int argc, char** argv) { return autosp::test::run_catch_session(argc, argv); }
