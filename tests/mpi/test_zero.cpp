// ZeRO stages 1, 2 and 3 (zero_optimization.stage; train/optimizer.h ZeroAdamW and Zero3State,
// train/grad_sync.h, graph/passes/shard_parameters.h) on however many ranks mpirun started (2 and
// 4 under ctest):
//   - reduce_scatter_sum, blocking and non-blocking, equals the closed-form sums of every rank's
//     chunks, and the CountingCommunicator counts what it sends;
//   - on every dp × sp mesh of the world, GPT-2 and a GQA Llama train 20 steps with the same losses
//     and final weights at stages 1, 2 and 3 as at stage 0 (the whole AdamW, the reference); bf16,
//     and stage 3 under activation checkpointing with AutoSP over the whole world, too;
//   - the per-rank optimizer state is 1/W of stage 0's (plus the padding), and stage 2 holds no
//     gradient bucket between steps; stage 3 holds 1/W of the parameters, and its program holds
//     whole parameters of at most two layers (plus those outside the layers) at once;
//   - the volumes: stages 1 and 2 move 2(W-1)/W of the gradients' bytes (what a ring all-reduce
//     moves), in a reduce-scatter and an all-gather of the same size; stage 3 the reduce-scatter
//     and two gathers of the parameters (the formula per parameter), about 1.5× stage 1;
//   - a stage-2 checkpoint (whole, consolidated) resumes on the same world at stages 0 and 2 like
//     the uninterrupted run, and on half the world at stage 1 like a stage-0 resume there; a
//     stage-3 checkpoint resumes on half the world at stage 1 like an uninterrupted run there;
//   - --dump-grads writes the whole gradients at stages 2 and 3, equal to stage 0's.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "comm/counting.h"
#include "common/env_var.h"
#include "config/config.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "mpi/mpi_test.h"
#include "tensor/safetensors.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Rank r's element i: small integers, so every sum is exact in f32 whatever the order.
double element(int64_t r, int64_t i) { return static_cast<double>((r + 1) * (i % 11 + 1)); }

TEST_CASE("zero: reduce_scatter_sum gives each rank the sum of its chunk", "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  for (DType dt : {DType::f32, DType::f64, DType::i64}) {
    for (bool async : {false, true}) {
      const int64_t chunk = 37;
      Tensor in = Tensor::zeros({P * chunk}, dt);
      for (int64_t i = 0; i < P * chunk; ++i) {
        if (dt == DType::f32) in.data<float>()[i] = static_cast<float>(element(r, i));
        else if (dt == DType::f64) in.data<double>()[i] = element(r, i);
        else in.data<int64_t>()[i] = static_cast<int64_t>(element(r, i));
      }
      Tensor out = Tensor::zeros({chunk}, dt);
      if (async) w.reduce_scatter_sum_async(in, out)->wait();
      else w.reduce_scatter_sum(in, out);
      const std::vector<double> got = out.to_doubles();
      int64_t wrong = 0;
      for (int64_t i = 0; i < chunk; ++i)  // Σ_q (q + 1) = P(P+1)/2
        if (got[static_cast<size_t>(i)] != element(0, r * chunk + i) * static_cast<double>(P * (P + 1) / 2)) ++wrong;
      INFO(dtype_name(dt) << (async ? " async" : " blocking"));
      CHECK(wrong == 0);
    }
  }
  // Counted: this rank sends P-1 of its P chunks.
  CountingCommunicator counted(w);
  const Tensor in = Tensor::zeros({P * 8}, DType::f32);
  Tensor out = Tensor::zeros({8}, DType::f32);
  counted.reduce_scatter_sum(in, out);
  CHECK(counted.stats().reduce_scatter.calls == 1);
  CHECK(counted.stats().reduce_scatter.bytes == (P - 1) * 8 * 4);
}

// Rank r's shard (c elements) of the n-element gradient whose element i on rank q is element(q, i),
// summed over W ranks: 0 past n (the padding).
void check_grad_shard(const std::vector<double>& got, int64_t W, int64_t r, int64_t n, int64_t c) {
  REQUIRE(got.size() == static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) {
    const int64_t at = r * c + i;
    double want = 0;
    for (int64_t q = 0; q < W && at < n; ++q) want += element(q, at);
    CHECK(got[static_cast<size_t>(i)] == want);
  }
}

