// The scaling model's communication volumes (apps/tools/scaling.h, docs/scaling.md) equal, byte for
// byte, what autosp moves: a training step through train() on the world wrapped in a
// CountingCommunicator (which counts the sp/dp groups the trainer splits off it too) at
// sp = world (2 or 4 under ctest), and on a dp 2 × sp 2 mesh at 4 ranks; Llama with all-to-all'd
// and with replicated K/V heads, GPT-2, and a sequence length sp does not divide (padded).
#include <catch2/catch.hpp>

#include "comm/counting.h"
#include "mpi/mpi_test.h"
#include "tools/scaling.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

using nlohmann::json;

struct Case {
  const char* name;
  json model;
  int64_t seq, batch;
};

void check_volume(const Case& c, int64_t sp, int64_t steps, int64_t k = 1) {
  Communicator& world = test_world();
  const Config cfg = parse_config({{"model", c.model},
                                   {"data", {{"source", "synthetic"}, {"seq_len", c.seq}, {"batch_size", c.batch}}},
                                   {"train", {{"steps", steps}, {"log_every", 1000}, {"gradient_accumulation_steps", k}}},
                                   {"runtime", {{"dtype", "float32"}, {"threads", 1}}},
                                   {"sequence_parallel", {{"autosp_size", sp}}}});
  CountingCommunicator counted(world);
  TrainArgs args;
  args.quiet = true;
  (void)train(cfg, args, counted);
  const CommStats s = counted.stats();

  const CommVolume v = step_comm_volume(cfg.model, c.batch, c.seq, sp, world.size(), 4, 4);
  // Besides the model's volume the trainer all-reduces the synthetic task's accuracy counts
  // (i64[2], 16 bytes), the step's target count (i64[1], 8 bytes: train/accumulation.h) and the
  // preemption-stop flag (i64[1], 8 bytes: train/preempt.h) each step; every rank
  // broadcast-receives rank 0's initial weights once. With k micro-batches every micro-batch moves
  // the activations' all-to-alls and all-reduces its share of the loss (4 bytes), the fed count
  // replaces the graph's own (4 bytes), and the gradients are reduced once per step.
  const int64_t host_bytes = 16 + 8 + 8;
  const int64_t graph_bytes = k == 1 ? v.all_reduce_bytes : v.grad_bytes + k * 4;
  INFO(c.name << " at world " << world.size() << ", sp " << sp << ", k " << k << ": all-to-all " << s.all_to_all.bytes
               << " bytes, all-reduce " << s.all_reduce.bytes << " bytes over " << steps << " steps");
  CHECK(s.all_to_all.calls == steps * k * v.all_to_all_calls);
  CHECK(s.all_to_all.bytes == steps * k * v.all_to_all_bytes);
  CHECK(s.all_reduce.bytes == steps * (graph_bytes + host_bytes));
  CHECK(s.broadcast.bytes == param_count(cfg.model) * 4);
  CHECK(s.all_gather.calls == 0);
}

const Case kCases[] = {
    // 8 heads, 4 K/V heads: all-to-all'd at sp 2 and 4.
    {"llama kv4", {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                   {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"intermediate_size", 96}}, 32, 2},
    // 4 heads, 2 K/V heads: replicated up to 4 at sp 4; sequence 30 padded to 32 at sp 4.
    {"llama kv2", {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                   {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}}, 30, 1},
    {"gpt2", {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"max_position_embeddings", 128}}, 32, 2},
};

TEST_CASE("comm volume: sp = world matches the scaling model exactly", "[mpi][scaling]") {
  for (const Case& c : kCases) check_volume(c, test_world().size(), 2);
}

TEST_CASE("comm volume: k micro-batches reduce the gradients once per step", "[mpi][scaling][accumulation]") {
  check_volume(kCases[0], test_world().size(), 2, 3);
}

TEST_CASE("comm volume: dp x sp mesh matches the scaling model exactly", "[mpi][scaling]") {
  if (test_world().size() != 4) return;
  check_volume(kCases[0], 2, 1);
}

}  // namespace
}  // namespace autosp::test
