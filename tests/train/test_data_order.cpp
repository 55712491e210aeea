// The read order (src/train/data_order.h, data.h's read/epochs/position): the shuffle is a
// bijection that differs per epoch and seed; read(first, count) is get()'s order; shuffled and mixed
// reads are pure functions of g (a fresh source reads any g as the run did); a mix's proportions
// against the weights and against Megatron's greedy rule run over the whole range; the resume rules
// against hand-computed indices. References are naive loops over the tokens: the shards hold
// token i at stream position i (plus a per-dataset offset), so a row says which window it is.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/temp_dir.h"
#include "train/data.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("order") {}
};

// An llm.c uint32 shard whose token i is first + i.
void write_iota_shard(const std::string& path, uint32_t first, int64_t n, int32_t magic = 20240801) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = 7;
  header[2] = static_cast<int32_t>(n);
  std::vector<uint32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first + static_cast<uint32_t>(i);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(n * 4));
  REQUIRE(f.good());
}

DataConfig tokens_cfg(const std::string& path, int64_t seq_len, int64_t batch, bool shuffle = false) {
  DataConfig c;
  c.source = DataSourceKind::tokens;
  c.path = path;
  c.seq_len = seq_len;
  c.batch_size = batch;
  c.shuffle = shuffle;
  return c;
}

std::vector<int64_t> row(const Tensor& t, int64_t b) {
  const int64_t S = t.dim(1);
  const int64_t* p = t.data<int64_t>() + b * S;
  return {p, p + S};
}

std::vector<int64_t> all(const Tensor& t) { return {t.data<int64_t>(), t.data<int64_t>() + t.numel()}; }

// The window a row of an iota stream (token = offset + position) reads: its first token's
// position / S, after checking that the row is a whole window (consecutive tokens, labels shifted).
int64_t window_of_row(const Batch& b, int64_t r, int64_t offset, int64_t S) {
  const std::vector<int64_t> in = row(b.input_ids, r), lab = row(b.labels, r);
  for (int64_t t = 0; t < S; ++t) {
    REQUIRE(in[static_cast<size_t>(t)] == in[0] + t);
    REQUIRE(lab[static_cast<size_t>(t)] == in[0] + t + 1);
  }
  REQUIRE((in[0] - offset) % S == 0);
  return (in[0] - offset) / S;
}

bool same(const Batch& a, const Batch& b) {
  return all(a.input_ids) == all(b.input_ids) && all(a.labels) == all(b.labels) &&
         all(a.position_ids) == all(b.position_ids) && a.doc_start.defined() == b.doc_start.defined() &&
         (!a.doc_start.defined() || all(a.doc_start) == all(b.doc_start));
}

}  // namespace

