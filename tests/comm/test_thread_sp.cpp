// AutoSP's contract (DESIGN.md, "AutoSP semantics") with ranks as threads (comm/threads.h), the
// way the one-GPU machine runs SP: for P = 1, 2, 4 the loss and the world-summed parameter
// gradients of every rank equal the unsharded P = 1 program in one process on the same batch, in
// f32 and bf16, for GPT-2 and Llama with GQA (kv 2: all-to-all'd K/V at P = 2, replicated at
// P = 4) and kv 4, on a sequence length P does not divide (padded at the end), on a dp × sp mesh,
// and through train() itself (a short loss curve); the tiled MLP and loss in bf16 too. The helpers and tolerances are those of the
// MPI test (tests/common/sp_case.h); the rank threads only compute, Catch checks afterwards.
// tests/cuda/test_thread_sp.cpp runs the same ranks on one GPU.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "comm/threads.h"
#include "common/sp_case.h"

namespace autosp::test {
namespace {

// Every rank's result of the SP program on `batch` (the same global batch on each rank: the
// graph slices its block).
std::vector<LossAndGrads> run_sp_threads(int P, const Config& cfg, const Batch& batch, const ParamMap& params,
                                         DType dt) {
  std::vector<LossAndGrads> out(static_cast<size_t>(P));
  run_thread_ranks(P, [&](ThreadCommunicator& w) {
    out[static_cast<size_t>(w.rank())] = run_sp_on(w, cfg, batch, params, dt);
  });
  return out;
}

TEST_CASE("thread sp: P = 1, 2, 4 thread ranks equal the P = 1 run in f32 and bf16", "[threads][autosp]") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const json& model : {kGpt2, kLlamaGqa, kLlamaKv4}) {
      const Config cfg_p1 = make_config(model, 1);
      const ParamMap params = init_params(cfg_p1.model, 11, DType::f32);
      const Batch batch = random_batch(2, 32, cfg_p1.model.vocab_size, 5);
      const LossAndGrads ref = run_reference(cfg_p1, batch, params, dt);
      for (const int P : {1, 2, 4}) {
        INFO(model_name(model) << ", " << dtype_name(dt) << ", P = " << P);
        const auto ranks = run_sp_threads(P, make_config(model, P), batch, params, dt);
        for (int r = 0; r < P; ++r) {
          INFO("rank " << r);
          if (dt == DType::f32) check_equal(ranks[static_cast<size_t>(r)], ref);
          else check_equal_bf16(ranks[static_cast<size_t>(r)], ref);
        }
      }
    }
  }
}

// The tiled MLP (runtime.tiled_mlp) is token-wise: it takes the sharded sequence as it is, and the
// sharded tiled program equals the untiled unsharded one.
TEST_CASE("thread sp: Llama with runtime.tiled_mlp at P = 2, 4 equals the untiled P = 1 run", "[threads][autosp]") {
  const Config cfg_p1 = make_config(kLlamaGqa, 1);
  const ParamMap params = init_params(cfg_p1.model, 12, DType::f32);
  const Batch batch = random_batch(2, 32, cfg_p1.model.vocab_size, 7);
  const LossAndGrads ref = run_reference(cfg_p1, batch, params);
  for (const int P : {2, 4}) {
    INFO("P = " << P);
    Config cfg = make_config(kLlamaGqa, P);
    cfg.runtime.tiled_mlp = true;
    for (const auto& got : run_sp_threads(P, cfg, batch, params, DType::f32)) check_equal(got, ref);
  }
}

// The tiled head + loss (runtime.tiled_loss) sums over this rank's rows like cross_entropy_sum, so
// normalize_loss makes it exact across ranks: GPT-2 (tied head) and Llama at P = 2, 4 equal the
// untiled P = 1 run.
TEST_CASE("thread sp: runtime.tiled_loss at P = 2, 4 equals the untiled P = 1 run", "[threads][autosp]") {
  for (const json& model : {kGpt2, kLlamaGqa}) {
    const Config cfg_p1 = make_config(model, 1);
    const ParamMap params = init_params(cfg_p1.model, 12, DType::f32);
    const Batch batch = random_batch(2, 32, cfg_p1.model.vocab_size, 7);
    const LossAndGrads ref = run_reference(cfg_p1, batch, params);
    for (const int P : {2, 4}) {
      INFO(model.at("arch").get<std::string>() << ", P = " << P);
      Config cfg = make_config(model, P);
      cfg.runtime.tiled_loss = true;
      for (const auto& got : run_sp_threads(P, cfg, batch, params, DType::f32)) check_equal(got, ref);
    }
  }
}

