// A fresh directory under the system's temp directory for one test, removed with everything in it
// when the object goes, so a test that fails half-way leaves nothing behind either:
// <tmp>/autosp-test-<tag>-<pid>-<n>. The multi-rank tests share one: <tmp>/autosp-test-<tag>-<id>,
// made and removed by its owner (tests/mpi/mpi_test.h: shared_temp_dir).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace autosp::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : TempDir(tag + "-" + std::to_string(getpid()) + "-" + std::to_string(next()), true) {}
  // The directory every process given the same `id` names alike; only the owner makes it (empty)
  // and removes it.
  TempDir(const std::string& tag, int64_t id, bool owner) : TempDir(tag + "-" + std::to_string(id), owner) {}
  ~TempDir() {
    std::error_code ec;
    if (owner_) std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name) const { return (dir / name).string(); }

  const std::filesystem::path dir;

 private:
  TempDir(const std::string& name, bool owner)
      : dir(std::filesystem::temp_directory_path() / ("autosp-test-" + name)), owner_(owner) {
    if (!owner_) return;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  static int next() {
    static int counter = 0;
    return counter++;
  }
  bool owner_;
};

}  // namespace autosp::test
