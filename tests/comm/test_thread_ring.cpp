// Ring attention (sequence_parallel.ring_size, decision 99) with ranks as threads (comm/threads.h):
// the loss and every world-summed parameter gradient of every rank equal the unsharded P = 1
// program in one process on the same batch, all in float64 (bars 1e-10: only the summation order
// differs), for Ulysses 2 × ring 2 with 2 heads, a pure ring of 3 on GPT-2 with 4 heads, a pure
// ring of 4 on a sequence 2P does not divide (padded), dp 2 × ring 2 with one head and "auto" with
// 6 heads at P = 4, each with packed documents too; activation checkpointing with the tiled loss,
// bf16, and ZeRO-3 through train(). Also: the ring_attention op itself in both chunk layouts
// (zigzag, and the contiguous one autosp-bench --mode ring times) against naive attention over the
// whole sequence, the zigzag layout against hand-written position lists,
// the ring's bytes (CountingCommunicator) against the formula, a windowed model's exchange
// (decision 135: only the keys the window reaches move) against a count over the positions, the
// tails a window needs against every query and key, and the pass's IR. gpt-oss's attention sinks
// under all of it, in f64 and bf16.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "comm/counting.h"
#include "comm/threads.h"
#include "engine/dispatch.h"
#include "engine/ring.h"
#include "common/naive.h"
#include "common/sp_case.h"
#include "graph/builder.h"
#include "graph/passes/autosp/autosp.h"
#include "kernels/cpu/attention.h"
#include "kernels/kernel_test.h"