TEST_CASE("data_order: the shuffle is a bijection of [0, N), new per epoch and seed", "[data]") {
  for (int64_t n : {1, 2, 3, 5, 16, 17, 1000, 4097, 65537}) {
    INFO("n " << n);
    std::vector<std::vector<int64_t>> orders;
    for (auto [seed, epoch] : {std::pair<uint64_t, uint64_t>{1, 0}, {1, 1}, {2, 0}, {1, 1000000}}) {
      const Permutation p(n, seed, epoch);
      std::vector<int64_t> order;
      std::vector<char> seen(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = p(i);
        REQUIRE((v >= 0 && v < n));
        REQUIRE(!seen[static_cast<size_t>(v)]);  // no value twice: with n values in [0, n), a bijection
        seen[static_cast<size_t>(v)] = 1;
        order.push_back(v);
      }
      CHECK(Permutation(n, seed, epoch)(n - 1) == order.back());  // a pure function of (n, seed, epoch, i)
      orders.push_back(order);
    }
    if (n >= 16) {
      std::vector<int64_t> identity(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
      CHECK(orders[0] != identity);
      CHECK(orders[0] != orders[1]);  // another epoch
      CHECK(orders[0] != orders[2]);  // another seed
      CHECK(orders[1] != orders[3]);
    }
  }
  // Where position 0 goes over 20000 epochs of N = 10: each of the 10 places about 2000 times
  // (a binomial's sd is 42; 6 sd is 255), so the epochs' permutations are not a few repeated ones.
  std::vector<int> hits(10, 0);
  for (uint64_t e = 0; e < 20000; ++e) ++hits[static_cast<size_t>(Permutation(10, 7, e)(0))];
  for (int h : hits) CHECK(std::abs(h - 2000) < 255);
  CHECK(dataset_seed(99, 0) == 99);
  CHECK(dataset_seed(99, 1) != dataset_seed(99, 2));
}

TEST_CASE("data: read(first, count) is get()'s order, row by row", "[data]") {
  TempDir tmp;
  write_iota_shard(tmp.path("a.bin"), 0, 203);
  DataConfig docs = tokens_cfg(tmp.path("a.bin"), 6, 4, true);
  docs.document_mask = true, docs.eos_token_id = 7;  // token 7 ends a document
  DataConfig synthetic;
  synthetic.seq_len = 16, synthetic.batch_size = 4;
  const std::vector<std::pair<const char*, DataConfig>> cfgs = {
      {"tokens", tokens_cfg(tmp.path("a.bin"), 6, 4)},
      {"tokens, shuffled", tokens_cfg(tmp.path("a.bin"), 6, 4, true)},
      {"documents, shuffled", docs},
      {"synthetic", synthetic}};
  for (const auto& [name, cfg] : cfgs) {
    INFO(name);
    auto src = make_data_source(cfg, 300, 3);
    for (int64_t dp : {1, 2, 4})
      for (int64_t step : {0, 1, 9, 33})
        for (int64_t d = 0; d < dp; ++d) {
          const int64_t first = (step * dp + d) * 4;
          CHECK(same(src->get(step, d, dp), src->read(first, 4)));
        }
    // A read of many rows is the reads of one row each (micro-batches of any size read alike).
    const Batch many = src->read(31, 9);
    CHECK(many.input_ids.shape() == Shape{9, cfg.seq_len});
    for (int64_t r = 0; r < 9; ++r) {
      const Batch one = src->read(31 + r, 1);
      CHECK(row(many.input_ids, r) == all(one.input_ids));
      CHECK(row(many.labels, r) == all(one.labels));
      CHECK(row(many.position_ids, r) == all(one.position_ids));
    }
  }
}

TEST_CASE("data: shuffled epochs are permutations of the windows; any g reads as in sequence", "[data]") {
  TempDir tmp;
  const int64_t n = 503, S = 8, N = (n - 1) / S;  // 62 windows; tokens 496..502 are past the last
  write_iota_shard(tmp.path("a.bin"), 0, n);
  const std::string text(n, 'x');
  {
    std::ofstream f(tmp.path("t.txt"), std::ios::binary);
    for (int64_t i = 0; i < n; ++i) f.put(static_cast<char>(i % 256));
  }
  auto plain = make_data_source(tokens_cfg(tmp.path("a.bin"), S, 1), 1000, 5);
  auto shuffled = make_data_source(tokens_cfg(tmp.path("a.bin"), S, 1, true), 1000, 5);
  CHECK(shuffled->sequences_per_epoch() == N);
  CHECK(shuffled->describe().find("62 sequences of 8 per epoch, shuffled each epoch (seed 5)") != std::string::npos);

  // Three epochs read in sequence, as a run of batch 2 would.
  std::vector<std::vector<int64_t>> epochs(3);
  std::vector<Batch> in_sequence;
  for (int64_t step = 0; step < 3 * N / 2; ++step) {
    const Batch b = shuffled->read(2 * step, 2);
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t g = 2 * step + r;
      epochs[static_cast<size_t>(g / N)].push_back(window_of_row(b, r, 0, S));
      in_sequence.push_back(shuffled->read(g, 1));
    }
  }
  std::vector<int64_t> identity(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) identity[static_cast<size_t>(i)] = i;
  for (auto& e : epochs) {
    std::vector<int64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == identity);  // each window once per epoch
    CHECK(e != identity);
  }
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  for (int64_t g = 0; g < N; ++g) CHECK(window_of_row(plain->read(g, 1), 0, 0, S) == g);  // unshuffled: in order

  // Resume: a fresh source (another batch size, as after a resume with another dp or k) reads
  // every g exactly as the run did, in any order of reads.
  auto fresh = make_data_source(tokens_cfg(tmp.path("a.bin"), S, 3, true), 1000, 5);
  for (int64_t g : {int64_t{150}, int64_t{0}, int64_t{61}, int64_t{62}, int64_t{100}, int64_t{185}})
    CHECK(same(fresh->read(g, 1), in_sequence[static_cast<size_t>(g)]));

  // data.seed overrides train.seed; -1 takes it.
  DataConfig seeded = tokens_cfg(tmp.path("a.bin"), S, 1, true);
  seeded.seed = 5;
  CHECK(same(make_data_source(seeded, 1000, 77)->read(0, 20), shuffled->read(0, 20)));
  seeded.seed = 6;
  CHECK_FALSE(same(make_data_source(seeded, 1000, 5)->read(0, 20), shuffled->read(0, 20)));

  // Text shuffles the same windows of bytes.
  DataConfig t = tokens_cfg(tmp.path("t.txt"), S, 1, true);
  t.source = DataSourceKind::text;
  auto txt = make_data_source(t, 256, 5);
  for (int64_t g = 0; g < N; ++g) {
    const std::vector<int64_t> in = all(txt->read(g, 1).input_ids);
    CHECK(in[0] == (epochs[0][static_cast<size_t>(g)] * S) % 256);  // the same permutation as the shard's
  }

  // Packed documents: marked after the shuffle, within each row.
  DataConfig d = tokens_cfg(tmp.path("a.bin"), S, 1, true);
  d.document_mask = true, d.eos_token_id = 100;
  auto docs = make_data_source(d, 1000, 5);
  for (int64_t g = 0; g < N; ++g) {
    const Batch b = docs->read(g, 1);
    CHECK(all(b.input_ids) == all(in_sequence[static_cast<size_t>(g)].input_ids));
    const std::vector<int64_t> in = all(b.input_ids), pos = all(b.position_ids);
    int64_t start = 0;
    for (int64_t i = 0; i < S; ++i) {
      if (i > 0 && in[static_cast<size_t>(i - 1)] == 100) start = i;
      CHECK(pos[static_cast<size_t>(i)] == i - start);
    }
  }
  // Validation never shuffles: its batch k is the plain order.
  d.val_path = tmp.path("a.bin");
  auto val = make_val_source(d, 1000, 5);
  for (int64_t g = 0; g < 10; ++g) CHECK(window_of_row(val->read(g, 1), 0, 0, S) == g);
}

