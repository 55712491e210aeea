// Reliability pieces one process can check: AUTOSP_FAULT parsing, CRC-32C, checkpoint checksums (a
// flipped byte is named), keep-last-K pruning, leftovers of dead writers, and a commit interrupted
// before its rename. The collective watchdog is tests/comm/test_watchdog.cpp; the multi-rank
// behaviour is tests/mpi/fault_injection.sh.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/env_var.h"
#include "common/temp_dir.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/fault.h"
#include "tensor/check.h"

using namespace autosp;
using autosp::testing::EnvVar;
namespace fs = std::filesystem;

namespace {

Config tiny_config() {
  return parse_config(nlohmann::json::parse(R"({
    "model": {"arch": "gpt2", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 16}, "data": {"seq_len": 8}})"));
}

void flip_byte(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("AUTOSP_FAULT values parse or are named errors", "[fault]") {
  CHECK_FALSE(parse_fault("").has_value());
  auto f = parse_fault("rank:1,step:3,kind:hang");
  REQUIRE(f);
  CHECK(f->rank == 1);
  CHECK(f->step == 3);
  CHECK(f->kind == FaultKind::hang);
  CHECK(f->where == FaultWhere::step);
  CHECK(parse_fault("rank:0,step:2,kind:nan")->kind == FaultKind::nan);
  f = parse_fault("kind:crash,where:checkpoint,step:12,rank:0");
  REQUIRE(f);
  CHECK(f->kind == FaultKind::crash);
  CHECK(f->where == FaultWhere::checkpoint);
  CHECK(f->step == 12);

  const std::vector<std::pair<const char*, const char*>> bad = {
      {"rank:1,step:3", "missing field 'kind'"},
      {"rank:1,kind:exit", "missing field 'step'"},
      {"step:1,kind:exit", "missing field 'rank'"},
      {"rank:1,step:3,kind:explode", "unknown kind 'explode'"},
      {"rank:1,step:3,kind:exit,where:later", "unknown where 'later'"},
      {"rank:x,step:3,kind:exit", "rank 'x' is not a non-negative integer"},
      {"rank:-1,step:3,kind:exit", "rank '-1'"},
      {"rank:1,step:0,kind:exit", "step must be"},
      {"rank:1,step:3.5,kind:exit", "step '3.5'"},
      {"rank:1,step:99999999999999999999,kind:exit", "step '99999999999999999999'"},
      {"rank:1,step:3,kind:exit,rank:2", "given twice"},
      {"rank:1,step:3,kind:exit,color:red", "unknown field 'color'"},
      {"rank:1,,step:3,kind:exit", "is not key:value"},
      {"rank:1,step:3,kind:exit,", "trailing ','"},
      {"garbage", "is not key:value"},
      {"rank:0,step:2,kind:nan,where:checkpoint", "kind:nan happens in a step"},
  };
  for (const auto& [text, needle] : bad) {
    INFO(text);
    CHECK_THROWS_AS(parse_fault(text), UsageError);
    CHECK_THROWS_WITH(parse_fault(text), Catch::Contains("AUTOSP_FAULT") && Catch::Contains(needle));
  }

  {
    EnvVar e("AUTOSP_FAULT", "rank:2,step:1,kind:exit");
    CHECK_THROWS_WITH(fault_from_env(2), Catch::Contains("rank 2 does not exist in a job of 2 ranks"));
    CHECK(fault_from_env(3)->rank == 2);
  }
  {
    EnvVar e("AUTOSP_FAULT", "rank:1,step:1,kind:exit,where:checkpoint");
    CHECK_THROWS_WITH(fault_from_env(2), Catch::Contains("needs rank:0"));
  }
  {
    EnvVar e("AUTOSP_FAULT", "rank:0,step:1,kind:hang");
    CHECK_THROWS_WITH(fault_from_env(1), Catch::Contains("at least 2 ranks"));
  }
  CHECK_FALSE(fault_from_env(1).has_value());
}

TEST_CASE("CRC-32C matches the standard check values", "[checkpoint]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(inc.data() + 5, 27, crc32c(inc.data(), 5)) == 0x46DD794Eu);  // continues
  CHECK(crc32c(nullptr, 0) == 0u);
}

TEST_CASE("checkpoints carry checksums, and a flipped byte is named", "[checkpoint]") {
  const test::TempDir tmp("reliability-checksum");
  const fs::path& dir = tmp.dir;
  Config cfg = tiny_config();
  ParamMap params = init_params(cfg.model, 1, DType::f32);
  AdamW opt;
  opt.init(params);
  const std::string good = save_checkpoint((dir / "root").string(), 4, params, opt, cfg);
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(fs::path(good) / "meta.json"));
  CHECK(meta["format"] == 2);
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    INFO(name);
    const fs::path file = fs::path(good) / name;
    CHECK(meta["files"][name]["bytes"] == fs::file_size(file));
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", crc32c_file(file.string()));
    CHECK(meta["files"][name]["crc32c"] == hex);

    // A flipped byte in the data section and one in the header: both named as corrupt.
    for (uint64_t offset : {fs::file_size(file) - 3, uint64_t{20}}) {
      const fs::path copy = dir / ("flip-" + std::to_string(offset) + "-" + name);
      fs::remove_all(copy);
      fs::copy(good, copy, fs::copy_options::recursive);
      flip_byte(copy / name, offset);
      CHECK_THROWS_AS(load_checkpoint(copy.string(), cfg, DType::f32), UsageError);
      CHECK_THROWS_WITH(load_checkpoint(copy.string(), cfg, DType::f32),
                        Catch::Contains((copy / name).string() + ": checksum mismatch") &&
                            Catch::Contains("the file is corrupt"));
    }
  }
  CHECK(load_checkpoint(good, cfg, DType::f32).step == 4);