namespace autosp::test {
namespace {

constexpr int64_t kEos = 3;
constexpr double kTol64 = 1e-10;

json llama(int64_t heads, int64_t kv_heads, int64_t hidden) {
  return {{"arch", "llama"},          {"vocab_size", 64},         {"hidden_size", hidden},
          {"num_hidden_layers", 2},   {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
          {"intermediate_size", 48}};
}

// `model` on P ranks with ring_size `ring` (an integer or "auto"); with `documents`, packed
// documents ending at kEos.
Config ring_config(const json& model, int64_t P, const json& ring, int64_t S, int64_t B, bool documents) {
  json data = {{"seq_len", S}, {"batch_size", B}};
  if (documents)
    data.update({{"source", "tokens"}, {"path", "unused.bin"}, {"eos_token_id", kEos}, {"document_mask", true}});
  return parse_config({{"model", model},
                       {"data", data},
                       {"runtime", {{"dtype", "float64"}, {"threads", 1}}},
                       {"sequence_parallel", {{"autosp_size", P}, {"ring_size", ring}}}});
}

// B rows of S + 1 tokens (labels shifted, about a quarter ignored); with `documents`, documents of
// 1 to 12 tokens ended by kEos and marked like the loader does (doc_start, restarted positions).
Batch ring_batch(int64_t B, int64_t S, uint64_t seed, bool documents) {
  if (!documents) return random_batch(B, S, 64, seed);
  Batch out = documents_batch(B, S, 64, kEos, 12, seed);
  mark_documents(out, kEos);
  return out;
}

void check_close(const LossAndGrads& got, const LossAndGrads& ref, double tol) {
  INFO("loss " << got.loss << " vs P = 1 " << ref.loss);
  CHECK(std::isfinite(ref.loss));
  CHECK(std::abs(got.loss - ref.loss) <= tol * std::abs(ref.loss));
  CHECK(got.grads.size() == ref.grads.size());
  for (const auto& [name, want] : ref.grads) {
    INFO("gradient of " << name);
    auto it = got.grads.find(name);
    CHECK(it != got.grads.end());
    if (it != got.grads.end()) CHECK(rel_err(it->second, want) < tol);
  }
}

// Every rank of a world of `W` threads runs the program of `cfg` on batch(rank) (f64).
std::vector<LossAndGrads> run_ranks(int W, const Config& cfg, const std::function<Batch(int)>& batch,
                                    const ParamMap& params, DType dt = DType::f64) {
  std::vector<LossAndGrads> out(static_cast<size_t>(W));
  run_thread_ranks(W, [&](ThreadCommunicator& w) {
    out[size_t(w.rank())] = run_sp_on(w, cfg, batch(w.rank()), params, dt);
  });
  return out;
}

// dp 2 x sp 2 on 4 ranks: dp rank d = r / 2 reads row d of `batch` (2 rows of S).
std::vector<LossAndGrads> run_dp2(const Config& cfg, const Batch& batch, const ParamMap& params, int64_t S) {
  auto row = [&](const Tensor& t, int64_t d) {
    return t.defined() ? t.as_strided({1, S}, t.strides(), d * S).contiguous() : Tensor();
  };
  return run_ranks(4, cfg, [&](int r) {
    const int64_t d = r / 2;
    return Batch{row(batch.input_ids, d), row(batch.labels, d), row(batch.position_ids, d), row(batch.doc_start, d)};
  }, params);
}

// gpt-oss's sinks spread around 1 (1 + 0.5·(h − 2l) for head h of layer l): init_params' N(0, 0.02)
// would barely move a softmax.
void spread_sinks(ParamMap& params, int layers, int heads) {
  for (int l = 0; l < layers; ++l) {
    Tensor& t = params.at(str("model.layers.", l, ".self_attn.sinks"));
    std::vector<double> v;
    for (int h = 0; h < heads; ++h) v.push_back(1.0 + 0.5 * double(h - 2 * l));
    t = Tensor::from_vector({heads}, v).to(t.dtype());
  }
}

struct RingCase {
  std::string name;
  json model;
  int64_t P;
  json ring;
  int64_t S;
};

TEST_CASE("ring: loss and gradients equal the float64 P = 1 run, with and without packed documents",
          "[threads][ring]") {
  const std::vector<RingCase> cases = {
      {"Ulysses 2 x ring 2, 2 heads", llama(2, 1, 16), 4, 2, 32},
      {"pure ring of 3, GPT-2 with 4 heads", kGpt2, 3, 3, 36},
      {"pure ring of 4, S = 30 (padded to 32)", kLlamaGqa, 4, 4, 30},
      {"auto with 6 heads at P = 4", llama(6, 2, 48), 4, "auto", 32},
  };
  for (const bool documents : {false, true})
    for (const RingCase& c : cases) {
      INFO(c.name << (documents ? ", packed documents" : ""));
      const Config cfg1 = ring_config(c.model, 1, 1, c.S, 2, documents);
      const Config cfg = ring_config(c.model, c.P, c.ring, c.S, 2, documents);
      if (c.ring == "auto") CHECK(cfg.sequence_parallel.ring_size == 2);  // U = 2 divides 6 heads and 2 kv heads
      const ParamMap params = init_params(cfg1.model, 31, DType::f64);
      const Batch batch = ring_batch(2, c.S, 40 + uint64_t(c.S), documents);
      const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
      const Batch padded = pad_to_multiple(batch, 2 * c.P);
      for (const auto& got : run_ranks(int(c.P), cfg, [&](int) { return padded; }, params)) check_close(got, ref, kTol64);
    }
}

TEST_CASE("ring: dp 2 x ring 2 with one head equals the float64 P = 1 run on the global batch", "[threads][ring]") {
  for (const bool documents : {false, true}) {
    INFO((documents ? "packed documents" : "plain"));
    const json model = llama(1, 1, 16);
    const Config cfg1 = ring_config(model, 1, 1, 32, 2, documents), cfg = ring_config(model, 2, 2, 32, 1, documents);
    const ParamMap params = init_params(cfg1.model, 32, DType::f64);
    const Batch global = ring_batch(2, 32, 50, documents);
    const auto got = run_dp2(cfg, global, params, 32);
    const LossAndGrads ref = run_reference(cfg1, global, params, DType::f64);
    for (const auto& g : got) check_close(g, ref, kTol64);
  }
}

// Mistral with sliding_window 5 and 12 (they cut: S = 32) at P = 4 as Ulysses 4, ring 4 (chunks
// of 4 tokens: the window crosses every boundary, and reaches one or three chunks back), Ulysses
// 2 x ring 2 (chunks of 8: w = 5 within one chunk back), ring 4 under activation checkpointing
// (the recomputed forward exchanges again), and dp 2 x ring 2, with and without packed documents
// (a key must be in the window and the document): every rank's loss and gradients equal the
// float64 P = 1 run, whose own windowed attention tests/ref/hf_windows.py checks against
// transformers. The ring moves only what the window reaches (decision 135).
TEST_CASE("ring: a windowed Mistral equals the float64 P = 1 run under Ulysses, ring and dp x sp",
          "[threads][ring][variants]") {
  for (const int64_t window : {5, 12}) {
    for (const bool documents : {false, true}) {
      json model = llama(4, 2, 16);
      model["arch"] = "mistral";
      model["sliding_window"] = window;
      INFO("sliding_window " << window);
      const Config cfg1 = ring_config(model, 1, 1, 32, 2, documents);
      const ParamMap params = init_params(cfg1.model, 33, DType::f64);
      const Batch batch = ring_batch(2, 32, 60, documents);
      const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
      for (const int64_t ring : {1, 4, 2}) {
        INFO("P = 4, ring " << ring << (documents ? ", packed documents" : ""));
        const Config cfg = ring_config(model, 4, ring, 32, 2, documents);
        for (const auto& got : run_ranks(4, cfg, [&](int) { return batch; }, params)) check_close(got, ref, kTol64);
      }
      {
        INFO("ring 4 under activation checkpointing" << (documents ? ", packed documents" : ""));
        Config cfg = ring_config(model, 4, 4, 32, 2, documents);
        cfg.runtime.activation_checkpointing = true;
        for (const auto& got : run_ranks(4, cfg, [&](int) { return batch; }, params)) check_close(got, ref, kTol64);
      }
      INFO("dp 2 x ring 2" << (documents ? ", packed documents" : ""));
      for (const auto& g : run_dp2(ring_config(model, 2, 2, 32, 1, documents), batch, params, 32))
        check_close(g, ref, kTol64);
    }
  }
}

// gpt-oss's attention sinks (model.attention_sinks; decision 175): Ulysses slices each rank's heads'
// sinks and the ring adds exp(sink) once per query, on its own chunk's pair. A Mistral with 4 heads
// and 2 kv heads, full (the whole ring) and with a window of 5 (the windowed exchange), with and
// without packed documents, at P = 4 as Ulysses 4, ring 4, Ulysses 2 x ring 2, ring 4 under
// activation checkpointing, and dp 2 x ring 2, at P = 2 as a pure ring: every rank's loss and
// gradients, the sinks' included, equal the float64 P = 1 run (whose attention
// tests/models/test_model_vs_torch.cpp checks against gpt-oss's eager attention).
TEST_CASE("ring: attention sinks equal the float64 P = 1 run under Ulysses, ring and dp x sp",
          "[threads][ring][variants]") {
  for (const int64_t window : {0, 5}) {
    for (const bool documents : {false, true}) {
      json model = llama(4, 2, 16);
      model.update({{"arch", "mistral"}, {"attention_sinks", true}});
      if (window > 0) model["sliding_window"] = window;
      INFO("sliding_window " << window << (documents ? ", packed documents" : ""));
      const Config cfg1 = ring_config(model, 1, 1, 32, 2, documents);
      ParamMap params = init_params(cfg1.model, 36, DType::f64);
      spread_sinks(params, 2, 4);
      const Batch batch = ring_batch(2, 32, 62, documents);
      const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
      for (const auto& [P, ring] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {4, 4}, {4, 2}, {2, 2}}) {
        INFO("P = " << P << ", ring " << ring);
        const Config cfg = ring_config(model, P, ring, 32, 2, documents);
        for (const auto& got : run_ranks(int(P), cfg, [&](int) { return batch; }, params)) check_close(got, ref, kTol64);
      }
      {
        INFO("ring 4 under activation checkpointing");
        Config cfg = ring_config(model, 4, 4, 32, 2, documents);
        cfg.runtime.activation_checkpointing = true;
        for (const auto& got : run_ranks(4, cfg, [&](int) { return batch; }, params)) check_close(got, ref, kTol64);
      }
      INFO("dp 2 x ring 2");
      for (const auto& g : run_dp2(ring_config(model, 2, 2, 32, 1, documents), batch, params, 32))
        check_close(g, ref, kTol64);
    }
  }
}

// The same sinks in bf16 (at this head dim, 4, the CPU emulates the ring and sdpa: decision 248),
// a windowed Mistral with packed documents at Ulysses 4, Ulysses 2 x ring 2 and as a ring of 4,
// within the bars of the other bf16 tests.
TEST_CASE("ring: attention sinks in bf16 match the P = 1 bf16 run", "[threads][ring][variants]") {
  json model = llama(4, 2, 16);
  model.update({{"arch", "mistral"}, {"sliding_window", 5}, {"attention_sinks", true}});
  const Config cfg1 = ring_config(model, 1, 1, 32, 2, true);
  ParamMap params = init_params(cfg1.model, 37, DType::f32);
  spread_sinks(params, 2, 4);
  const Batch batch = ring_batch(2, 32, 63, true);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::bf16);
  for (const int64_t ring : {1, 2, 4}) {
    INFO("P = 4, ring " << ring);
    for (const auto& got : run_ranks(4, ring_config(model, 4, ring, 32, 2, true), [&](int) { return batch; }, params,
                                     DType::bf16))
      check_equal_bf16(got, ref);
  }
}

// Activation checkpointing recomputes the forward's ring attention (it rings again); the tiled
// loss is token-wise. bf16 (at head dim 8 the CPU emulates the ring: decision 248), within the
// bars of the Ulysses bf16 tests.
TEST_CASE("ring: activation checkpointing with the tiled loss (f64), and bf16, at Ulysses 2 x ring 2",
          "[threads][ring]") {
  const json model = llama(2, 1, 16);
  const Config cfg1 = ring_config(model, 1, 1, 32, 2, true);
  Config cfg = ring_config(model, 4, 2, 32, 2, true);
  cfg.runtime.activation_checkpointing = true;
  cfg.runtime.tiled_loss = true;
  const Batch batch = ring_batch(2, 32, 60, true);
  {
    const ParamMap params = init_params(cfg1.model, 33, DType::f64);
    const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
    for (const auto& got : run_ranks(4, cfg, [&](int) { return batch; }, params)) check_close(got, ref, kTol64);
  }
  const ParamMap params = init_params(cfg1.model, 33, DType::f32);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::bf16);
  for (const auto& got : run_ranks(4, ring_config(model, 4, 2, 32, 2, true), [&](int) { return batch; }, params,
                                   DType::bf16))
    check_equal_bf16(got, ref);
}

