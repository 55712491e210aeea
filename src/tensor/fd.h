// A file descriptor that closes itself (the readers of user-given files: tensor/safetensors.cpp,
// tensor/input_file.cpp, train/data.cpp).
#pragma once

#include <unistd.h>

namespace autosp {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes it now (a write's close can fail: the caller checks); -1 afterwards.
  int close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace autosp
