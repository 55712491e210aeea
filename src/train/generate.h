// Text generation from a trained model with a KV cache: a prefill program runs the prompt (causal)
// and returns each layer's K, V; a decode program then runs one token at a time, attending over the
// cache plus its own K, V (models/model.h ForwardMode). Both are the model builder's graphs, run by
// the same executor and kernels as training, in one process (no sequence parallelism). Sampling is
// greedy, or temperature with an optional top-k, from a seeded generator. Knows nothing of the
// checkpoint format: the caller loads the model (apps/sample.cpp does it as the trainer does).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "engine/executor.h"
#include "models/model.h"

namespace autosp {

struct SampleOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0;     // 0: greedy (argmax, first maximum on ties); a tiny T > 0
                              // (even subnormal) draws only among the maxima
  int64_t top_k = 0;          // with temperature > 0: sample among the k largest logits (0: all)
  uint64_t seed = 0;          // the sampling generator's seed
  int64_t eos_token_id = -1;  // stop once it is generated (-1: never; else an id of the vocabulary)
  bool kv_cache = true;       // false: recompute the whole sequence for every token (the reference)
};

struct Generated {
  std::vector<int64_t> tokens;              // the new tokens (the prompt not included)
  std::vector<std::vector<double>> logits;  // per new token: the logits it was drawn from [V]
};

// What generate() refuses, checked from the model's config alone (no weights, no programs): an empty
// prompt, a prompt id or an eos_token_id (other than -1) outside [0, vocab_size), max_new_tokens,
// top_k or temperature out of range, and positions that do not fit GPT-2's position table, a
// sliding window or int64. A UsageError saying which; autosp-sample calls it before loading anything.
void check_generation(const ModelConfig& m, const std::vector<int64_t>& prompt, const SampleOptions& o);

class Generator {
 public:
  // `params` as the trainer holds them (HF names), in `dtype` (f32 or f64).
  Generator(const ModelConfig& m, DType dtype, ParamMap params);
  // check_generation first: a UsageError before anything runs.
  Generated generate(const std::vector<int64_t>& prompt, const SampleOptions& options) const;

 private:
  std::vector<double> last_logits(const RunResult& r) const;
  int64_t pick(const std::vector<double>& logits, const SampleOptions& o, std::mt19937_64& rng) const;

  ModelConfig m_;
  DType dtype_;
  ParamMap params_;
  std::unique_ptr<Graph> prefill_, decode_;
  std::unique_ptr<Executor> prefill_ex_, decode_ex_;
};

}  // namespace autosp
