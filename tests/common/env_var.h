// An environment variable set for one scope (unset at its end), for tests of settings read from
// the environment (AUTOSP_FAULT, AUTOSP_COLLECTIVE_TIMEOUT).
#pragma once

#include <cstdlib>
#include <string>

namespace autosp::testing {

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~EnvVar() { ::unsetenv(name.c_str()); }
};

}  // namespace autosp::testing