// bf16 through the windowed exchange: a Mistral with sliding_window 5 as a ring of 4 with packed
// documents, within the bars of the Ulysses bf16 tests. At its head dim (4) the CPU emulates the
// ring (decision 248: the f32 ring, so the tails and their gradients travel as f32); the test
// below runs a bf16 model's ring on the bf16 kernels.
TEST_CASE("ring: a windowed Mistral in bf16 as a ring of 4 matches the P = 1 bf16 run", "[threads][ring][variants]") {
  json model = llama(4, 2, 16);
  model.update({{"arch", "mistral"}, {"sliding_window", 5}});
  const Config cfg1 = ring_config(model, 1, 1, 32, 2, true), cfg = ring_config(model, 4, 4, 32, 2, true);
  const ParamMap params = init_params(cfg1.model, 35, DType::f32);
  const Batch batch = ring_batch(2, 32, 61, true);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::bf16);
  for (const auto& got : run_ranks(4, cfg, [&](int) { return batch; }, params, DType::bf16)) check_equal_bf16(got, ref);
}

// A bf16 model whose ring runs on the bf16 attention kernels (head dim 32, decisions 247, 248): a
// Mistral with 2 heads of 32, 2 kv heads, sliding_window 5, sinks and packed documents, as a ring
// of 4 and as Ulysses 2 x ring 2, against the P = 1 bf16 run (sdpa on the bf16 kernels), within the
// bars of the other bf16 tests; the run log names no attention op as emulated.
TEST_CASE("ring: a bf16 Mistral at head dim 32 (the ring on the bf16 kernels) matches the P = 1 bf16 run",
          "[threads][ring][variants][bf16]") {
  json model = llama(2, 2, 64);
  model.update({{"arch", "mistral"}, {"sliding_window", 5}, {"attention_sinks", true}});
  const Config cfg1 = ring_config(model, 1, 1, 32, 2, true);
  ParamMap params = init_params(cfg1.model, 38, DType::f32);
  spread_sinks(params, 2, 2);
  const Batch batch = ring_batch(2, 32, 64, true);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::bf16);
  const Config cfg = ring_config(model, 4, 4, 32, 2, true);
  const RankProgram prog = build_program(cfg, DType::bf16, Stage::joint, rank_layout(4, 0, 4, 4));
  int rings = 0;
  for (const auto& n : prog.graph->nodes()) rings += n->op() == Op::ring_attention_backward;
  CHECK(rings == 2);
  if (cpu::bf16_gemm_best() != cpu::Bf16Gemm::f32 && cpu::sdpa_bf16_native(32))
    for (const std::string& op : cpu_bf16_emulated_ops(*prog.graph)) {
      INFO("emulated: " << op);
      CHECK(op.find("attention") == std::string::npos);
    }
  for (const int64_t ring : {4, 2}) {
    INFO("P = 4, ring " << ring);
    for (const auto& got : run_ranks(4, ring_config(model, 4, ring, 32, 2, true), [&](int) { return batch; }, params,
                                     DType::bf16))
      check_equal_bf16(got, ref);
  }
}

