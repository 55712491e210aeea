// The model's size arithmetic from its shape alone: the parameter counts and the FLOPs of one
// training step, the formula behind autosp-bench's TFLOP/s column, its --project scaling model
// (docs/scaling.md derives it) and the trainer's TFLOP/s and MFU (train/step_log.h). Pure functions
// of ModelConfig; knows nothing of graphs or tensors.
#pragma once

#include <cstdint>

#include "models/model_config.h"

namespace autosp {

// C = hidden, N = heads, D = head dim, Nkv = K/V heads, M = MLP width, V = vocab, L = layers.
struct ModelDims {
  int64_t C, N, D, Nkv, M, V, L;
};
ModelDims model_dims(const ModelConfig& m);

// Every parameter of the model (the same count as the sum over param_specs()).
int64_t param_count(const ModelConfig& m);

// The parameters the FLOP formula counts: every parameter except the input-embedding lookups
// (Llama's embed_tokens when untied, GPT-2's wpe); a tied embedding counts once, as the LM head.
int64_t flop_param_count(const ModelConfig& m);

// The query-key pairs layer l's causal attention computes over `seq` tokens, as the FLOP formula
// counts them: seq²/2 with full causal attention; with a sliding window w < seq (a query sees itself
// and the w − 1 keys before it: ModelConfig::layer_window) seq·w − w²/2, the area under min(i, w),
// which meets seq²/2 at w = seq.
double attention_pairs(const ModelConfig& m, int64_t l, double seq);

// FLOPs of one training step (forward + backward) on `batch` sequences of `seq` tokens:
//   6 · flop_param_count · batch · seq  +  12 · heads · head_dim · batch · Σ_l attention_pairs(l).
// The first term is 2 FLOPs per weight per token forward and 4 backward; the second is attention's
// QKᵀ and PV (2·2·hidden per query-key pair forward, twice that backward) over the pairs the mask
// leaves: half the S² square when causal, a band of width w under a sliding window.
// With LoRA, `frozen` of the counted parameters are frozen (their weight-gradient GEMMs are not run:
// 4 FLOPs per weight per token, forward and input gradient) and `added` adapter parameters train
// (6 each): 6 · (counted − frozen + added) + 4 · frozen per token, plus attention.
double step_flops(const ModelConfig& m, int64_t batch, int64_t seq, int64_t frozen = 0, int64_t added = 0);

}  // namespace autosp
