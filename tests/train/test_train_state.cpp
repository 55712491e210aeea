// The training state (train/train_state.h): the ZeRO mode decided once from the stage and the
// world, the figures autosp-graph --plan-memory takes from it, and train() through every mode's
// state on two thread ranks: the same parameters as the replicated state after a few steps, with
// the state each mode promises to hold (1/W of the moments from stage 1, no buckets between steps
// at stage 2, 1/W of the parameters at stage 3).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "comm/threads.h"
#include "common/sp_case.h"
#include "train/train_state.h"

namespace autosp::test {
namespace {

TEST_CASE("train state: the ZeRO mode is decided from the stage and the world", "[train_state]") {
  struct Row {
    int64_t stage;
    int world;
    ZeroMode mode;
  };
  for (const Row& r : std::vector<Row>{{0, 1, ZeroMode::replicated},
                                       {0, 8, ZeroMode::replicated},
                                       {1, 1, ZeroMode::replicated},  // nothing to shard over
                                       {2, 1, ZeroMode::replicated},
                                       {3, 1, ZeroMode::replicated},
                                       {1, 2, ZeroMode::sharded_moments},
                                       {2, 4, ZeroMode::sharded_gradients},
                                       {3, 2, ZeroMode::sharded_parameters}}) {
    INFO("stage " << r.stage << ", world " << r.world);
    CHECK(zero_mode(ZeroConfig{r.stage}, r.world) == r.mode);
  }
}

TEST_CASE("train state: planned bytes per mode", "[train_state]") {
  // 1000 bytes of parameters, 1000 of gradients, 4 ranks (figures worked by hand).
  const PlannedStateBytes r1 = planned_state_bytes(ZeroMode::replicated, 1000, 1000, 1);
  CHECK(r1.optimizer == 2000);
  CHECK(r1.grad_buckets == 0);  // one rank: no all-reduce
  const PlannedStateBytes r4 = planned_state_bytes(ZeroMode::replicated, 1000, 1000, 4);
  CHECK(r4.grad_buckets == 1000);
  const PlannedStateBytes m = planned_state_bytes(ZeroMode::sharded_moments, 1000, 1000, 4);
  CHECK(m.optimizer == 500);
  CHECK(m.grad_buckets == 1250);
  CHECK(m.freed_outputs == 0);
  const PlannedStateBytes g = planned_state_bytes(ZeroMode::sharded_gradients, 1000, 1000, 3);
  CHECK(g.optimizer == 667);
  CHECK(g.grad_buckets == 334);
  CHECK(g.freed_outputs == 1000);
  const PlannedStateBytes p = planned_state_bytes(ZeroMode::sharded_parameters, 250, 250, 4);  // shards already
  CHECK(p.optimizer == 500);
  CHECK(p.grad_buckets == 0);
  const PlannedStateBytes fwd = planned_state_bytes(ZeroMode::sharded_moments, 1000, 0, 4);  // no gradients
  CHECK(fwd.optimizer == 0);
  CHECK(fwd.grad_buckets == 0);
}

double max_rel_diff(const ParamMap& a, const ParamMap& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    const std::vector<double> x = t.to_doubles(), y = b.at(name).to_doubles();
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (std::abs(y[i]) + 1e-3));
  }
  return worst;
}

TEST_CASE("train state: every mode's state trains like the replicated one on two thread ranks", "[train_state][threads]") {
  TrainArgs args;
  args.quiet = true;
  const json opt = {{"steps", 3}, {"lr", 1e-2}, {"warmup_steps", 1}};
  std::vector<std::vector<TrainResult>> by_stage(4, std::vector<TrainResult>(2));
  for (int64_t stage = 0; stage <= 3; ++stage)
    run_thread_ranks(2, [&](ThreadCommunicator& w) {
      Config cfg = make_config(kLlamaGqa, 2, {{"seq_len", 32}, {"batch_size", 2}}, opt);
      cfg.zero_optimization.stage = stage;
      cfg.runtime.grad_bucket_mb = 0.01;
      by_stage[static_cast<size_t>(stage)][static_cast<size_t>(w.rank())] = train(cfg, args, w);
    });
  const TrainResult& s0 = by_stage[0][0];
  size_t param_bytes = 0;
  for (const auto& [name, t] : s0.params) param_bytes += t.nbytes();
  CHECK(s0.optimizer_state_bytes == 2 * param_bytes);
  CHECK(s0.parameter_bytes == param_bytes);
  for (int64_t stage = 1; stage <= 3; ++stage) {
    for (const TrainResult& rank : by_stage[static_cast<size_t>(stage)]) {
      INFO("stage " << stage);
      CHECK(max_rel_diff(rank.params, s0.params) < 1e-4);
      // 1/2 of the moments (plus bucket padding), never the whole.
      CHECK(rank.optimizer_state_bytes < s0.optimizer_state_bytes * 3 / 4);
      CHECK(rank.optimizer_state_bytes >= s0.optimizer_state_bytes / 2 - 64);
    }
  }
  CHECK(by_stage[1][0].grad_bucket_bytes >= param_bytes);  // whole buckets kept between steps
  CHECK(by_stage[2][0].grad_bucket_bytes == 0);            // freed once reduce-scattered
  CHECK(by_stage[3][0].grad_bucket_bytes == 0);            // the graph reduce-scatters
  CHECK(by_stage[3][0].parameter_bytes < param_bytes * 3 / 4);
  CHECK(by_stage[2][0].parameter_bytes == param_bytes);
}

}  // namespace
}  // namespace autosp::test