// ZeRO-3's graph collectives where the shards do not tile the tensor (15 elements over W ranks:
// padding whenever W does not divide 15), through the executor, whose all_gather runs in the
// background; against the closed-form sums.
TEST_CASE("zero: the all_gather and reduce_scatter ops with padded shards", "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t W = w.size(), r = w.rank(), n = 15, c = (n + W - 1) / W;
  Graph g;
  Builder b(g);
  Node* shard = b.input("shard", DType::f32, {c}, Role::none);
  Node* grad = b.input("grad", DType::f32, {5, 3}, Role::none);
  g.add_output(b.all_gather(shard, "world", W, {5, 3}, "whole"));
  g.add_output(b.reduce_scatter(grad, "world", W, "grad_shard"));
  std::vector<float> mine(static_cast<size_t>(c)), full(static_cast<size_t>(n));
  for (int64_t i = 0; i < c; ++i) mine[static_cast<size_t>(i)] = static_cast<float>(element(r, i));
  for (int64_t i = 0; i < n; ++i) full[static_cast<size_t>(i)] = static_cast<float>(element(r, i));
  const Executor ex(g);
  const RunResult out = ex.run({{"shard", Tensor::from_vector<float>({c}, mine)},
                                {"grad", Tensor::from_vector<float>({5, 3}, full)}},
                               {{"world", &w}});
  const std::vector<double> whole = out.outputs.at("whole").to_doubles();
  REQUIRE(whole.size() == static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) CHECK(whole[static_cast<size_t>(i)] == element(i / c, i % c));
  const std::vector<double> got = out.outputs.at("grad_shard").to_doubles();
  check_grad_shard(got, W, r, n, c);
}

// A bf16 gradient summed in f32 (sum_dtype, ZeRO-3 under bf16) in pieces of 2 shard elements: 15
// elements are no multiple of W = 2 or 4 (padding), and 2 does not divide the shard at W = 2
// (c = 8: 4 pieces) or is half of it at W = 4 (c = 4: 2 pieces); at W = 3, c = 5: 2, 2, 1.
TEST_CASE("zero: a bf16 gradient reduce-scattered in f32, in pieces, with padded shards", "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t W = w.size(), r = w.rank(), n = 15, c = (n + W - 1) / W;
  // Every rank sets the same piece size: the pieces are collectives.
  const testing::EnvVar pieces("AUTOSP_RS_PIECE_BYTES", std::to_string(W * 4 * 2).c_str());
  for (bool background : {true, false}) {
    INFO((background ? "in the background" : "blocking"));
    Graph g;
    Builder b(g);
    Node* grad = b.input("grad", DType::bf16, {5, 3}, Role::none);
    Node* rs = b.reduce_scatter(grad, "world", W, "grad_shard");
    rs->attrs().set("sum_dtype", std::string("f32"));
    rs->set_type(infer_type(*rs, g.assumptions()));
    g.add_output(rs);
    std::vector<float> full(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) full[static_cast<size_t>(i)] = static_cast<float>(element(r, i));
    ExecOptions options;
    options.background_collectives = background;
    const Executor ex(g, options);
    const RunResult out = ex.run({{"grad", Tensor::from_vector<float>({5, 3}, full).to(DType::bf16)}}, {{"world", &w}});
    const Tensor& shard = out.outputs.at("grad_shard");
    CHECK(shard.dtype() == DType::f32);
    const std::vector<double> got = shard.to_doubles();
    check_grad_shard(got, W, r, n, c);
  }
}

const json kGpt2 = {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 4}, {"max_position_embeddings", 64}};
const json kLlamaGqa = {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}};

