// A fresh directory under the system's temp directory for one test, removed with everything in it
// when the object goes: <tmp>/autosp-test-<tag>-<pid>-<n>.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace autosp::test {

struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    dir = std::filesystem::temp_directory_path() /
          ("autosp-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

}  // namespace autosp::test
