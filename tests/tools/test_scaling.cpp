// The arithmetic of apps/tools/scaling.h on hand-computed cases: parameter counts (and that they
// match the graph's parameters), the FLOP formula, the per-step communication volumes, and the
// projection's SP degree, memory and monotonicity. (The volumes are checked against the bytes a
// real training step moves in tests/mpi/test_comm_volume.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "config/config.h"
#include "models/model.h"
#include "tools/scaling.h"

namespace autosp {
namespace {

ModelConfig llama_tiny() {  // configs/llama-tiny.json
  return parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 256}, {"hidden_size", 128}, {"num_hidden_layers", 2},
                                  {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"intermediate_size", 256}}}})
      .model;
}

ModelConfig gpt2_tiny() {  // configs/gpt2-tiny.json
  return parse_config({{"model", {{"arch", "gpt2"}, {"vocab_size", 512}, {"hidden_size", 256}, {"num_hidden_layers", 4},
                                  {"num_attention_heads", 8}, {"max_position_embeddings", 1024}}}})
      .model;
}

int64_t graph_param_count(const ModelConfig& m) {
  int64_t n = 0;
  for (const auto& p : param_specs(m)) {
    int64_t k = 1;
    for (int64_t d : p.shape) k *= d;
    n += k;
  }
  return n;
}

TEST_CASE("scaling: parameter counts", "[scaling]") {
  // Llama tiny, per layer: q, o 128·128; k, v 128·64; gate, up, down 128·256; two norms 128.
  //   16384·2 + 8192·2 + 32768·3 + 256 = 147712; ×2 layers + final norm 128 + embed and head 256·128 each.
  const ModelConfig l = llama_tiny();
  CHECK(param_count(l) == 147712 * 2 + 128 + 2 * 32768);
  CHECK(param_count(l) == 361088);
  CHECK(flop_param_count(l) == 361088 - 32768);  // the embedding lookup does no FLOPs
  CHECK(param_count(l) == graph_param_count(l));
  ModelConfig tied = l;
  tied.tie_word_embeddings = true;
  CHECK(param_count(tied) == 361088 - 32768);
  CHECK(flop_param_count(tied) == 361088 - 32768);  // the tied table counts once, as the head
  CHECK(param_count(tied) == graph_param_count(tied));

  // GPT-2 tiny: 12·C² + 13·C per layer, wte 512·256, wpe 1024·256, ln_f 2·256.
  const ModelConfig g = gpt2_tiny();
  CHECK(param_count(g) == 4 * 789760 + 131072 + 262144 + 512);
  CHECK(flop_param_count(g) == 4 * 789760 + 131072 + 512);
  CHECK(param_count(g) == graph_param_count(g));

  // Every family row, with each bias and tie setting it has and a decoupled head_dim where its
  // layout takes one: the formula (from the row) agrees with the graph (built from the row).
  for (const Family& f : families())
    for (int bits = 0; bits < 8; ++bits) {
      ModelConfig m = f.layout == Layout::gpt2 ? g : l;
      m.arch = f.arch;
      if (f.layout == Layout::llama) m.head_dim_config = 48;
      m.attention_bias = bits & 1;
      m.mlp_bias = bits & 2;
      m.tie_word_embeddings = f.tied_head == Presence::always || (f.tied_head == Presence::by_key && (bits & 4));
      INFO(f.name << " attention_bias " << m.attention_bias << " mlp_bias " << m.mlp_bias << " tied "
                  << m.tie_word_embeddings);
      CHECK(param_count(m) == graph_param_count(m));
    }
  // Llama-3-8B: 8.03 B.
  ProjectionConfig pc = parse_projection_config(nlohmann::json::object(), "test");
  CHECK(param_count(pc.model) == 8030261248);
}

TEST_CASE("scaling: FLOPs of a training step", "[scaling]") {
  // Llama tiny, B = 1, S = 1024: 6 · 328320 · 1024 = 2017198080 dense, and causal attention
  // 12 · 2 layers · 1024² · 128 · ½ = 1610612736.
  CHECK(step_flops(llama_tiny(), 1, 1024) == 3627810816.0);
  // GPT-2 tiny, B = 4, S = 256: 6 · 3290624 · 1024 tokens = 20217593856, attention
  // 12 · 4 · 256² · 256 · 4 · ½ = 1610612736.
  CHECK(step_flops(gpt2_tiny(), 4, 256) == 21828206592.0);
  // Doubling S doubles the dense part and quadruples attention.
  CHECK(step_flops(llama_tiny(), 1, 2048) == 2 * 2017198080.0 + 4 * 1610612736.0);
}