// Small buckets (10 kB: several per model, shard boundaries inside parameters) and clipping that
// fires (grad_clip 0.5), so the sharded norm matters.
Config make_config(const json& model, int64_t sp, int64_t stage, bool overlap = true, double bucket_mb = 0.01) {
  return parse_config({{"model", model},
                       {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}}},
                       {"train", {{"lr", 1e-2}, {"warmup_steps", 2}, {"grad_clip", 0.5}, {"log_every", 1000}}},
                       {"runtime", {{"threads", 1}, {"overlap_grad_sync", overlap}, {"grad_bucket_mb", bucket_mb}}},
                       {"sequence_parallel", {{"autosp_size", sp}}},
                       {"zero_optimization", {{"stage", stage}}}});
}

TrainArgs quiet_args() {
  TrainArgs a;
  a.quiet = true;
  a.accuracy = false;
  return a;
}

// The largest relative difference of the step losses and the largest absolute difference of the
// final weights between two runs.
struct Diff {
  double loss = 0, weight = 0;
};
Diff compare(const TrainResult& a, const TrainResult& b) {
  Diff d;
  REQUIRE(a.steps.size() == b.steps.size());
  for (size_t k = 0; k < a.steps.size(); ++k)
    d.loss = std::max(d.loss, std::abs(a.steps[k].loss - b.steps[k].loss) / std::abs(b.steps[k].loss));
  REQUIRE(a.params.size() == b.params.size());
  for (const auto& [name, t] : b.params) {
    const std::vector<double> x = a.params.at(name).to_doubles(), y = t.to_doubles();
    for (size_t i = 0; i < x.size(); ++i) d.weight = std::max(d.weight, std::abs(x[i] - y[i]));
  }
  return d;
}

TEST_CASE("zero: stages 1, 2 and 3 train like stage 0 on every mesh, GPT-2 and GQA Llama", "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  for (int64_t sp = 1; sp <= W; sp *= 2) {  // meshes W x 1, ..., 1 x W
    for (const json* model : {&kGpt2, &kLlamaGqa}) {
      const TrainResult ref = train(with_steps(make_config(*model, sp, 0), 20), quiet_args(), w);
      REQUIRE(ref.steps.size() == 20);
      for (int64_t stage : {1, 2, 3}) {
        const TrainResult z = train(with_steps(make_config(*model, sp, stage), 20), quiet_args(), w);
        const Diff d = compare(z, ref);
        INFO(model->at("arch") << " dp " << W / sp << " x sp " << sp << ", stage " << stage << ": loss "
                                << d.loss << ", weights " << d.weight);
        CHECK(d.loss < 1e-6);
        CHECK(d.weight < 1e-6);
        // The losses moved: the comparison is not between two runs that did nothing.
        CHECK(std::abs(ref.steps.back().loss - ref.steps.front().loss) > 1e-3);
      }
    }
  }
  // The blocking reduce-scatter (overlap off) at stage 2 too.
  const TrainResult ref = train(with_steps(make_config(kGpt2, 1, 0), 5), quiet_args(), w);
  const Diff d = compare(train(with_steps(make_config(kGpt2, 1, 2, /*overlap=*/false), 5), quiet_args(), w), ref);
  CHECK(d.loss < 1e-6);
  CHECK(d.weight < 1e-6);
  // bf16 mixed precision: f32 gradients and master weights, so the same sums; a last-bit change
  // of a master weight may round its bf16 copy the other way, hence the looser bound.
  Config bf16_0 = make_config(kLlamaGqa, 1, 0);
  bf16_0.runtime.dtype = DType::bf16;
  const TrainResult b0 = train(with_steps(bf16_0, 5), quiet_args(), w);
  for (int64_t stage : {2, 3}) {
    Config bf16 = make_config(kLlamaGqa, 1, stage);
    bf16.runtime.dtype = DType::bf16;
    const Diff b = compare(train(with_steps(bf16, 5), quiet_args(), w), b0);
    INFO("bf16, stage " << stage << ": loss " << b.loss << ", weights " << b.weight);
    CHECK(b.loss < 1e-3);
    CHECK(b.weight < 1e-3);
  }
  {  // stage 3's bf16 gradients summed in f32 in pieces of 40 bytes of staging: several per gradient
    const testing::EnvVar pieces("AUTOSP_RS_PIECE_BYTES", "40");
    Config bf16 = make_config(kLlamaGqa, 1, 3);
    bf16.runtime.dtype = DType::bf16;
    CountingCommunicator counted(w);
    const TrainResult z = train(with_steps(bf16, 5), quiet_args(), counted);
    const Diff b = compare(z, b0);
    INFO("bf16, stage 3 in pieces: loss " << b.loss << ", weights " << b.weight << ", "
                                          << counted.stats().reduce_scatter.calls << " reduce-scatters");
    CHECK(b.loss < 1e-3);
    CHECK(b.weight < 1e-3);
    CHECK(counted.stats().reduce_scatter.calls > 5 * 2 * static_cast<int64_t>(z.params.size()));
  }
  // Stage 3 under activation checkpointing (recomputed layers read their own gathers) and bf16,
  // with AutoSP on the whole world.
  Config ck0 = make_config(kLlamaGqa, W, 0), ck3 = make_config(kLlamaGqa, W, 3);
  for (Config* c : {&ck0, &ck3}) c->runtime.activation_checkpointing = true;
  const Diff ck = compare(train(with_steps(ck3, 5), quiet_args(), w), train(with_steps(ck0, 5), quiet_args(), w));
  INFO("checkpointing, sp " << W << ", stage 3: loss " << ck.loss << ", weights " << ck.weight);
  CHECK(ck.loss < 1e-6);
  CHECK(ck.weight < 1e-6);
  ck0.runtime.dtype = ck3.runtime.dtype = DType::bf16;
  const Diff ckb = compare(train(with_steps(ck3, 5), quiet_args(), w), train(with_steps(ck0, 5), quiet_args(), w));
  INFO("checkpointing + bf16, sp " << W << ", stage 3: loss " << ckb.loss << ", weights " << ckb.weight);
  CHECK(ckb.loss < 1e-3);
  CHECK(ckb.weight < 1e-3);
}

