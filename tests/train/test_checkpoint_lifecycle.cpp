// The checkpoint write at every point of its protocol: a writer killed (a forked child that
// _exit()s there) before or after each fsync and rename leaves step_N complete, old or new, and the
// next writer cleans up first; failed writes leave nothing; non-finite state is never written; a
// newest step_N without meta.json is an error. The reference is the directory listing and the
// tensors written, not the code under test.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "models/model.h"
#include "tensor/check.h"
#include "train/checkpoint.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

Tensor f32_tensor(const Shape& shape, const std::vector<double>& v) {
  return Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end()));
}

struct Fixture {
  test::TempDir tmp;
  const fs::path& dir = tmp.dir;
  Config cfg = parse_config(nlohmann::json::parse(R"({
    "model": {"arch": "gpt2", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 16}, "data": {"seq_len": 8}})"));
  ParamMap params = init_params(cfg.model, 1, DType::f32);
  AdamW opt;
  explicit Fixture(const std::string& name)
      : tmp("lifecycle-" + name) {
    opt.init(params);
  }
  // The parameters plus `delta` everywhere: tells which save a checkpoint came from.
  ParamMap shifted(double delta) const {
    ParamMap out;
    for (const auto& [name, t] : params) {
      std::vector<double> v = t.to_doubles();
      for (double& x : v) x += delta;
      out[name] = f32_tensor(t.shape(), v);
    }
    return out;
  }
  // Which shift the checkpoint at `path` holds (NaN if it matches none of 0, 1).
  double shift_of(const std::string& path) const {
    Checkpoint ck = load_checkpoint(path, cfg, DType::f32);
    const auto& [name, t] = *params.begin();
    const double d = ck.params.at(name).to_doubles()[0] - t.to_doubles()[0];
    for (double want : {0.0, 1.0})
      if (std::abs(d - want) < 1e-5) return want;
    return NAN;
  }
};

std::vector<std::string> names_under(const fs::path& root) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Runs `save` in a child that dies (_exit) at `point`; returns whether it got there.
bool killed_at(const char* point, const std::function<void(const SaveOptions&)>& save) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    SaveOptions o;
    o.at_point = [point](const char* at) {
      if (std::string(at) == point) ::_exit(42);
    };
    try {
      save(o);
    } catch (...) {
    }
    ::_exit(1);  // never reached the point
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 42;
}

}  // namespace

TEST_CASE("a re-save killed at any point leaves step_N complete, and the next save cleans up", "[checkpoint]") {
  // "exchanged" and "moved_aside"/"committed" are the two commit paths; whichever this filesystem
  // takes, one of them is reached.
  int reached_points = 0;
  for (const char* point : {"files", "synced", "exchanged", "moved_aside", "committed", "pruned"}) {
    INFO("killed at " << point);
    Fixture f(std::string("resave-") + point);
    const std::string root = (f.dir / "root").string();
    save_checkpoint(root, 5, f.params, f.opt, f.cfg);  // the old copy: shift 0
    const ParamMap newer = f.shifted(1.0);
    const bool reached = killed_at(point, [&](const SaveOptions& o) {
      save_checkpoint(root, 5, newer, f.opt, f.cfg, o);
    });
    if (!reached) continue;  // the other commit path
    ++reached_points;
    // Resume finds step 5, complete: the old copy before the commit, the new one after it.
    const std::string p = std::string(point);
    const bool committed = p == "exchanged" || p == "committed" || p == "pruned";
    CHECK(load_checkpoint(root, f.cfg, DType::f32).step == 5);
    CHECK(f.shift_of(root) == (committed ? 1.0 : 0.0));
    // The next writer (this process) cleans what the dead one left before writing.
    save_checkpoint(root, 6, f.params, f.opt, f.cfg);
    CHECK(names_under(root) == std::vector<std::string>{"step_00000005", "step_00000006"});
  }
  CHECK(reached_points >= 4);  // files, synced, pruned, and the commit path's own point(s)
}

TEST_CASE("a dead writer's moved-aside copy is put back when its step is missing", "[checkpoint]") {
  Fixture f("moved-aside");
  const fs::path root = f.dir / "root";
  save_checkpoint(root.string(), 3, f.params, f.opt, f.cfg);
  // What a writer killed between its two renames (no RENAME_EXCHANGE) leaves: no step_3, the
  // complete old copy under its pid, and its new copy half-way.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string pid = std::to_string(dead);
  fs::rename(root / "step_00000003", root / (".step_00000003.old." + pid));
  fs::create_directories(root / (".step_00000003.tmp." + pid));
  CHECK(load_checkpoint(root.string(), f.cfg, DType::f32).step == 3);
  CHECK(names_under(root) == std::vector<std::string>{"step_00000003"});
}

