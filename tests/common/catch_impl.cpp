// Catch2's implementation (Debian's 2.13 single header), compiled once per build into the static
// library autosp-catch that every test binary links, with the session the mains run
// (common/catch_session.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/catch_session.h"

namespace autosp::test {

int run_catch_session(int argc, char** argv, bool report_to_null) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (report_to_null) session.configData().outputFilename = "/dev/null";
  return session.run();
}

}  // namespace autosp::test
