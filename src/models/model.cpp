// The two graph builders, GPT-2's and the Llama family's (Llama, Mistral, Qwen2, Qwen3 and the
// mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE, whose sparse MLPs models/moe.h records), each reading
// the family row (models/family.h) for what its members change. Shapes: B = batch,
// S = sequence, C = hidden, N = heads, Nkv = key/value heads, D = head dim, V = vocab, I = MLP width.
#include "models/model.h"

#include <cmath>
#include <random>

#include "graph/builder.h"
#include "models/moe.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp {
namespace {

// T: the cached positions a decode step attends to besides its own (ForwardMode::decode).
const Dim B = Dim::sym("B"), S = Dim::sym("S"), T = Dim::sym("T");

// v as a value of dtype dt holds it (torch.tensor(v, dtype=dt)).
double round_to(double v, DType dt) {
  switch (dt) {
    case DType::f32: return static_cast<float>(v);
    case DType::bf16: return cpu::bf16_to_f32(cpu::f64_to_bf16(v));
    case DType::f16: return cpu::f16_to_f32(cpu::f32_to_f16(static_cast<float>(v)));
    default: return v;
  }
}

std::string gpt2_layer(int64_t l) { return "transformer.h." + std::to_string(l) + "."; }
std::string llama_layer(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

struct Inputs {
  Node *ids, *pos, *labels;  // labels: training only
  Node* doc_start;  // packed documents: [B, S] where each token's document begins; nullptr without
};

Inputs make_inputs(Builder& b, ForwardMode mode, bool document_mask) {
  AUTOSP_ASSERT(!document_mask || mode == ForwardMode::train, "a document mask is for training graphs");
  Node* ids = b.input("input_ids", DType::i64, {B, S}, Role::input_ids);
  Node* pos = b.input("position_ids", DType::i64, {B, S}, Role::position_ids);
  Node* labels = mode == ForwardMode::train ? b.input("labels", DType::i64, {B, S}, Role::labels) : nullptr;
  Node* doc_start = document_mask ? b.input("doc_start", DType::i64, {B, S}, Role::doc_start) : nullptr;
  return {ids, pos, labels, doc_start};
}

// The attention of one layer for the mode: training and prefill attend causally over the
// sequence's own K, V [B, Nkv, S, D]; decode over the cache ++ its own, [B, Nkv, T + S, D], with no
// mask (its S = 1 query may see every cached key); training with packed documents also keeps each
// query inside its document (doc_start). Generation modes output K, V as the layer's
// present cache (a decode step: the cache it was given plus its own positions). `variant`: the
// layer's sliding window (graph/builder.h AttentionAttrs; bottom-right aligned, so a decode step's
// window counts back from its own position too). `sinks` [N]: gpt-oss's per-head sink logits.
Node* attend(Builder& b, ForwardMode mode, int64_t l, Node* q, Node* k, Node* v, int64_t Nkv, int64_t D,
             DType dt, Node* doc_start, const AttentionAttrs& variant = {}, double scale = 0, Node* sinks = nullptr) {
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (mode == ForwardMode::train) return b.sdpa(q, k, v, true, scale, "attn", doc_start, variant, sinks);
  Graph& g = b.graph();
  if (mode == ForwardMode::decode) {
    Node* past_k = b.input(kv_past_name(l, false), dt, {B, Nkv, T, D}, Role::none);
    Node* past_v = b.input(kv_past_name(l, true), dt, {B, Nkv, T, D}, Role::none);
    k = b.concat({past_k, k}, 2, "present_k");
    v = b.concat({past_v, v}, 2, "present_v");
  } else {
    k = b.reshape(k, {B, Nkv, S, D}, "present_k");
    v = b.reshape(v, {B, Nkv, S, D}, "present_v");
  }
  g.add_output(k);
  g.add_output(v);
  return b.sdpa(q, k, v, mode == ForwardMode::prefill, scale, "attn", nullptr, variant, sinks);
}

// [B, S, H·D] → [B, H, S, D]
Node* to_heads(Builder& b, Node* x, int64_t heads, int64_t D, const std::string& name) {
  return b.transpose(b.reshape(x, {B, S, heads, D}, name + ".view"), 1, 2, name);
}
// [B, N, S, D] → [B, S, N·D]
Node* from_heads(Builder& b, Node* x, int64_t N, int64_t D, const std::string& name) {
  return b.reshape(b.transpose(x, 1, 2, name + ".t"), {B, S, N * D}, name);
}

// The DPO loss (GraphOptions::dpo_slots; K = slots pairs per sequence) over the policy's sums: from
// `logits` [B, S, V] (the head's, an output), or when it is null (the tiled loss) from x [B, S, C]
// and the head through the tiled head's DPO form, with no logits (capped by `softcap` > 0 there).
Node* dpo_loss(Builder& b, Node* x, Node* head, Node* logits, Node* labels, DType dtype, const GraphOptions& opt,
               double softcap) {
  Graph& g = b.graph();
  const Dim K(opt.dpo_slots);
  Node* slots = b.input("pair_slots", DType::i64, {B, S}, Role::pair_ids);
  Node* ref = b.input("ref_logps", dtype, {B, Dim(2), K}, Role::none);
  Node* tokens = b.input("seq_tokens", dtype, {B, Dim(2), K}, Role::none);
  Node* norms = b.input("dpo_norms", dtype, {Dim(2)}, Role::none);
  Node* policy = logits ? b.sequence_logps(logits, labels, slots, opt.dpo_slots, "sequence_logps")
                        : b.linear_sequence_logps(x, head, labels, slots, opt.dpo_slots, "sequence_logps");
  if (!logits && softcap > 0) policy->attrs().set("softcap", softcap);
  g.add_output(policy);
  return b.dpo_loss(policy, ref, tokens, norms, opt.dpo, "loss");
}

// The head and the token-mean loss over x [B, S, C] (after the final norm) and head [V, C]: the
// logits x · headᵀ as an output, or with `tiled` one linear_cross_entropy_sum (no logits; its
// argmax "predictions" [B, S] is the output instead); with opt.dpo_slots the DPO loss instead (tiled
// or not). softcap > 0 (Gemma's final_logit_softcapping): the logits are softcap · tanh(logits /
// softcap); the tiled loss caps each chunk of logits itself (its softcap attribute).
// Generation graphs output the logits only.
//
// `aux` (training with model.output_router_logits): the weighted load-balancing term
// (models/moe.h), added to the token-mean loss: loss = add(lm_loss, aux), as transformers adds it.
void finish(Builder& b, ForwardMode mode, Node* x, Node* head, Node* labels, DType dtype, const GraphOptions& opt,
            double softcap = 0, Node* aux = nullptr) {
  Graph& g = b.graph();
  b.set_prefix("");
  const bool tiled = opt.tiled_loss;
  auto head_logits = [&] {
    Node* logits = b.matmul(x, head, false, true, softcap > 0 ? "raw_logits" : "logits");
    if (softcap > 0) logits = b.scale(b.tanh(b.scale(logits, 1.0 / softcap, "capped"), "capped_tanh"), softcap, "logits");
    return logits;
  };
  Node* sum = nullptr;
  if (mode == ForwardMode::train && opt.dpo_slots > 0) {
    Node* logits = nullptr;
    if (!tiled) {
      logits = head_logits();
      logits->set_role(Role::logits);
      g.add_output(logits);
    }
    Node* loss = dpo_loss(b, x, head, logits, labels, dtype, opt, softcap);
    loss->set_role(Role::loss);
    g.add_output(loss);
    return;
  }
  if (mode == ForwardMode::train && tiled) {
    sum = b.linear_cross_entropy_sum(x, head, labels, "loss_sum");
    if (softcap > 0) sum->attrs().set("softcap", softcap);
    g.add_output(b.output(sum, 1, "predictions"));
  } else {
    Node* logits = head_logits();
    logits->set_role(Role::logits);
    g.add_output(logits);
    if (mode != ForwardMode::train) return;
    sum = b.cross_entropy_sum(logits, labels, "loss_sum");
  }
  Node* count = b.count_valid(labels, dtype, "valid_tokens");
  Node* loss = b.div(sum, count, aux ? "lm_loss" : "loss");
  if (aux) loss = b.add(loss, aux, "loss");
  loss->set_role(Role::loss);
  g.add_output(loss);
}

std::unique_ptr<Graph> build_gpt2(const ModelConfig& m, DType dt, ForwardMode mode, const GraphOptions& opt) {
  const Family& f = family(m.arch);
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  const int64_t C = m.hidden_size, N = m.num_attention_heads, D = m.head_dim(), V = m.vocab_size;
  auto in = make_inputs(b, mode, opt.document_mask);
  auto p = [&](const std::string& name, SymShape s) { return b.parameter(name, dt, std::move(s)); };
  // Parameters are created right before their first use, in a fixed order (argument evaluation
  // order is unspecified in C++, so every node is made in its own statement).
  Node* wte = p(std::string(f.embedding), {V, C});
  Node* tok = b.embedding(wte, in.ids, "tok_emb");
  Node* wpe = p("transformer.wpe.weight", {m.max_position_embeddings, C});
  Node* x = b.add(tok, b.embedding(wpe, in.pos, "pos_emb"), "x");
  auto layernorm = [&](Node* v, const std::string& pname, const std::string& name) {
    Node* w = p(pname + ".weight", {C});
    Node* bias = p(pname + ".bias", {C});
    return b.layernorm(v, w, bias, m.norm_eps, name);
  };
  auto conv1d = [&](Node* v, const std::string& pname, int64_t in_dim, int64_t out_dim, const std::string& name) {
    Node* w = p(pname + ".weight", {in_dim, out_dim});  // Conv1D: [in, out]
    Node* bias = p(pname + ".bias", {out_dim});
    return b.linear(v, w, bias, false, name);
  };
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string h = gpt2_layer(l);
    b.set_prefix(str(f.layer_scope, l, "."));
    // attention: x [B, S, C] → qkv [B, S, 3C] → q, k, v [B, N, S, D]
    Node* a = layernorm(x, h + "ln_1", "ln1");
    Node* qkv = conv1d(a, h + "attn.c_attn", C, 3 * C, "qkv");
    auto parts = b.split(qkv, 2, {C, C, C}, "qkv");
    Node* q = to_heads(b, parts[0], N, D, "q");
    Node* k = to_heads(b, parts[1], N, D, "k");
    Node* v = to_heads(b, parts[2], N, D, "v");
    Node* o = attend(b, mode, l, q, k, v, N, D, dt, in.doc_start);
    Node* proj = conv1d(from_heads(b, o, N, D, "attn_out"), h + "attn.c_proj", C, C, "attn_proj");
    x = b.add(x, proj, "res1");
    // MLP: [B, S, C] → [B, S, 4C] → [B, S, C]
    Node* mm = layernorm(x, h + "ln_2", "ln2");
    Node* fc = conv1d(mm, h + "mlp.c_fc", C, 4 * C, "fc");
    Node* mlp = conv1d(b.gelu_tanh(fc, "gelu"), h + "mlp.c_proj", 4 * C, C, "mlp_proj");
    x = b.add(x, mlp, "res2");
  }
  b.set_prefix("");
  x = layernorm(x, "transformer.ln_f", "ln_f");
  finish(b, mode, x, wte, in.labels, dt, opt);  // tied head: x · wteᵀ
  return g;
}

// rope_scaling as attributes of a rope node (read back by engine/launchers.h rope_scaling_of); an
// unscaled rope carries none, so its IR text is unchanged. yarn's defaults are resolved here as
// transformers 5 does: original_max_position_embeddings = the model's max_position_embeddings,
// beta_fast 32, beta_slow 1; attention_factor 0 = from mscale (kernels/kinds.h).
Node* with_rope_scaling(Node* rope, const ModelConfig& m) {
  const RopeScalingConfig& s = m.rope_scaling;
  if (s.rope_type.empty()) return rope;
  rope->attrs().set("rope_type", s.rope_type);
  rope->attrs().set("factor", s.factor);
  if (s.rope_type == "llama3") {
    rope->attrs().set("low_freq_factor", s.low_freq_factor);
    rope->attrs().set("high_freq_factor", s.high_freq_factor);
    rope->attrs().set("original_max_position_embeddings", static_cast<double>(s.original_max_position_embeddings));
  }
  if (s.rope_type == "yarn") {
    const int64_t orig = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                                : m.max_position_embeddings;
    rope->attrs().set("original_max_position_embeddings", static_cast<double>(orig));
    rope->attrs().set("beta_fast", s.beta_fast > 0 ? s.beta_fast : 32.0);
    rope->attrs().set("beta_slow", s.beta_slow > 0 ? s.beta_slow : 1.0);
    rope->attrs().set("attention_factor", s.attention_factor);
    rope->attrs().set("mscale", s.mscale);
    rope->attrs().set("mscale_all_dim", s.mscale_all_dim);
    rope->attrs().set("truncate", s.truncate ? 1.0 : 0.0);
  }
  return rope;
}

std::unique_ptr<Graph> build_llama(const ModelConfig& m, DType dt, ForwardMode mode, const GraphOptions& opt) {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  const Family& f = family(m.arch);  // what the member adds: biases, Qwen3's q/k norms
  const bool qkv_bias = present(f.qkv_bias, m.attention_bias), o_bias = present(f.o_bias, m.attention_bias);
  const bool mlp_bias = present(f.mlp_bias, m.mlp_bias);
  const int64_t C = m.hidden_size, N = m.num_attention_heads, Nkv = m.num_key_value_heads, D = m.head_dim();
  const int64_t V = m.vocab_size, I = m.intermediate_size;
  auto in = make_inputs(b, mode, opt.document_mask);
  auto p = [&](const std::string& name, SymShape s) { return b.parameter(name, dt, std::move(s)); };
  Node* embed = p(std::string(f.embedding), {V, C});
  Node* x = b.embedding(embed, in.ids, f.scaled_embedding ? "tok_emb" : "x");
  if (const int64_t pad = m.padding_row(); pad >= 0) x->attrs().set("padding_idx", pad);  // HF's padding_idx
  // Gemma: times √C as a tensor of the model's dtype (HF's normalizer), so bf16 rounds it first.
  if (f.scaled_embedding) x = b.scale(x, round_to(std::sqrt(static_cast<double>(C)), dt), "x");
  auto linear = [&](Node* v, const std::string& pname, int64_t out_dim, int64_t in_dim, bool bias,
                    const std::string& name) {
    Node* w = p(pname + ".weight", {out_dim, in_dim});  // nn.Linear: [out, in]
    Node* bv = bias ? p(pname + ".bias", {out_dim}) : nullptr;
    return b.linear(v, w, bv, true, name);
  };
  auto rmsnorm = [&](Node* v, const std::string& pname, int64_t dim, const std::string& name) {
    Node* w = p(pname + ".weight", {dim});
    if (!f.unit_offset_norm) return b.rmsnorm(v, w, m.norm_eps, name);
    // Gemma's RMSNorm as HF's Gemma2RMSNorm: in f32 (f64 stays f64), times (1 + w), cast back.
    const DType ct = dt == DType::f64 ? DType::f64 : DType::f32;
    if (ct != dt) {
      v = b.cast(v, ct, name + ".in");
      w = b.cast(w, ct, name + ".w");
    }
    Node* y = b.rmsnorm(v, b.add(w, b.full({dim}, 1.0, ct, name + ".one"), name + ".1pw"), m.norm_eps, name);
    return ct != dt ? b.cast(y, dt, name + ".out") : y;
  };
  // [B, S, H·D] → [B, H, S, D], with Qwen3's per-head RMSNorm over D on the [B, S, H, D] view
  auto heads = [&](Node* v, int64_t H, const std::string& norm, const std::string& name) {
    Node* view = b.reshape(v, {B, S, H, D}, name + ".view");
    if (!norm.empty()) view = rmsnorm(view, norm, D, name + "_norm");
    return b.transpose(view, 1, 2, name);
  };
  // The load-balancing loss's statistics, one per MoE layer (GraphOptions::router_aux_loss).
  const bool aux_loss = opt.router_aux_loss && mode == ForwardMode::train && family(m.arch).moe != Moe::none;
  std::vector<Node*> router_stats;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string h = llama_layer(l);
    b.set_prefix(str(f.layer_scope, l, "."));
    // attention: x [B, S, C] → q [B, N, S, D], k, v [B, Nkv, S, D]
    Node* a = rmsnorm(x, h + "input_layernorm", C, "norm1");
    Node* q = heads(linear(a, h + "self_attn.q_proj", N * D, C, qkv_bias, "q_proj"), N,
                    f.qk_norm ? h + "self_attn.q_norm" : "", "q");
    Node* k = heads(linear(a, h + "self_attn.k_proj", Nkv * D, C, qkv_bias, "k_proj"), Nkv,
                    f.qk_norm ? h + "self_attn.k_norm" : "", "k");
    Node* v = heads(linear(a, h + "self_attn.v_proj", Nkv * D, C, qkv_bias, "v_proj"), Nkv, "", "v");
    // Gemma 3's local layers: their own RoPE base, never scaled.
    const bool local = f.local_rope && m.layer_sliding(l);
    auto rope = [&](Node* t, const std::string& name) {
      Node* r = b.rope(t, in.pos, local ? m.rope_local_base_freq : m.rope_theta, name);
      return local ? r : with_rope_scaling(r, m);
    };
    q = rope(q, "q_rope");
    k = rope(k, "k_rope");
    const AttentionAttrs variant{.window = m.layer_window(l), .softcap = f.softcaps ? m.attn_logit_softcapping : 0.0};
    Node* sinks = m.has_sinks() ? p(h + "self_attn.sinks", {N}) : nullptr;  // gpt-oss
    Node* o = attend(b, mode, l, q, k, v, Nkv, D, dt, in.doc_start, variant, m.attention_scale(), sinks);
    Node* proj = linear(from_heads(b, o, N, D, "attn_out"), h + "self_attn.o_proj", C, N * D, o_bias, "o_proj");
    if (f.sandwich_norms) proj = rmsnorm(proj, h + "post_attention_layernorm", C, "post_attn_norm");
    x = b.add(x, proj, "res1");
    // SwiGLU (GeGLU) MLP: [B, S, C] → [B, S, I] → [B, S, C]
    Node* mm = rmsnorm(x, h + (f.sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm"), C, "norm2");
    Node* down = nullptr;
    if (m.sparse_layer(l)) {  // a mixture of experts (models/moe.h)
      const MoeBlock moe = moe_block(b, m, h, mm, p);
      down = moe.y;
      if (aux_loss) router_stats.push_back(moe_layer_stats(b, m, moe.probs));
    } else if (opt.tiled_mlp) {  // one op over chunks of rows, the same parameters (kernels/cpu/mlp.h)
      if (mlp_bias) throw UsageError("runtime.tiled_mlp: the MLP has biases (mlp_bias true); the tiled MLP has none");
      if (f.mlp != Mlp::swiglu) throw UsageError(str("runtime.tiled_mlp: ", f.name, "'s MLP is not SwiGLU"));
      Node* w_gate = p(h + "mlp.gate_proj.weight", {I, C});
      Node* w_up = p(h + "mlp.up_proj.weight", {I, C});
      down = b.swiglu_mlp(mm, w_gate, w_up, p(h + "mlp.down_proj.weight", {C, I}), "mlp");
    } else {
      Node* gate = linear(mm, h + "mlp.gate_proj", I, C, mlp_bias, "gate");
      Node* up = linear(mm, h + "mlp.up_proj", I, C, mlp_bias, "up");
      Node* act = f.mlp == Mlp::geglu ? b.mul(b.gelu_tanh(gate, "gelu"), up, "geglu")
                                      : b.mul(b.silu(gate, "silu"), up, "swiglu");
      down = linear(act, h + "mlp.down_proj", C, I, mlp_bias, "down");
    }
    if (f.sandwich_norms) down = rmsnorm(down, h + "post_feedforward_layernorm", C, "post_mlp_norm");
    x = b.add(x, down, "res2");
  }
  b.set_prefix("");
  x = rmsnorm(x, "model.norm", C, "norm_f");
  Node* head = m.tie_word_embeddings ? embed : p("lm_head.weight", {V, C});
  Node* aux = router_stats.empty() ? nullptr : moe_weighted_aux_loss(b, m, router_stats);
  finish(b, mode, x, head, in.labels, dt, opt, f.softcaps ? m.final_logit_softcapping : 0.0, aux);
  return g;
}

}  // namespace

std::unique_ptr<Graph> build_forward(const ModelConfig& m, DType dtype, ForwardMode mode, const GraphOptions& options) {
  switch (family(m.arch).layout) {
    case Layout::gpt2:
      if (options.tiled_mlp) throw UsageError("tiled_mlp: GPT-2's MLP is not SwiGLU (runtime.tiled_mlp is for Llama)");
      return build_gpt2(m, dtype, mode, options);
    case Layout::llama: return build_llama(m, dtype, mode, options);
  }
  AUTOSP_ASSERT(false, "model.arch ", arch_name(m.arch));
  return nullptr;
}

std::string kv_past_name(int64_t layer, bool value) { return str("past.", layer, value ? ".v" : ".k"); }
std::string kv_present_name(const ModelConfig& m, int64_t layer, bool value) {
  return layer_scopes(m).at(static_cast<size_t>(layer)) + (value ? "present_v" : "present_k");
}

std::vector<std::string> layer_scopes(const ModelConfig& m) {
  std::vector<std::string> out;  // what the builders name a layer's nodes with
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) out.push_back(str(family(m.arch).layer_scope, l, "."));
  return out;
}