TEST_CASE("ring: train() at Ulysses 2 x ring 2 and ZeRO-3 gives the P = 1 loss curve", "[threads][ring]") {
  const json data = {{"source", "synthetic"}, {"seq_len", 30}, {"batch_size", 2}};  // 30: padded to 32
  const json opt = {{"steps", 3}, {"lr", 1e-2}, {"warmup_steps", 1}, {"min_lr", 1e-4}};
  TrainArgs args;
  args.quiet = true;
  auto single = make_single_process_communicator();
  const TrainResult ref = train(make_config(llama(2, 1, 16), 1, data, opt), args, *single);
  REQUIRE(ref.steps.size() == 3);
  std::vector<TrainResult> sp(4);
  run_thread_ranks(4, [&](ThreadCommunicator& w) {
    Config cfg = make_config(llama(2, 1, 16), 4, data, opt);
    cfg.sequence_parallel.ring_size = 2;
    cfg.zero_optimization.stage = 3;
    sp[size_t(w.rank())] = train(cfg, args, w);
  });
  for (const auto& rank : sp) {
    REQUIRE(rank.steps.size() == 3);
    for (size_t k = 0; k < 3; ++k) {
      INFO("step " << k + 1 << ": loss " << rank.steps[k].loss << " vs P = 1 " << ref.steps[k].loss);
      CHECK(std::abs(rank.steps[k].loss - ref.steps[k].loss) < kTol * std::abs(ref.steps[k].loss));
    }
  }
}