TEST_CASE("dead writers' leftovers are removed before a write, and a failed write leaves none", "[checkpoint]") {
  Fixture f("before-write");
  const fs::path root = f.dir / "root";
  fs::create_directories(root / ".step_00000009.tmp.999999999");  // pid beyond pid_max: dead
  std::ofstream(root / ".step_00000009.tmp.999999999" / "model.safetensors") << std::string(4096, 'x');
  SaveOptions o;
  bool gone_before_write = false;
  o.at_point = [&](const char* at) {
    if (std::string(at) == "files") gone_before_write = !fs::exists(root / ".step_00000009.tmp.999999999");
  };
  save_checkpoint(root.string(), 1, f.params, f.opt, f.cfg, o);
  CHECK(gone_before_write);
  // A write that fails (ENOSPC would throw from the safetensors writer the same way) cleans up.
  for (const char* point : {"files", "synced"}) {
    SaveOptions failing;
    failing.at_point = [point](const char* at) {
      if (std::string(at) == point) throw RuntimeFailure("no space left on device");
    };
    CHECK_THROWS_WITH(save_checkpoint(root.string(), 2, f.params, f.opt, f.cfg, failing),
                      Catch::Contains("no space"));
    CHECK(names_under(root) == std::vector<std::string>{"step_00000001"});
  }
}

TEST_CASE("non-finite parameters or moments are never written", "[checkpoint]") {
  Fixture f("nonfinite");
  const fs::path root = f.dir / "root";
  save_checkpoint(root.string(), 1, f.params, f.opt, f.cfg);
  ParamMap bad = f.params;
  std::vector<double> v = bad.begin()->second.to_doubles();
  v[0] = NAN;
  bad.begin()->second = f32_tensor(bad.begin()->second.shape(), v);
  CHECK_THROWS_WITH(save_checkpoint(root.string(), 2, bad, f.opt, f.cfg),
                    Catch::Contains(bad.begin()->first) && Catch::Contains("non-finite"));
  AdamW bad_opt = f.opt;
  std::vector<double> m = bad_opt.exp_avg_sq.begin()->second.to_doubles();
  m[0] = INFINITY;
  bad_opt.exp_avg_sq.begin()->second = f32_tensor(bad_opt.exp_avg_sq.begin()->second.shape(), m);
  CHECK_THROWS_WITH(save_checkpoint(root.string(), 2, f.params, bad_opt, f.cfg),
                    Catch::Contains("exp_avg_sq.") && Catch::Contains("non-finite"));
  CHECK(names_under(root) == std::vector<std::string>{"step_00000001"});
  CHECK_THROWS_AS(save_checkpoint(root.string(), 2, bad, f.opt, f.cfg), RuntimeFailure);
}

TEST_CASE("a newest step without meta.json is an error, not a silent step back", "[checkpoint]") {
  Fixture f("no-meta");
  const fs::path root = f.dir / "root";
  save_checkpoint(root.string(), 5, f.params, f.opt, f.cfg);
  fs::create_directories(root / "step_00000007");
  CHECK_THROWS_WITH(load_checkpoint(root.string(), f.cfg, DType::f32),
                    Catch::Contains("step_00000007") && Catch::Contains("has no meta.json"));
  CHECK_THROWS_AS(load_checkpoint(root.string(), f.cfg, DType::f32), UsageError);
  CHECK(load_checkpoint((root / "step_00000005").string(), f.cfg, DType::f32).step == 5);  // explicit: fine
}

TEST_CASE("one live run per checkpoint directory; a dead owner's lock is taken over", "[checkpoint]") {
  Fixture f("lock");
  const std::string root = (f.dir / "root").string();
  {
    DirLock first(root);
    CHECK_THROWS_AS(DirLock(root), UsageError);
    CHECK_THROWS_WITH(DirLock(root), Catch::Contains("another run is writing checkpoints here") &&
                                         Catch::Contains(std::to_string(::getpid())));
  }
  DirLock again(root);  // released when the first ended
  // A child takes the lock and dies without releasing it by hand: the kernel releases it.
  Fixture g("lock-dead");
  const std::string other = (g.dir / "root").string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      new DirLock(other);  // never destroyed
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::ifstream held(fs::path(other) / ".lock");
  std::string holder;
  std::getline(held, holder);
  CHECK(holder.rfind(std::to_string(pid) + " ", 0) == 0);  // "<pid> <host>"
  CHECK_NOTHROW(DirLock(other));
}

TEST_CASE("move_aside keeps older checkpoints where they are and moves newer ones out of the way", "[checkpoint]") {
  Fixture f("aside");
  const fs::path root = f.dir / "root";
  CHECK(newest_step(root.string()) == -1);
  for (int64_t s : {2, 4, 6}) save_checkpoint(root.string(), s, f.params, f.opt, f.cfg);
  CHECK(newest_step(root.string()) == 6);
  CHECK(move_aside(root.string(), 6).empty());  // nothing newer than 6
  const std::string aside = move_aside(root.string(), 2);
  REQUIRE_FALSE(aside.empty());
  CHECK(names_under(aside) == std::vector<std::string>{"step_00000004", "step_00000006"});
  CHECK(newest_step(root.string()) == 2);
  CHECK(load_checkpoint(root.string(), f.cfg, DType::f32).step == 2);
  CHECK(load_checkpoint((fs::path(aside) / "step_00000006").string(), f.cfg, DType::f32).step == 6);  // intact
  move_aside(root.string(), -1);
  CHECK(newest_step(root.string()) == -1);
}
