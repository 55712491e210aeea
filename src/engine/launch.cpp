// What the CPU and CUDA launchers share (engine/dispatch.h): the node's output in its planned place,
// and the geometry of views (broadcast strides, transpose/permute, slice, the all-to-all send and
// receive views), so both devices read the same elements for a node.
#include "engine/dispatch.h"

namespace autosp {

// The node's output: the planned place in the arena when there is one, else a fresh tensor.
Tensor out_like(const KernelCall& c, DType dt) {
  if (c.out.defined()) {
    AUTOSP_ASSERT(c.out.dtype() == dt && c.out.shape() == c.out_shape, "planned output of ", c.node.name(), " is ",
                  c.out.str());
    return c.out;
  }
  return Tensor::empty(c.out_shape, dt, c.alloc);
}

// The next extra output (index = how many were pushed so far), planned or fresh.
Tensor extra_like(const KernelCall& c, Shape shape, DType dt) {
  const size_t i = c.extras.size();
  if (i < c.extra_out.size() && c.extra_out[i].defined()) {
    AUTOSP_ASSERT(c.extra_out[i].dtype() == dt && c.extra_out[i].shape() == shape, "planned extra output ", i + 1,
                  " of ", c.node.name(), " is ", c.extra_out[i].str());
    return c.extra_out[i];
  }
  return Tensor::empty(std::move(shape), dt, c.alloc);
}

namespace launch {

int axis(int64_t d, int rank) { return static_cast<int>(d < 0 ? d + rank : d); }

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t off = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) st[off + i] = t.shape()[i] == 1 && out[off + i] != 1 ? 0 : t.strides()[i];
  return st;
}

Tensor permuted_view(const KernelCall& c, const Tensor& x) {
  std::vector<int64_t> perm;
  if (c.node.op() == Op::transpose) {
    for (int i = 0; i < x.rank(); ++i) perm.push_back(i);
    std::swap(perm[axis(c.node.attrs().i("dim0"), x.rank())], perm[axis(c.node.attrs().i("dim1"), x.rank())]);
  } else {
    for (int64_t p : c.node.attrs().ints("perm")) perm.push_back(axis(p, x.rank()));
  }
  Shape sh, st;
  for (int64_t p : perm) {
    sh.push_back(x.shape()[p]);
    st.push_back(x.strides()[p]);
  }
  return x.as_strided(sh, st, 0);
}

Tensor slice_view(const KernelCall& c, const Tensor& x) {
  const int d = axis(c.node.attrs().i("dim"), x.rank());
  const int64_t start = c.node.attrs().dim("start").eval(c.bindings);
  const int64_t end = c.node.attrs().dim("end").eval(c.bindings);
  if (start < 0 || end < start || end > x.dim(d))
    throw UsageError(str("[slice] ", c.node.name(), ": bounds [", start, ", ", end, ") outside dim ", d, " of ", x.str()));
  Shape sh = x.shape();
  sh[d] = end - start;
  return x.as_strided(sh, x.strides(), start * x.strides()[d]);
}

Tensor all_to_all_send_view(const KernelCall& c, const Tensor& x, const Communicator& comm) {
  const int64_t P = c.node.attrs().i("group_size");
  if (comm.size() != P)
    throw RuntimeFailure(str("[all_to_all] ", c.node.name(), ": group '", c.node.attrs().s("group"), "' has ",
                             comm.size(), " ranks, the graph was built for ", P));
  // Dim s split as (P, s/P), P moved to the front.
  const int s = axis(c.node.attrs().i("scatter_dim"), x.rank());
  Shape sh{P}, st{x.dim(s) / P * x.strides()[s]};
  for (int d = 0; d < x.rank(); ++d) {
    sh.push_back(d == s ? x.dim(s) / P : x.dim(d));
    st.push_back(x.strides()[d]);
  }
  return x.as_strided(sh, st, 0);
}

Communicator& shard_group(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, c.node.op_name(), " without a communicator");
  const int64_t P = c.node.attrs().i("group_size");
  if (c.comm->size() != P)
    throw RuntimeFailure(str("[", c.node.op_name(), "] ", c.node.name(), ": group '", c.node.attrs().s("group"),
                             "' has ", c.comm->size(), " ranks, the graph was built for ", P));
  return *c.comm;
}

ShardLayout shard_layout(const Communicator& comm, int64_t whole_numel) {
  return {shard_numel(whole_numel, comm.size()), comm.size(), whole_numel};
}

Tensor all_to_all_recv_view(const KernelCall& c, const Tensor& recv) {
  // recv [P, chunk...]: move P next to the gather dim (g + 1 in recv), to be merged with it.
  const int rank = recv.rank() - 1;
  const int g = axis(c.node.attrs().i("gather_dim"), rank);
  Shape sh, st;
  for (int d = 1; d <= rank; ++d) {
    if (d == g + 1) {
      sh.push_back(recv.shape()[0]);
      st.push_back(recv.strides()[0]);
    }
    sh.push_back(recv.shape()[d]);
    st.push_back(recv.strides()[d]);
  }
  return recv.as_strided(sh, st, 0);
}

}  // namespace launch

}  // namespace autosp