double max_abs_diff(const naive::Vec& a, const naive::Vec& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Full-sequence tensors [B, H, S, D] and the expected outputs, against which ring_attention and its
// backward run on R thread ranks (each fed its two chunks of c tokens, layout `layout`, the node's
// attention attributes `attrs`, optionally document starts [B, S] and sinks [N]) are checked rank
// by rank: in f64 to 1e-12; in bf16 (the inputs already bf16 values) within bars that hold for one
// process's bf16 sdpa on the same values, where each result is rounded once (decision 284). The
// ring sums its chunk pairs' o, dq, dk, dv in f32 unrounded, so its errors are one process's:
// measured on the bf16 test's values, the worst relative L2 error of an output 2.57e-3 (one
// process: the same), an element of o 2.85e-3 · (1 + |ref|) (2.96e-3), of dq, dk, dv 1.07e-2
// (the same element, 1.07e-2, in one process: the bf16 products' rounding of P, which sdpa's own
// tests' 1e-2 does not meet on these values), dsinks 4.5e-3. Rounding each pair's results to bf16
// before the sum (as CUDA does) measured 3.09e-3, 4.01e-3, 1.17e-2 and 7.8e-3: the bars below
// (L2 2.8e-3, o 3.5e-3, dsinks 6e-3) fail it; the element bar of the gradients does not tell
// the two apart (1.25e-2, sdpa's 1e-2 with room for that one element).
struct RingOpCase {
  int64_t B, N, Nkv, D, c, R;
  double scale;
  std::string layout;
  AttentionAttrs attrs;
  naive::Vec q, k, v, dout, want_o, want_dq, want_dk, want_dv;
  std::vector<int64_t> docs = {};           // [B, S] global positions, or none
  naive::Vec sinks = {}, want_dsinks = {};  // [N], or none
};

// Rows of x [B, H, S, w] → ring rank r's [B, H, L, w]: its two chunks side by side.
template <class V>
V local_rows(const RingOpCase& t, const V& x, int64_t H, int64_t r, int64_t w) {
  const int64_t S = 2 * t.R * t.c, c = t.c;
  const RankChunks ch = ring_rank_chunks(r, t.R, t.layout == "zigzag" ? RingLayout::zigzag : RingLayout::contiguous);
  V out;
  for (int64_t bh = 0; bh < t.B * H; ++bh)
    for (int64_t chunk : {ch.first, ch.second})
      out.insert(out.end(), x.begin() + (bh * S + chunk * c) * w, x.begin() + (bh * S + chunk * c + c) * w);
  return out;
}

// A rank's ring op and its backward in `dt`: inputs q, k, v, dout (, docs) (, sinks), outputs o,
// dq, dk, dv (, dsinks).
void build_ring_op(Graph& g, const RingOpCase& t, DType dt) {
  const int64_t B = t.B, N = t.N, Nkv = t.Nkv, D = t.D, R = t.R, L = 2 * t.c;
  Builder b(g);
  Node* qn = b.input("q", dt, {B, N, L, D}, Role::none);
  Node* kn = b.input("k", dt, {B, Nkv, L, D}, Role::none);
  Node* vn = b.input("v", dt, {B, Nkv, L, D}, Role::none);
  Node* dn = b.input("dout", dt, {B, N, L, D}, Role::none);
  Node* docs = t.docs.empty() ? nullptr : b.input("docs", DType::i64, {B, L}, Role::none);
  Node* sinks = t.sinks.empty() ? nullptr : b.input("sinks", dt, {N}, Role::none);
  Node* o = b.ring_attention(qn, kn, vn, true, t.scale, "ring", R, "o", docs, sinks);
  Node* dq = b.ring_attention_backward(qn, kn, vn, o, b.output(o, 1, "lse"), dn, true, t.scale, "ring", R, "dq", docs,
                                       sinks);
  for (Node* n : {o, dq}) {
    n->attrs().set("layout", t.layout);
    set_attention_attrs(n, t.attrs);
  }
  for (Node* out : {o, dq, b.output(dq, 1, "dk"), b.output(dq, 2, "dv")}) g.add_output(out);
  if (sinks) g.add_output(b.output(dq, 3, "dsinks"));
}

// Each rank's outputs o, dq, dk, dv (and dsinks) of the ring op in `dt`.
std::vector<TensorMap> run_ring_op(const RingOpCase& t, DType dt) {
  const int64_t B = t.B, N = t.N, Nkv = t.Nkv, D = t.D, L = 2 * t.c;
  Graph g;
  build_ring_op(g, t, dt);
  std::vector<TensorMap> got(static_cast<size_t>(t.R));
  run_thread_ranks(int(t.R), [&](ThreadCommunicator& w) {
    const int64_t r = w.rank();
    const auto in = [&](const naive::Vec& x, int64_t H) {
      return Tensor::from_vector({B, H, L, D}, local_rows(t, x, H, r, D)).to(dt);
    };
    TensorMap feeds{{"q", in(t.q, N)}, {"k", in(t.k, Nkv)}, {"v", in(t.v, Nkv)}, {"dout", in(t.dout, N)}};
    if (!t.docs.empty()) feeds.emplace("docs", Tensor::from_vector({B, L}, local_rows(t, t.docs, 1, r, 1)));
    if (!t.sinks.empty()) feeds.emplace("sinks", Tensor::from_vector({N}, t.sinks).to(dt));
    got[size_t(r)] = Executor(g).run(feeds, {{"ring", &w}}).outputs;
  });
  return got;
}

// The ranks' o as the whole sequence's [B, N, S, D] (the inverse of local_rows).
naive::Vec gather_o(const RingOpCase& t, const std::vector<TensorMap>& got) {
  const int64_t S = 2 * t.R * t.c;
  naive::Vec whole(size_t(t.B * t.N * S * t.D));
  for (int64_t r = 0; r < t.R; ++r) {
    naive::Vec positions(size_t(t.B * t.N * S * t.D));
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = double(i);
    const naive::Vec at = local_rows(t, positions, t.N, r, t.D), o = got[size_t(r)].at("o").to_doubles();
    for (size_t i = 0; i < at.size(); ++i) whole[size_t(at[i])] = o[i];
  }
  return whole;
}

// `got` (run_ring_op's in `dt`; run here when null) against the case's expected outputs.
void check_ring_op(const RingOpCase& t, DType dt = DType::f64, const std::vector<TensorMap>* outputs = nullptr) {
  const std::vector<TensorMap> got = outputs ? *outputs : run_ring_op(t, dt);
  const auto check = [&](const Tensor& out, const naive::Vec& want, bool is_o) {
    CHECK(out.dtype() == dt);
    const naive::Vec x = out.to_doubles();
    if (dt == DType::f64) {
      CHECK(max_abs_diff(x, want) < 1e-12);
      return;
    }
    test::check_close(x, want, is_o ? 3.5e-3 : 1.25e-2);
    INFO("relative L2 error");
    CHECK(test::relative_l2(x, want) <= 2.8e-3);
  };
  for (int64_t r = 0; r < t.R; ++r) {
    INFO("ring rank " << r);
    const TensorMap& out = got[size_t(r)];
    for (const auto& [name, want, H] : {std::tuple{"o", &t.want_o, t.N}, {"dq", &t.want_dq, t.N},
                                        {"dk", &t.want_dk, t.Nkv}, {"dv", &t.want_dv, t.Nkv}}) {
      INFO(name);
      check(out.at(name), local_rows(t, *want, H, r, t.D), std::string(name) == "o");
    }
  }
  if (t.sinks.empty()) return;
  // dsinks: each rank's own rows' share (a model all-reduces them), summed over the ranks.
  naive::Vec dsinks(t.sinks.size(), 0.0);
  for (const TensorMap& out : got) {
    CHECK(out.at("dsinks").dtype() == dt);
    const naive::Vec x = out.at("dsinks").to_doubles();
    for (size_t h = 0; h < x.size(); ++h) dsinks[h] += x[h];
  }
  INFO("dsinks summed over the ranks");
  if (dt == DType::f64) CHECK(max_abs_diff(dsinks, t.want_dsinks) < 1e-12);
  else test::check_close(dsinks, t.want_dsinks, 6e-3);
}

// The ring_attention op and its backward on R thread ranks, each holding its two chunks of the
// sequence in `layout` (engine/ring.h), against naive float64 attention over the whole sequence:
// every rank's o, dq and its chunks' dk, dv. GQA (4 query heads, 2 KV heads), causal, B = 2.
TEST_CASE("ring: ring_attention in the zigzag and the contiguous layout equals attention over the whole sequence",
          "[threads][ring]") {
  const int64_t B = 2, N = 4, Nkv = 2, D = 3, c = 3;
  for (const int64_t R : {2, 3}) {
    for (const std::string layout : {"zigzag", "contiguous"}) {
      INFO("R = " << R << ", " << layout);
      const int64_t S = 2 * R * c;
      RingOpCase t{B, N, Nkv, D, c, R, 0.4, layout, {}, naive::random_normal(B * N * S * D, 1),
                   naive::random_normal(B * Nkv * S * D, 2), naive::random_normal(B * Nkv * S * D, 3),
                   naive::random_normal(B * N * S * D, 4), {}, {}, {}, {}};
      t.want_o = naive::sdpa(t.q, t.k, t.v, B, N, Nkv, S, S, D, t.scale, true);
      naive::sdpa_backward(t.q, t.k, t.v, t.dout, B, N, Nkv, S, S, D, t.scale, true, t.want_dq, t.want_dk, t.want_dv);
      check_ring_op(t);
    }
  }
}

// A sliding window (with a softcap) that crosses the chunk boundaries: ring_attention at R = 2 and
// 4 in the zigzag layout equals the float64 CPU kernel over the whole sequence (itself checked
// against a naive attention in tests/kernels/test_attention_variants.cpp), forward and backward.
// The window cuts: w = 5 < S; with w = 2 some chunk pairs are skipped outright, and with w = 1
// (each query sees itself) no rank needs anything of another: the windowed exchange has no round.
TEST_CASE("ring: a sliding window across chunk boundaries equals the whole sequence's windowed attention",
          "[threads][ring][variants]") {
  const int64_t B = 2, N = 2, Nkv = 1, D = 3, c = 3;
  for (const int64_t R : {2, 4})
    for (const int64_t window : {1, 2, 5, 9}) {
      INFO("R = " << R << ", window " << window);
      const int64_t S = 2 * R * c;
      RingOpCase t{B, N, Nkv, D, c, R, 0.4, "zigzag", {window, 3.0}, naive::random_normal(B * N * S * D, 11),
                   naive::random_normal(B * Nkv * S * D, 12), naive::random_normal(B * Nkv * S * D, 13),
                   naive::random_normal(B * N * S * D, 14), {}, {}, {}, {}};
      const AttentionVariant<double> var{.window = window, .softcap = 3.0};
      naive::Vec lse(size_t(B * N * S));
      t.want_o.resize(t.q.size()), t.want_dq.resize(t.q.size()), t.want_dk.resize(t.k.size()), t.want_dv.resize(t.v.size());
      cpu::sdpa_forward<double>(t.q.data(), t.k.data(), t.v.data(), t.want_o.data(), lse.data(), B, N, Nkv, S, S, D,
                                t.scale, true, nullptr, var);
      cpu::sdpa_backward<double>(t.q.data(), t.k.data(), t.v.data(), t.want_o.data(), lse.data(), t.dout.data(),
                                 t.want_dq.data(), t.want_dk.data(), t.want_dv.data(), B, N, Nkv, S, S, D, t.scale,
                                 true, nullptr, nullptr, var);
      check_ring_op(t);
      // The window changes the answer (full causal attention differs).
      CHECK(max_abs_diff(t.want_o, naive::sdpa(t.q, t.k, t.v, B, N, Nkv, S, S, D, t.scale, true)) > 1e-3);
    }
}

// The bf16 ring (engine/cpu/launchers.cpp ring_attention_bf16: each chunk pair on the bf16
// attention kernels with f32 outputs, the running output, log-sum-exp and gradients in f32, each
// result rounded once) at R = 2 and 4 in the zigzag layout: causal, with windows that cross the
// chunk boundaries (5 < c, 11 > c, with a softcap), packed documents and sinks, against the
// float64 CPU kernel over the whole sequence on the same (bf16) values (itself checked against a
// naive attention in tests/kernels/test_attention_variants.cpp), forward and backward, within
// one process's bars (check_ring_op). Where the CPU has the bf16 attention and prefers it (head dim 32: sdpa_bf16_preferred),
// the ring runs on it: its bits differ from the emulation's (the f32 ring on the widened values,
// each result rounded), which runs elsewhere and at head dim 16.
TEST_CASE("ring: bf16 ring_attention on the bf16 attention kernels matches the float64 attention",
          "[threads][ring][variants][bf16]") {
  const int64_t B = 2, N = 4, Nkv = 2, c = 8;
  struct Variant {
    const char* name;
    AttentionAttrs attrs;
    bool docs, sinks;
  };
  const Variant variants[] = {{"causal", {}, false, false},
                              {"window 5", {5, 0}, false, false},
                              {"window 11, softcap 3", {11, 3.0}, false, false},
                              {"documents", {}, true, false},
                              {"sinks", {}, false, true},
                              {"window 5, documents and sinks", {5, 0}, true, true}};
  if (!cpu::sdpa_bf16_preferred(32) || cpu::bf16_gemm_best() == cpu::Bf16Gemm::f32)
    WARN("SKIPPED: the bf16 attention kernels (this CPU has no bf16 GEMM path); checking the emulation");
  const auto bf16 = [](const naive::Vec& x) { return naive::map(x, naive::round_bf16); };
  for (const int64_t D : {32, 16})
    for (const int64_t R : {2, 4})
      for (const Variant& var : variants) {
        INFO("D = " << D << ", R = " << R << ", " << var.name);
        const bool native = D >= 32 && cpu::sdpa_bf16_native(D) && cpu::bf16_gemm_best() != cpu::Bf16Gemm::f32;
        const int64_t S = 2 * R * c;
        // The bf16 sdpa tests' inputs: q of deviation 2, the rest 1, scale 1/√D (logits of deviation 2).
        RingOpCase t{B, N, Nkv, D, c, R, 1 / std::sqrt(double(D)), "zigzag", var.attrs,
                     bf16(naive::random_normal(B * N * S * D, 21, 2.0)),
                     bf16(naive::random_normal(B * Nkv * S * D, 22)), bf16(naive::random_normal(B * Nkv * S * D, 23)),
                     bf16(naive::random_normal(B * N * S * D, 24)), {}, {}, {}, {}};
        if (var.docs)  // documents of 1 to 11 tokens, a different cut in each row
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0, start = 0; i < S; ++i) {
              if ((i * 7 + b * 3) % 11 == 0) start = i;
              t.docs.push_back(start);
            }
        if (var.sinks) t.sinks = {1.0, 1.5, 0.5, 2.0}, t.want_dsinks.assign(size_t(N), 0.0);
        const AttentionVariant<double> v{.window = var.attrs.window, .softcap = var.attrs.softcap,
                                         .sinks = var.sinks ? t.sinks.data() : nullptr,
                                         .dsinks = var.sinks ? t.want_dsinks.data() : nullptr};
        naive::Vec lse(size_t(B * N * S));
        t.want_o.resize(t.q.size()), t.want_dq.resize(t.q.size());
        t.want_dk.resize(t.k.size()), t.want_dv.resize(t.v.size());
        const int64_t* docs = var.docs ? t.docs.data() : nullptr;
        cpu::sdpa_forward<double>(t.q.data(), t.k.data(), t.v.data(), t.want_o.data(), lse.data(), B, N, Nkv, S, S, D,
                                  t.scale, true, docs, v);
        // The backward reads o as the ring stored it (bf16), as the bf16 sdpa tests' reference does.
        const std::vector<TensorMap> got = run_ring_op(t, DType::bf16);
        const naive::Vec o_seen = gather_o(t, got);
        cpu::sdpa_backward<double>(t.q.data(), t.k.data(), t.v.data(), o_seen.data(), lse.data(), t.dout.data(),
                                   t.want_dq.data(), t.want_dk.data(), t.want_dv.data(), B, N, Nkv, S, S, D, t.scale,
                                   true, docs, nullptr, v);
        check_ring_op(t, DType::bf16, &got);
        // Which path ran, by the bits of every rank's o (the backward's differ anyway: the f32
        // ring's reads an unrounded o).
        const std::vector<TensorMap> wide = run_ring_op(t, DType::f32);
        bool same = true;
        for (int64_t r = 0; r < R; ++r) {
          const Tensor x = got[size_t(r)].at("o"), e = wide[size_t(r)].at("o").to(DType::bf16);
          same = same && std::equal(x.data<uint16_t>(), x.data<uint16_t>() + x.numel(), e.data<uint16_t>());
        }
        CHECK(same == !native);
      }
}

