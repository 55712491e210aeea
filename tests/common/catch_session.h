#pragma once
// The Catch2 session of a test binary's main. Catch2's implementation, Session included, is compiled
// once per build (common/catch_impl.cpp, the library autosp-catch): a main that included it would
// compile all of it again (20 s per binary here, 50 s under ASan).

namespace autosp::test {

// Applies the command line to Catch's session and runs it. report_to_null sends Catch's report to
// /dev/null (ranks other than 0). Returns Catch's code: non-zero for a bad command line (nothing
// run) or the number of failed test cases.
int run_catch_session(int argc, char** argv, bool report_to_null = false);

}  // namespace autosp::test
