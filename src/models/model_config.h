// The model's part of the run configuration (the "model" section of config.json): the
// architecture and its sizes, as the builders (models/model.h), the weights loader and the scaling
// tools read them. Parsed and validated with the rest of the config by src/config.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace autosp {

// The architectures the builders know. Code that differs by architecture is a `switch (m.arch)`
// without a default, so a third architecture makes the compiler name every place it must handle
// (and the config schema's list of arch values, config/config.cpp).
enum class Arch { gpt2, llama };

// "gpt2", "llama": the spelling of model.arch in config.json, logs and benchmark rows.
inline std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::gpt2: return "gpt2";
    case Arch::llama: return "llama";
  }
  return "unknown arch";
}

// Hugging Face's rope_scaling (Llama): rope_type "" (none), "linear" or "llama3"; the math is in
// kernels/cpu/rope.h (RopeScaling), the JSON form in models/hf_config.h.
struct RopeScalingConfig {
  std::string rope_type;  // "" = none
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScalingConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int64_t vocab_size = 256, hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4;
  int64_t num_key_value_heads = 4;  // llama (defaults to num_attention_heads)
  int64_t intermediate_size = 512;  // llama; GPT-2's MLP width is 4·hidden_size
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;  // llama
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;  // GPT-2 always ties

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t mlp_width() const {
    switch (arch) {
      case Arch::gpt2: return 4 * hidden_size;
      case Arch::llama: return intermediate_size;
    }
    return 0;
  }
};

}  // namespace autosp
