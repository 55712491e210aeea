// read_input_file: a regular file is read whole; a FIFO or pipe is read as its writer writes, and
// one that nothing writes to is an error after the bounded wait, not a hang; what is neither is
// refused before it is opened. Every failure names the path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/temp_dir.h"
#include "tensor/check.h"
#include "tensor/input_file.h"

using namespace autosp;

namespace {

// AUTOSP_PIPE_TIMEOUT for the scope of one test.
struct PipeWait {
  explicit PipeWait(const char* seconds) { setenv("AUTOSP_PIPE_TIMEOUT", seconds, 1); }
  ~PipeWait() { unsetenv("AUTOSP_PIPE_TIMEOUT"); }
};

std::string usage_error(const std::string& path, const std::string& what = "a config file", uint64_t max = 1 << 20) {
  try {
    read_input_file(path, what, max);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a regular file is read whole; what is not one is refused naming the path", "[input_file]") {
  test::TempDir tmp("input");
  const std::string cfg = tmp.path("cfg.json");
  std::ofstream(cfg) << "{\"train\": {\"lr\": 0.1}}\n";
  CHECK(read_input_file(cfg, "a config file") == "{\"train\": {\"lr\": 0.1}}\n");
  std::ofstream(tmp.path("empty.json")).flush();
  CHECK(read_input_file(tmp.path("empty.json"), "a config file").empty());

  CHECK_THAT(usage_error(tmp.path("nope.json")), Catch::StartsWith(tmp.path("nope.json") + ": cannot open (No such file"));
  CHECK_THAT(usage_error(tmp.dir.string()), Catch::Equals(tmp.dir.string() + ": is a directory, not a config file"));
  CHECK_THAT(usage_error("/dev/null", "a DeepSpeed config"),
             Catch::Equals("/dev/null: not a regular file (a character device); expected a DeepSpeed config"));
  CHECK_THAT(usage_error(cfg, "a config file", 8), Catch::Contains("cfg.json: 23 bytes is larger than 8"));
  CHECK(file_kind(cfg) == "a regular file");
  CHECK(file_kind("/dev/null") == "a character device");
  CHECK(file_kind(tmp.path("nope.json")).empty());
}

TEST_CASE("a FIFO with no writer is an error after the bounded wait, not a hang", "[input_file]") {
  test::TempDir tmp("input");
  const std::string fifo = tmp.path("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(file_kind(fifo) == "a FIFO");
  PipeWait wait("0.3");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THAT(usage_error(fifo), Catch::Equals(fifo + ": a FIFO that nothing wrote to in 0.3 s: no process writes to it "
                                                     "(AUTOSP_PIPE_TIMEOUT sets the wait)"));
  const double took = seconds_since(t0);
  CHECK(took >= 0.29);
  CHECK(took < 5);
}

TEST_CASE("a FIFO is read as its writer writes, however late it opens and however it pauses", "[input_file]") {
  test::TempDir tmp("input");
  const std::string fifo = tmp.path("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  PipeWait wait("5");
  SECTION("a writer that opens after the reader, writes in pieces and closes") {
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int fd = ::open(fifo.c_str(), O_WRONLY);
      REQUIRE(fd >= 0);
      CHECK(::write(fd, "{\"a\": ", 6) == 6);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CHECK(::write(fd, "1}", 2) == 2);
      ::close(fd);
    });
    CHECK(read_input_file(fifo, "a config file") == "{\"a\": 1}");
    writer.join();
  }
  SECTION("a writer that opens and closes without writing: the text is empty") {
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::close(::open(fifo.c_str(), O_WRONLY));
    });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(read_input_file(fifo, "a config file").empty());
    CHECK(seconds_since(t0) < 4);
    writer.join();
  }
}

TEST_CASE("a writer that stops without closing is an error that says so", "[input_file]") {
  test::TempDir tmp("input");
  const std::string fifo = tmp.path("fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  PipeWait wait("0.3");
  int fd = -1;
  std::thread writer([&] {
    fd = ::open(fifo.c_str(), O_WRONLY);  // blocks until the reader has opened it
    CHECK(::write(fd, "{\"a\"", 4) == 4);
  });
  CHECK_THAT(usage_error(fifo), Catch::Equals(fifo + ": the FIFO's writer stopped for 0.3 s after 4 bytes without "
                                                     "closing it (AUTOSP_PIPE_TIMEOUT sets the wait)"));
  writer.join();
  ::close(fd);
}

TEST_CASE("an anonymous pipe by its /dev/fd name (bash's <(...)) is read to its end", "[input_file]") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const std::string text = "{\"model\": {\"arch\": \"llama\"}}";
  REQUIRE(::write(p[1], text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(p[1]);  // the writer has finished before the reader opens it, as a fast <(cat f) does
  const std::string path = "/dev/fd/" + std::to_string(p[0]);
  PipeWait wait("5");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(read_input_file(path, "a config file") == text);
  CHECK(seconds_since(t0) < 4);
  ::close(p[0]);
}

TEST_CASE("AUTOSP_PIPE_TIMEOUT must be a number of seconds", "[input_file]") {
  {
    PipeWait wait("soon");
    CHECK_THROWS_WITH(pipe_wait_seconds(), "AUTOSP_PIPE_TIMEOUT='soon': expected a number of seconds in (0, 1e7]");
  }
  {
    PipeWait wait("0");
    CHECK_THROWS_AS(pipe_wait_seconds(), UsageError);
  }
  CHECK(pipe_wait_seconds() == 10.0);
}
