// Parameter counts and training-step FLOPs from the model's shape (models/flops.h).
#include "models/flops.h"

namespace autosp {

ModelDims model_dims(const ModelConfig& m) {
  const int64_t N = m.num_attention_heads;
  const int64_t Nkv = family(m.arch).gqa ? m.num_key_value_heads : N;  // else every head has its own K and V
  return {m.hidden_size, N, m.head_dim(), Nkv, m.mlp_width(), m.vocab_size, m.num_hidden_layers};
}

namespace {

// Parameters of one norm over `dim` values.
int64_t norm_params(const Family& f, int64_t dim) { return f.norm == Norm::layernorm ? 2 * dim : dim; }

// The MLP parameters of layer l: GELU's two or SwiGLU's three matrices, or a mixture of experts'
// router [E, C], E experts of three [I, C] matrices each (`active`: the k a token uses),
// Qwen2-MoE's shared expert and its gate [1, C], and gpt-oss's biases (the router's [E], each
// expert's gate and up [I] and down [C]).
int64_t mlp_params(const ModelConfig& m, int64_t l, bool active) {
  const Family& f = family(m.arch);
  const int64_t C = m.hidden_size, I = m.expert_width();
  if (!m.sparse_layer(l)) return (f.mlp == Mlp::gelu ? 2 : 3) * C * m.mlp_width();
  const int64_t experts = active ? m.num_experts_per_tok : m.num_experts;
  const int64_t shared = f.shared_expert ? 3 * C * m.shared_expert_intermediate_size + C : 0;
  const bool biased = f.moe == Moe::gpt_oss;
  const int64_t router = m.num_experts * (C + (biased ? 1 : 0));
  return router + experts * (3 * C * I + (biased ? 2 * I + C : 0)) + shared;
}

// Parameters of transformer layer l, from the family row: q and o [C, N·D], k and v [C, Nkv·D],
// the MLP's (mlp_params), the biases the family has, two norms (four with Gemma's post-norms),
// q/k norms [D] where it has them, and gpt-oss's sinks [N].
int64_t layer_params(const ModelConfig& m, int64_t l, bool active) {
  const Family& f = family(m.arch);
  const ModelDims d = model_dims(m);
  const int64_t attn = d.C * d.N * d.D * 2 + d.C * d.Nkv * d.D * 2;
  int64_t biases = 0;
  if (present(f.qkv_bias, m.attention_bias)) biases += d.N * d.D + 2 * d.Nkv * d.D;
  if (present(f.o_bias, m.attention_bias)) biases += d.C;
  if (present(f.mlp_bias, m.mlp_bias)) biases += (f.mlp == Mlp::gelu ? 1 : 2) * d.M + d.C;
  const int64_t norms = f.sandwich_norms ? 4 : 2;
  return attn + mlp_params(m, l, active) + biases + norms * norm_params(f, d.C) + (f.qk_norm ? 2 * d.D : 0) +
         (m.has_sinks() ? d.N : 0);
}

// Every layer's parameters (active: a mixture of experts' k experts per layer, what a token computes with).
int64_t layers_params(const ModelConfig& m, bool active) {
  int64_t n = 0;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) n += layer_params(m, l, active);
  return n;
}

// The position table (learned positions) and the untied head: parameters besides the embedding,
// the layers and the final norm.
int64_t position_params(const ModelConfig& m) {
  return family(m.arch).positions == Positions::learned ? m.max_position_embeddings * m.hidden_size : 0;
}
int64_t head_params(const ModelConfig& m) {
  return present(family(m.arch).tied_head, m.tie_word_embeddings) ? 0 : m.vocab_size * m.hidden_size;
}

}  // namespace

int64_t param_count(const ModelConfig& m) {
  const ModelDims d = model_dims(m);
  return d.V * d.C + position_params(m) + layers_params(m, false) + norm_params(family(m.arch), d.C) + head_params(m);
}

int64_t flop_param_count(const ModelConfig& m) {
  return param_count(m) - position_params(m) - head_params(m) - layers_params(m, false) + layers_params(m, true);
}

double attention_pairs(const ModelConfig& m, int64_t l, double seq) {
  const double w = static_cast<double>(m.layer_window(l));
  return w > 0 && w < seq ? seq * w - w * w * 0.5 : seq * seq * 0.5;
}

double step_flops(const ModelConfig& m, int64_t batch, int64_t seq, int64_t frozen, int64_t added) {
  const double B = static_cast<double>(batch), S = static_cast<double>(seq);
  const double trained = static_cast<double>(flop_param_count(m) - frozen + added);
  const double dense = (6.0 * trained + 4.0 * static_cast<double>(frozen)) * B * S;
  double pairs = 0;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) pairs += attention_pairs(m, l, S);
  return dense + 12.0 * pairs * static_cast<double>(m.num_attention_heads * m.head_dim()) * B;
}

}  // namespace autosp
