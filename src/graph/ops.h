// The op table: one row per op with its name, arity, required attributes, shape rule and vjp rule.
// Adding an op = one enum value + one row here + one row in the kernel dispatch table
// (src/engine/dispatch.cpp) + one line in the op-case test table. static_asserts keep the
// tables complete. Knows nothing of kernels or devices.
#pragma once

#include <array>
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
  // backward-only ops (built by vjp rules; not differentiated again)
  sum_to, embedding_backward, gelu_tanh_backward, silu_backward, slice_backward, layernorm_backward,
  rmsnorm_backward, softmax_backward, rope_backward, sdpa_backward, cross_entropy_backward,
  // conversion between float dtypes (mixed precision)
  cast,
  // fused kernels (made by passes/fuse_elementwise): residual add + norm (extra output 1: the sum),
  // bias + tanh-GELU, and the latter's backward
  add_layernorm, add_rmsnorm, bias_gelu_tanh, bias_gelu_tanh_backward,
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

struct OpInfo {
  Op op;
  std::string_view name;   // snake_case, as printed
  int arity;               // number of inputs, -1 = one or more
  std::string_view attrs;  // required attributes, comma-separated
  ShapeFn infer;           // shape rule; validates and throws UsageError naming op and shapes
  ExtraFn extra;           // extra outputs (nullptr: the node has one output)
  VjpFn vjp;               // backward rule (builds IR); nullptr: not differentiable
  bool backward_only;      // made by vjp rules only; never differentiated again
  bool side_effects = false;  // kept by DCE even when unused (collectives, optimizer updates)
  // The vjp also takes gradients of the extra outputs (VjpContext::output_grads); for other
  // multi-output ops an extra output on the loss path is an autograd error.
  bool differentiable_extras = false;
};

const OpInfo& op_info(Op op);
std::string_view op_name(Op op);
bool op_from_name(std::string_view name, Op& out);
std::vector<std::string> op_required_attrs(Op op);

// The dtype a reduction over `t` values is kept in: f32 for bf16/f16 (a loss, a log-sum-exp, a
// token count), else `t` itself.
DType accumulate_dtype(DType t);

// Infer `n`'s output type from its inputs and attributes (the op's shape rule).
TensorType infer_type(const Node& n, const std::vector<Divisibility>& assumptions);
// Types of `n`'s extra outputs (empty for single-output ops).
std::vector<TensorType> extra_types(const Node& n);

}  // namespace autosp
