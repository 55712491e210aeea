// Small text inputs, read without blocking for ever (tensor/input_file.h).
#include "tensor/input_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "tensor/check.h"
#include "tensor/fd.h"

namespace autosp {
namespace {

constexpr const char* kWaitVar = "AUTOSP_PIPE_TIMEOUT";

std::string kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file";
}

std::string read_regular(int fd, const struct stat& st, const std::string& path, const std::string& what,
                         uint64_t max_bytes) {
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw UsageError(str(path, ": ", st.st_size, " bytes is larger than ", max_bytes, " (expected ", what, ")"));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UsageError(str(path, ": cannot read (", std::strerror(errno), ")"));
    if (n == 0) return text;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) throw UsageError(str(path, ": larger than ", max_bytes, " bytes (it grew while read)"));
  }
}

// A FIFO or pipe opened with O_NONBLOCK. A read gives data, or EAGAIN while a writer holds it open
// with nothing written yet, or 0 when no writer holds it: before any data that is also a FIFO
// whose writer has not opened it yet, so only a hang-up (a writer came and went) or data seen
// before makes 0 the end. Each wait for more is bounded.
std::string read_pipe(int fd, const std::string& path, const char* pipe_name, uint64_t max_bytes) {
  const double wait_s = pipe_wait_seconds();
  const auto wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait_s));
  std::string text;
  char buf[1 << 16];
  bool hung_up = false;
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > max_bytes) throw UsageError(str(path, ": more than ", max_bytes, " bytes came through the ", pipe_name));
      deadline = std::chrono::steady_clock::now() + wait;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw UsageError(str(path, ": cannot read the ", pipe_name, " (", std::strerror(errno), ")"));
    if (n == 0 && (hung_up || !text.empty())) return text;  // every writer has closed it
    const auto left = deadline - std::chrono::steady_clock::now();
    const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
    if (left_ms <= 0) {
      if (text.empty())
        throw UsageError(str(path, ": a ", pipe_name, " that nothing wrote to in ", wait_s,
                             " s: no process writes to it (", kWaitVar, " sets the wait)"));
      throw UsageError(str(path, ": the ", pipe_name, "'s writer stopped for ", wait_s, " s after ", text.size(),
                           " bytes without closing it (", kWaitVar, " sets the wait)"));
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left_ms, 1000 * 1000)));
    if (r < 0 && errno != EINTR) throw UsageError(str(path, ": cannot wait on the ", pipe_name, " (", std::strerror(errno), ")"));
    if (r > 0 && (p.revents & (POLLHUP | POLLERR))) hung_up = true;
  }
}

}  // namespace

double pipe_wait_seconds() {
  const char* v = std::getenv(kWaitVar);
  if (!v || !*v) return 10.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 1e7)
    throw UsageError(str(kWaitVar, "='", v, "': expected a number of seconds in (0, 1e7]"));
  return s;
}

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  // Refuse what is not a file or a pipe before opening it: opening a device can do things.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(str(path, ": cannot open (", std::strerror(errno), "; expected ", what, ")"));
  if (S_ISDIR(st.st_mode)) throw UsageError(str(path, ": is a directory, not ", what));
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    throw UsageError(str(path, ": not a regular file (", kind_of(st.st_mode), "); expected ", what));
  // O_NONBLOCK: a FIFO's open returns at once even with no writer (the read then waits, bounded).
  const Fd f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (f.get() < 0) throw UsageError(str(path, ": cannot open (", std::strerror(errno), "; expected ", what, ")"));
  if (::fstat(f.get(), &st) != 0) throw UsageError(str(path, ": cannot read (", std::strerror(errno), ")"));
  if (S_ISREG(st.st_mode)) return read_regular(f.get(), st, path, what, max_bytes);
  if (!S_ISFIFO(st.st_mode))  // it changed between the stat and the open
    throw UsageError(str(path, ": not a regular file (", kind_of(st.st_mode), "); expected ", what));
  struct stat link {};
  const bool named = ::lstat(path.c_str(), &link) == 0 && S_ISFIFO(link.st_mode);  // else /dev/fd/N: a pipe
  return read_pipe(f.get(), path, named ? "FIFO" : "pipe", max_bytes);
}

}  // namespace autosp