TEST_CASE("zero: per-rank optimizer state is 1/W of stage 0's; stage 2 frees its gradient buckets", "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  const double bucket_mb = 0.01;
  const TrainResult s0 = train(with_steps(make_config(kLlamaGqa, 1, 0, true, bucket_mb), 2), quiet_args(), w);
  const TrainResult s1 = train(with_steps(make_config(kLlamaGqa, 1, 1, true, bucket_mb), 2), quiet_args(), w);
  const TrainResult s2 = train(with_steps(make_config(kLlamaGqa, 1, 2, true, bucket_mb), 2), quiet_args(), w);
  size_t param_bytes = 0;
  for (const auto& [name, t] : s0.params) param_bytes += t.nbytes();
  // Stage 0: both moments of every parameter; the gradient buckets hold every gradient.
  CHECK(s0.optimizer_state_bytes == 2 * param_bytes);
  CHECK(s0.grad_bucket_bytes == param_bytes);
  // Stage 1: at most 1/W of it plus one bucket's moments (the bound) ...
  const auto bucket_bytes = static_cast<size_t>(bucket_mb * 1024 * 1024);
  INFO("stage 0 " << s0.optimizer_state_bytes << " bytes, stage 1 " << s1.optimizer_state_bytes << " on this rank");
  CHECK(s1.optimizer_state_bytes <= s0.optimizer_state_bytes / static_cast<size_t>(W) + 2 * bucket_bytes);
  CHECK(s2.optimizer_state_bytes == s1.optimizer_state_bytes);
  // ... and the ranks together hold all of it: every element once, plus each bucket's padding.
  Tensor total = Tensor::from_vector<int64_t>({1}, {static_cast<int64_t>(s1.optimizer_state_bytes)});
  w.all_reduce_sum(total);
  const int64_t all = total.data<int64_t>()[0];
  CHECK(all >= static_cast<int64_t>(s0.optimizer_state_bytes));
  CHECK(all <= static_cast<int64_t>(s0.optimizer_state_bytes + 2 * 4 * W * (param_bytes / bucket_bytes + 8)));
  // Stage 1 keeps the whole buckets between steps (padded), stage 2 none.
  CHECK(s1.grad_bucket_bytes >= param_bytes);
  CHECK(s2.grad_bucket_bytes == 0);
}

