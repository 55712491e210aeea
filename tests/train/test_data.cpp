// Data sources (src/train/data.h): llm.c shards and text read back in the documented order, a
// table of malformed inputs that must each be a UsageError naming the file, shards read through a
// mapping (a rank's RSS does not grow with the file), validation data, the synthetic
// associative-recall task checked by parsing its sequences independently, and count_correct.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "common/temp_dir.h"
#include "train/data.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("data") {}
};

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void put32(Bytes& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

// An llm.c shard: 256 × int32 header (magic, version, count) then the tokens (token_size 2 or 4).
Bytes shard(int32_t magic, int32_t version, uint32_t count, const std::vector<uint32_t>& tokens, int token_size) {
  Bytes b(1024, 0);
  put32(b, 0, static_cast<uint32_t>(magic));
  put32(b, 4, static_cast<uint32_t>(version));
  put32(b, 8, count);
  for (uint32_t t : tokens)
    for (int i = 0; i < token_size; ++i) b.push_back(static_cast<unsigned char>(t >> (8 * i)));
  return b;
}
Bytes shard16(const std::vector<uint32_t>& tokens) {
  return shard(20240520, 1, static_cast<uint32_t>(tokens.size()), tokens, 2);
}
Bytes shard32(const std::vector<uint32_t>& tokens) {
  return shard(20240801, 7, static_cast<uint32_t>(tokens.size()), tokens, 4);
}

std::vector<uint32_t> iota_tokens(uint32_t first, int n) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<uint32_t>(i);
  return t;
}

DataConfig data_cfg(DataSourceKind source, const std::string& path, int64_t seq_len, int64_t batch) {
  DataConfig c;
  c.source = source;
  c.path = path;
  c.seq_len = seq_len;
  c.batch_size = batch;
  return c;
}

std::vector<int64_t> values(const Tensor& t) {
  REQUIRE(t.dtype() == DType::i64);
  const int64_t* p = t.data<int64_t>();
  return {p, p + t.numel()};
}
std::vector<int64_t> row(const Tensor& t, int64_t b) {
  const int64_t S = t.dim(1);
  const int64_t* p = t.data<int64_t>() + b * S;
  return {p, p + S};
}

// The seq_len + 1 tokens starting at `start` of `stream`, wrapping.
std::vector<int64_t> window(const std::vector<uint32_t>& stream, int64_t start, int64_t len) {
  std::vector<int64_t> w;
  for (int64_t i = 0; i < len; ++i) w.push_back(stream[static_cast<size_t>((start + i) % static_cast<int64_t>(stream.size()))]);
  return w;
}

void check_row(const Batch& batch, int64_t b, const std::vector<int64_t>& seq_plus_one) {
  const std::vector<int64_t> in(seq_plus_one.begin(), seq_plus_one.end() - 1);
  const std::vector<int64_t> lab(seq_plus_one.begin() + 1, seq_plus_one.end());
  CHECK(row(batch.input_ids, b) == in);
  CHECK(row(batch.labels, b) == lab);
}

}  // namespace

