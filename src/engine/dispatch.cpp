// Kernel dispatch: a node runs the launcher of its op's row in its device's launcher table
// (engine/launchers.inc.h, compiled per device; the CPU's bf16 emulation wraps it), and the few
// kernels that want planned scratch say how much, per device. Builds without CUDA have no CUDA
// launchers: a node on a CUDA device says its op has no CUDA kernel.
#include "engine/dispatch.h"

#include <set>

#include "engine/launchers.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "tensor/check.h"

namespace autosp {
namespace {

// The kernels whose scratch depends on the sizes alone, so the memory plan places it
// (KernelCall::workspace); every other op wants none. Here rather than beside the launchers so
// that a build without CUDA plans a CUDA run as a CUDA build does (autosp-graph --plan-memory).
struct WorkspaceRow {
  Op op;
  WorkspaceFn cpu;
  WorkspaceFn cuda;
};
constexpr WorkspaceRow kWorkspaces[] = {
    {Op::reduce_scatter, launch::reduce_scatter_workspace, launch::reduce_scatter_workspace},
    {Op::sdpa_backward, cpu_ops::sdpa_backward_workspace, nullptr},
    {Op::linear_cross_entropy_sum, cpu_ops::linear_cross_entropy_workspace, nullptr},
    {Op::linear_cross_entropy_backward, cpu_ops::linear_cross_entropy_workspace, nullptr},
};

}  // namespace

size_t workspace_bytes(const Node& node, const Bindings& b, DeviceKind device) {
  for (const WorkspaceRow& row : kWorkspaces) {
    if (row.op != node.op()) continue;
    const WorkspaceFn f = device == DeviceKind::cpu ? row.cpu : row.cuda;
    return f != nullptr ? f(node, b) : 0;
  }
  return 0;
}

Tensor dispatch(const KernelCall& call, DeviceKind device) {
  if (device == DeviceKind::cuda) {
#ifdef AUTOSP_WITH_CUDA
    return cuda_ops::launcher(call.node.op())(call);
#else
    throw RuntimeFailure(str(call.node.op_name(), " has no CUDA kernel"));
#endif
  }
  const KernelFn f = cpu_ops::launcher(call.node.op());
  if (!cpu_ops::emulates_bf16(call)) return f(call);
  const KernelFn native = cpu_ops::native_bf16(call);
  return native ? native(call) : cpu_ops::bf16_via_f32(call, f);
}

std::vector<std::string> cpu_bf16_emulated_ops(const Graph& program) {
  std::set<std::string> ops;
  for (const std::unique_ptr<Node>& n : program.nodes()) {
    const Op op = n->op();
    if (op == Op::input || op == Op::parameter || op == Op::output) continue;  // not dispatched
    if (op_info(op).numerics != Numerics::computes || cpu_ops::has_native_bf16(*n)) continue;
    bool bf16 = n->dtype() == DType::bf16;
    for (const Node* in : n->inputs()) bf16 = bf16 || in->dtype() == DType::bf16;
    if (bf16) ops.insert(std::string(n->op_name()));
  }
  return {ops.begin(), ops.end()};
}

std::string cpu_bf16_numerics(const Graph& program) {
  const cpu::Bf16Gemm path = cpu::bf16_gemm_best();
  const std::vector<std::string> emulated = cpu_bf16_emulated_ops(program);
  std::string rest = emulated.empty() ? "every other op reads and writes bf16 itself"
                                      : "emulated (f32 kernels on widened copies, each result rounded to bf16): ";
  for (size_t i = 0; i < emulated.size(); ++i) rest += (i ? ", " : "") + emulated[i];
  if (path == cpu::Bf16Gemm::f32)
    return str("on cpu without AMX or AVX512-BF16: the GEMM-bound ops widen to f32 (as fast here); ", rest);
  // The attention's tile products follow the GEMM's path (kernels/cpu/attention.h sdpa_bf16_path).
  const std::string units = str("matmuls, the tiled MLP and loss and the attention's tile products on ",
                                cpu::bf16_gemm_name(cpu::sdpa_bf16_path()));
  return str("on cpu: ", units, ", each result rounded to bf16; ", rest);
}

}  // namespace autosp
