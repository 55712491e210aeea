// Tiny GPT-2 and Llama models and random token batches, shared by the model-level tests (CPU,
// mixed precision, fusion, CUDA, SP on GPUs). Each test picks the sizes; the shapes of the config
// sections and the batch are the same everywhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/executor.h"
#include "tensor/tensor.h"

namespace autosp::testing {

// The "model" section: vocab 64, 4 heads, `hidden` wide, `layers` deep; GPT-2 with 64 positions,
// Llama with 2 KV heads (GQA) and an MLP `intermediate` wide.
inline nlohmann::json tiny_model(const std::string& arch, int64_t hidden, int64_t layers, int64_t intermediate) {
  nlohmann::json model = {{"arch", arch}, {"vocab_size", 64}, {"hidden_size", hidden}, {"num_hidden_layers", layers},
                          {"num_attention_heads", 4}};
  if (arch == "gpt2") model["max_position_embeddings"] = 64;
  if (arch == "llama") {
    model["num_key_value_heads"] = 2;
    model["intermediate_size"] = intermediate;
  }
  return model;
}

// B random sequences of S tokens below `vocab`, about a fifth of the labels ignored (-100),
// positions 0..S-1: the feeds of a joint graph's inputs.
inline TensorMap random_token_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids, labels, pos;
  for (int64_t i = 0; i < B * S; ++i) {
    ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
    labels.push_back(rng() % 5 == 0 ? -100 : static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
    pos.push_back(i % S);
  }
  return {{"input_ids", Tensor::from_vector({B, S}, ids)},
          {"labels", Tensor::from_vector({B, S}, labels)},
          {"position_ids", Tensor::from_vector({B, S}, pos)}};
}

// ‖a − b‖ / ‖b‖ over every element (host tensors of one shape).
inline double rel_l2(const Tensor& a, const Tensor& b) {
  const auto x = a.to_doubles(), y = b.to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// max |a − b| / max |b| over every element (host tensors of one shape).
inline double rel_max(const Tensor& got, const Tensor& want) {
  const auto g = got.to_doubles(), w = want.to_doubles();
  double err = 0, scale = 1e-300;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return err / scale;
}

}  // namespace autosp::testing
