// The op table: one row per op, and every property of an op is a column of its row: name, arity,
// required attributes, shape rule, extra outputs, vjp rule, its locality along the sequence
// (AutoSP's shard_seq_dim), whether it communicates (DCE, the memory planner), whether its kernel
// may write over its input (the memory planner), and how it treats element values (the CPU's bf16
// emulation). static_asserts keep it complete.
// Knows nothing of kernels or devices.
//
// A new op touches (docs/architecture.md counts them for silu: 8 source files plus its kernels, and
// 2 test files):
//   graph/ops.h, graph/ops.cpp                    the enum value and its row here
//   graph/vjp.h, graph/vjp.cpp                    its vjp rule, as IR (forward ops)
//   graph/builder.h, graph/builder.cpp            a builder method (what models call)
//   engine/launchers.inc.h                        its launcher, written once for both devices, and its
//                                                 row in the launcher table (a row of a family launcher
//                                                 such as unary<Unary::silu> needs no launcher of its own)
//   kernels/kinds.h                               a kind of a kernel family (Unary::silu), where it is one
//   kernels/cpu/<family>.*, kernels/cuda/<family>.cu      the kernels (the CUDA ones take the stream last)
//   tests/common/op_cases.h, tests/common/naive.h one op case and its float64 reference
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/sym.h"
#include "tensor/dtype.h"