// One bucket (1 GiB cap), so the padding is known: the flat gradient of N elements padded to a
// multiple of W.
TEST_CASE("zero: stages 1 and 2 move what a ring all-reduce of the gradients moves", "[mpi][zero][scaling]") {
  Communicator& w = test_world();
  const int64_t W = w.size(), steps = 2;
  CollectiveStats stage0_all_reduce;
  for (int64_t stage : {0, 1, 2}) {
    const Config cfg = make_config(kGpt2, 1, stage, true, 1024);
    CountingCommunicator counted(w);
    const TrainResult r = train(with_steps(cfg, steps), quiet_args(), counted);
    const CommStats& s = counted.stats();
    int64_t n = 0;
    for (const auto& [name, t] : r.params) n += t.numel();
    const int64_t grad_bytes = n * 4, padded_bytes = (n + W - 1) / W * W * 4;
    INFO("stage " << stage << ": all-reduce " << s.all_reduce.bytes << " in " << s.all_reduce.calls
                  << " calls, reduce-scatter " << s.reduce_scatter.bytes << ", all-gather " << s.all_gather.bytes);
    if (stage == 0) {
      // The gradients (one bucket) plus a few scalars each step: the graph's loss and token
      // count, the preemption flag (train/preempt.h).
      stage0_all_reduce = s.all_reduce;
      CHECK(s.all_reduce.bytes > steps * grad_bytes);
      CHECK(s.all_reduce.bytes <= steps * (grad_bytes + 64));
      CHECK(s.reduce_scatter.calls == 0);
      CHECK(s.all_gather.calls == 0);
    } else {
      // The gradients' all-reduce becomes the gradient norm's (one f64); the scalars stay.
      CHECK(s.all_reduce.calls == stage0_all_reduce.calls);
      CHECK(s.all_reduce.bytes == stage0_all_reduce.bytes - steps * (grad_bytes - 8));
      CHECK(s.reduce_scatter.calls == steps);
      CHECK(s.reduce_scatter.bytes == steps * padded_bytes / W * (W - 1));
      CHECK(s.all_gather.calls == steps);
      CHECK(s.all_gather.bytes == steps * padded_bytes / W * (W - 1));
      // Together 2(W-1)/W of the padded gradient: a ring all-reduce's bytes per rank.
      CHECK(s.reduce_scatter.bytes + s.all_gather.bytes == steps * 2 * (W - 1) * padded_bytes / W);
    }
  }
}

TEST_CASE("zero: a stage-2 checkpoint resumes on the same world at stages 0 and 2, and on half of it at stage 1",
          "[mpi][zero][checkpoint]") {
  Communicator& w = test_world();
  const TempDir tmp = shared_temp_dir(w, "zero-resume");
  const fs::path& dir = tmp.dir;
  w.barrier();
  Config writer = make_config(kLlamaGqa, 1, 2);
  writer.train.checkpoint_dir = dir.string();
  writer.train.checkpoint_every = 4;
  const TrainResult whole = train(with_steps(writer, 8), quiet_args(), w);  // the uninterrupted run, saving at 4 and 8
  REQUIRE(whole.steps.size() == 8);
  const std::string step4 = (dir / "step_00000004").string();

  // Same world, stage 0: steps 5..8 as the uninterrupted stage-2 run.
  TrainArgs resume = quiet_args();
  resume.resume = step4;
  const TrainResult same = train(with_steps(make_config(kLlamaGqa, 1, 0), 8), resume, w);
  REQUIRE(same.steps.size() == 4);
  double worst = 0;
  for (size_t k = 0; k < 4; ++k)
    worst = std::max(worst, std::abs(same.steps[k].loss - whole.steps[k + 4].loss) / std::abs(whole.steps[k + 4].loss));
  CHECK(worst < 1e-6);
  // Same world, same stage: the resumed run ends on the uninterrupted run's weights.
  const TrainResult again = train(with_steps(make_config(kLlamaGqa, 1, 2), 8), resume, w);
  double worst_again = 0;
  for (size_t k = 0; k < 4; ++k)
    worst_again = std::max(worst_again, std::abs(again.steps[k].loss - whole.steps[k + 4].loss) /
                                            std::abs(whole.steps[k + 4].loss));
  CHECK(worst_again < 1e-6);
  double weight_gap = 0;
  for (const auto& [name, t] : whole.params) {
    const std::vector<double> x = again.params.at(name).to_doubles(), y = t.to_doubles();
    for (size_t i = 0; i < x.size(); ++i) weight_gap = std::max(weight_gap, std::abs(x[i] - y[i]));
  }
  CHECK(weight_gap < 1e-6);

  // Half the world (two groups of W/2 running the same thing), stage 1 against stage 0 there.
  auto half = w.split(w.rank() < w.size() / 2 ? 0 : 1, w.rank());
  const TrainResult h1 = train(with_steps(make_config(kLlamaGqa, 1, 1), 8), resume, *half);
  const TrainResult h0 = train(with_steps(make_config(kLlamaGqa, 1, 0), 8), resume, *half);
  const Diff d = compare(h1, h0);
  INFO("world " << half->size() << ": loss " << d.loss << ", weights " << d.weight);
  CHECK(d.loss < 1e-6);
  CHECK(d.weight < 1e-6);
  REQUIRE(h1.steps.size() == 4);
  CHECK(h1.steps.front().step == 5);  // it continued the checkpoint, not a fresh start
  w.barrier();
}