// A windowed layer's attention FLOPs are its band's query-key pairs, counted here one pair at a time:
// Mistral v0.1's shape (every layer windowed) and Gemma 2's (every other layer), w = 64 at S = 1,024.
// The formula's continuous count (S·w − w²/2, and S²/2 for full layers) is within 1/S of the
// pairs (it leaves out the diagonal's half); charging the windowed layers S²/2 would be 7× off.
TEST_CASE("scaling: a sliding window's attention FLOPs are the pairs its band keeps", "[scaling][window]") {
  const int64_t S = 1024, w = 64;
  for (const char* arch : {"mistral", "gemma2"}) {
    INFO(arch);
    const ModelConfig m = parse_config({{"model", {{"arch", arch}, {"vocab_size", 256}, {"hidden_size", 128},
                                                    {"num_hidden_layers", 4}, {"num_attention_heads", 8},
                                                    {"num_key_value_heads", 4}, {"intermediate_size", 256},
                                                    {"head_dim", 16}, {"sliding_window", w}}}})
                              .model;
    double pairs = 0;  // (query i, key j) with j ≤ i, and j > i − w where the layer has a window
    int64_t windowed = 0;
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
      windowed += m.layer_window(l) == w;
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j <= i; ++j) pairs += m.layer_window(l) == 0 || j > i - w;
    }
    CHECK(windowed == (std::string(arch) == "mistral" ? 4 : 2));
    const double attention = step_flops(m, 1, S) - 6.0 * static_cast<double>(flop_param_count(m)) * S;
    const double want = 12.0 * pairs * 8 * 16;
    CHECK(std::abs(attention - want) <= want / S);
  }
}

TEST_CASE("scaling: communication volume per rank and step", "[scaling]") {
  const ModelConfig l = llama_tiny();
  // sp = 2, B = 4, S = 256, f32: one all-to-all of h heads sends 4·h·128·16·4 / 2 bytes; q and o
  // have 8 heads, k and v 4; forward and backward; 2 layers.
  CommVolume v = step_comm_volume(l, 4, 256, 2, 2, 4, 4);
  CHECK(v.all_to_all_calls == 16);
  CHECK(v.kv_heads == 4);
  CHECK(v.all_to_all_bytes == 2 * 2 * (2 * 16384 * 8 + 2 * 16384 * 4));
  CHECK(v.all_to_all_bytes == 1572864);
  CHECK(v.grad_bytes == 361088 * 4);
  CHECK(v.all_reduce_bytes == 361088 * 4 + 8);

  // sp = 8: 4 K/V heads are replicated up to 8, so k and v carry as much as q and o.
  v = step_comm_volume(l, 1, 1024, 8, 8, 4, 4);
  CHECK(v.kv_heads == 8);
  CHECK(v.all_to_all_bytes == 2 * 2 * 4 * (1 * 8 * 128 * 16 * 4 / 8 * 7));

  // A sequence sp does not divide is padded (1023 → 1024); dp × sp: the all-to-alls are the sp
  // group's, the gradients go over the whole world.
  CHECK(step_comm_volume(l, 1, 1023, 4, 8, 4, 4).all_to_all_bytes == step_comm_volume(l, 1, 1024, 4, 4, 4, 4).all_to_all_bytes);
  v = step_comm_volume(l, 1, 1024, 1, 2, 4, 4);
  CHECK(v.all_to_all_bytes == 0);
  CHECK(v.all_reduce_bytes == 361088 * 4 + 8);
  v = step_comm_volume(l, 1, 1024, 1, 1, 4, 4);
  CHECK(v.all_reduce_bytes == 0);

  CHECK_THROWS_AS(step_comm_volume(l, 1, 1024, 3, 3, 4, 4), UsageError);   // 8 heads, sp 3
  CHECK_THROWS_AS(step_comm_volume(l, 1, 1024, 2, 3, 4, 4), UsageError);   // world 3, sp 2
}

// Ulysses × ring (decision 99): U fills a node where the heads allow it, the ring takes the rest,
// so every GPU holds S / gpus tokens; the ring's blocks are (3R − 2) per layer.
TEST_CASE("scaling: Ulysses x ring projection", "[scaling][ring]") {
  ProjectionConfig llama = parse_projection_config(nlohmann::json::object(), "test");
  ProjectionConfig qwen = parse_projection_config(
      {{"model", {{"arch", "qwen2"}, {"vocab_size", 152064}, {"hidden_size", 3584}, {"num_hidden_layers", 28},
                  {"num_attention_heads", 28}, {"num_key_value_heads", 4}, {"intermediate_size", 18944}}}},
      "qwen");
  CHECK(projection_ulysses_ring(llama, 64).ulysses == 8);  // 32 heads, 8 KV heads: a node of Ulysses
  CHECK(projection_ulysses_ring(llama, 64).ring == 8);
  CHECK(projection_ulysses_ring(qwen, 64).ulysses == 4);   // 28 heads: 8 does not divide them
  CHECK(projection_ulysses_ring(qwen, 64).ring == 16);
  CHECK(projection_ulysses_ring(qwen, 8).ring == 2);
  CHECK(projection_sp(qwen.model, 64) == 4);  // Ulysses alone: sp 4, dp 16
  const int64_t ring = longest_ring_sequence(qwen, 64), ulysses = longest_sequence(qwen, 64);
  CHECK(ring >= 15 * ulysses);  // S / 64 tokens per GPU instead of S / 4
  CHECK(ring % 1024 == 0);
  CHECK(project_ring_point(qwen, 64, ring).fits);
  CHECK_FALSE(project_ring_point(qwen, 64, ring + 64 * 1024).fits);
  // No ring: nothing is exchanged; a ring inside one node is on NVLink.
  CHECK(project_ring_point(llama, 8, 65536).ring_s == 0);
  const ProjectionRow r = project_ring_point(qwen, 64, 1 << 20);
  CHECK(r.seq == 1 << 20);
  CHECK(r.step_s == Approx(r.compute_s + r.all_to_all_s + r.ring_s));
  CHECK(r.ring_s >= 0);
}