namespace autosp {

enum class Op : uint16_t {
  // leaves
  input, parameter,
  // dense algebra
  embedding, matmul,
  // elementwise (binary ops broadcast, numpy rules)
  add, sub, mul, div, scale, neg, exp, gelu_tanh, silu,
  // inverted dropout with a counter-based mask (LoRA's lora_dropout): x [..., C] by token_index [...]
  dropout,
  // layout (explicit symbolic shapes)
  reshape, transpose, permute, slice, concat,
  // normalisation, position, attention
  layernorm, rmsnorm, softmax, rope, sdpa,
  // loss
  cross_entropy_sum, count_valid,
  // constants and multi-output access
  full, output,
  // masking (composite attention) and collectives
  causal_mask, all_to_all, all_reduce,
  // ZeRO-3's parameter collectives (graph/passes/shard_parameters): a whole parameter gathered from
  // every rank's shard, and its gradient reduce-scattered back to the shards
  all_gather, reduce_scatter,
  // ring attention (graph/passes/autosp/insert_ring_attention): sdpa over the ranks of a ring group,
  // the key/value blocks passed around the ring (zigzag sequence layout)
  ring_attention,
  // backward-only ops (built by vjp rules; not differentiated again)
  sum_to, embedding_backward, gelu_tanh_backward, silu_backward, slice_backward, layernorm_backward,
  rmsnorm_backward, softmax_backward, rope_backward, sdpa_backward, ring_attention_backward, cross_entropy_backward,
  // conversion between float dtypes (mixed precision)
  cast,
  // fused kernels (made by passes/fuse_elementwise): residual add + norm (extra output 1: the sum),
  // bias + tanh-GELU, and the latter's backward
  add_layernorm, add_rmsnorm, bias_gelu_tanh, bias_gelu_tanh_backward,
  // the tiled SwiGLU MLP (Llama's, with runtime.tiled_mlp): one op over chunks of rows, so no
  // [S, I] tensor is planned; its backward recomputes gate and up (extra outputs: dw_gate, dw_up, dw_down)
  swiglu_mlp, swiglu_mlp_backward,
  // the tiled LM head + loss (runtime.tiled_loss): cross_entropy_sum(x · wᵀ, labels) over chunks of
  // rows, so no [S, V] logits are planned (extra output: each row's argmax); its backward computes
  // the logits again, chunk by chunk (extra output: dw)
  linear_cross_entropy_sum, linear_cross_entropy_backward,
  // a mixture-of-experts layer's experts (Mixtral, Qwen2-MoE, Qwen3-MoE): top-k routing of each
  // token by the router's probabilities, then per expert its tokens through a SwiGLU MLP (gpt-oss:
  // with biases, clamped; moe_biased), weighted and summed back; its backward recomputes the gate
  // and up projections (extra outputs: dprobs, then each weight's and bias's gradient)
  moe_experts, moe_experts_backward,
  // the same over an expert group (graph/passes/expert_parallel): the node takes this rank's 1/G of
  // the experts' weights, tokens travel to their experts' ranks and back by all-to-all
  moe_experts_ep, moe_experts_ep_backward,
  // preference training (train.objective "dpo", graph/passes/autosp/normalize_loss): each sequence's
  // summed completion log-probability [B, 2, K] (chosen, rejected of slot k) from logits, labels and
  // the targets' pair slots; the DPO loss over those and the reference's; their backwards
  sequence_logps, dpo_loss, sequence_logps_backward, dpo_loss_backward,
  // a mixture-of-experts layer's router statistics [2, E] (each expert's top-k token count, not
  // differentiated, and its summed probability) and transformers' load-balancing loss over the
  // layers' statistics [L, 2, E] (models/moe.h; graph/passes/autosp/normalize_loss); its backward
  moe_router_stats, moe_aux_loss, moe_aux_loss_backward,
  // elementwise tanh (Gemma's final logit softcap: cap · tanh(logits / cap))
  tanh,
  // Llama's SwiGLU activation (made by passes/fuse_elementwise from silu(gate) · up): silu(g) · u in
  // one pass, and its backward in one pass (dg; extra output: du)
  swiglu, swiglu_backward,
  // GPT-2's fused qkv into attention heads (made by passes/fuse_elementwise on CPU programs from
  // add(qkv, b) → three slices → reshape [B, S, N, D] → transpose(1, 2)): x [B, S, 3·N·D] + b [3·N·D]
  // → q [B, N, S, D] in one pass (extra outputs 1, 2: k, v); its backward lays dq, dk, dv back
  // side by side as dx [B, S, 3·N·D] and sums the bias gradient in the same pass (extra output 1)
  qkv_heads, qkv_heads_backward,
  kCount
};
inline constexpr size_t kNumOps = static_cast<size_t>(Op::kCount);
inline constexpr int64_t kIgnoreIndex = -100;  // labels with this value are not scored (PyTorch)

class Node;
struct TensorType;
struct VjpContext;  // defined by graph/autograd (the backward pass)

struct ShapeContext {
  const std::vector<Divisibility>* assumptions = nullptr;
  bool same(const Dim& a, const Dim& b) const;  // equal under the assumptions
};

using ShapeFn = TensorType (*)(const Node&, const ShapeContext&);
// Types of a node's extra outputs (1, 2, ...), read through `output(node, index=i)` nodes.
using ExtraFn = std::vector<TensorType> (*)(const Node&);
using VjpFn = void (*)(VjpContext&);

// Locality along the sequence (AutoSP's shard_seq_dim). Given which dim of each input holds the
// sequence (kNoSeq: none), the dim of the output that holds it; or, for an op that would compute
// something else once each rank holds S/P positions (it reduces, contracts, masks or slices along
// the sequence), `rejects` says what it does ("contracts over") and `dim` is the offending input dim.
inline constexpr int kNoSeq = -1;
struct SeqVerdict {
  int dim = kNoSeq;
  std::string_view rejects = {};
};
using SeqFn = SeqVerdict (*)(const Node&, std::span<const int> in, std::string_view seq);

// How an op treats element values: it computes with them (arithmetic in its dtype), only moves
// them (layout, all-to-all: exact in any dtype), or produces values of a dtype it declares itself
// (cast, constants, counts; reduce_scatter, whose launchers sum bf16 in f32 themselves, piece by
// piece). The CPU emulates bf16 only for `computes` ops.
enum class Numerics : uint8_t { computes, moves, converts };

// One row of the op table; written with designated initialisers, unnamed columns keep these defaults.
struct OpInfo {
  Op op;
  std::string_view name;       // snake_case, as printed
  int arity = 0;               // number of inputs, -1 = one or more
  int optional = 0;            // trailing inputs past `arity` that may be absent (sdpa's document starts)
  std::string_view attrs = {};  // required attributes, comma-separated
  ShapeFn infer = nullptr;     // shape rule; validates and throws UsageError naming op and shapes
  ExtraFn extra = nullptr;     // extra outputs (nullptr: the node has one output)
  VjpFn vjp = nullptr;         // backward rule (builds IR); nullptr: not differentiable
  SeqFn seq = nullptr;         // locality along the sequence; nullptr: AutoSP rejects the op on the sequence path
  bool backward_only = false;  // made by vjp rules only; never differentiated again
  // Communicates over the process group its "group" attribute names (the executor hands it that
  // group's communicator): DCE keeps it even when unused, since its effect is on the other ranks,
  // and the memory planner ends a background collective before the next one (background_until).
  bool collective = false;
  // The vjp also takes gradients of the extra outputs (VjpContext::output_grads); for other
  // multi-output ops an extra output on the loss path is an autograd error.
  bool differentiable_extras = false;
  // Elementwise: its kernel reads element i of input 0 before writing element i, so the memory
  // planner may give the output input 0's buffer when input 0 dies here.
  bool in_place = false;
  Numerics numerics = Numerics::computes;
};

const OpInfo& op_info(Op op);
std::string_view op_name(Op op);
const std::vector<std::string>& op_required_attrs(Op op);

// The dtype a reduction over `t` values is kept in: f32 for bf16/f16 (a loss, a log-sum-exp, a
// token count), else `t` itself.
DType accumulate_dtype(DType t);

// Infer `n`'s output type from its inputs and attributes (the op's shape rule).
TensorType infer_type(const Node& n, const std::vector<Divisibility>& assumptions);
// Whether a linear_cross_entropy_backward node computes dw (its optional weight_grad attribute,
// false for a frozen head; absent = true).
bool linear_ce_weight_grad(const Node& n);
// A linear_cross_entropy_sum / _backward node's final logit softcap (its optional softcap
// attribute, Gemma's final_logit_softcapping; absent = 0, no cap).
double linear_ce_softcap(const Node& n);
// A moe_experts* node's gpt-oss options (graph/builder.h MoeExpertOptions), optional attributes:
// "biases" (true: E gate, E up and E down biases follow the 3E weights) and "activation"
// ("swiglu" when absent, or "clamped_swiglu" with "alpha" and "limit").
bool moe_biased(const Node& n);
bool moe_clamped(const Node& n);
// Whether a moe_experts node keeps each assignment's gate and up projections for its backward (the
// optional attribute "keep", set by graph/passes/keep_moe_projections): then its extra output 1 is
// that block [2, rows · top_k, I], and its moe_experts_backward takes it as a last input.
bool moe_keeps(const Node& n);
// Where a moe_experts* node's weight and bias inputs end: its input count, less a backward's kept
// block (its last input, which has no gradient).
size_t moe_weights_end(const Node& n);
// The parameter inputs per expert of a moe_experts* node: 3, or 6 with biases.
inline int64_t moe_params_per_expert(const Node& n) { return moe_biased(n) ? 6 : 3; }
// Types of `n`'s extra outputs (empty for single-output ops).
std::vector<TensorType> extra_types(const Node& n);

}  // namespace autosp
