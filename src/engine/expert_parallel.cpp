// Expert parallelism's exchange (engine/expert_parallel.h): counts, payloads, the local experts on
// the CPU MoE kernel's per-expert code (kernels/cpu/moe.h expert_rows_*), and the weighted
// scatter-add back at the source.
#include "engine/expert_parallel.h"
#include "engine/expert_parallel_layout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/moe.h"
#include "kernels/moe_routing.h"
#include "tensor/check.h"
#include "tensor/tensor.h"

namespace autosp {
namespace {

using Exchange = EpLayout;

Exchange exchange_counts(Communicator& ep, const kernels::MoeRouting& r) {
  const int G = ep.size();
  AUTOSP_ASSERT(r.E % G == 0, "expert parallelism: ", r.E, " experts over ", G, " ranks");
  Tensor mine = Tensor::empty({r.E}, DType::i64), all = Tensor::empty({G, r.E}, DType::i64);
  for (int64_t e = 0; e < r.E; ++e) mine.data<int64_t>()[e] = r.rows_of(e);
  ep.all_gather(mine, all);
  return Exchange(G, ep.rank(), r.E, std::vector<int64_t>(all.data<int64_t>(), all.data<int64_t>() + G * r.E));
}

// The send buffer [G, M, width]: row a of this rank's rows for rank d's experts (slot order, so by
// expert, then by token) is filled by fill(slot, dst) with `width` elements.
template <class T, class Fill>
Tensor pack(const Exchange& x, const kernels::MoeRouting& r, Allocator& alloc, int64_t width, const Fill& fill) {
  Tensor t = Tensor::empty({x.G, x.M, width}, dtype_of<T>, alloc);
  std::memset(t.raw(), 0, t.nbytes());
  T* p = t.data<T>();
  for (int d = 0; d < x.G; ++d) {
    const int64_t a0 = r.offset[size_t(d * x.L)], a1 = r.offset[size_t((d + 1) * x.L)];
    for (int64_t a = a0; a < a1; ++a) fill(r.slot[size_t(a)], p + (d * x.M + a - a0) * width);
  }
  return t;
}

// The same rows of the buffer the exchange brought back: use(slot, src) for each.
template <class T, class Use>
void unpack(const Exchange& x, const kernels::MoeRouting& r, const Tensor& t, int64_t width, const Use& use) {
  const T* p = t.data<T>();
  for (int d = 0; d < x.G; ++d) {
    const int64_t a0 = r.offset[size_t(d * x.L)], a1 = r.offset[size_t((d + 1) * x.L)];
    for (int64_t a = a0; a < a1; ++a) use(r.slot[size_t(a)], p + (d * x.M + a - a0) * width);
  }
}

Tensor exchange(Communicator& ep, const Tensor& send, Allocator& alloc) {
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), alloc);
  ep.all_to_all(send, recv);
  return recv;
}

// Local expert j's received rows as one contiguous block: each row's elements [from, from + n)
// (source rank order, then as sent) into `dst` [rows, n], or back from `src` into the buffer.
template <class T>
int64_t gather_local(const Exchange& x, int64_t j, const Tensor& recv, int64_t width, int64_t from, int64_t n, T* dst) {
  const T* p = recv.data<T>();
  int64_t row = 0;
  for (int s = 0; s < x.G; ++s) {
    const int64_t a0 = x.start(s, j), cnt = x.rows(s, x.g * x.L + j);
    for (int64_t a = 0; a < cnt; ++a, ++row) std::copy_n(p + (s * x.M + a0 + a) * width + from, n, dst + row * n);
  }
  return row;
}
template <class T>
void scatter_local(const Exchange& x, int64_t j, Tensor& buf, int64_t width, int64_t from, int64_t n, const T* src) {
  T* p = buf.data<T>();
  int64_t row = 0;
  for (int s = 0; s < x.G; ++s) {
    const int64_t a0 = x.start(s, j), cnt = x.rows(s, x.g * x.L + j);
    for (int64_t a = 0; a < cnt; ++a, ++row) std::copy_n(src + row * n, n, p + (s * x.M + a0 + a) * width + from);
  }
}

}  // namespace

