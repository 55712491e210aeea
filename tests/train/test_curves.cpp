// train/curves.h: CRC-32C against its published check values (RFC 3720 B.4, the iSCSI test
// vectors), the TFRecord framing of an event file read back by hand, and the CSV. TensorBoard's own
// reader reads the event files in tests/ref/tensorboard_events.py.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/temp_dir.h"
#include "tensor/check.h"
#include "train/curves.h"

using namespace autosp;
namespace fs = std::filesystem;

TEST_CASE("curves: CRC-32C equals the published check values", "[curves]") {
  CHECK(crc32c("") == 0u);
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc += static_cast<char>(i);
  CHECK(crc32c(inc) == 0x46DD794Eu);
  // TFRecord's mask: rotate right by 15, add 0xa282ead8.
  const uint32_t c = crc32c("123456789");
  CHECK(masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
template <class T>
T read_le(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}
}  // namespace

TEST_CASE("curves: an event file is TFRecords with checked lengths and data", "[curves]") {
  const test::TempDir tmp("curves");
  const fs::path& dir = tmp.dir;
  std::string path;
  {
    EventFile f((dir / "tb").string());
    f.scalars(7, {{"train/loss", 2.5}});
    path = f.path();
  }
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::string s = slurp(path);
  size_t at = 0;
  int records = 0;
  while (at < s.size()) {
    REQUIRE(at + 12 <= s.size());
    const auto len = read_le<uint64_t>(s, at);
    CHECK(read_le<uint32_t>(s, at + 8) == masked_crc32c(s.substr(at, 8)));
    REQUIRE(at + 12 + len + 4 <= s.size());
    CHECK(read_le<uint32_t>(s, at + 12 + len) == masked_crc32c(s.substr(at + 12, len)));
    if (records == 0) CHECK(s.substr(at + 12, len).find("brain.Event:2") != std::string::npos);
    if (records == 1) CHECK(s.substr(at + 12, len).find("train/loss") != std::string::npos);
    at += 12 + len + 4;
    ++records;
  }
  CHECK(records == 2);
}

TEST_CASE("curves: the CSV has a header once and a row per step; bad directories are refused", "[curves]") {
  const test::TempDir tmp("curves-csv");
  const fs::path& dir = tmp.dir;
  Config cfg;
  cfg.train.csv_dir = (dir / "csv").string();
  StepRecord rec;
  rec.step = 3, rec.loss = 1.5, rec.lr = 0.25, rec.grad_norm = 2, rec.tokens_per_sec = 100;
  for (int run = 0; run < 2; ++run) {  // a resumed run appends
    Curves c(cfg, true);
    c.step(rec);
  }
  CHECK(slurp((dir / "csv" / "metrics.csv").string()) ==
        "step,loss,lr,grad_norm,tokens_per_sec,mfu,accuracy,val_loss,val_accuracy\n"
        "3,1.5,0.25,2,100,,,,\n3,1.5,0.25,2,100,,,,\n");
  Curves silent(cfg, false);  // not rank 0: writes nothing
  silent.step(rec);
  std::ofstream((dir / "file").string()) << "x";
  cfg.train.csv_dir = (dir / "file" / "sub").string();
  CHECK_THROWS_WITH(Curves(cfg, true), Catch::Contains("train.csv_dir") && Catch::Contains("cannot create"));
  cfg.train.csv_dir = "";
  cfg.train.tensorboard_dir = (dir / "file").string();
  CHECK_THROWS_WITH(Curves(cfg, true), Catch::Contains("train.tensorboard_dir") && Catch::Contains("cannot create"));
}