TEST_CASE("data: a mix reads its datasets in proportion to the weights, each in its own order", "[data]") {
  TempDir tmp;
  // Dataset k's tokens are 10000k + position: a row says its dataset and its window.
  const std::vector<int64_t> sizes = {401, 1601, 97};
  for (size_t k = 0; k < sizes.size(); ++k)
    write_iota_shard(tmp.path("d" + std::to_string(k) + ".bin"), static_cast<uint32_t>(10000 * k), sizes[k]);
  const int64_t S = 4;
  const std::vector<double> weights = {5, 3, 2};  // any scale: 50%, 30%, 20%
  DataConfig c = tokens_cfg("", S, 1);
  for (size_t k = 0; k < sizes.size(); ++k) c.mix.push_back({tmp.path("d" + std::to_string(k) + ".bin"), weights[k]});

  for (bool shuffle : {false, true}) {
    INFO("shuffle " << shuffle);
    c.shuffle = shuffle;
    auto mix = make_data_source(c, 40000, 11);
    CHECK(mix->sequences_per_epoch() == 0);
    CHECK(mix->num_tokens() == 401 + 1601 + 97);
    CHECK(mix->describe().find("mix of 3 datasets: 50% tokens") == 0);
    const int64_t G = 23456;
    const Batch b = mix->read(0, G);
    std::vector<std::vector<int64_t>> seen(3);  // each dataset's windows, in the order read
    std::vector<int64_t> count(3, 0), greedy(3, 0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k = row(b.input_ids, g)[0] / 10000;
      REQUIRE((k >= 0 && k < 3));
      seen[static_cast<size_t>(k)].push_back(window_of_row(b, g, 10000 * k, S));
      ++count[static_cast<size_t>(k)];
      // Megatron's greedy rule over the whole run, unblocked: the dataset furthest behind w·(g+1).
      size_t best = 0;
      for (size_t j = 1; j < 3; ++j)
        if (weights[j] / 10 * static_cast<double>(g + 1) - static_cast<double>(greedy[j]) >
            weights[best] / 10 * static_cast<double>(g + 1) - static_cast<double>(greedy[best]))
          best = j;
      ++greedy[best];
      // Every prefix is within 1 sequence of its share, as the greedy rule keeps it.
      if (g % 1000 == 999 || g == G - 1)
        for (size_t j = 0; j < 3; ++j) {
          CHECK(std::abs(static_cast<double>(count[j]) - weights[j] / 10 * static_cast<double>(g + 1)) <= 1.0);
          CHECK(std::abs(count[j] - greedy[j]) <= 1);
        }
    }
    // Each dataset reads its own sequence index 0, 1, 2, ... through its own epochs: every epoch a
    // permutation of its N_k windows (in order without shuffle), and epochs of one dataset differ.
    for (size_t k = 0; k < 3; ++k) {
      const int64_t Nk = (sizes[k] - 1) / S;
      const auto& w = seen[k];
      for (size_t e = 0; (e + 1) * static_cast<size_t>(Nk) <= w.size(); ++e) {
        std::vector<int64_t> epoch(w.begin() + static_cast<std::ptrdiff_t>(e * Nk),
                                   w.begin() + static_cast<std::ptrdiff_t>((e + 1) * Nk));
        std::vector<int64_t> sorted = epoch, identity(static_cast<size_t>(Nk));
        std::sort(sorted.begin(), sorted.end());
        for (int64_t i = 0; i < Nk; ++i) identity[static_cast<size_t>(i)] = i;
        CHECK(sorted == identity);
        CHECK((epoch == identity) == !shuffle);
      }
      // The epochs the log reports: dataset k has read count[k] sequences at G.
      const EpochProgress p = mix->epochs(G)[k];
      CHECK(p.name == c.mix[k].path);
      CHECK(p.epoch == count[k] / Nk);
      CHECK(p.fraction == Approx(static_cast<double>(count[k] % Nk) / static_cast<double>(Nk)));
    }
    // A fresh mix (another batch) reads any g as the run did.
    DataConfig c4 = c;
    c4.batch_size = 4;
    auto fresh = make_data_source(c4, 40000, 11);
    for (int64_t g : {int64_t{0}, int64_t{9999}, int64_t{10000}, int64_t{23455}, int64_t{777}}) {
      const Batch one = fresh->read(g, 1);
      CHECK(all(one.input_ids) == row(b.input_ids, g));
      CHECK(all(one.labels) == row(b.labels, g));
    }
  }
  // A block of 10000 holds exactly round(w·M) slots of each; the count before g is what at() gave.
  const MixSchedule third({1, 1, 1});
  CHECK((third.slots(0) == 3334 && third.slots(1) == 3333 && third.slots(2) == 3333));
  int64_t before1 = 0;
  for (int64_t g = 0; g < 20017; ++g) {
    const MixSchedule::Slot s = third.at(g);
    if (s.dataset == 1) CHECK(s.index == before1++);
    CHECK(third.count_before(1, g + 1) == before1);
  }
  CHECK_THROWS_WITH(MixSchedule({1, 1e-6}), Catch::Contains("less than one sequence in 10000"));
  CHECK_THROWS_AS(MixSchedule({1, 0}), UsageError);
  CHECK_THROWS_AS(MixSchedule({}), UsageError);
}