TEST_CASE("tokens: uint16 shard read back in the documented order", "[data]") {
  TempDir tmp;
  const std::vector<uint32_t> stream = iota_tokens(1000, 50);  // token i is 1000 + i
  write_file(tmp.path("a.bin"), shard16(stream));
  auto src = make_data_source(data_cfg(DataSourceKind::tokens, tmp.path("a.bin"), 4, 2), 2000, 0);
  CHECK(src->num_tokens() == 50);
  CHECK(src->describe().find("tokens: 1 shard, 50 tokens (uint16)") == 0);

  // step 0, dp 1: sequence b starts at b·4.
  Batch b0 = src->get(0, 0, 1);
  CHECK(b0.input_ids.shape() == Shape{2, 4});
  CHECK(values(b0.input_ids) == std::vector<int64_t>{1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007});
  CHECK(values(b0.labels) == std::vector<int64_t>{1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008});
  CHECK(values(b0.position_ids) == std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3});

  // 50 tokens hold N = ⌊49 / 4⌋ = 12 windows (tokens 0..48); sequence g reads window g mod 12.
  CHECK(src->sequences_per_epoch() == 12);
  // step 5, dp 1: g = 10, 11 → the last windows of epoch 0, from 40 and 44 (token 49 is never read).
  Batch b5 = src->get(5, 0, 1);
  check_row(b5, 0, {1040, 1041, 1042, 1043, 1044});
  check_row(b5, 1, {1044, 1045, 1046, 1047, 1048});
  // step 6: g = 12, 13 → epoch 1 starts again at window 0.
  CHECK(values(src->get(6, 0, 1).input_ids) == values(b0.input_ids));
  CHECK(format_epochs(src->epochs(12)) == "epoch 1 (0%)");
  CHECK(format_epochs(src->epochs(15)) == "epoch 1 (25%)");

  // dp 2: step 3, rank 1, b 1 is g = (3·2 + 1)·2 + 1 = 15 → window 3, from 12.
  Batch d = src->get(3, 1, 2);
  check_row(d, 1, {1012, 1013, 1014, 1015, 1016});
  // step 3, rank 0, b 0 is g = 12 → window 0.
  check_row(src->get(3, 0, 2), 0, {1000, 1001, 1002, 1003, 1004});

  // A large index reads like its window (12·10^15 ≡ 0 mod 12); one past 2^63 is an error.
  const int64_t big = 12'000'000'000'000'000;
  CHECK(values(src->read(big, 2).input_ids) == values(b0.input_ids));
  check_row(src->read(big + 5, 1), 0, {1020, 1021, 1022, 1023, 1024});
  CHECK_THROWS_AS(src->get(5'000'000'000'000'000'000, 0, 1), UsageError);  // g = 10^19
}

TEST_CASE("tokens: uint32 shard, labels are inputs shifted by one, dp ranks interleave", "[data]") {
  TempDir tmp;
  std::vector<uint32_t> stream;
  for (uint32_t i = 0; i < 37; ++i) stream.push_back(100000 + i * 7);  // beyond uint16
  write_file(tmp.path("big.bin"), shard32(stream));
  const int64_t S = 5;
  auto one = make_data_source(data_cfg(DataSourceKind::tokens, tmp.path("big.bin"), S, 4), 400000, 0);
  auto two = make_data_source(data_cfg(DataSourceKind::tokens, tmp.path("big.bin"), S, 2), 400000, 0);
  CHECK(one->describe().find("(uint32)") != std::string::npos);
  for (int64_t step : {0, 1, 2, 7, 123}) {
    Batch g = one->get(step, 0, 1);
    for (int64_t b = 0; b < 4; ++b) {
      // Every row is the window at its global index, and labels are inputs shifted by one.
      check_row(g, b, window(stream, ((step * 4 + b) % 7) * S, S + 1));  // N = ⌊36 / 5⌋ = 7 windows
      const std::vector<int64_t> in = row(g.input_ids, b), lab = row(g.labels, b);
      for (int64_t t = 0; t + 1 < S; ++t) CHECK(lab[static_cast<size_t>(t)] == in[static_cast<size_t>(t + 1)]);
      CHECK(row(g.position_ids, b) == std::vector<int64_t>{0, 1, 2, 3, 4});
    }
    // dp 2 × batch 2 is the same global batch as dp 1 × batch 4: rank d takes rows 2d, 2d+1.
    for (int64_t d = 0; d < 2; ++d) {
      Batch r = two->get(step, d, 2);
      for (int64_t b = 0; b < 2; ++b) {
        CHECK(row(r.input_ids, b) == row(g.input_ids, 2 * d + b));
        CHECK(row(r.labels, b) == row(g.labels, 2 * d + b));
      }
    }
  }
}

TEST_CASE("tokens: a glob concatenates the matching shards in sorted order", "[data]") {
  TempDir tmp;
  // Written out of order; one uint16 shard among uint32 ones; a file that does not match.
  write_file(tmp.path("train_002.bin"), shard32({20, 21, 22}));
  write_file(tmp.path("train_000.bin"), shard32({0, 1, 2, 3}));
  write_file(tmp.path("train_001.bin"), shard16({10, 11}));
  write_file(tmp.path("val_000.bin"), shard32({99, 99, 99, 99, 99}));
  auto src = make_data_source(data_cfg(DataSourceKind::tokens, tmp.path("train_*.bin"), 3, 1), 100, 0);
  CHECK(src->num_tokens() == 9);
  CHECK(src->describe().find("tokens: 3 shards, 9 tokens (uint16 and uint32)") == 0);
  // Stream: 0 1 2 3 10 11 20 21 22: N = ⌊8 / 3⌋ = 2 windows, from 0 and 3.
  check_row(src->get(0, 0, 1), 0, {0, 1, 2, 3});
  check_row(src->get(1, 0, 1), 0, {3, 10, 11, 20});  // crosses two shard boundaries
  check_row(src->get(2, 0, 1), 0, {0, 1, 2, 3});     // epoch 1: 21 and 22 are past the last window
}

