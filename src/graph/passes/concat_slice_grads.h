// concat_slice_grads: where a tensor was split into slices along one dim (GPT-2's fused qkv into
// q, k and v), autograd sums the slices' gradients as slice_backward (each a zero tensor of the
// whole shape with one slice written) added together. When the slice_backwards of one add chain
// cover the dim exactly, without overlap, the chain is their inputs concatenated:
//   add(add(slice_backward(dv, [512, 768)), slice_backward(dk, [256, 512))), slice_backward(dq, [0, 256)))
//     ⇒ concat(dq, dk, dv, dim)
// which writes the result once instead of 3 zero-filled tensors and 2 sums (5 tensor writes).
// Exact: every element of the sum is one slice's value plus zeros. Run after autograd
// (compiler/program.cpp: program_passes, with runtime.fuse_kernels). Edits through the Graph API;
// the replaced adds and slice_backwards are erased.
#pragma once

#include "graph/passes/pass.h"

namespace autosp {

namespace passes {
PassResult concat_slice_grads(Graph&, const PassContext&);
}  // namespace passes

}  // namespace autosp