// A bf16 program's ring attention and its backward run on the bf16 attention kernels wherever its
// sdpa does (the CPU has a bf16 GEMM path, the head dim is at least 32): the run log's emulated
// ops (engine/dispatch.h cpu_bf16_emulated_ops) name them exactly where they name sdpa.
TEST_CASE("ring: the dispatch runs bf16 ring attention natively where it runs bf16 sdpa natively", "[ring][bf16]") {
  for (const int64_t D : {32, 16}) {
    INFO("head dim " << D);
    Graph g;
    RingOpCase t{1, 2, 2, D, 4, 2, 0.3, "zigzag", {5, 0}, {}, {}, {}, {}, {}, {}, {}, {}};
    t.docs.assign(8, 0), t.sinks = {1.0, 2.0};
    build_ring_op(g, t, DType::bf16);
    Builder b(g);
    Node* q = b.input("q2", DType::bf16, {1, 2, 8, D}, Role::none);
    g.add_output(b.sdpa(q, q, q, true, 0.3));
    const std::vector<std::string> ops = cpu_bf16_emulated_ops(g);
    const auto emulated = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
    const bool native = cpu::bf16_gemm_best() != cpu::Bf16Gemm::f32 && D >= 32 && cpu::sdpa_bf16_native(D);
    CHECK(emulated("sdpa") == !native);
    CHECK(emulated("ring_attention") == !native);
    CHECK(emulated("ring_attention_backward") == !native);
    CHECK(ops.size() == (native ? 0u : 3u));
  }
}

