// Errors and checks shared by every part of autosp.
//
// Two kinds of failure reach the user: a UsageError (bad config, flags, input files, sizes that
// don't divide; exit code 2) and a RuntimeFailure (device, communication, I/O; exit code 3).
// AUTOSP_ASSERT guards internal invariants that kernels assume; it names file:line.
// This header knows nothing of graphs, kernels or devices.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace autosp {

// A mistake in what the user gave us: exit code 2, one `error:` line.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure of the machine (device, communication, I/O): exit code 3.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

// Build a message from pieces: fmt_msg("[matmul] lhs ", shape, " vs ", ...).
template <class... Args>
std::string str(const Args&... args) {
  return detail::cat(args...);
}

}  // namespace autosp

#define AUTOSP_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) ::autosp::detail::assert_fail(#cond, __FILE__, __LINE__, ::autosp::str(__VA_ARGS__)); \
  } while (0)
