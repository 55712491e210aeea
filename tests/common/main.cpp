// Catch2 entry point for autosp-tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
