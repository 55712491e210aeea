// Expert parallelism's exchange (engine/expert_parallel.h): counts, payloads, the local experts on
// the CPU MoE kernel's per-expert code (kernels/cpu/moe.h expert_rows_*; bf16: kernels/cpu/moe_bf16.h
// ExpertBf16), and the weighted scatter-add back at the source.
#include "engine/expert_parallel.h"
#include "engine/expert_parallel_layout.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/moe.h"
#include "kernels/cpu/moe_bf16.h"
#include "kernels/moe_routing.h"
#include "tensor/check.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace autosp {
namespace {

using Exchange = EpLayout;
using Bf16 = uint16_t;  // bf16 bits

// The type of what is summed at the source or owner, and of the routing weights and their
// gradients on the wire: f32 for bf16 tokens, else the tokens' own type.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, Bf16>, float, T>;

Exchange exchange_counts(Communicator& ep, const kernels::MoeRouting& r) {
  const int G = ep.size();
  AUTOSP_ASSERT(r.E % G == 0, "expert parallelism: ", r.E, " experts over ", G, " ranks");
  Tensor mine = Tensor::empty({r.E}, DType::i64), all = Tensor::empty({G, r.E}, DType::i64);
  for (int64_t e = 0; e < r.E; ++e) mine.data<int64_t>()[e] = r.rows_of(e);
  ep.all_gather(mine, all);
  return Exchange(G, ep.rank(), r.E, std::vector<int64_t>(all.data<int64_t>(), all.data<int64_t>() + G * r.E));
}

// A payload row: parts of their own types side by side, the row padded to 8 bytes. A buffer is
// [G, M, words] of int64 (the communicator moves it whatever the parts are), as the CUDA
// exchange's (decision 226): one message each way however many parts.
struct Row {
  int64_t bytes = 0;
  template <class U>
  int64_t part(int64_t n) {  // a part of n U's: its byte offset in the row
    const int64_t at = bytes;
    bytes += n * int64_t(sizeof(U));
    return at;
  }
  int64_t words() const { return (bytes + 7) / 8; }
};

Tensor buffer(const Exchange& x, const Row& row, Allocator& alloc) {
  Tensor t = Tensor::empty({x.G, x.M, row.words()}, DType::i64, alloc);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}
std::byte* row_at(const Tensor& t, int64_t i) { return static_cast<std::byte*>(t.raw()) + i * t.dim(2) * 8; }

template <class U>
void put(std::byte* row, int64_t at, const U* src, int64_t n) {
  std::memcpy(row + at, src, size_t(n) * sizeof(U));
}
template <class U>
void get(const std::byte* row, int64_t at, U* dst, int64_t n) {
  std::memcpy(dst, row + at, size_t(n) * sizeof(U));
}

// The send buffer: row a of this rank's rows for rank d's experts (slot order, so by expert, then
// by token) is filled by fill(slot, row).
template <class Fill>
Tensor pack(const Exchange& x, const kernels::MoeRouting& r, const Row& row, Allocator& alloc, const Fill& fill) {
  Tensor t = buffer(x, row, alloc);
  for (int d = 0; d < x.G; ++d) {
    const int64_t a0 = r.offset[size_t(d * x.L)], a1 = r.offset[size_t((d + 1) * x.L)];
    for (int64_t a = a0; a < a1; ++a) fill(r.slot[size_t(a)], row_at(t, d * x.M + a - a0));
  }
  return t;
}

// The same rows of the buffer the exchange brought back: use(slot, row) for each.
template <class Use>
void unpack(const Exchange& x, const kernels::MoeRouting& r, const Tensor& t, const Use& use) {
  for (int d = 0; d < x.G; ++d) {
    const int64_t a0 = r.offset[size_t(d * x.L)], a1 = r.offset[size_t((d + 1) * x.L)];
    for (int64_t a = a0; a < a1; ++a) use(r.slot[size_t(a)], row_at(t, d * x.M + a - a0));
  }
}

Tensor exchange(Communicator& ep, const Tensor& send, Allocator& alloc) {
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), alloc);
  ep.all_to_all(send, recv);
  return recv;
}

// Local expert j's received rows as one contiguous block: each row's part at byte `at`, n U's
// (source rank order, then as sent), into `dst` [rows, n], or back from `src` into the buffer.
template <class U>
int64_t gather_local(const Exchange& x, int64_t j, const Tensor& recv, int64_t at, int64_t n, U* dst) {
  int64_t row = 0;
  for (int s = 0; s < x.G; ++s) {
    const int64_t a0 = x.start(s, j), cnt = x.rows(s, x.g * x.L + j);
    for (int64_t a = 0; a < cnt; ++a, ++row) get(row_at(recv, s * x.M + a0 + a), at, dst + row * n, n);
  }
  return row;
}
template <class U>
void scatter_local(const Exchange& x, int64_t j, const Tensor& buf, int64_t at, int64_t n, const U* src) {
  int64_t row = 0;
  for (int s = 0; s < x.G; ++s) {
    const int64_t a0 = x.start(s, j), cnt = x.rows(s, x.g * x.L + j);
    for (int64_t a = 0; a < cnt; ++a, ++row) put(row_at(buf, s * x.M + a0 + a), at, src + row * n, n);
  }
}