TEST_CASE("text: the file's bytes are the tokens, same read order", "[data]") {
  TempDir tmp;
  const std::string text = "hello, w\xC3\xB6rld";  // 13 bytes, two of them ≥ 128
  write_file(tmp.path("t.txt"), Bytes(text.begin(), text.end()));
  auto src = make_data_source(data_cfg(DataSourceKind::text, tmp.path("t.txt"), 4, 2), 256, 0);
  CHECK(src->num_tokens() == 13);
  std::vector<uint32_t> stream;
  for (unsigned char c : text) stream.push_back(c);
  Batch b = src->get(1, 0, 1);  // g = 2, 3 of N = 3 windows: from 8, then epoch 1 from 0
  check_row(b, 0, window(stream, 8, 5));
  check_row(b, 1, {'h', 'e', 'l', 'l', 'o'});
  CHECK(row(b.input_ids, 0)[0] == 0xC3);
  CHECK(values(b.position_ids) == std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3});
}

TEST_CASE("data: malformed inputs are usage errors that name the file", "[data]") {
  TempDir tmp;
  std::mt19937 gen(7);
  Bytes noise(2000);
  for (auto& c : noise) c = static_cast<unsigned char>(gen());
  const std::vector<uint32_t> ten = iota_tokens(0, 10);

  struct Case {
    const char* name;
    std::function<Bytes()> bytes;  // written to `file` when set
    DataSourceKind source = DataSourceKind::tokens;
    std::string file = "x.bin", path = "";  // path defaults to file
    int64_t seq_len = 4, vocab = 256;
    std::string expect;            // substring of the message
    bool prefix_is_path = true;    // the message starts with the path
  };
  auto bad_count = [&](uint32_t count) { return [=] { return shard(20240520, 1, count, iota_tokens(0, 10), 2); }; };
  using enum DataSourceKind;  // the table's sources: tokens, text, synthetic
  std::vector<Case> cases = {
      {"bad magic", [&] { return shard(12345, 1, 10, ten, 2); }, tokens, "x.bin", "", 4, 256, "bad magic 12345"},
      {"bad version u16", [&] { return shard(20240520, 2, 10, ten, 2); }, tokens, "x.bin", "", 4, 256,
       "unsupported version 2 for magic 20240520"},
      {"bad version u32", [&] { return shard(20240801, 1, 10, ten, 4); }, tokens, "x.bin", "", 4, 256,
       "unsupported version 1 for magic 20240801"},
      {"count larger than the file", bad_count(11), tokens, "x.bin", "", 4, 256,
       "token count mismatch: the header says 11 tokens (22 bytes) but the file holds 20 bytes"},
      {"count smaller than the file", bad_count(9), tokens, "x.bin", "", 4, 256, "header says 9 tokens"},
      {"odd data bytes", [&] { Bytes b = shard16(ten); b.push_back(0); return b; }, tokens, "x.bin", "", 4, 256,
       "holds 21 bytes after the header"},
      {"negative count", bad_count(static_cast<uint32_t>(-5)), tokens, "x.bin", "", 4, 256, "header says -5 tokens"},
      {"2^31 tokens on a tiny file", bad_count(0x80000000u), tokens, "x.bin", "", 4, 256, "token count mismatch"},
      {"2^31-1 tokens on a tiny file", bad_count(0x7FFFFFFFu), tokens, "x.bin", "", 4, 256,
       "header says 2147483647 tokens"},
      {"2^31-1 uint32 tokens, header only", [&] { return shard(20240801, 7, 0x7FFFFFFFu, {}, 4); }, tokens, "x.bin",
       "", 4, 256, "token count mismatch"},
      {"truncated header", [&] { Bytes b = shard16(ten); b.resize(500); return b; }, tokens, "x.bin", "", 4, 256,
       "truncated header: the file holds 500 bytes"},
      {"empty shard", [] { return Bytes{}; }, tokens, "x.bin", "", 4, 256, "empty file"},
      {"random bytes", [&] { return noise; }, tokens, "x.bin", "", 4, 256, "bad magic"},
      {"token ≥ vocab", [&] { std::vector<uint32_t> t = ten; t[5] = 300; return shard16(t); }, tokens, "x.bin", "",
       4, 256, "token 300 at index 5 is ≥ vocab_size 256"},
      {"uint32 token ≥ vocab", [&] { std::vector<uint32_t> t = ten; t[9] = 70000; return shard32(t); }, tokens,
       "x.bin", "", 3, 65536, "token 70000 at index 9 is ≥ vocab_size 65536"},  // seq_len 3: windows reach 9
      {"stream shorter than seq_len + 1", [&] { return shard16(ten); }, tokens, "x.bin", "", 10, 256,
       "holds 10 tokens, fewer than seq_len + 1 = 11"},
      {"glob with no match", nullptr, tokens, "x.bin", "nothing_*.bin", 4, 256, "no file matches"},
      {"missing file", nullptr, tokens, "x.bin", "missing.bin", 4, 256, "cannot open"},
      {"directory", nullptr, tokens, "x.bin", ".", 4, 256, "not a regular file"},
      {"one bad shard in a glob", [&] { return shard(20240520, 1, 3, ten, 2); }, tokens, "s_1.bin", "s_*.bin", 4,
       256, "token count mismatch"},
      {"text with vocab < 256", [] { return Bytes(100, 'a'); }, text, "t.txt", "", 4, 255,
       "needs vocab_size ≥ 256, got 255"},
      {"empty text", [] { return Bytes{}; }, text, "t.txt", "", 4, 256, "empty file"},
      {"text shorter than seq_len + 1", [] { return Bytes(8, 'a'); }, text, "t.txt", "", 8, 256,
       "holds 8 bytes, fewer than seq_len + 1 = 9"},
      {"missing text", nullptr, text, "t.txt", "nope.txt", 4, 256, "cannot open"},
      {"tokens without a path", nullptr, tokens, "x.bin", "<empty>", 4, 256, "data.path", false},
      {"synthetic vocab < 16", nullptr, synthetic, "x.bin", "", 64, 15, "needs ≥ 16, got 15", false},
      {"synthetic seq_len < 8", nullptr, synthetic, "x.bin", "", 7, 256, "needs ≥ 8, got 7", false},
      {"seq_len 0", nullptr, tokens, "x.bin", "", 0, 256, "data.seq_len", false},
  };
  REQUIRE(cases.size() >= 12);
  // The good shard that sits next to the bad one in the glob case.
  write_file(tmp.path("s_0.bin"), shard16(ten));
  for (const Case& c : cases) {
    SECTION(c.name) {
      if (c.bytes) write_file(tmp.path(c.file), c.bytes());
      const std::string path = c.path == "<empty>" ? "" : tmp.path(c.path.empty() ? c.file : c.path);
      const std::string named = c.bytes && c.path.find('*') != std::string::npos ? tmp.path(c.file) : path;
      std::string msg;
      try {
        // Shards are mapped, and a token is checked when a batch reads it: read every token.
        auto src = make_data_source(data_cfg(c.source, path, c.seq_len, 2), c.vocab, 0);
        for (int64_t k = 0; k <= src->num_tokens(); ++k) src->get(k, 0, 1);
        FAIL("no error for " << c.name);
      } catch (const UsageError& e) {
        msg = e.what();
      }
      INFO(c.name << ": " << msg);
      CHECK(msg.find(c.expect) != std::string::npos);
      if (c.prefix_is_path) CHECK(msg.rfind(named, 0) == 0);
      CHECK(msg.find('\n') == std::string::npos);
    }
  }
}

