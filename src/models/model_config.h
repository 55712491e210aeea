// The model's part of the run configuration (the "model" section of config.json): the
// architecture and its sizes, as the builders (models/model.h), the weights loader and the scaling
// tools read them. What the architecture itself fixes is its family row (models/family.h); the
// keys, their types and their Hugging Face names are one table (models/model_keys.h). Parsed and
// validated with the rest of the config by src/config.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/family.h"

namespace autosp {

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
  int64_t num_key_value_heads = 4;  // families with GQA (defaults to num_attention_heads)
  int64_t intermediate_size = 512;  // SwiGLU's width; GPT-2's MLP width is 4·hidden_size
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;  // RoPE families
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;  // GPT-2 always ties (Family::tied_head)
  // Llama layout. head_dim_config: HF's head_dim, 0 = hidden_size / num_attention_heads (Qwen3 and
  // Mistral-Nemo decouple them). attention_bias, mlp_bias: the biases a family has by_key
  // (Family::qkv_bias, o_bias, mlp_bias). sliding_window: 0 = none (Family::window).
  int64_t head_dim_config = 0;
  bool attention_bias = false, mlp_bias = false;
  // HF's pad_token_id where the family's embedding is nn.Embedding(V, C, padding_idx=pad_token_id)
  // (Family::padding_idx): that row gets no gradient from the lookup. nullopt: none (HF's None);
  // negative as PyTorch takes it, from the end (-1: row V - 1).
  std::optional<int64_t> pad_token_id;
  // The embedding row the lookup leaves out of the gradient, or -1 for none.
  int64_t padding_row() const {
    if (!pad_token_id || !family(arch).padding_idx) return -1;
    return *pad_token_id < 0 ? vocab_size + *pad_token_id : *pad_token_id;
  }
  // Attention sinks: a learned logit per query head in every softmax denominator, the parameter
  // model.layers.{i}.self_attn.sinks [num_attention_heads] (docs/decisions.md 174): gpt-oss's
  // always (its family row), another Llama-layout model's with model.attention_sinks.
  bool attention_sinks = false;
  bool has_sinks() const { return present(family(arch).sinks, attention_sinks); }
  int64_t sliding_window = 0;
  // Which layers the window applies to (docs/decisions.md 143): layer_types (transformers 5: one
  // "full_attention" or "sliding_attention" per layer) when given; else every layer of a
  // Window::key family (Mistral), and the layers l >= max_window_layers of a Window::switched one
  // (Qwen: transformers' rule; 28, Qwen2Config's default).
  // Window::pattern (Gemma): layer l slides unless (l + 1) % sliding_window_pattern == 0;
  // Window::alternating (gpt-oss): the even layers slide.
  int64_t max_window_layers = 28;
  int64_t sliding_window_pattern = 2;
  std::vector<std::string> layer_types;

  // Whether layer l is a local (sliding) layer: its layer_types kind, else the family's rule.
  bool layer_sliding(int64_t l) const {
    if (!layer_types.empty()) return layer_types.at(size_t(l)) == "sliding_attention";
    switch (family(arch).window) {
      case Window::none: return false;
      case Window::key: return true;
      case Window::switched: return l >= max_window_layers;
      case Window::pattern: return (l + 1) % sliding_window_pattern != 0;
      case Window::alternating: return l % 2 == 0;
    }
    return false;
  }
  // Layer l's window: sliding_window where it applies, else 0 (full causal attention).
  int64_t layer_window(int64_t l) const { return sliding_window > 0 && layer_sliding(l) ? sliding_window : 0; }
  // Gemma (Family::softcaps, query_pre_attn_scalar, local_rope): 0 = none (HF's null) for the
  // softcaps; query_pre_attn_scalar 0 = the head dim (the usual 1/√D scale); the local layers' RoPE base.
  double attn_logit_softcapping = 0, final_logit_softcapping = 0, query_pre_attn_scalar = 0;
  double rope_local_base_freq = 10000.0;
  // Mixtures of experts (Family::moe; models/moe.h builds the layer): num_experts experts, the top
  // num_experts_per_tok per token. Qwen: the experts' width moe_intermediate_size (Mixtral's is
  // intermediate_size; Qwen's dense layers keep intermediate_size), the sparse layers (every
  // decoder_sparse_step-th, less mlp_only_layers), norm_topk_prob (Mixtral always renormalises) and
  // Qwen2-MoE's shared expert width. The load-balancing loss: router_aux_loss_coef × it is added to
  // the loss when output_router_logits.
  int64_t num_experts = 8, num_experts_per_tok = 2, moe_intermediate_size = 1408;
  int64_t shared_expert_intermediate_size = 5632, decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false, output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  // gpt-oss's experts (Moe::gpt_oss): the clamped SwiGLU's limit and sigmoid gain (GptOssConfig's
  // swiglu_limit and swiglu_alpha; models/moe.h).
  double swiglu_limit = 7.0, swiglu_alpha = 1.702;

  int64_t head_dim() const { return head_dim_config > 0 ? head_dim_config : hidden_size / num_attention_heads; }
  int64_t mlp_width() const { return family(arch).mlp == Mlp::gelu ? 4 * hidden_size : intermediate_size; }
  // The attention's scale: query_pre_attn_scalar^-0.5 where the family has it (Gemma), else 1/√D.
  double attention_scale() const {
    const double d = family(arch).query_pre_attn_scalar && query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                                                      : static_cast<double>(head_dim());
    return 1.0 / std::sqrt(d);
  }
  // Whether layer l's MLP is a mixture of experts (transformers' Qwen2MoeDecoderLayer rule;
  // Mixtral, gpt-oss: every layer), and the experts' width.
  bool sparse_layer(int64_t l) const {
    const Moe moe = family(arch).moe;
    if (moe == Moe::none) return false;
    if (moe == Moe::mixtral || moe == Moe::gpt_oss) return true;
    for (int64_t o : mlp_only_layers)
      if (o == l) return false;
    return num_experts > 0 && (l + 1) % decoder_sparse_step == 0;
  }
  int64_t expert_width() const { return family(arch).moe == Moe::qwen ? moe_intermediate_size : intermediate_size; }
};

}  // namespace autosp