TEST_CASE("data: every path of a mix is validated like data.path", "[data]") {
  TempDir tmp;
  write_iota_shard(tmp.path("good.bin"), 0, 100);
  write_iota_shard(tmp.path("magic.bin"), 0, 100, 12345);
  write_iota_shard(tmp.path("big.bin"), 250, 100);  // tokens 250..349: ≥ vocab 300 from index 50
  write_iota_shard(tmp.path("short.bin"), 0, 4);
  auto open = [&](const std::string& second, int64_t vocab = 300) {
    DataConfig c = tokens_cfg("", 4, 2);
    c.mix = {{tmp.path("good.bin"), 1}, {second, 1}};
    auto src = make_data_source(c, vocab, 0);
    for (int64_t g = 0; g < 200; ++g) src->read(g, 1);
  };
  CHECK_THROWS_WITH(open(tmp.path("magic.bin")), Catch::StartsWith(tmp.path("magic.bin") + ": bad magic 12345"));
  CHECK_THROWS_WITH(open(tmp.path("big.bin")), Catch::StartsWith(tmp.path("big.bin") + ": token 300 at index 50"));
  CHECK_THROWS_WITH(open(tmp.path("short.bin")), Catch::Contains("fewer than seq_len + 1 = 5"));
  CHECK_THROWS_WITH(open(tmp.path("none_*.bin")), Catch::Contains("no file matches"));
  CHECK_NOTHROW(open(tmp.path("good.bin")));
  DataConfig c = tokens_cfg("", 4, 2);
  c.val_path = tmp.path("v.bin");
  c.mix = {{tmp.path("good.bin"), 2}, {tmp.path("g*.bin"), 1}};
  CHECK(data_input_paths(c) == std::vector<std::string>{tmp.path("good.bin"), tmp.path("g*.bin"), tmp.path("v.bin")});
}