TEST_CASE("zero: --dump-grads writes the whole gradients at stages 2 and 3", "[mpi][zero]") {
  Communicator& w = test_world();
  const TempDir tmp = shared_temp_dir(w, "zero-grads");
  const fs::path& dir = tmp.dir;
  w.barrier();
  for (int64_t stage : {2, 3}) {
  TrainArgs a0 = quiet_args(), a2 = quiet_args();
  a0.dump_grads = (dir / "stage0.safetensors").string();
  a2.dump_grads = (dir / ("stage" + std::to_string(stage) + ".safetensors")).string();
  (void)train(with_steps(make_config(kGpt2, 1, 0), 1), a0, w);
  (void)train(with_steps(make_config(kGpt2, 1, stage), 1), a2, w);
  w.barrier();
  if (w.rank() == 0) {
    INFO("stage " << stage);
    const SafetensorsFile g0 = load_safetensors(a0.dump_grads), g2 = load_safetensors(a2.dump_grads);
    CHECK(g0.tensors.size() == g2.tensors.size());
    double worst = 0;
    for (const auto& [name, t] : g0.tensors) {
      REQUIRE(g2.tensors.count(name) == 1);
      CHECK(g2.tensors.at(name).shape() == t.shape());
      const std::vector<double> x = t.to_doubles(), y = g2.tensors.at(name).to_doubles();
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    }
    CHECK(worst < 1e-6);
  }
  w.barrier();
  }
}

// ---- ZeRO-3 -------------------------------------------------------------------------------------

const json kLlama4 = [] {
  json m = kLlamaGqa;
  m["num_hidden_layers"] = 4;
  return m;
}();

// Whole-parameter bytes of the layers (names with "layers.<i>.") and of the rest.
struct ParamBytes {
  std::map<std::string, size_t> layer;
  size_t other = 0, total = 0, count = 0;
};
ParamBytes param_bytes_of(const ParamMap& params) {
  ParamBytes b;
  for (const auto& [name, t] : params) {
    b.total += t.nbytes();
    ++b.count;
    const size_t at = name.find("layers.");
    if (at == std::string::npos) {
      b.other += t.nbytes();
      continue;
    }
    b.layer[name.substr(0, name.find('.', at + 7))] += t.nbytes();
  }
  return b;
}

