// The model's part of the run configuration (the "model" section of config.json): the
// architecture and its sizes, as the builders (models/model.h), the weights loader and the scaling
// tools read them. Parsed and validated with the rest of the config by src/config.
#pragma once

#include <cstdint>
#include <string>

namespace autosp {

struct ModelConfig {
  std::string arch = "gpt2";  // "gpt2" | "llama"
  int64_t vocab_size = 256, hidden_size = 128, num_hidden_layers = 2, num_attention_heads = 4;
  int64_t num_key_value_heads = 4;  // llama (defaults to num_attention_heads)
  int64_t intermediate_size = 512;  // llama; GPT-2's MLP width is 4·hidden_size
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;  // GPT-2 always ties

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t mlp_width() const { return arch == "gpt2" ? 4 * hidden_size : intermediate_size; }
  bool is_llama() const { return arch == "llama"; }
};

}  // namespace autosp