namespace {

// Parse one synthetic sequence (input + labels, as a training step sees it) without the
// generator's layout code: BOS, pair tokens up to the first PAD/SEP, SEP, then queries "key value".
// With m keys (the largest m with 3 + 2m + m² ≤ vocab): keys 3.., values 3 + m.., pair (i, j) is
// 3 + 2m + i·m + j.
struct Parsed {
  std::map<int64_t, int64_t> pairs;  // key token → value token
  std::vector<int64_t> pair_order, query_order;
  int64_t sep = -1;
};

int64_t num_keys(int64_t vocab) {
  int64_t m = 0;
  while (3 + 2 * (m + 1) + (m + 1) * (m + 1) <= vocab) ++m;
  return m;
}

Parsed parse_synthetic(const std::vector<int64_t>& in, const std::vector<int64_t>& lab, int64_t vocab) {
  const int64_t S = static_cast<int64_t>(in.size());
  const int64_t m = num_keys(vocab), first_pair = 3 + 2 * m;
  auto is_pair = [&](int64_t t) { return t >= first_pair && t < first_pair + m * m; };
  Parsed p;
  REQUIRE(in[0] == 1);  // BOS
  int64_t i = 1;
  for (; i < S && is_pair(in[static_cast<size_t>(i)]); ++i) {
    const int64_t k = 3 + (in[static_cast<size_t>(i)] - first_pair) / m, v = 3 + m + (in[static_cast<size_t>(i)] - first_pair) % m;
    REQUIRE(p.pairs.count(k) == 0);  // keys are distinct
    p.pairs[k] = v;
    p.pair_order.push_back(k);
  }
  for (; i < S && in[static_cast<size_t>(i)] == 0; ++i) {}  // PAD
  REQUIRE(i < S);
  REQUIRE(in[static_cast<size_t>(i)] == 2);  // SEP
  p.sep = i;
  std::vector<bool> answer(static_cast<size_t>(S), false);
  for (int64_t q = i + 1; q < S; q += 2) {
    const int64_t k = in[static_cast<size_t>(q)];
    REQUIRE(p.pairs.count(k) == 1);  // a query asks for a key given earlier
    CHECK(lab[static_cast<size_t>(q)] == p.pairs[k]);  // its label is that key's value
    if (q + 1 < S) CHECK(in[static_cast<size_t>(q + 1)] == p.pairs[k]);
    answer[static_cast<size_t>(q)] = true;
    p.query_order.push_back(k);
  }
  for (int64_t t = 0; t < S; ++t)
    if (!answer[static_cast<size_t>(t)]) CHECK(lab[static_cast<size_t>(t)] == -100);
  return p;
}

}  // namespace

