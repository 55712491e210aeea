// autosp-plan's search (apps/tools/layout_search.h) against independent references: its pruned,
// bound-ordered walk against every layout planned at full depth (a brute force), its short-program
// extrapolation against full-depth plans, and its cost model's bytes and FLOPs against
// step_comm_volume (checked byte for byte against a real step in tests/mpi/test_comm_volume.cpp) and
// step_flops.
#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

#include "config/config.h"
#include "compiler/program.h"
#include "tools/layout_search.h"
#include "tools/scaling.h"

namespace autosp {
namespace {

Config tiny(int64_t layers) {  // configs/llama-tiny.json at `layers` layers
  return parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 256}, {"hidden_size", 128},
                                  {"num_hidden_layers", layers}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                                  {"intermediate_size", 256}, {"max_position_embeddings", 65536}}},
                       {"data", {{"seq_len", 256}, {"batch_size", 1}}}});
}

Cluster cpu_with(double bytes) {
  Cluster c = for_ranks(find_device("cpu"), 4);
  c.memory_bytes = bytes;
  return c;
}

// Every layout of 4 ranks for 8 heads and 4 KV heads, by a naive rule: Ulysses U divides the
// heads and the KV heads are a multiple of U or divide it.
std::vector<ParallelLayout> every_layout(int64_t ranks) {
  std::vector<ParallelLayout> out;
  for (int64_t sp = 1; sp <= ranks; ++sp)
    for (int64_t ring = 1; ring <= sp; ++ring) {
      if (ranks % sp || sp % ring) continue;
      const int64_t u = sp / ring;
      if (8 % u || (4 % u && u % 4)) continue;
      for (int64_t z = 0; z <= 3; ++z)
        for (int f = 0; f < 8; ++f) {
          ParallelLayout l;
          l.sp = sp;
          l.ring = ring;
          l.dp = ranks / sp;
          l.zero_stage = z;
          l.checkpointing = f & 1;
          l.tiled_mlp = f & 2;
          l.tiled_loss = f & 4;
          out.push_back(l);
        }
    }
  return out;
}

}  // namespace

TEST_CASE("layout search: the pruned search finds what planning every layout at full depth finds", "[layout_search]") {
  const Config cfg = tiny(6);  // deeper than 4: the search extrapolates from 3 and 4 layers
  const int64_t S = 2048;
  MemoryOracle full(cfg, 4, DeviceKind::cpu);
  for (double memory : {14e6, 20e6, 40e6}) {
    SearchRequest r;
    r.config = cfg;
    r.seq_len = S;
    r.ranks = 4;
    r.cluster = cpu_with(memory);
    r.top = 3;
    const SearchResult got = search_layouts(r);
    // The brute force: the fastest fitting layout of each (sp, ring), fastest groups first.
    std::map<std::pair<int64_t, int64_t>, double> group_best;
    for (const ParallelLayout& l : every_layout(4)) {
      if (full.peak_bytes(l, S, true) > r.cluster.usable_bytes()) continue;
      const double t = estimate_step(cfg, l, S, r.cluster).tokens_per_s;
      double& best = group_best[{l.sp, l.ring}];
      best = std::max(best, t);
    }
    std::vector<double> expected;
    for (const auto& [g, t] : group_best) expected.push_back(t);
    std::sort(expected.rbegin(), expected.rend());
    if (expected.size() > 3) expected.resize(3);
    INFO("memory " << memory);
    REQUIRE(got.best.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      CHECK(got.best[i].cost.tokens_per_s == Approx(expected[i]).epsilon(1e-12));
      CHECK(got.best[i].full_plan);
      CHECK(got.best[i].peak_bytes == full.peak_bytes(got.best[i].layout, S, true));
      CHECK(got.best[i].peak_bytes <= r.cluster.usable_bytes());
    }
    CHECK(got.planned < static_cast<int64_t>(every_layout(4).size()));  // it did not plan everything
  }
}

