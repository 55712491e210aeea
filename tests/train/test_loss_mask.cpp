// Loss masks (data.loss_mask_path, train/data.h): the label that predicts token i of the stream is
// -100 exactly where mask[i] = 0, checked against expectations built here from the stream and the
// mask by index (hand-written for one small case), across shard boundaries, under shuffle and a
// mix (the mask follows the window), with packed documents and for validation data; the .npy
// files are written byte by byte from NumPy's format description (tests/common/loss_mask_files.h).
// Every malformed mask is a UsageError naming the mask (and its token file where there is one).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "common/loss_mask_files.h"
#include "common/temp_dir.h"
#include "train/accumulation.h"
#include "train/data.h"

using namespace autosp;

namespace {

using test::Bytes;
using test::npy;
using test::npy_mask;
using test::write_bytes;
using test::write_shard;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("mask") {}
};

DataConfig tokens_cfg(const std::string& path, const std::string& masks, int64_t seq_len, int64_t batch) {
  DataConfig c;
  c.source = DataSourceKind::tokens;
  c.path = path;
  c.loss_mask_path = masks;
  c.seq_len = seq_len;
  c.batch_size = batch;
  return c;
}

std::vector<int64_t> row(const Tensor& t, int64_t b) {
  const int64_t S = t.dim(1);
  return {t.data<int64_t>() + b * S, t.data<int64_t>() + (b + 1) * S};
}

// A stream whose token i is `base + i` (so a row's first input names its window) with a random mask.
struct Stream {
  std::vector<int64_t> tokens;
  std::vector<int> mask;
};
Stream make_stream(int64_t base, int64_t n, uint64_t seed, double keep) {
  std::mt19937_64 rng(seed);
  Stream s;
  for (int64_t i = 0; i < n; ++i) {
    s.tokens.push_back(base + i);
    s.mask.push_back(std::uniform_real_distribution<double>(0, 1)(rng) < keep ? 1 : 0);
  }
  return s;
}

// Writes `s` as shards of the given sizes (and masks of the same sizes) named <stem>_k.bin / .npy.
void write_split(const TempDir& tmp, const std::string& stem, const Stream& s, const std::vector<int64_t>& sizes) {
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const auto a = static_cast<std::ptrdiff_t>(at), e = static_cast<std::ptrdiff_t>(at + sizes[k]);
    write_shard(tmp.path(stem + "_" + std::to_string(k) + ".bin"), {s.tokens.begin() + a, s.tokens.begin() + e});
    write_bytes(tmp.path(stem + "_" + std::to_string(k) + ".npy"), npy_mask(std::vector<int64_t>(s.mask.begin() + a, s.mask.begin() + e)));
    at += sizes[k];
  }
  REQUIRE(at == static_cast<int64_t>(s.tokens.size()));
}

// Every row of `b`: its first input names the stream index i0 it starts at (token = base + i), and
// its labels must be token i0 + t + 1 where mask[i0 + t + 1] = 1, else -100.
int64_t check_rows(const Batch& b, const Stream& s, int64_t base) {
  int64_t masked = 0;
  for (int64_t r = 0; r < b.input_ids.dim(0); ++r) {
    const std::vector<int64_t> in = row(b.input_ids, r), lab = row(b.labels, r);
    const int64_t i0 = in[0] - base;
    for (size_t t = 0; t < in.size(); ++t) {
      const size_t next = static_cast<size_t>(i0) + t + 1;
      REQUIRE(in[t] == s.tokens[next - 1]);
      const int64_t want = s.mask[next] ? s.tokens[next] : -100;
      INFO("row " << r << " from stream index " << i0 << ", t " << t);
      CHECK(lab[t] == want);
      masked += want == -100;
    }
  }
  return masked;
}

}  // namespace

TEST_CASE("loss mask: mask[i] = 0 ignores the label that predicts token i (a hand-written case)", "[data][mask]") {
  TempDir tmp;
  // Tokens 10..19 in two shards of 6 and 4; S = 4, so window 0 is tokens 0..4 and window 1 is 4..8.
  write_shard(tmp.path("t_0.bin"), {10, 11, 12, 13, 14, 15});
  write_shard(tmp.path("t_1.bin"), {16, 17, 18, 19});
  // Masked: token 0 (never a target), 2, and 5..6 (a span over the shard boundary, in window 1).
  write_bytes(tmp.path("t_0.npy"), npy_mask({0, 1, 0, 1, 1, 0}));
  write_bytes(tmp.path("t_1.npy"), npy_mask({0, 1, 1, 1}, "|b1"));
  auto src = make_data_source(tokens_cfg(tmp.path("t_*.bin"), tmp.path("t_*.npy"), 4, 2), 64, 0);
  const Batch b = src->get(0, 0, 1);
  CHECK(row(b.input_ids, 0) == std::vector<int64_t>{10, 11, 12, 13});
  CHECK(row(b.labels, 0) == std::vector<int64_t>{11, -100, 13, 14});  // predicting 12 (index 2) is masked
  CHECK(row(b.input_ids, 1) == std::vector<int64_t>{14, 15, 16, 17});
  CHECK(row(b.labels, 1) == std::vector<int64_t>{-100, -100, 17, 18});  // predicting 15 and 16 are masked
  CHECK(src->describe().find("loss masks from") != std::string::npos);

  // The same tokens without masks: every label is the next token.
  auto plain = make_data_source(tokens_cfg(tmp.path("t_*.bin"), "", 4, 2), 64, 0);
  CHECK(row(plain->get(0, 0, 1).labels, 1) == std::vector<int64_t>{15, 16, 17, 18});
}

