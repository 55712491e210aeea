// CUDA grouped expert MLP (moe.cuh): host routing (kernels/moe_routing.h), then per expert and per
// chunk of kMlpChunkRows of its rows the steps of the CPU kernel (kernels/cpu/moe.cpp): a gather,
// the gate and up GEMMs, the activation in one pass (the biases added there), the down GEMM, and a
// weighted scatter-add (with the down bias). The backward costs seven GEMMs per expert, as on the
// CPU: gate and up recomputed, d = dy·Wd (unweighted), dWd, dx twice, dWg and dWu; each slot's
// routing-weight gradient is (dy·Wd)·h (+ dy·b_down) from the same pass that forms dg and du, so the
// expert's output is never rebuilt. An expert's rows are distinct tokens, so its scatter has no
// races; experts run one after another in index order, as on the CPU. The per-expert loops take a
// list of rows (MoeRows: slots, per-expert offsets, k, weights), so expert parallelism's owner
// (engine/cuda/expert_parallel.cpp) runs them on the rows it received (k = 1, a slot per row).
#include "kernels/cuda/moe.cuh"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cuda/matmul.cuh"
#include "kernels/kinds.h"
#include "kernels/moe_routing.h"

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

// The expert's activation in the accumulation type A: SwiGLU h = silu(g)·u (Mixtral's), or
// gpt-oss's clamped one, gc = min(g, L), uc = clamp(u, −L, L), h = (uc + 1)·gc·σ(α·gc).
template <class A>
struct Activation {
  bool clamped;
  A alpha, limit;
  __device__ static A sigmoid(A v) { return A(1) / (A(1) + dexp(-v)); }
  __device__ A forward(A g, A u) const {
    if (!clamped) return g * sigmoid(g) * u;
    const A gc = g > limit ? limit : g, uc = u > limit ? limit : (u < -limit ? -limit : u);
    return (uc + A(1)) * gc * sigmoid(alpha * gc);
  }
  // h, and the gradients dg, du of dh (torch.clamp's: zero where a clamp cut, the bounds included
  // as inside).
  __device__ A backward(A g, A u, A dh, A& dg, A& du) const {
    if (!clamped) {
      const A s = sigmoid(g), gs = g * s;
      dg = dh * u * (s * (A(1) + g * (A(1) - s)));
      du = dh * gs;
      return gs * u;
    }
    const A gc = g > limit ? limit : g, uc = u > limit ? limit : (u < -limit ? -limit : u);
    const A s = sigmoid(alpha * gc), glu = gc * s;
    dg = g <= limit ? dh * (uc + A(1)) * (s * (A(1) + alpha * gc * (A(1) - s))) : A(0);
    du = (u >= -limit && u <= limit) ? dh * glu : A(0);
    return (uc + A(1)) * glu;
  }
};

// ---- kernels ----

// xe [n, C] = src rows slot[a] / k (zeros where slot[a] < 0: an exchange's padding).
template <class T>
__global__ void gather_rows(const T* src, const int64_t* slot, T* xe, int64_t n, int64_t C, int64_t k) {
  AUTOSP_GRID_STRIDE(i, n * C) {
    const int64_t a = i / C, c = i % C, s = slot[a];
    xe[i] = s < 0 ? T{} : src[(s / k) * C + c];
  }
}

// dst row slot[a] / k += weight[slot[a]] · (ye[a] + bias) (weight null: 1; bias null: none).
template <class T>
__global__ void scatter_add_rows(const T* ye, const T* bias, const int64_t* slot, const acc_t<T>* weight, T* dst,
                                 int64_t n, int64_t C, int64_t k) {
  AUTOSP_GRID_STRIDE(i, n * C) {
    const int64_t a = i / C, c = i % C, s = slot[a], at = (s / k) * C + c;
    const acc_t<T> w = weight ? weight[s] : acc_t<T>(1);
    store(dst, at, load(dst, at) + w * (load(ye, i) + (bias ? load(bias, c) : acc_t<T>(0))));
  }
}

// g [r, I] ← act(g + bg, u + bu) (biases null: none).
template <class T>
__global__ void activate(T* g, const T* u, const T* bg, const T* bu, int64_t r, int64_t I, Activation<acc_t<T>> act) {
  AUTOSP_GRID_STRIDE(j, r * I) {
    const int64_t i = j % I;
    acc_t<T> gv = load(g, j), uv = load(u, j);
    if (bg) gv += load(bg, i), uv += load(bu, i);
    store(g, j, act.forward(gv, uv));
  }
}