TEST_CASE("synthetic: associative recall, answers only at query keys", "[data]") {
  struct Dims {
    int64_t vocab, seq_len, expect_pairs;
  };
  // Pairs: min(m, seq_len / 4) with m = 2 (vocab 16), 14 (256), 8 (83), 223 (50257).
  for (Dims d : {Dims{16, 8, 1}, Dims{16, 64, 2}, Dims{256, 256, 14}, Dims{256, 33, 8}, Dims{83, 64, 8},
                 Dims{50257, 128, 31}}) {
    INFO("vocab " << d.vocab << " seq_len " << d.seq_len);
    auto src = make_data_source(data_cfg(DataSourceKind::synthetic, "", d.seq_len, 3), d.vocab, 42);
    CHECK(src->num_tokens() == 0);
    CHECK(src->describe().find("synthetic") == 0);
    int shuffled = 0;
    for (int64_t step : {0, 1, 1000}) {
      Batch b = src->get(step, 0, 1);
      CHECK(b.input_ids.shape() == Shape{3, d.seq_len});
      CHECK(b.labels.shape() == Shape{3, d.seq_len});
      for (int64_t t : values(b.input_ids)) CHECK((t >= 0 && t < d.vocab));
      for (int64_t r = 0; r < 3; ++r) {
        std::vector<int64_t> pos = row(b.position_ids, r);
        for (int64_t t = 0; t < d.seq_len; ++t) CHECK(pos[static_cast<size_t>(t)] == t);
        Parsed p = parse_synthetic(row(b.input_ids, r), row(b.labels, r), d.vocab);
        CHECK(static_cast<int64_t>(p.pairs.size()) == d.expect_pairs);
        // Every key is queried exactly once, all in the second half; the pairs are in the first.
        std::vector<int64_t> asked = p.query_order;
        std::sort(asked.begin(), asked.end());
        std::vector<int64_t> keys = p.pair_order;
        std::sort(keys.begin(), keys.end());
        CHECK(asked == keys);
        CHECK(2 * p.sep >= d.seq_len);
        CHECK(2 * (d.expect_pairs + 1) <= d.seq_len + 1);
        int64_t labelled = 0;
        for (int64_t l : row(b.labels, r)) labelled += l != -100;
        CHECK(labelled == d.expect_pairs);
        shuffled += p.query_order != p.pair_order;
      }
    }
    if (d.expect_pairs > 4) CHECK(shuffled > 0);
    if (d.vocab == 16) CHECK(num_keys(16) == 2);
  }
}