TEST_CASE("zero: stage 3 holds 1/W of the parameters, and whole ones for at most two layers at a time",
          "[mpi][zero]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  for (bool checkpointing : {false, true}) {
    Config c0 = make_config(kLlama4, 1, 0), c3 = make_config(kLlama4, 1, 3);
    c0.runtime.activation_checkpointing = c3.runtime.activation_checkpointing = checkpointing;
    const TrainResult s0 = train(with_steps(c0, 2), quiet_args(), w), s3 = train(with_steps(c3, 2), quiet_args(), w);
    const ParamBytes b = param_bytes_of(s0.params);
    INFO("checkpointing " << checkpointing << ": stage 0 holds " << s0.parameter_bytes << " parameter bytes, stage 3 "
                          << s3.parameter_bytes);
    CHECK(s0.parameter_bytes == b.total);
    // Shards: ceil(n / W) elements of each parameter (at most one element of padding each).
    CHECK(s3.parameter_bytes <= b.total / static_cast<size_t>(W) + 4 * b.count);
    CHECK(s3.parameter_bytes >= b.total / static_cast<size_t>(W));
    CHECK(s3.optimizer_state_bytes == 2 * s3.parameter_bytes);

    // The whole parameters the stage-3 program holds at once: each gather (and its bf16 cast) is
    // live from where it runs to its last reader.
    const RankLayout layout = rank_layout(W, w.rank(), c3.sequence_parallel.autosp_size);
    const RankProgram prog = build_program(c3, DType::f32, Stage::joint, layout);
    const Graph& g = *prog.graph;
    std::vector<int64_t> live(g.size() + 1, 0);
    size_t gathers = 0;
    for (const auto& n : g.nodes()) {
      if (n->op() != Op::all_gather) continue;
      ++gathers;
      size_t last = g.position(n.get());
      for (const Node* u : n->users()) last = std::max(last, g.position(u));
      int64_t bytes = 4;
      for (const Dim& d : n->shape()) bytes *= d.value();
      for (size_t p = g.position(n.get()); p <= last; ++p) live[p] += bytes;
    }
    const int64_t peak = *std::max_element(live.begin(), live.end());
    size_t largest_layer = 0;
    for (const auto& [layer, bytes] : b.layer) largest_layer = std::max(largest_layer, bytes);
    INFO("whole parameters alive at once: " << peak << " bytes in " << gathers << " gathers; layers of "
                                            << largest_layer << " bytes, " << b.other << " outside the layers");
    REQUIRE(b.layer.size() == 4);
    CHECK(gathers > b.count);  // the backward gathers again
    CHECK(peak <= static_cast<int64_t>(2 * largest_layer + b.other));
    CHECK(peak < static_cast<int64_t>(b.total));
  }
}

// Llama (untied): every parameter is gathered once in the forward and, except the token embedding
// (its backward reads only the gradient and the ids) and the final norm and LM head (read by the
// forward's last unit and the backward's first, which share one copy), once more in the backward;
// every gradient is reduce-scattered once; the end of the run gathers each parameter once more for
// the result. Under bf16 the step's gathers move the bf16 cast of each shard (2 bytes an element);
// the reduce-scatters and the result's gather stay f32.
TEST_CASE("zero: stage 3 moves the gradients' reduce-scatter and two parameter gathers, about 1.5x stage 1",
          "[mpi][zero][scaling]") {
  Communicator& w = test_world();
  const int64_t W = w.size(), steps = 2;
  CountingCommunicator c1(w), c3(w);
  (void)train(with_steps(make_config(kLlamaGqa, 1, 1, true, 1024), steps), quiet_args(), c1);
  const TrainResult r = train(with_steps(make_config(kLlamaGqa, 1, 3), steps), quiet_args(), c3);
  int64_t shards = 0, once = 0;  // Σ ceil(n / W), and over the parameters gathered once a step
  for (const auto& [name, t] : r.params) {
    const int64_t c = (t.numel() + W - 1) / W;
    shards += c;
    if (name.find("embed_tokens") != std::string::npos || name == "model.norm.weight" || name == "lm_head.weight")
      once += c;
  }
  REQUIRE(once > 0);
  const CommStats& s = c3.stats();
  INFO("stage 3: reduce-scatter " << s.reduce_scatter.bytes << " in " << s.reduce_scatter.calls << ", all-gather "
                                  << s.all_gather.bytes << " in " << s.all_gather.calls);
  CHECK(s.reduce_scatter.calls == steps * static_cast<int64_t>(r.params.size()));
  CHECK(s.reduce_scatter.bytes == steps * shards * 4 * (W - 1));
  CHECK(s.all_gather.bytes == (steps * (2 * shards - once) + shards) * 4 * (W - 1));
  const CommStats& s1 = c1.stats();
  const double stage1 = static_cast<double>(s1.reduce_scatter.bytes + s1.all_gather.bytes);
  const double stage3 = static_cast<double>(s.reduce_scatter.bytes + s.all_gather.bytes -
                                            static_cast<size_t>(shards * 4 * (W - 1)));  // less the result's gather
  INFO("stage 3 / stage 1 per step: " << stage3 / stage1);
  CHECK(stage3 / stage1 > 1.3);
  CHECK(stage3 / stage1 < 1.51);

  Config bf16 = make_config(kLlamaGqa, 1, 3);
  bf16.runtime.dtype = DType::bf16;
  CountingCommunicator cb(w);
  (void)train(with_steps(bf16, steps), quiet_args(), cb);
  const CommStats& sb = cb.stats();
  INFO("stage 3, bf16: reduce-scatter " << sb.reduce_scatter.bytes << ", all-gather " << sb.all_gather.bytes);
  CHECK(sb.reduce_scatter.bytes == steps * shards * 4 * (W - 1));
  CHECK(sb.all_gather.bytes == (steps * (2 * shards - once) * 2 + shards * 4) * (W - 1));
}