namespace {

DataPosition stream_position(int64_t g, int64_t seq_len, int64_t tokens, bool shuffle = false, int64_t seed = 0) {
  DataPosition p;
  p.next_sequence = g;
  p.global_batch = 8;
  p.source = "tokens";
  p.seq_len = seq_len;
  p.shuffle = shuffle;
  p.seed = seed;
  p.datasets = {{"data/train_*.bin", 1, tokens}};
  return p;
}

}  // namespace

TEST_CASE("data position: JSON round trip, and where a resumed run continues", "[data]") {
  // 101 tokens: N = 25 windows of 4, 12 of 8.
  DataPosition saved = stream_position(30, 4, 101);
  const DataPosition back = parse_data_position(nlohmann::json::parse(data_position_json(saved).dump()), "meta.json");
  CHECK(data_position_json(back) == data_position_json(saved));
  CHECK(back.datasets.size() == 1);

  auto next = [](const DataPosition& a, const DataPosition& b) { return resume_data(a, b).next_sequence; };
  // Only the global batch changed (dp, batch, accumulation): the same sequence.
  DataPosition now = stream_position(0, 4, 101);
  now.global_batch = 16;
  const DataResume same = resume_data(saved, now);
  CHECK(same.next_sequence == 30);
  CHECK(same.log == "data: resuming at sequence 30 (epoch 1 (20%)); global batch 8 → 16 sequences");
  // seq_len 4 → 8 unshuffled: g 30 is epoch 1, window 5, token 20 → new window ⌈20 / 8⌉ = 3 → 12 + 3.
  CHECK(next(saved, stream_position(0, 8, 101)) == 15);
  CHECK(resume_data(saved, stream_position(0, 8, 101)).log.find("token 20 of epoch 1 was reached; 4 tokens skipped") !=
        std::string::npos);
  // g 49: epoch 1, window 24, token 96 → window 12 is past the 12 of 8 → epoch 2 starts at 24.
  CHECK(next(stream_position(49, 4, 101), stream_position(0, 8, 101)) == 24);
  // seq_len 8 → 4: g 13 is epoch 1, window 1, token 8 → window 2 → 25 + 2.
  CHECK(next(stream_position(13, 8, 101), stream_position(0, 4, 101)) == 27);
  // seq_len 4 → 3 (N = 33): g 7, token 28 → window ⌈28 / 3⌉ = 10.
  CHECK(next(stream_position(7, 4, 101), stream_position(0, 3, 101)) == 10);
  // At an epoch boundary anything may change: g 50 is the start of epoch 2 → 2 · 12.
  CHECK(next(stream_position(50, 4, 101, true, 1), stream_position(0, 8, 101, false, 9)) == 24);
  CHECK(next(stream_position(50, 4, 101, false), stream_position(0, 4, 101, true, 3)) == 50);
  // Shuffled with the same seq_len and seed: the same g.
  CHECK(next(stream_position(33, 4, 101, true, 7), stream_position(0, 4, 101, true, 7)) == 33);
  // Within a shuffled epoch: no seq_len, shuffle or seed change.
  CHECK_THROWS_WITH(resume_data(stream_position(33, 4, 101, true, 7), stream_position(0, 8, 101, true, 7)),
                    Catch::Contains("data.seq_len changed (4 → 8) within shuffled epoch 1") &&
                        Catch::Contains("until the epoch ends (sequence 50)"));
  CHECK_THROWS_WITH(resume_data(stream_position(33, 4, 101, false), stream_position(0, 4, 101, true, 7)),
                    Catch::Contains("data.shuffle changed (false → true) within epoch 1"));
  CHECK_THROWS_WITH(resume_data(stream_position(33, 4, 101, true, 7), stream_position(0, 4, 101, true, 8)),
                    Catch::Contains("data.seed changed (7 → 8) within shuffled epoch 1"));
  // The seed does not matter unshuffled.
  CHECK(next(stream_position(33, 4, 101, false, 7), stream_position(0, 4, 101, false, 8)) == 33);
  // The data changed.
  CHECK_THROWS_WITH(resume_data(saved, stream_position(0, 4, 102)), Catch::Contains("the data changed") &&
                                                                         Catch::Contains("read 101 tokens"));
  DataPosition text = stream_position(0, 4, 101);
  text.source = "text";
  CHECK_THROWS_WITH(resume_data(saved, text), Catch::Contains("data.source was \"tokens\", now \"text\""));
  DataPosition moved = stream_position(0, 4, 101);
  moved.datasets[0].path = "/new/disk/train_*.bin";
  CHECK_THAT(resume_data(saved, moved).log, Catch::Contains("data/train_*.bin is now /new/disk/train_*.bin (same size)"));
  CHECK(next(saved, moved) == 30);

  // A mix continues only as it was.
  DataPosition mix = stream_position(1234, 4, 101);
  mix.datasets = {{"a.bin", 0.7, 101}, {"b.bin", 0.3, 5000}};
  DataPosition mix_now = mix;
  mix_now.next_sequence = 0;
  CHECK(next(mix, mix_now) == 1234);
  mix_now.datasets[1].weight = 0.4;
  CHECK_THROWS_WITH(resume_data(mix, mix_now), Catch::Contains("data.mix[1].weight was 0.3, now 0.4"));
  mix_now.datasets[1].weight = 0.3;
  mix_now.seq_len = 8;
  CHECK_THROWS_WITH(resume_data(mix, mix_now), Catch::Contains("a mix continues only with the same data.seq_len"));
  mix_now.datasets.pop_back();
  CHECK_THROWS_WITH(resume_data(mix, mix_now), Catch::Contains("read 2 dataset(s), now 1"));

  // Synthetic data is generated from g: the same g under any seq_len.
  DataPosition syn = stream_position(77, 16, 0);
  syn.source = "synthetic";
  syn.datasets = {{"", 1, 0}};
  DataPosition syn_now = syn;
  syn_now.seq_len = 32;
  CHECK(next(syn, syn_now) == 77);

  // Malformed positions are usage errors naming the file.
  for (const char* bad : {R"([])", R"({})", R"({"next_sequence": -1, "global_batch": 0, "source": "tokens", "seq_len": 4,
                           "shuffle": false, "seed": 0, "datasets": [{"path": "a", "weight": 1, "tokens": 5}]})",
                          R"({"next_sequence": 1, "global_batch": 0, "source": "tokens", "seq_len": 4,
                           "shuffle": "yes", "seed": 0, "datasets": [{"path": "a", "weight": 1, "tokens": 5}]})",
                          R"({"next_sequence": 1, "global_batch": 0, "source": "tokens", "seq_len": 4,
                           "shuffle": false, "seed": 0, "datasets": []})",
                          R"({"next_sequence": 1, "global_batch": 0, "source": "tokens", "seq_len": 4,
                           "shuffle": false, "seed": 0, "datasets": [{"path": "a", "weight": -1, "tokens": 5}]})"})
    CHECK_THROWS_WITH(parse_data_position(nlohmann::json::parse(bad), "ck/meta.json"),
                      Catch::StartsWith("ck/meta.json: data position: "));
}