TEST_CASE("synthetic: deterministic, varies with step and seed, independent of the dp split", "[data]") {
  auto make = [](int64_t batch, uint64_t seed) { return make_data_source(data_cfg(DataSourceKind::synthetic, "", 64, batch), 256, seed); };
  auto a = make(4, 1), a2 = make(4, 1), other_seed = make(4, 2);
  auto two = make(2, 1), four = make(1, 1);
  for (int64_t step : {int64_t{0}, int64_t{5}, int64_t{99999999999}}) {
    Batch g = a->get(step, 0, 1);
    CHECK(values(g.input_ids) == values(a->get(step, 0, 1).input_ids));  // same call, same batch
    CHECK(values(g.input_ids) == values(a2->get(step, 0, 1).input_ids));  // same seed, same batch
    CHECK(values(g.labels) == values(a2->get(step, 0, 1).labels));
    CHECK(values(g.input_ids) != values(a->get(step + 1, 0, 1).input_ids));
    CHECK(values(g.input_ids) != values(other_seed->get(step, 0, 1).input_ids));
    std::set<std::vector<int64_t>> rows;
    for (int64_t b = 0; b < 4; ++b) rows.insert(row(g.input_ids, b));
    CHECK(rows.size() == 4);  // sequences within a batch differ
    // dp 2 × batch 2 and dp 4 × batch 1 see the same global batch as dp 1 × batch 4.
    for (int64_t d = 0; d < 2; ++d) {
      Batch r = two->get(step, d, 2);
      for (int64_t b = 0; b < 2; ++b) {
        CHECK(row(r.input_ids, b) == row(g.input_ids, 2 * d + b));
        CHECK(row(r.labels, b) == row(g.labels, 2 * d + b));
      }
    }
    for (int64_t d = 0; d < 4; ++d) {
      Batch r = four->get(step, d, 4);
      CHECK(row(r.input_ids, 0) == row(g.input_ids, d));
      CHECK(row(r.labels, 0) == row(g.labels, d));
    }
  }
}

TEST_CASE("count_correct: argmax against labels, skipping -100", "[data]") {
  // rows: argmax 2 (label 2, right), ignored, argmax 1 (label 0, wrong), tie 1/2 → first (label 1, right)
  const std::vector<float> lf = {0.1f, 0.2f, 0.9f,  5, 0, 0,  0, 3, -1,  0, 2, 2};
  const Tensor labels = Tensor::from_vector<int64_t>({4}, {2, -100, 0, 1});
  CHECK(count_correct(Tensor::from_vector<float>({4, 3}, lf), labels) == std::pair<int64_t, int64_t>{2, 3});
  const std::vector<double> ld(lf.begin(), lf.end());
  CHECK(count_correct(Tensor::from_vector<double>({4, 3}, ld), labels) == std::pair<int64_t, int64_t>{2, 3});
  // [B, S, V] logits with [B, S] labels (i32), all ignored → (0, 0).
  CHECK(count_correct(Tensor::from_vector<float>({2, 2, 3}, lf), Tensor::from_vector<int32_t>({2, 2}, {-100, -100, -100, -100})) ==
        std::pair<int64_t, int64_t>{0, 0});

  // The argmax itself (runtime.tiled_loss's predictions, i64 [rows]): the same rows as above.
  CHECK(count_correct(Tensor::from_vector<int64_t>({4}, {2, 0, 1, 1}), labels) == std::pair<int64_t, int64_t>{2, 3});

  // One-hot logits at the synthetic labels score every answer.
  auto src = make_data_source(data_cfg(DataSourceKind::synthetic, "", 32, 2), 64, 3);
  Batch b = src->get(0, 0, 1);
  const std::vector<int64_t> lab = values(b.labels);
  std::vector<float> logits(lab.size() * 64, 0.f);
  for (size_t i = 0; i < lab.size(); ++i)
    if (lab[i] != -100) logits[i * 64 + static_cast<size_t>(lab[i])] = 1.f;
  const auto [correct, total] = count_correct(Tensor::from_vector<float>({2, 32, 64}, logits), b.labels);
  CHECK(total == 2 * 6);  // min(6 keys at vocab 64, (33 - 2) / 4 = 7) = 6 pairs per sequence
  CHECK(correct == total);
}

