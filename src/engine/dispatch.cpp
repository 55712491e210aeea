// The kernel dispatch table: one row per op, in Op enum order, naming its CPU launcher and its CUDA
// launcher (engine/launchers.h), or an explicit entry that throws "<op> has no CUDA kernel".
// static_asserts keep the table complete.
#include "engine/dispatch.h"

#include <array>

#include "engine/launchers.h"
#ifdef AUTOSP_WITH_CUDA
// The CUDA column names a cuda_ops launcher; builds without CUDA (which compile none) name no_cuda.
#define AUTOSP_CUDA(launcher) cuda_ops::launcher
#else
#define AUTOSP_CUDA(launcher) no_cuda
#endif

namespace autosp {
namespace {

Tensor leaf(const KernelCall& c) {
  AUTOSP_ASSERT(false, "node ", c.node.name(), " is resolved by the executor, not dispatched");
  return {};
}

[[maybe_unused]] Tensor no_cuda(const KernelCall& c) {
  throw RuntimeFailure(str(c.node.op_name(), " has no CUDA kernel"));
}

using kernels::Binary;
using kernels::Unary;
using kernels::UnaryGrad;
constexpr std::array<KernelRow, kNumOps> kKernels{{
    {Op::input, leaf, leaf},
    {Op::parameter, leaf, leaf},
    {Op::embedding, cpu_ops::embedding, AUTOSP_CUDA(embedding)},
    {Op::matmul, cpu_ops::matmul, AUTOSP_CUDA(matmul)},
    {Op::add, cpu_ops::binary<Binary::add>, AUTOSP_CUDA(binary<Binary::add>)},
    {Op::sub, cpu_ops::binary<Binary::sub>, AUTOSP_CUDA(binary<Binary::sub>)},
    {Op::mul, cpu_ops::binary<Binary::mul>, AUTOSP_CUDA(binary<Binary::mul>)},
    {Op::div, cpu_ops::binary<Binary::div>, AUTOSP_CUDA(binary<Binary::div>)},
    {Op::scale, cpu_ops::unary<Unary::scale>, AUTOSP_CUDA(unary<Unary::scale>)},
    {Op::neg, cpu_ops::unary<Unary::neg>, AUTOSP_CUDA(unary<Unary::neg>)},
    {Op::exp, cpu_ops::unary<Unary::exp>, AUTOSP_CUDA(unary<Unary::exp>)},
    {Op::gelu_tanh, cpu_ops::unary<Unary::gelu_tanh>, AUTOSP_CUDA(unary<Unary::gelu_tanh>)},
    {Op::silu, cpu_ops::unary<Unary::silu>, AUTOSP_CUDA(unary<Unary::silu>)},
    {Op::reshape, cpu_ops::reshape, AUTOSP_CUDA(reshape)},
    {Op::transpose, cpu_ops::permute, AUTOSP_CUDA(permute)},
    {Op::permute, cpu_ops::permute, AUTOSP_CUDA(permute)},
    {Op::slice, cpu_ops::slice, AUTOSP_CUDA(slice)},
    {Op::concat, cpu_ops::concat, AUTOSP_CUDA(concat)},
    {Op::layernorm, cpu_ops::layernorm, AUTOSP_CUDA(layernorm)},
    {Op::rmsnorm, cpu_ops::rmsnorm, AUTOSP_CUDA(rmsnorm)},
    {Op::softmax, cpu_ops::softmax, AUTOSP_CUDA(softmax)},
    {Op::rope, cpu_ops::rope<false>, AUTOSP_CUDA(rope<false>)},
    {Op::sdpa, cpu_ops::sdpa, AUTOSP_CUDA(sdpa)},
    {Op::cross_entropy_sum, cpu_ops::cross_entropy_sum, AUTOSP_CUDA(cross_entropy_sum)},
    {Op::count_valid, cpu_ops::count_valid, AUTOSP_CUDA(count_valid)},
    {Op::full, cpu_ops::full, AUTOSP_CUDA(full)},
    {Op::output, leaf, leaf},
    {Op::causal_mask, cpu_ops::causal_mask, AUTOSP_CUDA(causal_mask)},
    {Op::all_to_all, cpu_ops::all_to_all, AUTOSP_CUDA(all_to_all)},
    {Op::all_reduce, cpu_ops::all_reduce, AUTOSP_CUDA(all_reduce)},
    {Op::all_gather, cpu_ops::all_gather, AUTOSP_CUDA(all_gather)},
    {Op::reduce_scatter, cpu_ops::reduce_scatter, AUTOSP_CUDA(reduce_scatter), launch::reduce_scatter_workspace,
     launch::reduce_scatter_workspace},
    {Op::ring_attention, cpu_ops::ring_attention, AUTOSP_CUDA(ring_attention)},
    {Op::sum_to, cpu_ops::sum_to, AUTOSP_CUDA(sum_to)},
    {Op::embedding_backward, cpu_ops::embedding_backward, AUTOSP_CUDA(embedding_backward)},
    {Op::gelu_tanh_backward, cpu_ops::unary_backward<UnaryGrad::gelu_tanh>, AUTOSP_CUDA(unary_backward<UnaryGrad::gelu_tanh>)},
    {Op::silu_backward, cpu_ops::unary_backward<UnaryGrad::silu>, AUTOSP_CUDA(unary_backward<UnaryGrad::silu>)},
    {Op::slice_backward, cpu_ops::slice_backward, AUTOSP_CUDA(slice_backward)},
    {Op::layernorm_backward, cpu_ops::layernorm_backward, AUTOSP_CUDA(layernorm_backward)},
    {Op::rmsnorm_backward, cpu_ops::rmsnorm_backward, AUTOSP_CUDA(rmsnorm_backward)},
    {Op::softmax_backward, cpu_ops::softmax_backward, AUTOSP_CUDA(softmax_backward)},
    {Op::rope_backward, cpu_ops::rope<true>, AUTOSP_CUDA(rope<true>)},
    {Op::sdpa_backward, cpu_ops::sdpa_backward, AUTOSP_CUDA(sdpa_backward), cpu_ops::sdpa_backward_workspace},
    {Op::ring_attention_backward, cpu_ops::ring_attention_backward, AUTOSP_CUDA(ring_attention_backward)},
    {Op::cross_entropy_backward, cpu_ops::cross_entropy_backward, AUTOSP_CUDA(cross_entropy_backward)},
    {Op::cast, cpu_ops::cast, AUTOSP_CUDA(cast)},
    {Op::add_layernorm, cpu_ops::add_layernorm, AUTOSP_CUDA(add_layernorm)},
    {Op::add_rmsnorm, cpu_ops::add_rmsnorm, AUTOSP_CUDA(add_rmsnorm)},
    {Op::bias_gelu_tanh, cpu_ops::bias_gelu_tanh, AUTOSP_CUDA(bias_gelu_tanh)},
    {Op::bias_gelu_tanh_backward, cpu_ops::bias_gelu_tanh_backward, AUTOSP_CUDA(bias_gelu_tanh_backward)},
    {Op::swiglu_mlp, cpu_ops::swiglu_mlp, AUTOSP_CUDA(swiglu_mlp)},
    {Op::swiglu_mlp_backward, cpu_ops::swiglu_mlp_backward, AUTOSP_CUDA(swiglu_mlp_backward)},
    {Op::linear_cross_entropy_sum, cpu_ops::linear_cross_entropy_sum, AUTOSP_CUDA(linear_cross_entropy_sum),
     cpu_ops::linear_cross_entropy_workspace},
    {Op::linear_cross_entropy_backward, cpu_ops::linear_cross_entropy_backward,
     AUTOSP_CUDA(linear_cross_entropy_backward), cpu_ops::linear_cross_entropy_workspace},
}};

constexpr bool kernels_in_order() {
  for (size_t i = 0; i < kKernels.size(); ++i)
    if (static_cast<size_t>(kKernels[i].op) != i || !kKernels[i].cpu || !kKernels[i].cuda) return false;
  return true;
}
static_assert(kKernels.size() == kNumOps, "every op needs a row in the kernel dispatch table");
static_assert(kernels_in_order(), "dispatch rows must follow the Op enum order and name both launchers");

}  // namespace

size_t workspace_bytes(const Node& node, const Bindings& b, DeviceKind device) {
  const KernelRow& row = kKernels[static_cast<size_t>(node.op())];
  const WorkspaceFn f = device == DeviceKind::cpu ? row.cpu_workspace : row.cuda_workspace;
  return f != nullptr ? f(node, b) : 0;
}

Tensor dispatch(const KernelCall& call, DeviceKind device) {
  const KernelRow& row = kKernels[static_cast<size_t>(call.node.op())];
  if (device == DeviceKind::cuda) return row.cuda(call);
  return cpu_ops::emulates_bf16(call) ? cpu_ops::bf16_via_f32(call, row.cpu) : row.cpu(call);
}

}  // namespace autosp
