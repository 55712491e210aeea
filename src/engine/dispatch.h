// The kernel dispatch table: one row per op (same enum as the op table in src/graph) with a CPU
// launcher and a CUDA launcher (both declared in engine/launchers.h). A launcher turns
// tensors into the raw pointers and sizes of a kernel in src/kernels/{cpu,cuda}. An op without a
// CUDA kernel has an explicit entry that throws "<op> has no CUDA kernel". static_asserts keep the
// table complete (engine/dispatch.cpp). This header is also the launchers' interface: KernelCall
// and the helpers both devices share (engine/launch.cpp).
#pragma once

#include <span>

#include "comm/communicator.h"
#include "config/attention_backend.h"
#include "graph/ir.h"
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
  // Scratch the memory plan placed for the kernel (KernelRow::cpu_workspace bytes, valid for this
  // call only), or undefined: the kernel allocates its own.
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
}  // namespace launch

// Bytes of scratch a CPU kernel wants for the node at these sizes (0: none), which the memory
// planner then places in the arena for the node's duration (KernelCall::workspace).
using WorkspaceFn = size_t (*)(const Node&, const Bindings&);

struct KernelRow {
  Op op;
  KernelFn cpu;
  KernelFn cuda;
  WorkspaceFn cpu_workspace = nullptr;
};

// Run `call.node` on the device of its inputs. Leaves (input, parameter) and `output` (which reads
// an extra output kept by the executor) are not dispatched.
Tensor dispatch(const KernelCall& call, DeviceKind device);

// The scratch `node` wants on `device` at bindings `b` (the row's cpu_workspace; none on CUDA).
size_t workspace_bytes(const Node& node, const Bindings& b, DeviceKind device);

}  // namespace autosp