TEST_CASE("layout search: nothing fits gives the layout of least planned memory", "[layout_search]") {
  const Config cfg = tiny(2);
  SearchRequest r;
  r.config = cfg;
  r.seq_len = 2048;
  r.ranks = 4;
  r.cluster = cpu_with(1e6);
  const SearchResult got = search_layouts(r);
  CHECK(got.best.empty());
  REQUIRE(got.closest);
  MemoryOracle full(cfg, 4, DeviceKind::cpu);
  double least = 1e300;
  for (const ParallelLayout& l : every_layout(4)) least = std::min(least, full.peak_bytes(l, 2048, true));
  // The least of each (sp, ring) is taken with every saver on; the tiled loss can cost a little more
  // than it saves on a model this small.
  CHECK(got.closest->peak_bytes <= least * 1.01);
  CHECK(got.closest->peak_bytes > r.cluster.usable_bytes());
}

TEST_CASE("layout search: two short programs give the full plan's bytes within the search's slack", "[layout_search]") {
  const Config cfg = tiny(10);
  MemoryOracle oracle(cfg, 4, DeviceKind::cpu);
  for (const ParallelLayout& l : every_layout(4)) {
    if (l.tiled_mlp != l.checkpointing) continue;  // a quarter of them: enough, and quick
    for (int64_t S : {512, 4096}) {
      INFO("sp " << l.sp << " ring " << l.ring << " zero " << l.zero_stage << " ckpt " << l.checkpointing << " S " << S);
      const double short_plan = oracle.peak_bytes(l, S), full = oracle.peak_bytes(l, S, true);
      // What the search needs: never more than 1.1× the full plan (it rules a layout out only past
      // 1.1× the memory), and close enough that few layouts go on to a full plan in vain.
      CHECK(short_plan <= 1.1 * full);
      CHECK(short_plan >= 0.9 * full);
    }
  }
}

TEST_CASE("layout search: the cost model's bytes and FLOPs are step_comm_volume's and step_flops'", "[layout_search]") {
  const Config cfg = tiny(2);
  Cluster c;
  c.peak_tflops = 1e-12;  // one FLOP a second: compute_s counts FLOPs
  c.achieved_fraction = 1;
  c.ranks_per_node = 8;
  c.intra = c.inter = {0, 1};  // one byte a second, no latency: times count bytes
  for (int64_t sp : {1, 2, 4, 8}) {
    ParallelLayout l;
    l.sp = sp;
    l.dp = 8 / sp;
    const int64_t S = 1000;  // padded to a multiple of sp inside, as the trainer pads
    const StepCost s = estimate_step(cfg, l, S, c);
    const CommVolume v = step_comm_volume(cfg.model, 1, S, sp, 8, 4, 4);
    CHECK(s.all_to_all_s == Approx(static_cast<double>(v.all_to_all_bytes)));
    CHECK(s.compute_s == Approx(step_flops(cfg.model, 1, padded_seq(l, S)) / static_cast<double>(sp)));
  }
  // The gradient all-reduce (stage 0) with no compute to hide behind: 2·(W−1)/W of the gradients.
  c.peak_tflops = 1e30;
  ParallelLayout l;
  l.sp = 2;
  l.dp = 4;
  const CommVolume v = step_comm_volume(cfg.model, 1, 1000, 2, 8, 4, 4);
  CHECK(estimate_step(cfg, l, 1000, c).zero_s == Approx(2.0 * 7.0 / 8.0 * static_cast<double>(v.grad_bytes)));
  // Accumulation multiplies the compute, not the gradient synchronisation.
  c.peak_tflops = 1e-12;
  ParallelLayout k4 = l;
  k4.accumulation = 4;
  CHECK(estimate_step(cfg, k4, 1000, c).compute_s == Approx(4 * estimate_step(cfg, l, 1000, c).compute_s));
}

}  // namespace autosp