TEST_CASE("scaling: projection", "[scaling]") {
  ProjectionConfig c = parse_projection_config(nlohmann::json::object(), "test");
  // 32 heads: Ulysses stops at sp = 32; 64 GPUs are dp 2 × sp 32.
  CHECK(projection_sp(c.model, 8) == 8);
  CHECK(projection_sp(c.model, 32) == 32);
  CHECK(projection_sp(c.model, 64) == 32);
  CHECK(projection_sp(c.model, 48) == 16);

  // Activations with checkpointing, per local token: (32·4096 + 2·(7·4096 + 2·1024 + 4·14336)) bf16
  // elements plus fp32 logits and their gradient.
  CHECK(activation_bytes_per_token(c) == (32.0 * 4096 + 2 * (7 * 4096 + 2 * 1024 + 4 * 14336)) * 2 + 2.0 * 128256 * 4);

  int64_t previous = 0;
  for (int64_t g : {8, 16, 32, 64}) {
    const int64_t s = longest_sequence(c, g);
    CHECK(s % 1024 == 0);
    CHECK(s >= previous);
    previous = s;
    CHECK(project_point(c, g, s).fits);
    CHECK_FALSE(project_point(c, g, s + 64 * 1024).fits);
    const ProjectionRow r = project_point(c, g, 262144);
    CHECK(r.step_s == Approx(r.compute_s + r.all_to_all_s + r.exposed_all_reduce_s));
    CHECK(r.efficiency > 0);
    CHECK(r.efficiency <= 1);
  }
  CHECK(longest_sequence(c, 32) > 3 * longest_sequence(c, 8));

  // Replicated fp32 Adam state of 8 B parameters alone exceeds 141 GB: nothing fits.
  ProjectionConfig r = parse_projection_config({{"replicated_bytes_per_param", 18}, {"sharded_bytes_per_param", 0}}, "t");
  CHECK(longest_sequence(r, 8) == 0);

  // zero_stage: this runtime's bytes per parameter at each stage (4 f32 parameters, 8 of gradient
  // output and bucket, 8 of moments), counted by hand for Llama-3-8B on 8 GPUs.
  const double p = static_cast<double>(param_count(c.model));
  const double expected[] = {p * 20, p * (12 + 8.0 / 8), p * (4 + 12.0 / 8)};
  for (int64_t stage = 0; stage <= 2; ++stage) {
    const ProjectionConfig z = parse_projection_config({{"zero_stage", stage}}, "t");
    CHECK(state_bytes_per_gpu(z, 8) == Approx(expected[stage]));
  }
  CHECK(longest_sequence(parse_projection_config({{"zero_stage", 0}}, "t"), 8) == 0);  // 160 GB of states
  CHECK(longest_sequence(parse_projection_config({{"zero_stage", 2}}, "t"), 8) >
        longest_sequence(parse_projection_config({{"zero_stage", 1}}, "t"), 8));
  // Stage 3: 16/8 B per parameter plus two layers' f32 parameters, below stage 2.
  const ProjectionConfig z3 = parse_projection_config({{"zero_stage", 3}}, "t");
  CHECK(state_bytes_per_gpu(z3, 8) > p * 2);
  CHECK(state_bytes_per_gpu(z3, 8) < p * 2 + 2 * p / 32 * 4);
  CHECK_THROWS_AS(parse_projection_config({{"zero_stage", 4}}, "t"), UsageError);
  CHECK_THROWS_AS(parse_projection_config({{"zero_stage", 1}, {"sharded_bytes_per_param", 1}}, "t"), UsageError);

  CHECK_THROWS_AS(parse_projection_config({{"gpu", 8}}, "t"), UsageError);
  CHECK_THROWS_AS(parse_projection_config({{"gpus", {8, 0}}}, "t"), UsageError);
  CHECK_THROWS_AS(parse_projection_config({{"links", {{"nvlink", {{"alpha", 1}}}}}}, "t"), UsageError);
  CHECK_THROWS_AS(parse_projection_config({{"model", {{"arch", "llama"}, {"hidden_size", "big"}}}}, "t"), UsageError);
}

}  // namespace
}  // namespace autosp
