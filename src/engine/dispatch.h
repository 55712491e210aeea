// Kernel dispatch: a node runs through its op's launcher on the device of its inputs. Each op has
// one launcher, written once (engine/launchers.inc.h, compiled for the CPU by engine/cpu/launchers.cpp
// and for CUDA by engine/cuda/launchers.cpp, each with its row per op in a launcher table that
// static_asserts keep complete); a launcher turns tensors into the raw pointers and sizes of a
// kernel in src/kernels/{cpu,cuda}. An op a device has no kernel for gets an explicit launcher
// there that throws "<op> has no CUDA kernel". This header is also the launchers' interface:
// KernelCall and the helpers both devices share (engine/launch.cpp).
#pragma once

#include <functional>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "graph/ir.h"
#include "kernels/attention_backend.h"
#include "tensor/tensor.h"

namespace autosp {

struct KernelCall {
  const Node& node;
  std::span<const Tensor> in;
  const Shape& out_shape;    // the node's shape with symbols bound
  const Bindings& bindings;  // for attributes that are dims (slice bounds)
  Allocator& alloc;
  std::vector<Tensor>& extras;  // a multi-output op appends its extra outputs (1, 2, ...) here
  Communicator* comm;           // the group named by the node's "group" attribute (collectives)
  Tensor out;                   // where the output goes when the memory plan placed it (else undefined)
  std::vector<Tensor> extra_out;  // likewise for the extra outputs
  AttentionBackend attention = AttentionBackend::flash;  // the executor's (ExecOptions::attention)
  // Where a collective that may run in the background (all_gather) leaves its handle, when the
  // executor asks for that (else null: the launcher waits). The output is valid once it finished.
  std::unique_ptr<PendingCollective>* pending = nullptr;
  // Scratch the memory plan placed for the kernel (workspace_bytes below, valid for this call
  // only), or undefined: the kernel allocates its own.
  Tensor workspace = {};
};

using KernelFn = Tensor (*)(const KernelCall&);

// For launchers (CPU and CUDA): the node's output, in the planned place (`out`) when the memory
// plan placed it, else fresh from `alloc`; and likewise its next extra output (index = how many
// the launcher has pushed to `extras` so far).
Tensor out_like(const KernelCall& c, DType dt);
Tensor extra_like(const KernelCall& c, Shape shape, DType dt);

// Geometry the CPU and CUDA launchers share: views of their inputs (no data moves), so both
// devices read the same elements for a node.
namespace launch {
int axis(int64_t d, int rank);  // a negative dim counted from the end
// Strides of `t` broadcast (right-aligned) to `out`'s rank: 0 on broadcast dims.
Shape broadcast_strides(const Tensor& t, const Shape& out);
// A concat node's output y [..., Σ n_i, ...] as `outer` rows (one per index over the dims before its
// dim), each the inputs' contiguous blocks x_i [..., n_i, ...] side by side; sizes in bytes, all 0
// when there are no rows.
struct ConcatRows {
  int64_t outer = 0, row_bytes = 0;
  std::vector<int64_t> block_bytes;  // input i's block
};
ConcatRows concat_rows(const KernelCall& c);
// `x` with its dims reordered as a transpose or permute node says.
Tensor permuted_view(const KernelCall& c, const Tensor& x);
// The [start, end) part of `x` along a slice node's dim; bounds outside `x` are a UsageError.
Tensor slice_view(const KernelCall& c, const Tensor& x);
// Ulysses all-to-all: the send view of `x`, [P, chunk...] (chunk j of scatter_dim goes to rank j),
// after checking that `group_size` (P) ranks are in the node's group; and the received
// [P, chunk...] as the node's output view: the chunks side by side along gather_dim, rank order.
Tensor all_to_all_send_view(const KernelCall& c, const Tensor& x, const Communicator& comm);
Tensor all_to_all_recv_view(const KernelCall& c, const Tensor& recv);
// ZeRO-3's collectives (all_gather, reduce_scatter): the node's group, checked against the
// group_size the graph was built for; and the ranks' shards laid side by side, `whole` elements
// of them real and the rest padding. `direct` when they tile `whole` exactly (no padding).
Communicator& shard_group(const KernelCall& c);
struct ShardLayout {
  int64_t shard = 0, ranks = 1, whole = 0;
  bool direct() const { return shard * ranks == whole; }
  Shape padded() const { return {shard * ranks}; }  // the shards side by side
};
ShardLayout shard_layout(const Communicator& comm, int64_t whole_numel);

// ZeRO-3's reduce_scatter without a whole copy of its input (decision 102). The sum is in f32 when
// bf16 is involved (a bf16 gradient, sum_dtype f32), else in the output's dtype. The input goes to
// the collective as it is when it is in that dtype and its shards tile it (`staged` false);
// otherwise piece by piece through a staging buffer: piece j (m shard elements, the last fewer)
// holds, for every rank r, elements [r·c + j·m, r·c + j·m + length(j)) of the flattened input cast
// to the sum dtype (zeros past its end), and reduce-scattering it gives elements
// [j·m, j·m + length(j)) of this rank's shard (c = shard, P = ranks). The staging's P·m elements
// take at most reduce_scatter_piece_bytes() (m ≥ 1); when the output is not in the sum dtype
// (bf16 without sum_dtype) m more receive the piece's sum before it is cast into the output.
struct ScatterPieces {
  ShardLayout layout;
  DType sum = DType::f32;
  bool staged = false;
  int64_t m = 0, count = 1;  // shard elements per piece, number of pieces
  bool receive_apart = false;  // the output's dtype is not the sum's
  int64_t length(int64_t j) const { return std::min(m, layout.shard - j * m); }
  size_t workspace_bytes() const {
    return staged ? static_cast<size_t>((layout.ranks + (receive_apart ? 1 : 0)) * m) * dtype_size(sum) : 0;
  }
};
// AUTOSP_RS_PIECE_BYTES when set (tests make it small), else 1 GiB (decision 102).
size_t reduce_scatter_piece_bytes();
ScatterPieces scatter_pieces(const ShardLayout& l, DType in, DType out);
// The staging a reduce_scatter node wants (both devices: the memory plan places it, and keeps it
// until a collective left in the background has finished: memory_plan.h).
size_t reduce_scatter_workspace(const Node& n, const Bindings& b);
// The staging of a staged reduce_scatter: the planned workspace when it is large enough, else its
// own from the call's allocator.
Tensor reduce_scatter_staging(const KernelCall& c, const ScatterPieces& p);
// A staged reduce_scatter of `g` (flattened) into `y` through `staging` (≥ workspace_bytes()), with
// the device's cast (`convert`: from → to, same shapes; the same dtype is a copy) and zero fill.
// One piece runs in the background when the call asks (KernelCall::pending: the handle keeps
// `g` and `staging` alive); more run one after another, blocking (they share the staging).
struct DeviceFill {
  std::function<void(const Tensor& from, const Tensor& to)> convert;
  std::function<void(const Tensor& t)> zero;
};
void staged_reduce_scatter(const KernelCall& c, Communicator& comm, const ScatterPieces& p, const Tensor& g,
                           const Tensor& y, const Tensor& staging, const DeviceFill& fill);
}  // namespace launch

// Bytes of scratch a kernel wants for the node at these sizes (0: none), which the memory
// planner then places in the arena for the node's duration (KernelCall::workspace; a collective
// left in the background keeps it until it has finished).
using WorkspaceFn = size_t (*)(const Node&, const Bindings&);

// Run `call.node` on the device of its inputs. Leaves (input, parameter) and `output` (which reads
// an extra output kept by the executor) are not dispatched.
Tensor dispatch(const KernelCall& call, DeviceKind device);

// How the CPU computes the bf16 nodes of `program` on this machine, for the run log: which ops run
// on its bf16 units (and which path: kernels/cpu/matmul.h bf16_gemm_best, "AMX", "AVX512-BF16" or
// "emulated"), and by name the program's ops that are emulated (f32 kernels on widened copies).
std::string cpu_bf16_numerics(const Graph& program);
// The ops of `program` that compute on bf16 (a bf16 input or output) and have no bf16 launcher on
// this machine, by name, sorted: they run through bf16_via_f32.
std::vector<std::string> cpu_bf16_emulated_ops(const Graph& program);

// The scratch `node` wants on `device` at bindings `b` (engine/dispatch.cpp: the few ops that want
// one, per device; 0 for the others). Known in every build, so a build without CUDA plans a CUDA
// run's memory too.
size_t workspace_bytes(const Node& node, const Bindings& b, DeviceKind device);

}  // namespace autosp
