// autosp-plan's search with expert parallelism (apps/tools/layout_search.h, decision 217): for a
// mixture of experts it also varies moe.expert_parallel_size over the E that divide the experts and
// the ranks, with the memory planner's bytes (the experts' parameters and AdamW state fall by E,
// counted here by hand from the shapes) and the exchanges' cost (worked out here by hand); a dense
// model never gets E > 1, nor a GPU cluster (no CUDA exchange yet); --longest reaches further with
// E where the experts are most of the memory; "auto" for the key picks the E that fits, and the
// chosen layout trains like one process on thread ranks.
#include <catch2/catch.hpp>

#include <set>

#include "comm/threads.h"
#include "common/ep_case.h"
#include "compiler/program.h"
#include "models/flops.h"
#include "tools/layout_search.h"
#include "tools/plan_summary.h"

namespace autosp {
namespace {

// A tiny Mixtral whose experts are most of its bytes: 2 layers of 4 experts of [256, 32] × 3.
Config moe_config(std::vector<std::string> sets = {}) {
  return parse_config({{"model", {{"arch", "mixtral"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 256},
                                  {"num_local_experts", 4}, {"num_experts_per_tok", 2}}},
                       {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}}},
                       {"train", {{"steps", 3}, {"lr", 1e-2}, {"warmup_steps", 1}, {"min_lr", 1e-4}}},
                       {"runtime", {{"dtype", "float32"}, {"threads", 1}}}},
                      sets);
}

SearchRequest request(const Config& cfg, int64_t ranks, double memory) {
  SearchRequest r;
  r.config = cfg;
  r.seq_len = cfg.data.seq_len;
  r.ranks = ranks;
  r.cluster = for_ranks(find_device("cpu"), ranks);
  r.cluster.memory_bytes = memory;
  r.top = 100;
  return r;
}

}  // namespace

TEST_CASE("layout search x ep: a mixture of experts is searched over E, a dense model never", "[layout_search][ep]") {
  const Config moe = moe_config();
  SearchRequest r = request(moe, 4, 1e9);
  const SearchResult got = search_layouts(r);
  std::set<int64_t> eps;
  for (const Candidate& c : got.best) eps.insert(c.layout.ep);
  CHECK(eps == std::set<int64_t>{1, 2, 4});  // 4 experts, 4 ranks: E = 1, 2, 4
  r.vary_ep = false;
  CHECK(search_layouts(r).layouts * 3 == got.layouts);
  // 6 experts on 4 ranks: only E = 2 divides both.
  eps.clear();
  for (const Candidate& c : search_layouts(request(moe_config({"model.num_local_experts=6"}), 4, 1e9)).best)
    eps.insert(c.layout.ep);
  CHECK(eps == std::set<int64_t>{1, 2});
  // On GPUs the run is "cuda", which has the expert exchange too (decision 225): the same E, no note.
  SearchRequest gpu = request(moe, 4, 1e9);
  gpu.cluster = for_ranks(find_device("H100-80GB"), 4);
  const SearchResult g = search_layouts(gpu);
  REQUIRE(!g.best.empty());
  eps.clear();
  for (const Candidate& c : g.best) eps.insert(c.layout.ep);
  CHECK(eps == std::set<int64_t>{1, 2, 4});
  CHECK(g.notes.empty());
  // A dense model: E stays 1 and nothing is noted.
  const Config dense = parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32},
                                                {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                                {"num_key_value_heads", 2}, {"intermediate_size", 64}}},
                                     {"data", {{"seq_len", 16}, {"batch_size", 2}}}});
  const SearchResult d = search_layouts(request(dense, 4, 1e9));
  REQUIRE(!d.best.empty());
  for (const Candidate& c : d.best) CHECK(c.layout.ep == 1);
  CHECK(d.notes.empty());
}