// In bf16 the tiled MLP and the tiled head + loss run on the CPU's bf16 GEMM where it has one
// (kernels/cpu/mlp.h, loss.h: their hidden h, dg, du and dlogits rounded to bf16): sharded at
// P = 2, 4 they equal the untiled P = 1 bf16 run within bf16's tolerance.
TEST_CASE("thread sp: bf16 Llama with runtime.tiled_mlp and tiled_loss at P = 2, 4 equals the untiled P = 1 run",
          "[threads][autosp][bf16]") {
  const Config cfg_p1 = make_config(kLlamaGqa, 1);
  const ParamMap params = init_params(cfg_p1.model, 12, DType::f32);
  const Batch batch = random_batch(2, 32, cfg_p1.model.vocab_size, 7);
  const LossAndGrads ref = run_reference(cfg_p1, batch, params, DType::bf16);
  for (const int P : {2, 4}) {
    INFO("P = " << P);
    Config cfg = make_config(kLlamaGqa, P);
    cfg.runtime.tiled_mlp = cfg.runtime.tiled_loss = true;
    for (const auto& got : run_sp_threads(P, cfg, batch, params, DType::bf16)) check_equal_bf16(got, ref);
  }
}

TEST_CASE("thread sp: a sequence length P does not divide is padded, not truncated", "[threads][autosp]") {
  for (const int64_t S : {int64_t{31}, int64_t{30}}) {  // 31: padded at P = 2 and 4; 30: at P = 4
    for (const json& model : {kGpt2, kLlamaGqa}) {
      const Config cfg_p1 = make_config(model, 1);
      const ParamMap params = init_params(cfg_p1.model, 13, DType::f32);
      const Batch batch = random_batch(2, S, cfg_p1.model.vocab_size, 6);
      const LossAndGrads ref = run_reference(cfg_p1, batch, params);  // unpadded
      for (const int P : {2, 4}) {
        INFO(model_name(model) << ", P = " << P << ", seq_len " << S);
        const Batch padded = pad_to_multiple(batch, P);
        CHECK(padded.input_ids.dim(1) % P == 0);
        const auto ranks = run_sp_threads(P, make_config(model, P), padded, params, DType::f32);
        for (const auto& got : ranks) check_equal(got, ref);
      }
    }
  }
}

TEST_CASE("thread sp: a dp 2 x sp 2 mesh of thread ranks equals the P = 1 run on the global batch",
          "[threads][autosp]") {
  const json model = kLlamaGqa;
  const Config cfg = make_config(model, 2), cfg_p1 = make_config(model, 1, {{"seq_len", 32}, {"batch_size", 4}});
  const ParamMap params = init_params(cfg.model, 12, DType::f32);
  const Batch global = random_batch(4, 32, cfg.model.vocab_size, 8);
  // dp rank d reads sequences [2d, 2d + 2) of the global batch.
  auto rows = [&](const Tensor& t, int64_t d) { return t.as_strided({2, 32}, t.strides(), d * 2 * 32).contiguous(); };
  std::vector<LossAndGrads> out(4);
  run_thread_ranks(4, [&](ThreadCommunicator& w) {
    const int64_t d = w.rank() / 2;
    const Batch mine{rows(global.input_ids, d), rows(global.labels, d), rows(global.position_ids, d)};
    out[static_cast<size_t>(w.rank())] = run_sp_on(w, cfg, mine, params, DType::f32);
  });
  const LossAndGrads ref = run_reference(cfg_p1, global, params);
  for (const auto& got : out) check_equal(got, ref);
}

// Also at ZeRO stage 3, where each step's graph gathers parameters in the background and
// reduce-scatters every gradient on the communicator's worker (comm/threads.h).
TEST_CASE("thread sp: train() on 2 thread ranks gives the P = 1 loss curve, at ZeRO stages 0 and 3",
          "[threads][autosp]") {
  const json data = {{"source", "synthetic"}, {"seq_len", 32}, {"batch_size", 2}};
  const json opt = {{"steps", 6}, {"lr", 1e-2}, {"warmup_steps", 2}, {"min_lr", 1e-4}};
  TrainArgs args;
  args.quiet = true;
  auto single = make_single_process_communicator();
  const TrainResult ref = train(make_config(kLlamaGqa, 1, data, opt), args, *single);
  REQUIRE(ref.steps.size() == 6);
  CHECK(ref.steps.back().loss < ref.steps.front().loss);
  for (int64_t stage : {0, 3}) {
    std::vector<TrainResult> sp(2);
    run_thread_ranks(2, [&](ThreadCommunicator& w) {
      Config cfg = make_config(kLlamaGqa, 2, data, opt);
      cfg.zero_optimization.stage = stage;
      sp[static_cast<size_t>(w.rank())] = train(cfg, args, w);
    });
    for (const auto& rank : sp) {
      REQUIRE(rank.steps.size() == 6);
      for (size_t k = 0; k < ref.steps.size(); ++k) {
        INFO("stage " << stage << ", step " << k + 1 << ": loss " << rank.steps[k].loss << " vs P = 1 "
                      << ref.steps[k].loss);
        CHECK(std::abs(rank.steps[k].loss - ref.steps[k].loss) < kTol * std::abs(ref.steps[k].loss));
      }
    }
  }
}

}  // namespace
}  // namespace autosp::test
