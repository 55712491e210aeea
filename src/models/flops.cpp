// Parameter counts and training-step FLOPs from the model's shape (models/flops.h).
#include "models/flops.h"

namespace autosp {

ModelDims model_dims(const ModelConfig& m) {
  const int64_t N = m.num_attention_heads;
  int64_t Nkv = N;  // GPT-2: every head has its own K and V
  switch (m.arch) {
    case Arch::gpt2: break;
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: Nkv = m.num_key_value_heads; break;
  }
  return {m.hidden_size, N, m.head_dim(), Nkv, m.mlp_width(), m.vocab_size, m.num_hidden_layers};
}

namespace {

// Parameters of one transformer layer.
int64_t layer_params(const ModelConfig& m) {
  const ModelDims d = model_dims(m);
  switch (m.arch) {
    case Arch::gpt2:
      // c_attn [C, 3C] + 3C, c_proj [C, C] + C, c_fc [C, 4C] + 4C, c_proj [4C, C] + C, ln_1, ln_2.
      return 3 * d.C * d.C + 3 * d.C + d.C * d.C + d.C + 4 * d.C * d.C + 4 * d.C + 4 * d.C * d.C + d.C + 4 * d.C;
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: {
      const int64_t attn = d.C * d.N * d.D * 2 + d.C * d.Nkv * d.D * 2;  // q, o; k, v
      const int64_t qkv_bias = d.N * d.D + 2 * d.Nkv * d.D;
      int64_t extra = 0;  // models/model.cpp LlamaTraits: biases, Qwen3's q_norm and k_norm [D]
      switch (m.arch) {
        case Arch::llama: extra = (m.attention_bias ? qkv_bias + d.C : 0) + (m.mlp_bias ? 2 * d.M + d.C : 0); break;
        case Arch::qwen2: extra = qkv_bias; break;
        case Arch::qwen3: extra = (m.attention_bias ? qkv_bias + d.C : 0) + 2 * d.D; break;
        case Arch::mistral:
        case Arch::gpt2: break;
      }
      return attn + 3 * d.C * d.M + 2 * d.C + extra;  // gate, up, down; two RMSNorms
    }
  }
  return 0;
}

}  // namespace

int64_t param_count(const ModelConfig& m) {
  const ModelDims d = model_dims(m);
  const int64_t layers = d.L * layer_params(m);
  switch (m.arch) {
    case Arch::gpt2: return d.V * d.C + m.max_position_embeddings * d.C + layers + 2 * d.C;  // wte, wpe, layers, ln_f
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: return d.V * d.C + layers + d.C + (m.tie_word_embeddings ? 0 : d.V * d.C);
  }
  return 0;
}

int64_t flop_param_count(const ModelConfig& m) {
  const ModelDims d = model_dims(m);
  switch (m.arch) {
    case Arch::gpt2: return param_count(m) - m.max_position_embeddings * d.C;
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: return param_count(m) - (m.tie_word_embeddings ? 0 : d.V * d.C);
  }
  return 0;
}

double step_flops(const ModelConfig& m, int64_t batch, int64_t seq) {
  const double B = static_cast<double>(batch), S = static_cast<double>(seq);
  const double dense = 6.0 * static_cast<double>(flop_param_count(m)) * B * S;
  const double attention = 12.0 * static_cast<double>(m.num_hidden_layers) * S * S *
                           static_cast<double>(m.num_attention_heads * m.head_dim()) * B * 0.5;
  return dense + attention;
}

}  // namespace autosp