// One block per row a of the chunk, from g, u (the projections, before their biases) and
// d = dy_e·Wd (unweighted), w the slot's routing weight: h = act(g + bg, u + bu); g ← dg and u ← du
// (of dh = w·d), h ← w·h (what dWd reads), grad[slot[a]] = d·h + dy_e·bd (the gradient of w).
template <class T>
__global__ void activate_backward(T* g, T* u, const T* d, T* h, const T* de, const T* bg, const T* bu, const T* bd,
                                  const int64_t* slot, const acc_t<T>* weight, acc_t<T>* grad, int64_t I, int64_t C,
                                  Activation<acc_t<T>> act) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const int64_t a = blockIdx.x;
  const A w = weight[slot[a]];
  A dot = 0;
  for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
    const int64_t j = a * I + i;
    A gv = load(g, j), uv = load(u, j), dg, du;
    if (bg) gv += load(bg, i), uv += load(bu, i);
    const A dv = load(d, j), hv = act.backward(gv, uv, w * dv, dg, du);
    dot += dv * hv;
    store(g, j, dg), store(u, j, du), store(h, j, w * hv);
  }
  if (bd)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load(de, a * C + c) * load(bd, c);
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) grad[slot[a]] = dot;
}

// acc [n] += Σ_a scale_a · m[a, :] over the r rows of m (scale_a = weight[slot[a]], or 1 where
// weight is null): a bias's gradient, one thread per column adding the rows in order.
template <class T>
__global__ void sum_rows(const T* m, int64_t r, int64_t n, const int64_t* slot, const acc_t<T>* weight, acc_t<T>* acc) {
  AUTOSP_GRID_STRIDE(i, n) {
    acc_t<T> s = acc[i];
    for (int64_t a = 0; a < r; ++a) s += (weight ? weight[slot[a]] : acc_t<T>(1)) * load(m, a * n + i);
    acc[i] = s;
  }
}

// dst [n] = acc rounded to T.
template <class T>
__global__ void store_sums(const acc_t<T>* acc, T* dst, int64_t n) {
  AUTOSP_GRID_STRIDE(i, n) store(dst, i, acc[i]);
}

// ---- host helpers ----

template <class T>
double host_value(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return double(__bfloat162float(v));
  else
    return double(v);
}
template <class T>
T device_value(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(float(v));
  else
    return T(v);
}