// The source's f32 (or T) sums [R, C] into the output.
template <class T>
void store(const std::vector<Acc<T>>& sums, T* out) {
  if constexpr (std::is_same_v<T, Bf16>) cpu::cast<float, Bf16>(sums.data(), out, int64_t(sums.size()));
  else std::copy(sums.begin(), sums.end(), out);
}

// The exchange around the owner's work, any token type T. Forward: rows out [x: C × T], back
// [y: C × Acc] (the expert's output, unweighted); local(j, xe [n, C], n, ye [n, C]) runs local
// expert j on its n received rows.
template <class T, class Local>
void ep_forward(Communicator& ep, Allocator& alloc, const kernels::MoeRouting& r, const T* x, T* y, int64_t C,
                const Local& local) {
  using A = Acc<T>;
  const int64_t R = r.R, k = r.k;
  const Exchange ex = exchange_counts(ep, r);
  std::vector<A> sums(size_t(R * C), A(0));
  if (ex.M == 0) return store(sums, y);  // no rank routed any token (every rank knows it)
  Row out_row, back_row;
  const int64_t x_at = out_row.part<T>(C), y_at = back_row.part<A>(C);
  const Tensor sent =
      pack(ex, r, out_row, alloc, [&](int64_t s, std::byte* row) { put(row, x_at, x + (s / k) * C, C); });
  const Tensor recv = exchange(ep, sent, alloc);
  const Tensor out = buffer(ex, back_row, alloc);
  const int64_t n_max = ex.max_local_rows();
  std::vector<T> xe(size_t(n_max * C));
  std::vector<A> ye(size_t(n_max * C));
  for (int64_t j = 0; j < ex.L; ++j) {
    const int64_t n = gather_local(ex, j, recv, x_at, C, xe.data());
    if (n == 0) continue;
    local(j, xe.data(), n, ye.data());
    scatter_local(ex, j, out, y_at, C, ye.data());
  }
  const Tensor back = exchange(ep, out, alloc);
  std::vector<A> ys(static_cast<size_t>(C));
  unpack(ex, r, back, [&](int64_t s, const std::byte* row) {  // experts in index order, as moe_experts
    get(row, y_at, ys.data(), C);
    const A w = A(r.weight[size_t(s)]);
    A* o = sums.data() + (s / k) * C;
    for (int64_t c = 0; c < C; ++c) o[c] += w * ys[c];
  });
  store(sums, y);
}

// Backward: rows out [x: C × T | dy: C × T | w: Acc] (w the slot's routing weight), back
// [dx: C × Acc | g: Acc] (g = dy · the expert's output, the weight's gradient);
// local(j, xe, dye, we, n, dxe, ge) runs local expert j's backward on its n received rows (n may be
// 0: it still writes the expert's gradients, zeros) and writes the rows' dx (overwritten) and g.
// Returns each slot's weight gradient [R·k]; dx is written.
template <class T, class Local>
std::vector<double> ep_backward(Communicator& ep, Allocator& alloc, const kernels::MoeRouting& r, const T* dy,
                                const T* x, T* dx, int64_t C, const Local& local) {
  using A = Acc<T>;
  const int64_t R = r.R, k = r.k;
  const Exchange ex = exchange_counts(ep, r);
  std::vector<A> sums(size_t(R * C), A(0));
  std::vector<double> g(size_t(R * k), 0.0);
  Row out_row, back_row;
  const int64_t x_at = out_row.part<T>(C), dy_at = out_row.part<T>(C), w_at = out_row.part<A>(1);
  const int64_t dx_at = back_row.part<A>(C), g_at = back_row.part<A>(1);
  Tensor recv, out;
  if (ex.M > 0) {
    const Tensor sent = pack(ex, r, out_row, alloc, [&](int64_t s, std::byte* row) {
      const A w = A(r.weight[size_t(s)]);
      put(row, x_at, x + (s / k) * C, C);
      put(row, dy_at, dy + (s / k) * C, C);
      put(row, w_at, &w, 1);
    });
    recv = exchange(ep, sent, alloc);
    out = buffer(ex, back_row, alloc);
  }
  const size_t rows = size_t(ex.M == 0 ? 0 : ex.max_local_rows());
  std::vector<T> xe(rows * C), dye(rows * C);
  std::vector<A> we(rows), dxe(rows * C), ge(rows);
  for (int64_t j = 0; j < ex.L; ++j) {  // the local experts' backward, rows from every source
    const int64_t n = ex.M == 0 ? 0 : gather_local(ex, j, recv, x_at, C, xe.data());
    if (n > 0) {
      gather_local(ex, j, recv, dy_at, C, dye.data());
      gather_local(ex, j, recv, w_at, 1, we.data());
    }
    local(j, xe.data(), dye.data(), we.data(), n, dxe.data(), ge.data());
    if (n == 0) continue;
    scatter_local(ex, j, out, dx_at, C, dxe.data());
    scatter_local(ex, j, out, g_at, 1, ge.data());
  }
  if (ex.M > 0) {
    const Tensor back = exchange(ep, out, alloc);
    std::vector<A> d(static_cast<size_t>(C));
    unpack(ex, r, back, [&](int64_t s, const std::byte* row) {
      get(row, dx_at, d.data(), C);
      A* o = sums.data() + (s / k) * C;
      for (int64_t c = 0; c < C; ++c) o[c] += d[c];
      A gs;
      get(row, g_at, &gs, 1);
      g[size_t(s)] = double(gs);
    });
  }
  store(sums, dx);
  return g;
}

}  // namespace