namespace {

// The resident set of this process in KiB (VmRSS of /proc/self/status).
int64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

}  // namespace

TEST_CASE("tokens: a shard is mapped, not read: RSS stays flat on a 400 MB shard", "[data]") {
  // A sparse uint32 shard of 100M tokens (400 MB that take no disk: the holes read as token 0)
  // with a few real tokens written at known places. A loader that read the file into memory would
  // grow this process by ≥ 400 MB (the old one: 4 bytes per token, plus its read buffer).
  TempDir tmp;
  const std::string path = tmp.path("sparse.bin");
  const int64_t n = 100'000'000;
  {
    write_file(path, shard(20240801, 7, static_cast<uint32_t>(n), {}, 4));
    std::filesystem::resize_file(path, 1024 + n * 4);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    for (int64_t at : {int64_t{0}, n / 2, n - 1000}) {  // n - 1000: the last token a window reads
      const uint32_t tok = static_cast<uint32_t>(7 + at % 5);
      f.seekp(1024 + at * 4);
      f.write(reinterpret_cast<const char*>(&tok), 4);
    }
    REQUIRE(f.good());
  }
  const int64_t before = rss_kib();
  REQUIRE(before > 0);
  auto src = make_data_source(data_cfg(DataSourceKind::tokens, path, 1000, 4), 100, 0);
  CHECK(src->num_tokens() == n);
  // Windows at the start, the middle (step n/2 / 4000 begins at n/2) and the end: N = 99999
  // windows, so step n/4000 - 1 reads g = 99996..99999, the last three windows and then window 0.
  for (int64_t step : {int64_t{0}, n / 2 / 4000, n / 4000 - 1, int64_t{7}, int64_t{123}}) src->get(step, 0, 1);
  CHECK(values(src->get(0, 0, 1).input_ids)[0] == 7);
  CHECK(row(src->get(n / 2 / 4000, 0, 1).input_ids, 0)[0] == static_cast<int64_t>(7 + (n / 2) % 5));
  const Batch last = src->get(n / 4000 - 1, 0, 1);  // row 2 is window 99998, its last label token n - 1000
  CHECK(row(last.labels, 2)[999] == static_cast<int64_t>(7 + (n - 1000) % 5));
  CHECK(row(last.input_ids, 3)[0] == 7);
  const int64_t grew = rss_kib() - before;
  INFO("RSS grew by " << grew << " KiB");
  CHECK(grew < 32 * 1024);
}

TEST_CASE("tokens: validation data is data.val_path read like data.path; synthetic holds sequences out", "[data]") {
  TempDir tmp;
  write_file(tmp.path("train.bin"), shard16(iota_tokens(0, 40)));
  write_file(tmp.path("val.bin"), shard16(iota_tokens(100, 40)));
  DataConfig c = data_cfg(DataSourceKind::tokens, tmp.path("train.bin"), 4, 2);
  c.val_path = tmp.path("val.bin");
  auto val = make_val_source(c, 200, 0);
  check_row(val->get(1, 0, 1), 1, {112, 113, 114, 115, 116});  // batch 1, sequence 1 starts at 12
  c.val_path = tmp.path("missing.bin");
  CHECK_THROWS_AS(make_val_source(c, 200, 0), UsageError);

  // Synthetic: the same task, other sequences than training's for the same step and seed.
  const DataConfig s = data_cfg(DataSourceKind::synthetic, "", 64, 4);
  auto train = make_data_source(s, 32, 1234);
  auto held = make_val_source(s, 32, 1234);
  CHECK(held->describe() == train->describe());
  for (int64_t k = 0; k < 3; ++k) {
    const Batch a = train->get(k, 0, 1), b = held->get(k, 0, 1);
    for (int64_t r = 0; r < 4; ++r) CHECK(row(a.input_ids, r) != row(b.input_ids, r));
    CHECK(values(b.input_ids) == values(make_val_source(s, 32, 1234)->get(k, 0, 1).input_ids));  // deterministic
  }
}

