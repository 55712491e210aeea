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
#include <utility>
#include <vector>

namespace autosp {

// A mistake in what the user gave us: exit code 2, one `error:` line (or one block: Problems).
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

// Everything wrong with one input (a run config, a DeepSpeed file, a Hugging Face config.json),
// said at once rather than one fix at a time. Each problem names the key and its value, says why
// it is refused and what to do: "key = value: why; what to do". raise() throws one UsageError:
// one problem is one line, "origin: problem"; several are one block, "origin: N problems:" and a
// line "  - problem" each.
class Problems {
 public:
  explicit Problems(std::string origin) : origin_(std::move(origin)) {}
  // A problem as one phrase ("unknown key 'x' (did you mean 'y'?)").
  void add(std::string problem);
  // `key` = `value` (as JSON text): `why`; `fix` (left out when empty).
  void add(const std::string& key, const std::string& value, const std::string& why, const std::string& fix);
  bool empty() const { return list_.empty(); }
  const std::vector<std::string>& list() const { return list_; }
  std::string message() const;  // what raise() throws
  void raise() const;           // throws UsageError(message()) when there is a problem
 private:
  std::string origin_;
  std::vector<std::string> list_;
};

// `message` (a UsageError's text, one line or a Problems block) with `note` added to its first line.
std::string with_note(const std::string& message, const std::string& note);

// Edit distance with adjacent transpositions counting one ("stesp" → "steps").
size_t edit_distance(const std::string& a, const std::string& b);
// The option `word` most likely misspells (within about a third of its length), or "" when none
// is close: the hint of a "did you mean" for an unknown key.
std::string closest_name(const std::string& word, const std::vector<std::string>& options);

}  // namespace autosp

#define AUTOSP_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) ::autosp::detail::assert_fail(#cond, __FILE__, __LINE__, ::autosp::str(__VA_ARGS__)); \
  } while (0)