TEST_CASE("data position: a real source's position, resumed with another seq_len, continues at the token reached",
          "[data]") {
  TempDir tmp;
  write_iota_shard(tmp.path("a.bin"), 0, 1001);
  auto before = make_data_source(tokens_cfg(tmp.path("a.bin"), 6, 2), 2000, 0);
  auto after = make_data_source(tokens_cfg(tmp.path("a.bin"), 10, 2), 2000, 0);
  const int64_t N = 1000 / 6;  // 166 windows of 6
  for (int64_t g : {int64_t{1}, int64_t{57}, N - 1, N + 40, 5 * N + 3}) {
    INFO("g " << g);
    DataPosition saved = before->position(g);
    CHECK(saved.datasets.at(0).tokens == 1001);
    // The last token the first run's sequence g - 1 read as input, in its epoch.
    const int64_t reached = all(before->read(g - 1, 1).input_ids).back() + 1;
    const DataResume r = resume_data(parse_data_position(data_position_json(saved), "meta.json"), after->position(0));
    const int64_t first = all(after->read(r.next_sequence, 1).input_ids)[0];
    const int64_t epoch = (g - 1) / N, new_epoch = r.next_sequence / (1000 / 10);
    if (new_epoch == epoch) {  // the same epoch: the first window at or after the token reached
      CHECK(first >= reached);
      CHECK(first < reached + 10);
    } else {  // the epoch's rest held no window of 10: the next epoch's first
      CHECK(new_epoch == epoch + 1);
      CHECK(first == 0);
      CHECK(reached + 10 > 1000);
    }
  }
}