namespace autosp {

// A windowed layer (decision 135) is charged the tails its window reaches, not the full ring: a
// Mistral of 2 layers (4 K/V heads of 16, f32) as a ring of 4 at S = 1,024, bytes counted at one byte
// a second with no compute to hide behind. By hand: a key's K and V are 2·4·16·4 = 512 bytes; the
// full ring moves 3·4 − 2 = 10 blocks of 256 keys a layer, 1,310,720 bytes; with w = 32 a rank moves
// the 32 keys before each of its 2 chunks forward, backward and as dK/dV back, 6·32·512 = 98,304.
// A window as long as the sequence cuts nothing and costs the full ring.
TEST_CASE("layout search: a windowed ring is charged the window's tails", "[layout_search][window]") {
  auto mistral = [](nlohmann::json window) {
    return parse_config({{"model", {{"arch", "mistral"}, {"vocab_size", 256}, {"hidden_size", 128},
                                    {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                                    {"intermediate_size", 256}, {"max_position_embeddings", 65536},
                                    {"sliding_window", window}}},
                         {"data", {{"seq_len", 1024}, {"batch_size", 1}}}});
  };
  Cluster c;
  c.peak_tflops = 1e30;  // attention hides nothing
  c.achieved_fraction = 1;
  c.ranks_per_node = 8;
  c.intra = c.inter = {0, 1};
  ParallelLayout l;
  l.sp = 4;
  l.ring = 4;
  CHECK(estimate_step(mistral(nullptr), l, 1024, c).ring_s == Approx(2 * 1310720.0));
  CHECK(estimate_step(mistral(32), l, 1024, c).ring_s == Approx(2 * 98304.0));
  CHECK(estimate_step(mistral(1024), l, 1024, c).ring_s == Approx(2 * 1310720.0));
  // The compute falls with the attention's pairs (step_flops).
  c.peak_tflops = 1e-12;
  CHECK(estimate_step(mistral(32), l, 1024, c).compute_s < estimate_step(mistral(nullptr), l, 1024, c).compute_s);
}

TEST_CASE("layout search: \"auto\" layout keys are resolved by the search, and garbage is refused", "[layout_search]") {
  const std::vector<std::string> autos = {"sequence_parallel.autosp_size=auto", "sequence_parallel.ring_size=auto",
                                          "zero_optimization.stage=auto", "runtime.activation_checkpointing=auto",
                                          "runtime.tiled_mlp=auto", "runtime.tiled_loss=auto"};
  const nlohmann::json base = tiny(2).resolved;
  Config cfg = parse_config(base, autos);
  CHECK(cfg.auto_keys.size() == 5);  // ring_size has its own flag (ring_auto)
  CHECK(cfg.resolved["zero_optimization"]["stage"] == "auto");
  CHECK(parse_config(cfg.resolved).auto_keys == cfg.auto_keys);  // the resolved config parses back to itself
  CHECK_THROWS_WITH(build_program(cfg, cfg.runtime.dtype, Stage::joint), Catch::Contains("is \"auto\""));

  // The choice is the search's best over the "auto" keys, and runs: its program builds.
  Cluster c = cpu_with(30e6);
  const Config got = resolve_auto(cfg, 4, c);
  CHECK(got.auto_keys.empty());
  SearchRequest r;
  r.config = cfg;
  r.seq_len = cfg.data.seq_len;
  r.ranks = 4;
  r.cluster = c;
  r.top = 1;
  const ParallelLayout best = search_layouts(r).best.at(0).layout;
  CHECK(got.sequence_parallel.autosp_size == best.sp);
  CHECK(got.sequence_parallel.ring_size == best.ring);
  CHECK(got.zero_optimization.stage == best.zero_stage);
  CHECK(got.runtime.activation_checkpointing == best.checkpointing);
  CHECK(got.resolved["zero_optimization"]["stage"] == best.zero_stage);
  CHECK(parse_config(got.resolved).auto_keys.empty());
  CHECK_NOTHROW(build_program(got, got.runtime.dtype, Stage::joint, rank_layout(4, 0, best.sp, best.ring)));

  // A key the config gives keeps its value.
  const Config fixed = resolve_auto(parse_config(base, {"sequence_parallel.autosp_size=auto", "zero_optimization.stage=2"}), 4, c);
  CHECK(fixed.zero_optimization.stage == 2);

  // Nothing fits: a UsageError that names the keys and the closest layout.
  CHECK_THROWS_WITH(resolve_auto(cfg, 4, cpu_with(1e5)),
                    Catch::Contains("sequence_parallel.autosp_size") && Catch::Contains("the closest"));
  // Garbage.
  for (const std::string bad : {"sequence_parallel.autosp_size=automatic", "zero_optimization.stage=1.5",
                                 "runtime.tiled_mlp=\"yes\"", "runtime.activation_checkpointing=AUTO", "zero_optimization.stage=4"})
    CHECK_THROWS_WITH(parse_config(base, {bad}), Catch::Contains(bad.substr(0, bad.find('='))));
}

}  // namespace autosp
