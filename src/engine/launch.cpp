// What the CPU and CUDA launchers share (engine/dispatch.h): the node's output in its planned place,
// and the geometry of views (broadcast strides, transpose/permute, slice, the all-to-all send and
// receive views), so both devices read the same elements for a node.
#include "engine/dispatch.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

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

ConcatRows concat_rows(const KernelCall& c) {
  const int d = axis(c.node.attrs().i("dim"), c.in[0].rank());
  const int64_t es = static_cast<int64_t>(dtype_size(c.in[0].dtype()));
  ConcatRows r;
  r.outer = shape_numel(std::span(c.out_shape).first(d));
  if (r.outer == 0) {
    r.block_bytes.assign(c.in.size(), 0);
    return r;
  }
  r.row_bytes = shape_numel(c.out_shape) / r.outer * es;
  for (const Tensor& x : c.in) r.block_bytes.push_back(x.numel() / r.outer * es);
  return r;
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

size_t reduce_scatter_piece_bytes() {
  constexpr size_t kDefault = size_t(1) << 30;
  const char* env = std::getenv("AUTOSP_RS_PIECE_BYTES");
  if (env == nullptr || *env == '\0') return kDefault;
  // Digits only: strtoull alone would take "-5" as 2^64 - 5 and " 7" as 7.
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::isdigit(static_cast<unsigned char>(*env)) ? std::strtoull(env, &end, 10) : 0;
  if (v == 0 || *end != '\0' || errno == ERANGE)
    throw UsageError(str("AUTOSP_RS_PIECE_BYTES='", env, "': expected a positive byte count"));
  return static_cast<size_t>(v);
}

ScatterPieces scatter_pieces(const ShardLayout& l, DType in, DType out) {
  ScatterPieces p;
  p.layout = l;
  p.sum = in == DType::bf16 || out == DType::bf16 ? DType::f32 : out;
  p.staged = !(l.direct() && in == p.sum && out == p.sum);
  p.receive_apart = out != p.sum;
  p.m = l.shard;
  if (p.staged && l.shard > 0) {
    const int64_t per_piece = static_cast<int64_t>(reduce_scatter_piece_bytes() / (static_cast<size_t>(l.ranks) * dtype_size(p.sum)));
    p.m = std::clamp<int64_t>(per_piece, 1, l.shard);
  }
  p.count = p.m > 0 ? (l.shard + p.m - 1) / p.m : 1;
  return p;
}

size_t reduce_scatter_workspace(const Node& n, const Bindings& b) {
  int64_t numel = 1;
  for (const auto& d : n.input(0)->shape()) numel *= d.eval(b);
  const int64_t P = n.attrs().i("group_size");
  return scatter_pieces({shard_numel(numel, P), P, numel}, n.input(0)->dtype(), n.dtype()).workspace_bytes();
}

Tensor reduce_scatter_staging(const KernelCall& c, const ScatterPieces& p) {
  const size_t bytes = p.workspace_bytes();
  if (c.workspace.defined() && c.workspace.nbytes() >= bytes) return c.workspace;
  return Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::i64, c.alloc);
}

void staged_reduce_scatter(const KernelCall& c, Communicator& comm, const ScatterPieces& p, const Tensor& g,
                           const Tensor& y, const Tensor& staging, const DeviceFill& fill) {
  const ShardLayout& l = p.layout;
  const size_t in_size = dtype_size(g.dtype()), sum_size = dtype_size(p.sum), out_size = dtype_size(y.dtype());
  AUTOSP_ASSERT(p.staged && staging.nbytes() >= p.workspace_bytes() && g.numel() == l.whole && y.numel() == l.shard,
                "staged reduce_scatter of ", g.str(), " into ", y.str(), " with ", staging.nbytes(), " bytes of staging");
  // Piece j: rank r's part at r·len, then (receive_apart) the received sum at P·m.
  auto send_of = [&](int64_t j) {
    const int64_t len = p.length(j);
    for (int64_t r = 0; r < l.ranks; ++r) {
      const int64_t from = r * l.shard + j * p.m;  // in the flattened input
      const int64_t real = std::clamp<int64_t>(l.whole - from, 0, len);
      const size_t at = static_cast<size_t>(r * len) * sum_size;
      if (real > 0)
        fill.convert(Tensor::view_bytes(g, static_cast<size_t>(from) * in_size, {real}, g.dtype()),
                     Tensor::view_bytes(staging, at, {real}, p.sum));
      if (real < len)
        fill.zero(Tensor::view_bytes(staging, at + static_cast<size_t>(real) * sum_size, {len - real}, p.sum));
    }
    return Tensor::view_bytes(staging, 0, {l.ranks * len}, p.sum);
  };
  auto recv_of = [&](int64_t j) {
    return p.receive_apart ? Tensor::view_bytes(staging, static_cast<size_t>(l.ranks * p.m) * sum_size, {p.length(j)}, p.sum)
                           : Tensor::view_bytes(y, static_cast<size_t>(j * p.m) * out_size, {p.length(j)}, y.dtype());
  };
  auto out_of = [&](int64_t j) {
    return Tensor::view_bytes(y, static_cast<size_t>(j * p.m) * out_size, {p.length(j)}, y.dtype());
  };
  if (l.shard == 0) return;
  if (c.pending && p.count == 1) {
    Tensor send = send_of(0), recv = recv_of(0);
    auto copy_out = [apart = p.receive_apart, recv, out = out_of(0), g, staging, convert = fill.convert] {
      if (apart) convert(recv, out);
    };
    *c.pending = followed_by(comm.reduce_scatter_sum_async(send, recv), copy_out);
    return;
  }
  for (int64_t j = 0; j < p.count; ++j) {
    Tensor recv = recv_of(j);
    comm.reduce_scatter_sum(send_of(j), recv);
    if (p.receive_apart) fill.convert(recv, out_of(j));
  }
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
