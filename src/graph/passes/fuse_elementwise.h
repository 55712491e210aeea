// fuse_elementwise: rewrites memory-bound op pairs of the forward graph into fused ops that read and
// write each tensor once (docs/decisions.md):
//   add(x, r) → layernorm / rmsnorm        ⇒ add_layernorm / add_rmsnorm (x, r [..., C] same shape);
//       the add's other users read the sum from the fused node's extra output 1 (`output(·, 1)`);
//       with PassContext::fuse_residual_bias, an operand r = add(m, b [C]) read by nothing else
//       (an output projection's bias) becomes the fused node's optional last input rb:
//       add_layernorm / add_rmsnorm (x, m, w (, b), rb), s = x + (m + rb);
//   add(x, b [C]) → gelu_tanh (the add has no other user) ⇒ bias_gelu_tanh(x, b);
//   silu(g) → mul(·, u) (the silu has no other user, u the mul's shape) ⇒ swiglu(g, u);
//   add(x, b [3C]) → slices [0, C), [C, 2C), [2C, 3C) of the last dim → reshape [B, S, N, D] →
//       transpose(1, 2) (GPT-2's attention inputs; with PassContext::fuse_qkv_heads) ⇒ qkv_heads(x, b),
//       k and v as its extra outputs 1, 2.
// Run after AutoSP and before autograd (compiler/program.cpp: program_passes), so the backward is built from the
// fused ops' vjps. Edits through the Graph API only; the replaced nodes are erased.
#pragma once

#include "graph/passes/pass.h"

namespace autosp {

namespace passes {
PassResult fuse_elementwise(Graph&, const PassContext&);
}  // namespace passes

}  // namespace autosp