  // meta.json's step must agree with its directory; format 1 (no checksums) is refused by name.
  const fs::path moved = dir / "root" / "step_00000005";
  fs::copy(good, moved, fs::copy_options::recursive);
  CHECK_THROWS_WITH(load_checkpoint(moved.string(), cfg, DType::f32),
                    Catch::Contains("but the directory is step_00000005"));
  fs::remove_all(moved);
  meta["format"] = 1;
  const fs::path old = dir / "format1";
  fs::copy(good, old, fs::copy_options::recursive);
  std::ofstream(old / "meta.json", std::ios::trunc) << meta.dump();
  CHECK_THROWS_WITH(load_checkpoint(old.string(), cfg, DType::f32), Catch::Contains("predates checksums"));
  meta["format"] = 2;
  meta["files"].erase("model.safetensors");
  std::ofstream(old / "meta.json", std::ios::trunc) << meta.dump();
  CHECK_THROWS_WITH(load_checkpoint(old.string(), cfg, DType::f32),
                    Catch::Contains("no {bytes, crc32c} entry for model.safetensors"));
  std::ofstream(old / "meta.json", std::ios::trunc) << std::string(100, '[') << std::string(100, ']');
  CHECK_THROWS_WITH(load_checkpoint(old.string(), cfg, DType::f32), Catch::Contains("nested deeper than"));
}

TEST_CASE("the newest K checkpoints are kept, and dead writers' leftovers removed", "[checkpoint]") {
  const test::TempDir tmp("reliability-keep");
  const fs::path& dir = tmp.dir;
  Config cfg = tiny_config();
  ParamMap params = init_params(cfg.model, 1, DType::f32);
  AdamW opt;
  opt.init(params);
  auto steps_under = [](const fs::path& root) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };

  SaveOptions keep3;
  keep3.keep_last = 3;
  const fs::path root = dir / "root";
  fs::create_directories(root);
  // Leftovers: a temporary directory of a dead process (pid far beyond pid_max) and one of a live one.
  fs::create_directories(root / ".step_00000001.tmp.999999999");
  const std::string live = ".step_00000001.tmp." + std::to_string(::getppid());
  fs::create_directories(root / live);
  for (int64_t s = 1; s <= 5; ++s) save_checkpoint(root.string(), s, params, opt, cfg, keep3);
  CHECK(steps_under(root) == std::vector<std::string>{live, "step_00000003", "step_00000004", "step_00000005"});

  SaveOptions keep_all;  // 0 = keep every checkpoint
  for (int64_t s = 6; s <= 9; ++s) save_checkpoint(root.string(), s, params, opt, cfg, keep_all);
  CHECK(steps_under(root).size() == 8);

  // Newest by number, not by name: step 100000000 sorts before step 99999999 as text.
  const fs::path big = dir / "big";
  save_checkpoint(big.string(), 99999999, params, opt, cfg);
  save_checkpoint(big.string(), 100000000, params, opt, cfg);
  CHECK(load_checkpoint(big.string(), cfg, DType::f32).step == 100000000);
  SaveOptions keep1;
  keep1.keep_last = 1;
  save_checkpoint(big.string(), 100000001, params, opt, cfg, keep1);
  CHECK(steps_under(big) == std::vector<std::string>{"step_100000001"});

  // A write interrupted before its rename leaves the previous checkpoint as the newest.
  SaveOptions interrupted = keep3;
  interrupted.before_commit = [] { throw RuntimeFailure("interrupted"); };
  CHECK_THROWS_WITH(save_checkpoint(root.string(), 10, params, opt, cfg, interrupted), "interrupted");
  CHECK_FALSE(fs::exists(root / "step_00000010"));
  CHECK(load_checkpoint(root.string(), cfg, DType::f32).step == 9);
}