TEST_CASE("loss mask: every window of a multi-shard stream, in order and shuffled", "[data][mask]") {
  TempDir tmp;
  const Stream s = make_stream(100, 301, 7, 0.6);
  write_split(tmp, "s", s, {50, 1, 0, 130, 120});  // an empty shard and a one-token shard included
  for (bool shuffle : {false, true}) {
    DataConfig cfg = tokens_cfg(tmp.path("s_*.bin"), tmp.path("s_*.npy"), 12, 5);
    cfg.shuffle = shuffle;
    cfg.seed = 3;
    auto src = make_data_source(cfg, 1000, 0);
    auto plain_cfg = cfg;
    plain_cfg.loss_mask_path.clear();
    auto plain = make_data_source(plain_cfg, 1000, 0);
    INFO("shuffle " << shuffle);
    int64_t masked = 0;
    for (int64_t step = 0; step < 12; ++step) {  // past one epoch of 25 windows
      const Batch b = src->get(step, 0, 1);
      CHECK(row(b.input_ids, 0) == row(plain->get(step, 0, 1).input_ids, 0));  // the same windows as without masks
      masked += check_rows(b, s, 100);
    }
    CHECK(masked > 50);  // the masks were applied
  }
}

TEST_CASE("loss mask: a mix reads each dataset's masks with its windows", "[data][mask]") {
  TempDir tmp;
  const Stream a = make_stream(0, 97, 1, 0.5), b = make_stream(500, 131, 2, 0.8);
  write_split(tmp, "a", a, {40, 57});
  write_split(tmp, "b", b, {131});
  DataConfig cfg = tokens_cfg("", "", 8, 4);
  cfg.mix = {{tmp.path("a_*.bin"), 1.0, tmp.path("a_*.npy"), ""}, {tmp.path("b_*.bin"), 2.0, tmp.path("b_*.npy"), ""}};
  cfg.shuffle = true;
  cfg.seed = 9;
  auto src = make_data_source(cfg, 1000, 0);
  int64_t from_a = 0, from_b = 0;
  for (int64_t step = 0; step < 10; ++step) {
    const Batch batch = src->get(step, 0, 1);
    for (int64_t r = 0; r < 4; ++r) {
      const Batch one = micro_batch(batch, r, 4);  // row r
      if (row(one.input_ids, 0)[0] < 500) ++from_a, check_rows(one, a, 0);
      else ++from_b, check_rows(one, b, 500);
    }
  }
  CHECK(from_a > 5);
  CHECK(from_b > 5);
}

TEST_CASE("loss mask: with packed documents an EOS's target stays ignored, and validation data takes masks",
          "[data][mask]") {
  TempDir tmp;
  // EOS = 3 ends documents; the mask keeps everything but tokens 6 and 7.
  const std::vector<int64_t> tokens = {5, 6, 3, 7, 8, 9, 3, 10, 11};
  write_shard(tmp.path("d.bin"), tokens);
  write_bytes(tmp.path("d.npy"), npy_mask({1, 1, 1, 1, 1, 1, 0, 0, 1}));
  DataConfig cfg = tokens_cfg(tmp.path("d.bin"), tmp.path("d.npy"), 8, 1);
  cfg.eos_token_id = 3;
  cfg.document_mask = true;
  const Batch b = make_data_source(cfg, 64, 0)->get(0, 0, 1);
  // labels: 6, 3 (a document's EOS is its target), (the EOS's target 7: ignored), 8, 9, (predicting
  // token 6, an EOS: masked), (predicting token 7: masked, and an EOS's target), 11
  CHECK(row(b.labels, 0) == std::vector<int64_t>{6, 3, -100, 8, 9, -100, -100, 11});
  CHECK(row(b.position_ids, 0) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0});

  // Validation: data.val_loss_mask_path beside data.val_path.
  cfg.val_path = tmp.path("d.bin");
  cfg.val_loss_mask_path = tmp.path("d.npy");
  cfg.document_mask = false;
  CHECK(row(make_val_source(cfg, 64, 0)->get(0, 0, 1).labels, 0) == std::vector<int64_t>{6, 3, 7, 8, 9, -100, -100, 11});
  cfg.val_loss_mask_path.clear();
  CHECK(row(make_val_source(cfg, 64, 0)->get(0, 0, 1).labels, 0) == std::vector<int64_t>{6, 3, 7, 8, 9, 3, 10, 11});
}