std::vector<ParamSpec> param_specs(const ModelConfig& m) {
  // The parameters are exactly the graph's parameter nodes (one source of truth).
  auto g = build_forward(m, DType::f32);
  std::vector<ParamSpec> out;
  for (Node* n : g->with_role(Role::parameter)) {
    Shape s;
    for (const auto& d : n->shape()) s.push_back(d.value());
    out.push_back({n->name(), s});
  }
  return out;
}

ParamMap init_params(const ModelConfig& m, uint64_t seed, DType dtype) {
  std::mt19937_64 rng(seed);
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.num_hidden_layers));
  ParamMap out;
  for (const auto& spec : param_specs(m)) {
    const std::string& n = spec.name;
    auto ends = [&](const char* suffix) { return n.size() >= std::char_traits<char>::length(suffix) &&
                                                 n.compare(n.size() - std::char_traits<char>::length(suffix),
                                                           std::string::npos, suffix) == 0; };
    bool is_norm = n.find("ln_") != std::string::npos || n.find("layernorm") != std::string::npos ||
                   ends("_norm.weight") || n == "model.norm.weight";
    std::vector<double> v(static_cast<size_t>(shape_numel(spec.shape)));
    if (is_norm && ends(".weight")) {  // Gemma's (1 + w) norms start at w = 0, as HF initialises them
      std::fill(v.begin(), v.end(), family(m.arch).unit_offset_norm ? 0.0 : 1.0);
    } else if (ends(".bias")) {
      std::fill(v.begin(), v.end(), 0.0);
    } else {
      bool resid = ends("c_proj.weight") || ends("o_proj.weight") || ends("down_proj.weight");
      std::normal_distribution<double> nd(0.0, resid ? resid_std : 0.02);
      for (auto& x : v) x = nd(rng);
    }
    out[n] = Tensor::from_vector(spec.shape, v).to(dtype);
  }
  return out;
}

}  // namespace autosp