TEST_CASE("data: a file that shrinks or is replaced under the run is a RuntimeFailure naming it", "[data]") {
  // A read of a mapped page past a shrunk file's end is a SIGBUS: without the check this test
  // binary dies of it at the second get() of the truncate rows. 8192 uint16 tokens: the windows of
  // step 40 (tokens 40·2·64 = 5120 on: bytes 11264.. of a shard, 5120.. of the text) lie past the
  // first page of the file, which is all that a truncated file keeps mapped.
  TempDir tmp;
  const Bytes full = shard16(iota_tokens(0, 8192));
  const std::string size = std::to_string(full.size());
  struct Row {
    const char* what;
    DataSourceKind source;
    bool val;                                        // change data.val_path instead of data.path
    std::function<void(const std::string&)> change;  // what happens to the file after the first batch
    std::string now;                                 // the message's "now …"
  };
  auto truncate_to = [](off_t n) { return [n](const std::string& p) { REQUIRE(::truncate(p.c_str(), n) == 0); }; };
  const std::vector<Row> rows = {
      {"truncate", DataSourceKind::tokens, false, truncate_to(1024 + 2), "now 1026 bytes"},
      {"truncate of the validation shard", DataSourceKind::tokens, true, truncate_to(1024), "now 1024 bytes"},
      {"cp over it (same inode, rewritten shorter)", DataSourceKind::tokens, false,
       [](const std::string& p) { write_file(p, shard16(iota_tokens(0, 100))); }, "now 1224 bytes"},
      {"a file renamed onto the path (same size)", DataSourceKind::tokens, false,
       [&](const std::string& p) {
         write_file(p + ".new", full);
         REQUIRE(std::rename((p + ".new").c_str(), p.c_str()) == 0);
       },
       "now another file of " + size + " bytes"},
      {"appended to", DataSourceKind::tokens, false,
       [](const std::string& p) { std::ofstream(p, std::ios::binary | std::ios::app) << "xx"; },
       "now " + std::to_string(full.size() + 2) + " bytes"},
      {"truncate of a text file", DataSourceKind::text, false, truncate_to(10), "now 10 bytes"},
  };
  for (const Row& r : rows) {
    INFO(r.what);
    const std::string train = tmp.path("train.bin"), val = tmp.path("val.bin");
    write_file(train, full);
    write_file(val, full);
    DataConfig c = data_cfg(r.source, train, 64, 2);
    c.val_path = val;
    auto src = r.val ? make_val_source(c, 65536, 0) : make_data_source(c, 65536, 0);
    src->get(0, 0, 1);
    const std::string path = r.val ? val : train;
    r.change(path);
    try {
      src->get(40, 0, 1);
      FAIL("the changed file was read");
    } catch (const RuntimeFailure& e) {
      CHECK_THAT(e.what(), Catch::StartsWith(path + ": the data file changed while the run read it (was " + size +
                                             " bytes, " + r.now + ")"));
    }
  }
  // A removed file is not a change: the mapping still holds it, and nothing can shrink it any more.
  const std::string kept = tmp.path("kept.bin");
  write_file(kept, full);
  auto src = make_data_source(data_cfg(DataSourceKind::tokens, kept, 64, 2), 65536, 0);
  const int fd = ::open(kept.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(fs::remove(kept));
  check_row(src->get(40, 0, 1), 1, window(iota_tokens(0, 8192), (40 * 2 + 1) * 64, 65));
  // Shrunk then by another holder, which no stat of the path can see (nor a truncate racing the
  // check): the read's SIGBUS comes back as a RuntimeFailure naming the file.
  REQUIRE(::ftruncate(fd, 1024) == 0);
  ::close(fd);
  CHECK_THROWS_MATCHES(src->get(40, 0, 1), RuntimeFailure,
                       Catch::Message(kept + ": a read of the mapped data file failed (SIGBUS: the file shrank, or an "
                                             "I/O error)"));
  // The guard is scoped to the read: a SIGBUS anywhere else still ends the process with it.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::raise(SIGBUS);
    _exit(0);  // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
#ifdef __SANITIZE_ADDRESS__
  // ASan's own SIGBUS handler reports the signal and ends the child with its error exit.
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
#else
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS));
#endif
}

TEST_CASE("format_example: context, then each answer with what the model said", "[data]") {
  const std::vector<int64_t> in = {1, 5, 20, 6, 21, 2, 6, 21, 5}, lab = {-100, -100, -100, -100, -100, -100, 21, -100, 20};
  const std::vector<int64_t> pred = {0, 0, 0, 0, 0, 0, 21, 0, 19};
  CHECK(format_example(in, lab, pred) == "context [1 5 20 6 21 2] answers [6→21 5→19 (want 20)] 1/2 right");
}