template <class T>
void moe_ep_forward(Communicator& ep, Allocator& alloc, const T* x, const T* probs, const T* const* w_gate,
                    const T* const* w_up, const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I,
                    int64_t k, bool norm, const kernels::MoeOptions<T>& opt) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  const Exchange ex = exchange_counts(ep, r);
  std::fill(y, y + R * C, T(0));
  if (ex.M == 0) return;  // no rank routed any token (every rank knows it)
  const Tensor sent = pack<T>(ex, r, alloc, C, [&](int64_t s, T* dst) { std::copy_n(x + (s / k) * C, C, dst); });
  const Tensor recv = exchange(ep, sent, alloc);
  Tensor out = Tensor::empty(recv.shape(), recv.dtype(), alloc);
  std::memset(out.raw(), 0, out.nbytes());
  const int64_t n_max = ex.max_local_rows();
  std::vector<T> xe(size_t(n_max * C)), ye(size_t(n_max * C));
  for (int64_t j = 0; j < ex.L; ++j) {
    const int64_t n = gather_local(ex, j, recv, C, 0, C, xe.data());
    if (n == 0) continue;
    std::fill(ye.begin(), ye.end(), T(0));
    cpu::expert_rows_forward<T>(xe.data(), cpu::Expert<T>::of(w_gate, w_up, w_down, opt, j), ye.data(), n, C, I);
    scatter_local(ex, j, out, C, 0, C, ye.data());
  }
  const Tensor back = exchange(ep, out, alloc);
  unpack<T>(ex, r, back, C, [&](int64_t s, const T* ys) {  // experts in index order, as moe_experts
    const T w = T(r.weight[size_t(s)]);
    T* yr = y + (s / k) * C;
    for (int64_t c = 0; c < C; ++c) yr[c] += w * ys[c];
  });
}

template <class T>
void moe_ep_backward(Communicator& ep, Allocator& alloc, const T* dy, const T* x, const T* probs,
                     const T* const* w_gate, const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                     T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I,
                     int64_t k, bool norm, const kernels::MoeOptions<T>& opt) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  const Exchange ex = exchange_counts(ep, r);
  std::fill(dx, dx + R * C, T(0));
  std::vector<double> g(size_t(R * k), 0.0);  // the gradient of each slot's weight
  const int64_t n_max = ex.M == 0 ? 0 : ex.max_local_rows(), W = 2 * C + 1;
  Tensor recv, out;
  if (ex.M > 0) {  // rows out: [x | dy | w], the slot's routing weight w in T (as the kernel applies it)
    const Tensor sent = pack<T>(ex, r, alloc, W, [&](int64_t s, T* dst) {
      std::copy_n(x + (s / k) * C, C, dst);
      std::copy_n(dy + (s / k) * C, C, dst + C);
      dst[2 * C] = T(r.weight[size_t(s)]);
    });
    recv = exchange(ep, sent, alloc);
    out = Tensor::empty({ex.G, ex.M, C + 1}, recv.dtype(), alloc);
    std::memset(out.raw(), 0, out.nbytes());
  }
  const size_t rows = static_cast<size_t>(n_max);
  std::vector<T> xe(rows * C), dye(rows * C), dxe(rows * C), we(rows), ge(rows);
  std::vector<double> wd(rows), gd(rows);
  for (int64_t j = 0; j < ex.L; ++j) {  // the local experts' backward (kernels/cpu/moe.h), rows from every source
    const int64_t n = ex.M == 0 ? 0 : gather_local(ex, j, recv, W, 0, C, xe.data());
    if (n > 0) {
      gather_local(ex, j, recv, W, C, C, dye.data());
      gather_local(ex, j, recv, W, 2 * C, 1, we.data());
    }
    std::transform(we.begin(), we.begin() + n, wd.begin(), [](T v) { return double(v); });
    std::fill(dxe.begin(), dxe.end(), T(0));
    cpu::Expert<T> e = cpu::Expert<T>::of(w_gate, w_up, w_down, opt, j);
    e.dwg = dw_gate[j], e.dwu = dw_up[j], e.dwd = dw_down[j];
    cpu::expert_rows_backward<T>(dye.data(), xe.data(), wd.data(), e, dxe.data(), gd.data(), n, C, I);
    if (n == 0) continue;
    std::transform(gd.begin(), gd.begin() + n, ge.begin(), [](double v) { return T(v); });
    scatter_local(ex, j, out, C + 1, 0, C, dxe.data());  // rows back: [dx | g]
    scatter_local(ex, j, out, C + 1, C, 1, ge.data());
  }
  if (ex.M > 0) {
    const Tensor back = exchange(ep, out, alloc);
    unpack<T>(ex, r, back, C + 1, [&](int64_t s, const T* row) {
      T* dxr = dx + (s / k) * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] += row[c];
      g[size_t(s)] = double(row[C]);
    });
  }
  kernels::moe_probs_grad(r, norm, g.data(), dprobs);
}

#define AUTOSP_MOE_EP(T)                                                                                             \
  template void moe_ep_forward<T>(Communicator&, Allocator&, const T*, const T*, const T* const*, const T* const*,  \
                                  const T* const*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,            \
                                  const kernels::MoeOptions<T>&);                                                    \
  template void moe_ep_backward<T>(Communicator&, Allocator&, const T*, const T*, const T*, const T* const*,        \
                                   const T* const*, const T* const*, T*, T*, T* const*, T* const*, T* const*,        \
                                   int64_t, int64_t, int64_t, int64_t, int64_t, bool, const kernels::MoeOptions<T>&);
AUTOSP_MOE_EP(float)
AUTOSP_MOE_EP(double)
#undef AUTOSP_MOE_EP

}  // namespace autosp
