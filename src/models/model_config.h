// The model's part of the run configuration (the "model" section of config.json): the
// architecture and its sizes, as the builders (models/model.h), the weights loader and the scaling
// tools read them. Parsed and validated with the rest of the config by src/config.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace autosp {

// The architectures the builders know, named as Hugging Face's model_type. Code that differs by
// architecture is a `switch (m.arch)` without a default, so a further architecture makes the
// compiler name every place it must handle (and the config schema's list of arch values,
// config/config.cpp). Mistral, Qwen2 and Qwen3 are Llama's graph with per-family differences
// (models/model.cpp LlamaTraits): Mistral = Llama without biases; Qwen2 = q/k/v biases; Qwen3 =
// an RMSNorm over each head of q and k before RoPE (q_norm, k_norm).
enum class Arch { gpt2, llama, mistral, qwen2, qwen3 };

// "gpt2", "llama", "mistral", "qwen2", "qwen3": the spelling of model.arch in config.json, logs and
// benchmark rows.
inline std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::gpt2: return "gpt2";
    case Arch::llama: return "llama";
    case Arch::mistral: return "mistral";
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
  }
  return "unknown arch";
}

// The family whose graph an architecture uses: GPT-2 (learned positions, LayerNorm, GELU) or
// Llama (RoPE, RMSNorm, SwiGLU, GQA). Config keys that apply to Llama apply to its whole family.
inline Arch family(Arch a) {
  switch (a) {
    case Arch::gpt2: return Arch::gpt2;
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: return Arch::llama;
  }
  return a;
}

// Hugging Face's rope_scaling (transformers 5's rope_parameters less rope_theta): rope_type ""
// (none), "linear", "llama3" or "yarn"; the math is in kernels/kinds.h (RopeScaling), the JSON
// form in models/hf_config.h.
struct RopeScalingConfig {
  std::string rope_type;  // "" = none
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  // llama3: required; yarn: 0 = the model's max_position_embeddings (transformers 5's default).
  int64_t original_max_position_embeddings = 8192;
  // yarn only; 0 = absent (HF's defaults: beta_fast 32, beta_slow 1, attention_factor from mscale).
  double beta_fast = 0, beta_slow = 0, attention_factor = 0, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;  // yarn: floor/ceil the correction range (transformers 5's "truncate")
  bool operator==(const RopeScalingConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int64_t vocab_size = 256, hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4;
  int64_t num_key_value_heads = 4;  // llama family (defaults to num_attention_heads)
  int64_t intermediate_size = 512;  // llama; GPT-2's MLP width is 4·hidden_size
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;  // llama
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;  // GPT-2 always ties
  // Llama family. head_dim_config: HF's head_dim, 0 = hidden_size / num_attention_heads (Qwen3 and
  // Mistral-Nemo decouple them). attention_bias: llama's q/k/v/o and qwen3's q/k/v/o projections
  // have biases (qwen2's q/k/v always do). mlp_bias: llama's gate/up/down. sliding_window: 0 =
  // none; a window is only accepted where it changes nothing (config/: at least data.seq_len).
  int64_t head_dim_config = 0;
  bool attention_bias = false, mlp_bias = false;
  int64_t sliding_window = 0;

  int64_t head_dim() const { return head_dim_config > 0 ? head_dim_config : hidden_size / num_attention_heads; }
  int64_t mlp_width() const { return family(arch) == Arch::gpt2 ? 4 * hidden_size : intermediate_size; }
};

}  // namespace autosp
