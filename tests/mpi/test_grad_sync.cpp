// GradSync (train/grad_sync.h) on however many ranks mpirun started: buckets reduced while the
// "backward" is still handing in gradients equal the closed-form sums, with overlap on and off, for
// several steps in a row; and the trainer gives the same losses and weights with the all-reduce
// overlapped as with it blocking after the backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "config/config.h"
#include "mpi/mpi_test.h"
#include "train/grad_sync.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

using nlohmann::json;

// Rank r's value of element i of slot k in step s: exact in f32, so the sum has a closed form.
double value(int64_t r, size_t k, int64_t i, int step) { return static_cast<double>((r + 1) * (static_cast<int64_t>(k) + 1 + i % 7 + step)); }

TEST_CASE("grad sync: overlapped buckets equal the closed-form sums, step after step", "[mpi][grad_sync]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  // Mixed shapes and dtypes: a dtype change starts a new bucket, and 256 bytes holds a few slots.
  const std::vector<GradSync::Slot> slots = {{{3, 5}, DType::f32}, {{17}, DType::f32},     {{40}, DType::f32},
                                             {{2, 2, 2}, DType::f64}, {{100}, DType::f32}, {{1}, DType::f32}};
  for (bool overlap : {true, false}) {
    GradSync sync(w, slots, overlap, 256);
    CHECK(sync.num_buckets() >= 4);
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < slots.size(); ++k) {
        Tensor g = Tensor::empty(slots[k].shape, slots[k].dtype);
        for (int64_t i = 0; i < g.numel(); ++i) {
          if (g.dtype() == DType::f32) g.data<float>()[i] = static_cast<float>(value(r, k, i, step));
          else g.data<double>()[i] = value(r, k, i, step);
        }
        sync.ready(k, g);
        sync.poll();
      }
      const std::vector<Tensor> out = sync.finish();
      REQUIRE(out.size() == slots.size());
      int64_t wrong = 0;
      for (size_t k = 0; k < slots.size(); ++k) {
        CHECK(out[k].shape() == slots[k].shape);
        const std::vector<double> got = out[k].to_doubles();
        for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i)
          if (got[i] != value(0, k, i, step) * static_cast<double>(P * (P + 1) / 2)) ++wrong;
      }
      INFO("overlap " << overlap << ", step " << step);
      CHECK(wrong == 0);
    }
    CHECK(sync.stats().calls == 3 * sync.num_buckets());
    CHECK(sync.stats().bytes == 3 * (15 + 17 + 40 + 100 + 1) * 4 + 3 * 8 * 8);
  }
}

TEST_CASE("grad sync: the trainer's losses and weights are the same with the all-reduce overlapped", "[mpi][grad_sync]") {
  Communicator& w = test_world();
  // Pure data parallelism (sp 1): every rank has different data, so the all-reduce matters.
  auto cfg = [&](bool overlap) {
    return parse_config({{"model", {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                    {"num_attention_heads", 4}, {"max_position_embeddings", 64}}},
                         {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}}},
                         {"train", {{"lr", 1e-2}, {"warmup_steps", 1}}},
                         {"runtime", {{"threads", 1}, {"overlap_grad_sync", overlap}, {"grad_bucket_mb", 0.01}}},
                         {"sequence_parallel", {{"autosp_size", 1}}}});
  };
  TrainArgs args;
  args.quiet = true;
  const TrainResult a = train(with_steps(cfg(true), 5), args, w), b = train(with_steps(cfg(false), 5), args, w);
  REQUIRE(a.steps.size() == 5);
  REQUIRE(b.steps.size() == 5);
  double worst = 0;
  for (size_t k = 0; k < a.steps.size(); ++k)
    worst = std::max(worst, std::abs(a.steps[k].loss - b.steps[k].loss) / std::abs(b.steps[k].loss));
  // A sum of P values in another order differs in the last bit at most; 5 AdamW steps keep it tiny.
  CHECK(worst < 1e-6);
  double wdiff = 0;
  for (const auto& [name, p] : a.params) {
    const auto x = p.to_doubles(), y = b.params.at(name).to_doubles();
    for (size_t i = 0; i < x.size(); ++i) wdiff = std::max(wdiff, std::abs(x[i] - y[i]));
  }
  CHECK(wdiff < 1e-5);
  CHECK(a.steps.back().loss < a.steps.front().loss);
}

}  // namespace
}  // namespace autosp::test