// The global batch is the same at every world size when the whole world is one SP group.
TEST_CASE("zero: a world-W stage-3 checkpoint resumes on half the world at stage 1 like an uninterrupted run there",
          "[mpi][zero][checkpoint]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  const TempDir tmp = shared_temp_dir(w, "zero-resume3");
  const fs::path& dir = tmp.dir;
  w.barrier();
  Config writer = make_config(kLlamaGqa, W, 3);
  writer.train.checkpoint_dir = dir.string();
  writer.train.checkpoint_every = 4;
  const TrainResult whole = train(with_steps(writer, 8), quiet_args(), w);  // the schedule of an 8-step run, saved at 4 and 8
  TrainArgs resume = quiet_args();
  resume.resume = (dir / "step_00000004").string();
  // The same world and stage, with every collective blocking this time: the uninterrupted run.
  Config again_cfg = make_config(kLlamaGqa, W, 3, /*overlap=*/false);
  const TrainResult again = train(with_steps(again_cfg, 8), resume, w);
  REQUIRE(again.steps.size() == 4);
  const Diff same = compare(again, TrainResult{.steps = {whole.steps.begin() + 4, whole.steps.end()}, .params = whole.params});
  INFO("world " << W << " stage 3 resumed at stage 3: loss " << same.loss << ", weights " << same.weight);
  CHECK(same.loss < 1e-6);
  CHECK(same.weight < 1e-6);
  auto half = w.split(w.rank() < W / 2 ? 0 : 1, w.rank());
  const TrainResult resumed = train(with_steps(make_config(kLlamaGqa, W / 2, 1), 8), resume, *half);
  const TrainResult uninterrupted = train(with_steps(make_config(kLlamaGqa, W / 2, 0), 8), quiet_args(), *half);
  REQUIRE(resumed.steps.size() == 4);
  REQUIRE(uninterrupted.steps.size() == 8);
  CHECK(resumed.steps.front().step == 5);
  double worst = 0;
  for (size_t k = 0; k < 4; ++k)
    worst = std::max(worst, std::abs(resumed.steps[k].loss - uninterrupted.steps[k + 4].loss) /
                                std::abs(uninterrupted.steps[k + 4].loss));
  INFO("world " << W << " stage 3 -> world " << half->size() << " stage 1: worst relative loss gap " << worst);
  CHECK(worst < 1e-5);
  CHECK(std::abs(uninterrupted.steps[7].loss - uninterrupted.steps[4].loss) > 1e-3);
  w.barrier();
}

}  // namespace
}  // namespace autosp::test