// The routing of probs (on the device), computed on the host in probs' precision (bf16: float).
template <class T>
kernels::MoeRouting route(const T* probs, int64_t R, int64_t E, int64_t k, bool norm, cudaStream_t s) {
  std::vector<T> h(size_t(R * E));
  if (!h.empty()) CUDA_CHECK(cudaMemcpyAsync(h.data(), probs, h.size() * sizeof(T), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if constexpr (std::is_same_v<T, double>) {
    return kernels::moe_route(h.data(), R, E, k, norm);
  } else {
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = float(host_value(h[i]));
    return kernels::moe_route(f.data(), R, E, k, norm);
  }
}

// One expert's parameters and options (kinds.h MoeOptions; biases null: none).
template <class T>
struct Expert {
  const T *wg, *wu, *wd, *bg = nullptr, *bu = nullptr, *bd = nullptr;
  Activation<acc_t<T>> act;
  Expert(const T* const* w_gate, const T* const* w_up, const T* const* w_down, const kernels::MoeOptions<T>& opt,
         int64_t e)
      : wg(w_gate[e]), wu(w_up[e]), wd(w_down[e]),
        act{opt.clamped, acc_t<T>(opt.alpha), acc_t<T>(opt.limit)} {
    if (opt.b_gate) bg = opt.b_gate[e], bu = opt.b_up[e], bd = opt.b_down[e];
  }
};

// The device scratch of one chunk of up to `rows` rows: xe, de, dxe [rows, C]; g, u, d, h [rows, I].
template <class T>
struct ChunkScratch {
  Scratch xe, de, dxe, g, u, d, h;
  ChunkScratch(int64_t rows, int64_t C, int64_t I, bool backward, cudaStream_t s)
      : xe(rows * C * sizeof(T), s), de((backward ? rows : 1) * C * sizeof(T), s), dxe(rows * C * sizeof(T), s),
        g(rows * I * sizeof(T), s), u(rows * I * sizeof(T), s), d((backward ? rows * I : 1) * sizeof(T), s),
        h((backward ? rows * I : 1) * sizeof(T), s) {}
};

// g, u [r, I] = xe · Wgᵀ, xe · Wuᵀ (biases not added).
template <class T>
void project(const Expert<T>& ex, const T* xe, T* g, T* u, int64_t r, int64_t C, int64_t I, cudaStream_t s) {
  gemm_batched<T>(false, true, 1, r, I, C, 1.0, xe, 0, ex.wg, 0, 0.0, g, 0, s);
  gemm_batched<T>(false, true, 1, r, I, C, 1.0, xe, 0, ex.wu, 0, 0.0, u, 0, s);
}

// The chunk: the most rows any expert of `rows` gets, at most kMlpChunkRows (at least 1).
int64_t chunk_rows(const std::vector<int64_t>& offset) {
  int64_t m = 0;
  for (size_t e = 0; e + 1 < offset.size(); ++e) m = std::max(m, offset[e + 1] - offset[e]);
  return std::max<int64_t>(1, std::min(m, kernels::kMlpChunkRows));
}

}  // namespace

template <class T>
DeviceRouting<T>::DeviceRouting(const kernels::MoeRouting& r, cudaStream_t s)
    : slot(std::max<size_t>(1, r.slot.size()) * sizeof(int64_t), s),
      weight(std::max<size_t>(1, r.weight.size()) * sizeof(acc_t<T>), s) {
  const std::vector<acc_t<T>> w(r.weight.begin(), r.weight.end());
  if (r.slot.empty()) return;
  CUDA_CHECK(cudaMemcpyAsync(slot.as<int64_t>(), r.slot.data(), r.slot.size() * sizeof(int64_t),
                             cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(weight.as<acc_t<T>>(), w.data(), w.size() * sizeof(acc_t<T>), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));  // w is a host temporary
}

template <class T>
kernels::MoeRouting moe_route(const T* probs, int64_t R, int64_t E, int64_t k, bool norm, cudaStream_t s) {
  return route(probs, R, E, k, norm, s);
}

template <class T>
void moe_rows_forward(const T* x, const MoeRows<T>& rows, const T* const* w_gate, const T* const* w_up,
                      const T* const* w_down, T* y, int64_t C, int64_t I, const kernels::MoeOptions<T>& opt,
                      cudaStream_t s) {
  const std::vector<int64_t>& offset = *rows.offset;
  const int64_t chunk = chunk_rows(offset);
  ChunkScratch<T> sc(chunk, C, I, false, s);
  T *xe = sc.xe.template as<T>(), *ye = sc.dxe.template as<T>(), *g = sc.g.template as<T>(), *u = sc.u.template as<T>();
  for (size_t e = 0; e + 1 < offset.size(); ++e) {
    const Expert<T> ex(w_gate, w_up, w_down, opt, int64_t(e));
    const int64_t count = offset[e + 1] - offset[e];
    for (int64_t r0 = 0; r0 < count; r0 += chunk) {
      const int64_t n = std::min(chunk, count - r0);
      const int64_t* slot = rows.slot + offset[e] + r0;
      launch_kernel(gather_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, x, slot, xe, n, C, rows.k);
      project(ex, xe, g, u, n, C, I, s);
      launch_kernel(activate<T>, grid_for(n * I, kBlock), kBlock, 0, s, g, u, ex.bg, ex.bu, n, I, ex.act);
      gemm_batched<T>(false, true, 1, n, C, I, 1.0, g, 0, ex.wd, 0, 0.0, ye, 0, s);  // ye = h · Wdᵀ
      launch_kernel(scatter_add_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, ye, ex.bd, slot, rows.weight, y, n, C,
                    rows.k);
    }
  }
}

template <class T>
void moe_rows_backward(const T* dy, const T* x, const MoeRows<T>& rows, const T* const* w_gate, const T* const* w_up,
                       const T* const* w_down, T* dx, acc_t<T>* grad, T* const* dw_gate, T* const* dw_up,
                       T* const* dw_down, int64_t C, int64_t I, const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  using A = acc_t<T>;
  const std::vector<int64_t>& offset = *rows.offset;
  const int64_t chunk = chunk_rows(offset);
  ChunkScratch<T> sc(chunk, C, I, true, s);
  T *xe = sc.xe.template as<T>(), *de = sc.de.template as<T>(), *dxe = sc.dxe.template as<T>();
  T *g = sc.g.template as<T>(), *u = sc.u.template as<T>(), *dd = sc.d.template as<T>(), *h = sc.h.template as<T>();
  const int64_t n_acc = ChunkedGradient<T>::acc_elems(I, C);
  Scratch acc(std::max<int64_t>(1, 3 * n_acc) * sizeof(float), s);  // bf16: the weight gradients' f32 sums
  Scratch bias_acc((2 * I + C) * sizeof(A), s);                     // the bias gradients' sums: dbg, dbu, dbd
  A *dbg_acc = bias_acc.as<A>(), *dbu_acc = dbg_acc + I, *dbd_acc = dbu_acc + I;
  for (size_t e = 0; e + 1 < offset.size(); ++e) {
    const Expert<T> ex(w_gate, w_up, w_down, opt, int64_t(e));
    float* af = n_acc > 0 ? acc.as<float>() : nullptr;
    ChunkedGradient<T> gwg{dw_gate[e], af, I, C}, gwu{dw_up[e], af ? af + n_acc : nullptr, I, C},
        gwd{dw_down[e], af ? af + 2 * n_acc : nullptr, C, I};
    if (ex.bg) CUDA_CHECK(cudaMemsetAsync(dbg_acc, 0, (2 * I + C) * sizeof(A), s));
    const int64_t count = offset[e + 1] - offset[e];
    for (int64_t r0 = 0; r0 < count; r0 += chunk) {
      const int64_t n = std::min(chunk, count - r0);
      const int64_t* slot = rows.slot + offset[e] + r0;
      launch_kernel(gather_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, x, slot, xe, n, C, rows.k);
      launch_kernel(gather_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, dy, slot, de, n, C, rows.k);
      project(ex, xe, g, u, n, C, I, s);
      gemm_batched<T>(false, false, 1, n, I, C, 1.0, de, 0, ex.wd, 0, 0.0, dd, 0, s);  // d = dy_e · Wd
      launch_kernel(activate_backward<T>, dim3(unsigned(n)), kBlock, 0, s, g, u, dd, h, de, ex.bg, ex.bu, ex.bd, slot,
                    rows.weight, grad, I, C, ex.act);
      gwd.add(true, false, n, de, h, s);                                               // dWd += dy_eᵀ · (w ∘ h)
      gemm_batched<T>(false, false, 1, n, C, I, 1.0, g, 0, ex.wg, 0, 0.0, dxe, 0, s);  // dx_e = dg · Wg
      gemm_batched<T>(false, false, 1, n, C, I, 1.0, u, 0, ex.wu, 0, 1.0, dxe, 0, s);  //      + du · Wu
      gwg.add(true, false, n, g, xe, s);                                               // dWg += dgᵀ · xe
      gwu.add(true, false, n, u, xe, s);                                               // dWu += duᵀ · xe
      if (ex.bg) {  // dbd += Σ w·dy_e, dbg += Σ dg, dbu += Σ du
        const A* none = nullptr;
        launch_kernel(sum_rows<T>, grid_for(C, kBlock), kBlock, 0, s, de, n, C, slot, rows.weight, dbd_acc);
        launch_kernel(sum_rows<T>, grid_for(I, kBlock), kBlock, 0, s, g, n, I, slot, none, dbg_acc);
        launch_kernel(sum_rows<T>, grid_for(I, kBlock), kBlock, 0, s, u, n, I, slot, none, dbu_acc);
      }
      launch_kernel(scatter_add_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, dxe, static_cast<const T*>(nullptr),
                    slot, static_cast<const A*>(nullptr), dx, n, C, rows.k);
    }
    for (ChunkedGradient<T>* gw : {&gwg, &gwu, &gwd}) gw->finish(s);  // zeros for an expert without rows
    if (ex.bg) {
      launch_kernel(store_sums<T>, grid_for(I, kBlock), kBlock, 0, s, dbg_acc, opt.db_gate[e], I);
      launch_kernel(store_sums<T>, grid_for(I, kBlock), kBlock, 0, s, dbu_acc, opt.db_up[e], I);
      launch_kernel(store_sums<T>, grid_for(C, kBlock), kBlock, 0, s, dbd_acc, opt.db_down[e], C);
    }
  }
}

template <class V>
void moe_gather_rows(const V* src, const int64_t* slot, V* dst, int64_t n, int64_t C, int64_t k, cudaStream_t s) {
  if (n * C > 0) launch_kernel(gather_rows<V>, grid_for(n * C, kBlock), kBlock, 0, s, src, slot, dst, n, C, k);
}

template <class T>
void moe_scatter_add_rows(const T* src, const int64_t* slot, const acc_t<T>* weight, T* dst, int64_t n, int64_t C,
                          int64_t k, cudaStream_t s) {
  if (n * C > 0)
    launch_kernel(scatter_add_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, src, static_cast<const T*>(nullptr), slot,
                  weight, dst, n, C, k);
}

template <class T>
void moe_probs_grad(const kernels::MoeRouting& r, bool norm, const acc_t<T>* grad, T* dprobs, cudaStream_t s) {
  using A = acc_t<T>;
  std::vector<A> gh(r.slot.size());
  if (!gh.empty()) CUDA_CHECK(cudaMemcpyAsync(gh.data(), grad, gh.size() * sizeof(A), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<double> gw(gh.begin(), gh.end());
  std::vector<double> dp(size_t(r.R * r.E));
  kernels::moe_probs_grad(r, norm, gw.data(), dp.data());
  std::vector<T> dph(dp.size());
  for (size_t i = 0; i < dp.size(); ++i) dph[i] = device_value<T>(dp[i]);
  if (!dph.empty()) CUDA_CHECK(cudaMemcpyAsync(dprobs, dph.data(), dph.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));  // dph is a host temporary
}

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                         const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  const kernels::MoeRouting r = route(probs, R, E, k, norm, s);
  const DeviceRouting<T> d(r, s);
  CUDA_CHECK(cudaMemsetAsync(y, 0, R * C * sizeof(T), s));
  moe_rows_forward<T>(x, {d.slots(), &r.offset, k, d.weights()}, w_gate, w_up, w_down, y, C, I, opt, s);
}

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  using A = acc_t<T>;
  const kernels::MoeRouting r = route(probs, R, E, k, norm, s);
  const DeviceRouting<T> d(r, s);
  Scratch gd(std::max<size_t>(1, r.slot.size()) * sizeof(A), s);  // each slot's weight gradient
  CUDA_CHECK(cudaMemsetAsync(dx, 0, R * C * sizeof(T), s));
  moe_rows_backward<T>(dy, x, {d.slots(), &r.offset, k, d.weights()}, w_gate, w_up, w_down, dx, gd.as<A>(), dw_gate,
                       dw_up, dw_down, C, I, opt, s);
  moe_probs_grad<T>(r, norm, gd.as<A>(), dprobs, s);  // dprobs from the slots' weight gradients, on the host
}

#define AUTOSP_INSTANTIATE(T)                                                                                       \
  template void moe_experts_forward<T>(const T*, const T*, const T* const*, const T* const*, const T* const*, T*,  \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool,                          \
                                       const kernels::MoeOptions<T>&, cudaStream_t);                               \
  template void moe_experts_backward<T>(const T*, const T*, const T*, const T* const*, const T* const*,           \
                                        const T* const*, T*, T*, T* const*, T* const*, T* const*, int64_t,         \
                                        int64_t, int64_t, int64_t, int64_t, bool, const kernels::MoeOptions<T>&,   \
                                        cudaStream_t);                                                             \
  template struct DeviceRouting<T>;                                                                               \
  template kernels::MoeRouting moe_route<T>(const T*, int64_t, int64_t, int64_t, bool, cudaStream_t);              \
  template void moe_rows_forward<T>(const T*, const MoeRows<T>&, const T* const*, const T* const*, const T* const*, \
                                    T*, int64_t, int64_t, const kernels::MoeOptions<T>&, cudaStream_t);            \
  template void moe_rows_backward<T>(const T*, const T*, const MoeRows<T>&, const T* const*, const T* const*,      \
                                     const T* const*, T*, acc_t<T>*, T* const*, T* const*, T* const*, int64_t,     \
                                     int64_t, const kernels::MoeOptions<T>&, cudaStream_t);                        \
  template void moe_gather_rows<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, cudaStream_t);         \
  template void moe_scatter_add_rows<T>(const T*, const int64_t*, const acc_t<T>*, T*, int64_t, int64_t, int64_t,  \
                                        cudaStream_t);                                                             \
  template void moe_probs_grad<T>(const kernels::MoeRouting&, bool, const acc_t<T>*, T*, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