template <class T>
void moe_ep_forward(Communicator& ep, Allocator& alloc, const T* x, const T* probs, const T* const* w_gate,
                    const T* const* w_up, const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I,
                    int64_t k, bool norm, const kernels::MoeOptions<T>& opt) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  ep_forward<T>(ep, alloc, r, x, y, C, [&](int64_t j, const T* xe, int64_t n, T* ye) {
    std::fill(ye, ye + n * C, T(0));
    cpu::expert_rows_forward<T>(xe, cpu::Expert<T>::of(w_gate, w_up, w_down, opt, j), ye, n, C, I);
  });
}

template <class T>
void moe_ep_backward(Communicator& ep, Allocator& alloc, const T* dy, const T* x, const T* probs,
                     const T* const* w_gate, const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                     T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I,
                     int64_t k, bool norm, const kernels::MoeOptions<T>& opt) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  std::vector<double> wd, gd;
  const std::vector<double> g =
      ep_backward<T>(ep, alloc, r, dy, x, dx, C, [&](int64_t j, const T* xe, const T* dye, const T* we, int64_t n,
                                                     T* dxe, T* ge) {
        wd.assign(we, we + n), gd.assign(size_t(n), 0.0);
        std::fill(dxe, dxe + n * C, T(0));
        cpu::Expert<T> e = cpu::Expert<T>::of(w_gate, w_up, w_down, opt, j);
        e.dwg = dw_gate[j], e.dwu = dw_up[j], e.dwd = dw_down[j];
        cpu::expert_rows_backward<T>(dye, xe, wd.data(), e, dxe, gd.data(), n, C, I);
        std::transform(gd.begin(), gd.end(), ge, [](double v) { return T(v); });
      });
  kernels::moe_probs_grad(r, norm, g.data(), dprobs);
}

void moe_ep_forward_bf16(Communicator& ep, Allocator& alloc, cpu::Bf16Gemm path, const uint16_t* x,
                         const uint16_t* probs, const uint16_t* const* w_gate, const uint16_t* const* w_up,
                         const uint16_t* const* w_down, uint16_t* y, int64_t R, int64_t C, int64_t E, int64_t I,
                         int64_t k, bool norm, const kernels::MoeOptions<uint16_t>& opt) {
  const kernels::MoeRouting r = cpu::moe_route_bf16(probs, R, E, k, norm);
  cpu::ExpertBf16 ex(path, kernels::kMlpChunkRows, C, I);
  ep_forward<Bf16>(ep, alloc, r, x, y, C, [&](int64_t j, const Bf16* xe, int64_t n, float* ye) {
    const cpu::ExpertBits e = cpu::ExpertBits::of(w_gate, w_up, w_down, opt, j);
    for (int64_t a0 = 0; a0 < n; a0 += kernels::kMlpChunkRows)  // the kernel's chunks of an expert's rows
      ex.forward(e, xe + a0 * C, std::min(kernels::kMlpChunkRows, n - a0), ye + a0 * C);
  });
}

void moe_ep_backward_bf16(Communicator& ep, Allocator& alloc, cpu::Bf16Gemm path, const uint16_t* dy,
                          const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                          const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                          uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                          int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<uint16_t>& opt) {
  const kernels::MoeRouting r = cpu::moe_route_bf16(probs, R, E, k, norm);
  cpu::ExpertBf16 ex(path, kernels::kMlpChunkRows, C, I);
  std::vector<double> gd;
  const std::vector<double> g = ep_backward<Bf16>(
      ep, alloc, r, dy, x, dx, C,
      [&](int64_t j, const Bf16* xe, const Bf16* dye, const float* we, int64_t n, float* dxe, float* ge) {
        cpu::ExpertBits e = cpu::ExpertBits::of(w_gate, w_up, w_down, opt, j);
        e.dwg = dw_gate[j], e.dwu = dw_up[j], e.dwd = dw_down[j];
        if (n == 0) return cpu::zero_expert_grads_bf16(e, C, I);  // an expert no row reached
        gd.resize(size_t(n));
        for (int64_t a0 = 0; a0 < n; a0 += kernels::kMlpChunkRows)
          ex.backward(e, xe + a0 * C, dye + a0 * C, we + a0, std::min(kernels::kMlpChunkRows, n - a0), a0 == 0,
                      gd.data() + a0, dxe + a0 * C);
        ex.finish(e);
        std::transform(gd.begin(), gd.end(), ge, [](double v) { return float(v); });
      });
  cpu::moe_probs_grad_bf16(r, norm, g.data(), dprobs);
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
