// GPT-2 and Llama-family (Llama, Mistral, Qwen2, Qwen3) forward graphs with Hugging Face
// semantics, recorded on the symbols B (batch) and S (sequence) through the Builder, plus the list
// of parameters with their HF names and shapes.
// The graph's inputs are tagged input_ids, position_ids and labels (already shifted by the data
// loader); its outputs are the logits [B, S, V] and the token-mean loss
// loss = cross_entropy_sum(logits, labels) / count_valid(labels); with GraphOptions::tiled_loss
// the predictions [B, S] and loss = linear_cross_entropy_sum(x, head, labels) / count_valid(labels).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"  // DpoLoss
#include "graph/ir.h"
#include "models/model_config.h"
#include "tensor/tensor.h"

namespace autosp {

struct ParamSpec {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;       // Hugging Face layout ([out, in] for Linear, [in, out] for GPT-2 Conv1D)
};

std::vector<ParamSpec> param_specs(const ModelConfig& m);

// What the graph is for. train: inputs input_ids, position_ids, labels; outputs logits, loss.
// Generation with a KV cache (train/generate.h), inputs input_ids, position_ids [B, S], no loss:
//   prefill  causal over the prompt; outputs logits and each layer's K, V (after RoPE) as its
//            present cache [B, Nkv, S, D] (kv_present_name)
//   decode   S new tokens (S = 1) attend, unmasked, over the inputs kv_past_name [B, Nkv, T, D]
//            ++ their own K, V; outputs logits and the present cache [B, Nkv, T + S, D]
enum class ForwardMode { train, prefill, decode };

// How a training graph is built (the config keys that change it).
struct GraphOptions {
  // data.document_mask (packed documents; train mode only): the graph has a fourth input doc_start
  // [B, S] (tagged doc_start): token t's document begins at position doc_start[t] of its sequence,
  // and every attention keeps query t to the keys [doc_start[t], t].
  bool document_mask = false;
  // runtime.tiled_mlp (Llama only, else a UsageError): each layer's MLP is one swiglu_mlp node,
  // "l<i>.mlp", over the same gate_proj, up_proj and down_proj parameters, instead of gate, up,
  // silu, swiglu and down.
  bool tiled_mlp = false;
  // runtime.tiled_loss (train mode): the head and the loss are one linear_cross_entropy_sum node,
  // "loss_sum", over the final norm's output and the same head weight; the graph outputs its
  // extra output "predictions" (each position's argmax, i64 [B, S]) instead of the logits.
  bool tiled_loss = false;
  // train.objective "dpo" (train mode, untiled loss): dpo_slots > 0 pair slots a sequence holds at
  // most. The graph then has the inputs pair_slots [B, S] (tagged pair_ids: target t's slot,
  // +(k + 1) on chosen, −(k + 1) on rejected, 0 none), and ref_logps, seq_tokens [B, 2, K] and
  // dpo_norms [2] (the reference's sums, each sequence's completion targets, the step's pairs and
  // chosen targets: Builder::dpo_loss), and its loss is
  //   loss = dpo_loss(sequence_logps(logits, labels, pair_slots), ref_logps, seq_tokens, dpo_norms)
  // with the policy's sums "sequence_logps" an output too.
  int64_t dpo_slots = 0;
  DpoLoss dpo = {};
  // model.output_router_logits in a training program (train mode, a mixture of experts): the loss
  // is add(lm_loss, router_aux_loss_coef × aux_loss), the load-balancing loss over every MoE
  // layer's router statistics (models/moe.h), and "aux_loss" and "router_stats" are outputs too.
  // Validation and autosp-eval leave it out: their loss is the LM loss (perplexity).
  bool router_aux_loss = false;
};

// The forward graph in `dtype` (f32 or f64).
std::unique_ptr<Graph> build_forward(const ModelConfig& m, DType dtype, ForwardMode mode = ForwardMode::train,
                                     const GraphOptions& options = {});

// The names of layer `layer`'s cache: the decode graph's input ("past.<l>.k" / ".v") and the
// generation graphs' output.
std::string kv_past_name(int64_t layer, bool value);
std::string kv_present_name(const ModelConfig& m, int64_t layer, bool value);

// The name prefix of each transformer layer's nodes ("l0.", … for Llama, "h0.", … for GPT-2):
// the scopes activation checkpointing recomputes.
std::vector<std::string> layer_scopes(const ModelConfig& m);

// Deterministic initialisation in the style of GPT-2 / Llama (normal(0, 0.02), residual
// projections scaled by 1/sqrt(2·layers), norm weights 1, biases 0).
ParamMap init_params(const ModelConfig& m, uint64_t seed, DType dtype);

}  // namespace autosp