TEST_CASE("loss mask: a text file takes one mask of its bytes", "[data][mask]") {
  TempDir tmp;
  write_bytes(tmp.path("t.txt"), {'a', 'b', 'c', 'd', 'e'});
  write_bytes(tmp.path("t.npy"), npy_mask({1, 1, 0, 1, 1}, "|u1", 2));  // format 2.0: a 4-byte header length
  DataConfig cfg = tokens_cfg(tmp.path("t.txt"), tmp.path("t.npy"), 4, 1);
  cfg.source = DataSourceKind::text;
  CHECK(row(make_data_source(cfg, 256, 0)->get(0, 0, 1).labels, 0) == std::vector<int64_t>{'b', -100, 'd', 'e'});
}

TEST_CASE("loss mask: every malformed mask is a UsageError naming the mask and its token file", "[data][mask]") {
  TempDir tmp;
  write_shard(tmp.path("x_0.bin"), {1, 2, 3, 4, 5, 6});
  write_shard(tmp.path("x_1.bin"), {7, 8, 9});
  const std::string good1 = "(3,)";
  struct Case {
    std::string name;
    Bytes m0;        // the mask of x_0.bin (6 tokens)
    bool second;     // whether x_1's mask exists
    std::string want;  // in the message
    bool names_tokens = true;
  };
  Bytes header_only = npy_mask({1, 1, 1, 1, 1, 1});
  Bytes bad_version = header_only;
  bad_version[6] = 4;
  Bytes bad_magic = header_only;
  bad_magic[1] = 'X';
  Bytes truncated(header_only.begin(), header_only.begin() + 30);
  Bytes long_header = header_only;
  long_header[8] = 0xff, long_header[9] = 0x7f;
  const std::vector<Case> cases = {
      {"length", npy_mask({1, 1, 1, 1, 1}), true, "holds 5 values but its token file"},
      {"count", npy_mask({1, 1, 1, 1, 1, 1}), false, "1 loss mask for the 2 token files", false},
      {"dtype f4", npy("<f4", "(6,)", Bytes(24, 0)), true, "dtype '<f4'"},
      {"dtype i8", npy("<i8", "(6,)", Bytes(48, 0)), true, "dtype '<i8'"},
      {"2-D", npy("|u1", "(2, 3)", Bytes(6, 1)), true, "one dimension"},
      {"0-D", npy("|u1", "()", Bytes(1, 1)), true, "one dimension"},
      {"data short", npy("|u1", "(6,)", Bytes(5, 1)), true, "bytes of data after its header"},
      {"data long", npy("|u1", "(6,)", Bytes(7, 1)), true, "bytes of data after its header"},
      {"magic", bad_magic, true, "not a .npy file"},
      {"version", bad_version, true, "unsupported .npy version 4.0"},
      {"truncated", truncated, true, "truncated .npy header"},
      {"header length", long_header, true, "truncated .npy header"},
      {"empty", Bytes{}, true, "not a .npy file"},
      {"no dict", npy("|u1", "(6,)", Bytes(6, 1)), true, "malformed .npy header"},
      {"value 2", npy_mask({1, 2, 1, 1, 1, 1}), true, "value 2 at index 1 of a loss mask is not 0 or 1", false},
      {"control bytes", npy("|u1\n\x01", "(6,)", Bytes(6, 1)), true, "dtype '|u1??'"},
      {"unterminated", npy("|u1" + std::string(60000, 'a') + "', 'x': '", "(6,)", Bytes(6, 1)), true, "dtype '|u1aaa"},
      {"long header", npy("|u1", "(6,)" + std::string(70000, ' '), Bytes(6, 1), 2), true, "truncated .npy header"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Bytes m0 = c.m0;
    if (c.name == "no dict") {  // the dict's keys renamed: no 'descr'
      const std::string h(m0.begin(), m0.end());
      const size_t at = h.find("descr");
      m0[at] = 'D';
    }
    for (const char* f : {"x_0.npy", "x_1.npy"}) std::filesystem::remove(tmp.path(f));
    write_bytes(tmp.path("x_0.npy"), m0);
    if (c.second) write_bytes(tmp.path("x_1.npy"), npy_mask({1, 1, 1}));
    try {
      auto src = make_data_source(tokens_cfg(tmp.path("x_*.bin"), tmp.path("x_*.npy"), 4, 2), 64, 0);
      src->get(0, 0, 1);  // mask values are checked when read
      FAIL("no error");
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(c.want) != std::string::npos);
      CHECK(msg.find('\n') == std::string::npos);  // one line
      CHECK(msg.find("x_") != std::string::npos);
      CHECK(msg.find(".npy") != std::string::npos);
      if (c.names_tokens) CHECK(msg.find("x_0.bin") != std::string::npos);
    }
  }
  // A glob that matches no mask names the pattern.
  CHECK_THROWS_WITH(make_data_source(tokens_cfg(tmp.path("x_*.bin"), tmp.path("none_*.npy"), 4, 2), 64, 0),
                    Catch::Contains("none_*.npy: no file matches"));
}