// The positions each rank holds, written out by hand from the zigzag rule (ring rank ρ of R holds
// chunks ρ and 2R-1-ρ of 2R; its U Ulysses ranks split those two chunks side by side).
std::vector<int64_t> positions(int64_t P, int64_t R, int64_t r, int64_t S) {
  std::vector<int64_t> out;
  for (const auto& [a, b] : zigzag_units(P, R, r))
    for (int64_t t = a * S / (2 * P); t < b * S / (2 * P); ++t) out.push_back(t);
  return out;
}

TEST_CASE("ring: the zigzag layout against hand-written position lists", "[ring]") {
  using V = std::vector<int64_t>;
  // P = 4, U 2 x R 2, S = 16: chunks of 4; ring rank 0 holds chunks 0, 3; ring rank 1 chunks 1, 2.
  CHECK(positions(4, 2, 0, 16) == V{0, 1, 2, 3});
  CHECK(positions(4, 2, 1, 16) == V{12, 13, 14, 15});
  CHECK(positions(4, 2, 2, 16) == V{4, 5, 6, 7});
  CHECK(positions(4, 2, 3, 16) == V{8, 9, 10, 11});
  // P = 3, pure ring, S = 12: chunks of 2; rank r holds chunks r and 5 - r.
  CHECK(positions(3, 3, 0, 12) == V{0, 1, 10, 11});
  CHECK(positions(3, 3, 1, 12) == V{2, 3, 8, 9});
  CHECK(positions(3, 3, 2, 12) == V{4, 5, 6, 7});
  // P = 6, U 3 x R 2, S = 12: chunks of 3 (ring rank 0: 0-2 and 9-11); the middle Ulysses rank
  // takes the end of one chunk and the start of the other.
  CHECK(positions(6, 2, 0, 12) == V{0, 1});
  CHECK(positions(6, 2, 1, 12) == V{2, 9});
  CHECK(positions(6, 2, 2, 12) == V{10, 11});
  CHECK(positions(6, 2, 4, 12) == V{5, 6});
  // Every layout covers the sequence once.
  for (const auto& [P, R] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {4, 4}, {6, 2}, {6, 3}, {8, 2}}) {
    std::vector<int> seen(size_t(4 * P), 0);
    for (int64_t r = 0; r < P; ++r)
      for (int64_t t : positions(P, R, r, 4 * P)) ++seen[size_t(t)];
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

// Per layer, forward: R - 1 K/V blocks; backward: R - 1 K/V blocks and R dK/dV blocks back to
// their owners. A block is K and V of the local sequence at the Ulysses-local KV width:
// 2 · B · Nkv_local · (S / R) · D elements.
TEST_CASE("ring: CountingCommunicator counts the ring's bytes as the formula says", "[threads][ring]") {
  struct Shape {
    json model;
    int64_t P, R, kv_local, D;
  };
  for (const Shape& s : {Shape{llama(1, 1, 16), 2, 2, 1, 16}, Shape{llama(2, 1, 16), 4, 2, 1, 8},
                         Shape{llama(4, 2, 32), 4, 4, 2, 8}}) {
    const int64_t B = 2, S = 32, L = 2;
    const Config cfg = ring_config(s.model, s.P, s.R, S, B, false);
    const ParamMap params = init_params(cfg.model, 34, DType::f64);
    const Batch batch = ring_batch(B, S, 70, false);
    std::vector<CollectiveStats> stats(size_t(s.P));
    run_thread_ranks(int(s.P), [&](ThreadCommunicator& w) {
      CountingCommunicator counted(w);
      (void)run_sp_on(counted, cfg, batch, params, DType::f64);
      stats[size_t(w.rank())] = counted.stats().send_recv;
    });
    const int64_t block = 2 * B * s.kv_local * (S / s.R) * s.D * int64_t(sizeof(double));
    INFO("P = " << s.P << ", R = " << s.R);
    for (const auto& st : stats) {
      CHECK(st.calls == L * (3 * s.R - 2));
      CHECK(st.bytes == L * (3 * s.R - 2) * block);
    }
  }
}

// With a sliding window the ring moves only what the window reaches (decision 135). A pure ring
// of 4 on S = 32 has chunks of c = 4 tokens (rank r: chunks r and 7 - r). With w = 4, a query
// reaches back 3 keys, so rank r needs the last 3 keys of chunk r - 1 (rank r - 1's first chunk)
// and of chunk 8 - r (rank r + 1's second chunk; rank 3's late chunk 4 follows its own chunk 3):
// per layer two rounds (d = 1 and d = 3; nobody needs anything of the rank two away), each
// moving one tail of 3 keys, 2 · B · Nkv · 3 · D elements, to a rank that needs it. The end ranks
// 0 and 3 send one tail per round pair, the middle ones two. Backward: the same K/V again, and
// every tail's dK, dV back to its owner (as many as the rank received: 1, 2, 2, 1). So per layer
// 2 + 4 calls and 3 · tails · tail bytes. With w = 9 (> 2c) the window reaches 8 keys back: two
// chunks and a tail; the bytes are counted from the same rule by a loop over the positions.
// Either way, below the full ring's (3R - 2) blocks of 2 · B · Nkv · 8 · D elements (with w = 4,
// less than a quarter).
TEST_CASE("ring: with a window, each rank moves only the keys the window reaches", "[threads][ring][variants]") {
  const int64_t B = 2, S = 32, L = 2, R = 4, c = 4, D = 8, Nkv = 2;
  for (const int64_t w : {4, 9}) {
    json model = llama(4, 2, 32);
    model.update({{"arch", "mistral"}, {"sliding_window", w}});
    const Config cfg = ring_config(model, R, R, S, B, false);
    const ParamMap params = init_params(cfg.model, 34, DType::f64);
    const Batch batch = ring_batch(B, S, 70, false);
    std::vector<CollectiveStats> stats(static_cast<size_t>(R));
    run_thread_ranks(int(R), [&](ThreadCommunicator& wc) {
      CountingCommunicator counted(wc);
      (void)run_sp_on(counted, cfg, batch, params, DType::f64);
      stats[size_t(wc.rank())] = counted.stats().send_recv;
    });
    // Keys of rank o's chunks that rank r's queries see through the window, position by position.
    auto chunk_of = [&](int64_t t) { return t / c; };
    auto owner = [&](int64_t chunk) { return chunk < R ? chunk : 2 * R - 1 - chunk; };
    auto keys_sent = [&](int64_t o, int64_t r) {  // distinct (chunk, first key needed) -> key count
      int64_t n = 0;
      for (int64_t chunk = 0; chunk < 2 * R; ++chunk) {
        if (owner(chunk) != o) continue;
        int64_t first = c;  // the earliest key of this chunk any query of rank r sees
        for (int64_t qi = 0; qi < S; ++qi)
          if (owner(chunk_of(qi)) == r)
            for (int64_t kj = chunk * c; kj < chunk * c + c; ++kj)
              if (kj <= qi && kj > qi - w) first = std::min(first, kj - chunk * c);
        n += c - first;
      }
      return n;
    };
    const int64_t row = 2 * B * Nkv * D * int64_t(sizeof(double));  // K and V of one key
    const int64_t ring_bytes = L * (3 * R - 2) * 2 * B * Nkv * (S / R) * D * int64_t(sizeof(double));
    for (int64_t r = 0; r < R; ++r) {
      int64_t sent = 0, returned = 0, rounds = 0;
      for (int64_t d = 1; d < R; ++d) {
        bool any = false;
        for (int64_t x = 0; x < R; ++x) any = any || keys_sent((x - d + R) % R, x) > 0;
        rounds += any;
        sent += keys_sent(r, (r + d) % R);
        returned += keys_sent((r - d + R) % R, r);
      }
      INFO("w = " << w << ", ring rank " << r << ": " << stats[size_t(r)].bytes << " bytes vs the full ring's "
                  << ring_bytes);
      CHECK(stats[size_t(r)].calls == L * 3 * rounds);
      CHECK(stats[size_t(r)].bytes == L * (2 * sent + returned) * row);
      CHECK(stats[size_t(r)].bytes < ring_bytes);
      if (w == 4) {
        CHECK(rounds == 2);
        CHECK(sent == (r == 0 || r == R - 1 ? 3 : 6));
        CHECK(stats[size_t(r)].bytes * 4 < ring_bytes);  // 18 keys' K, V at most, against 80
      }
    }
  }
}

// What a ring rank needs of another (RingChunks::tails) against a loop over the positions: for
// every pair of ranks of rings of 2 to 5, chunk lengths 1 to 5 and windows 1 to 2S.
TEST_CASE("ring: the tails a window needs, against every query and key position", "[ring]") {
  for (int64_t R = 2; R <= 5; ++R)
    for (int64_t c = 1; c <= 5; ++c)
      for (int64_t w = 1; w <= 4 * R * c; ++w) {
        const int64_t S = 2 * R * c;
        RingChunks g{1, 1, 1, c, 1, true, {}, {}, nullptr, RingLayout::zigzag, R, w};
        for (int o = 0; o < R; ++o)
          for (int r = 0; r < R; ++r) {
            const RankChunks oc = g.chunks_of(o), rc = g.chunks_of(r);
            std::vector<ChunkTail> want;
            for (int b = 0; b < 2; ++b) {
              const int64_t kb = b == 0 ? oc.first : oc.second;
              int64_t first = c;
              for (int64_t qi = 0; qi < S; ++qi) {
                if (qi / c != rc.first && qi / c != rc.second) continue;
                for (int64_t kj = kb * c; kj < kb * c + c; ++kj)
                  if (kj <= qi && kj > qi - w) first = std::min(first, kj - kb * c);
              }
              if (o == r) first = 0;  // a rank's own block is whole
              if (first < c) want.push_back({b, c - first});
            }
            INFO("R = " << R << ", c = " << c << ", w = " << w << ", rank " << r << " of rank " << o);
            CHECK(g.tails(o, r) == want);
            if (g.tails(o, r) != want) return;
          }
      }
}

TEST_CASE("ring: the rank's graph has ring attention over the ring, all-to-alls over the Ulysses group",
          "[ring]") {
  const Config cfg = ring_config(llama(2, 1, 16), 4, 2, 32, 2, true);
  const RankProgram prog = build_program(cfg, DType::f32, "insert_ring_attention", rank_layout(4, 1, 4, 2));
  int rings = 0;
  for (const auto& n : prog.graph->nodes()) {
    CHECK(n->op() != Op::sdpa);
    if (n->op() == Op::ring_attention) {
      ++rings;
      CHECK(n->attrs().s("group") == "ring");
      CHECK(n->attrs().i("group_size") == 2);
      CHECK(n->inputs().size() == 4);  // q, k, v, doc_start
    }
    if (n->op() == Op::all_to_all) CHECK(n->attrs().s("group") == "ulysses");
  }
  CHECK(rings == 2);
}

}  // namespace
}  // namespace autosp::test