// The bytes are the planner's (plan_summary's planned_bytes of the program the layout builds), and
// the experts' part falls by E as counted by hand: 2 layers × 4 experts × 3 × 256 × 32 f32 weights,
// of which a rank holds 1/E, each with its gradient and two AdamW moments at ZeRO 0.
TEST_CASE("layout search x ep: the planned bytes fall by the experts' (1 - 1/E)", "[layout_search][ep]") {
  const Config cfg = moe_config();
  const double experts = 2 * 4 * 3 * 256 * 32 * 4.0;  // bytes
  MemoryOracle oracle(cfg, 4, DeviceKind::cpu);
  double peak[5] = {};
  PlannedBytes planned[5];
  for (int64_t E : {1, 2, 4}) {
    ParallelLayout l;
    l.dp = 4;
    l.micro_batch = 2;
    l.ep = E;
    peak[E] = oracle.peak_bytes(l, 16, true);
    const RankProgram prog = build_program(l.apply(cfg), DType::f32, Stage::joint, rank_layout(4, 0, 1, 1, E));
    planned[E] = planned_bytes(prog, {{"B", 2}, {"S", 16}}, 4, DeviceKind::cpu, ZeroMode::replicated);
    CHECK(peak[E] == static_cast<double>(planned[E].total()));  // no ring, ZeRO-2 or tiled loss: nothing beside
  }
  for (int64_t E : {2, 4}) {
    INFO("E = " << E);
    const double fall = experts * (1 - 1.0 / static_cast<double>(E));
    CHECK(static_cast<double>(planned[1].params) - static_cast<double>(planned[E].params) == fall);
    CHECK(static_cast<double>(planned[1].optimizer) - static_cast<double>(planned[E].optimizer) == 2 * fall);
    CHECK(peak[E] < peak[E / 2]);
  }
}

// The exchanges' cost by hand: Mixtral above, micro-batch 1, S = 16 over sp 2, E = 2, f32, on a link
// of 20 µs and 4 GB/s. A rank's 8 tokens × top 2 × 32 × 4 B = 2,048 B, half of it for the other
// rank: 1,024 B forward each way (x out, the experts' outputs back), backward 2,048 B out ([x | dy])
// and 1,024 B back (dx); the counts [2, 4] int64 = 64 B. A layer: (20.016 + 2 × 20.256) µs forward
// + (20.016 + 20.512 + 20.256) µs backward = 121.312 µs; 2 layers 242.624 µs; checkpointing adds
// the forward again (363.68 µs); 2 micro-batches twice that.
TEST_CASE("layout search x ep: the expert exchange's cost, by hand", "[layout_search][ep]") {
  const Config cfg = moe_config();
  Cluster c;
  c.peak_tflops = 1e30;
  c.achieved_fraction = 1;
  c.ranks_per_node = 8;
  c.intra = c.inter = {20e-6, 4e9};
  ParallelLayout l;
  l.sp = 2;
  l.dp = 1;
  l.ep = 2;
  CHECK(expert_exchange_s(cfg, l, 16, c) == Approx(242.624e-6).epsilon(1e-12));
  CHECK(estimate_step(cfg, l, 16, c).expert_s == Approx(242.624e-6).epsilon(1e-12));
  l.checkpointing = true;
  CHECK(expert_exchange_s(cfg, l, 16, c) == Approx(363.68e-6).epsilon(1e-12));
  l.checkpointing = false;
  l.accumulation = 2;
  CHECK(expert_exchange_s(cfg, l, 16, c) == Approx(2 * 242.624e-6).epsilon(1e-12));
  l.ep = 1;
  CHECK(expert_exchange_s(cfg, l, 16, c) == 0);
  // Across nodes: E = 2 with one rank a node takes the inter-node link.
  c.ranks_per_node = 1;
  c.inter = {20e-6, 2e9};
  l.ep = 2;
  l.accumulation = 1;
  CHECK(expert_exchange_s(cfg, l, 16, c) > 242.624e-6);
  // The gradient all-reduce at ZeRO 0 over dp 2: with E = 2 each expert has one holder, so only the
  // dense bytes move (no compute to hide behind).
  c.intra = c.inter = {0, 1};
  c.ranks_per_node = 8;
  ParallelLayout d;
  d.dp = 2;
  const double all = static_cast<double>(param_count(cfg.model)) * 4, experts = 2 * 4 * 3 * 256 * 32 * 4.0;
  CHECK(estimate_step(cfg, d, 16, c).zero_s == Approx(2 * 0.5 * all));
  d.ep = 2;
  CHECK(estimate_step(cfg, d, 16, c).zero_s == Approx(2 * 0.5 * (all - experts)));
}

// "auto": with memory between E = 1's and E = 2's planned peaks, the search picks E = 2 on 2 ranks,
// the resolved config records it, and that config trains like one process (thread ranks).
TEST_CASE("layout search x ep: \"auto\" picks the E that fits, and the chosen layout runs", "[layout_search][ep]") {
  const Config cfg = moe_config({"moe.expert_parallel_size=auto"});
  CHECK(cfg.auto_keys == std::set<std::string>{"moe.expert_parallel_size"});
  CHECK(cfg.resolved["moe"]["expert_parallel_size"] == "auto");
  MemoryOracle oracle(cfg, 2, DeviceKind::cpu);
  ParallelLayout l;
  l.dp = 2;
  l.micro_batch = 1;
  const double e1 = oracle.peak_bytes(l, 16, true);
  l.ep = 2;
  const double e2 = oracle.peak_bytes(l, 16, true);
  REQUIRE(e2 < e1);
  Cluster c = for_ranks(find_device("cpu"), 2);
  c.memory_bytes = (e1 + e2) / 2 / (1 - c.reserve_fraction);
  Config two = moe_config({"moe.expert_parallel_size=auto", "data.batch_size=1"});
  const Config got = resolve_auto(two, 2, c);
  CHECK(got.moe.expert_parallel_size == 2);
  CHECK(got.resolved["moe"]["expert_parallel_size"] == 2);
  CHECK(got.auto_keys.empty());
  // With room for E = 1 it is the faster (no exchange).
  c.memory_bytes = 1e9;
  CHECK(resolve_auto(two, 2, c).moe.expert_parallel_size == 1);

  std::vector<TrainResult> ranks(2);
  run_thread_ranks(2, [&](ThreadCommunicator& w) {
    ranks[static_cast<size_t>(w.rank())] = train(got, test::quiet_args(), w);
  });
  auto single = make_single_process_communicator();
  const TrainResult one = train(moe_config(), test::quiet_args(), *single);
  for (const TrainResult& r : ranks) test::check_train_like(r, one);
}

// --longest: E frees the experts' state for activations, so where the experts are most of the
// memory the longest S that fits is longer with E varied, and its layout has E > 1.
TEST_CASE("layout search x ep: --longest reaches further with the experts split", "[layout_search][ep]") {
  const Config cfg = moe_config({"model.intermediate_size=1024", "data.batch_size=1"});
  MemoryOracle oracle(cfg, 4, DeviceKind::cpu);
  ParallelLayout l;
  l.dp = 4;
  l.micro_batch = 1;
  l.checkpointing = l.tiled_mlp = l.tiled_loss = true;
  l.zero_stage = 3;
  const double fixed = oracle.peak_bytes(l, 16, true);  // mostly the experts' state, whatever S
  SearchRequest r = request(cfg, 4, 1.5 * fixed / 0.9);
  r.top = 1;
  r.vary_sp = r.vary_ring = false;
  const LongestResult with = search_longest(r, 64, 1 << 16);
  r.vary_ep = false;
  const LongestResult without = search_longest(r, 64, 1 << 16);
  REQUIRE(with.seq > 0);
  REQUIRE(without.seq > 0);
  CHECK(with.seq > without.seq);
  CHECK(with.at.best.at(0).layout.ep > 1);
}

}  // namespace autosp
