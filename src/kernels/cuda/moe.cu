// CUDA grouped expert MLP (moe.cuh): host routing (kernels/moe_routing.h), then per expert the
// gather, the tiled SwiGLU MLP (mlp.cu) and the scatter. An expert's rows are distinct tokens, so
// its scatter has no races; experts run one after another in index order, as on the CPU.
#include "kernels/cuda/moe.cuh"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cuda/mlp.cuh"
#include "kernels/kinds.h"
#include "kernels/moe_routing.h"

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

// ---- kernels ----

// xe [n, C] = src rows slot[a] / k.
template <class T>
__global__ void gather_rows(const T* src, const int64_t* slot, T* xe, int64_t n, int64_t C, int64_t k) {
  AUTOSP_GRID_STRIDE(i, n * C) {
    const int64_t a = i / C, c = i % C;
    xe[i] = src[(slot[a] / k) * C + c];
  }
}

// dst row slot[a] / k += weight[slot[a]] · ye[a] (weight null: 1).
template <class T>
__global__ void scatter_add_rows(const T* ye, const int64_t* slot, const acc_t<T>* weight, T* dst, int64_t n,
                                 int64_t C, int64_t k) {
  AUTOSP_GRID_STRIDE(i, n * C) {
    const int64_t a = i / C, c = i % C, s = slot[a], at = (s / k) * C + c;
    const acc_t<T> w = weight ? weight[s] : acc_t<T>(1);
    store(dst, at, load(dst, at) + w * load(ye, i));
  }
}

// dye[a] = weight[slot[a]] · dy[row]; one block per assignment also sums g[slot[a]] = dy[row] · ye[a].
template <class T>
__global__ void weight_grads(const T* dy, const T* ye, const int64_t* slot, const acc_t<T>* weight, T* dye,
                             acc_t<T>* g, int64_t C, int64_t k) {
  __shared__ acc_t<T> shared[32];
  const int64_t a = blockIdx.x, s = slot[a], row = s / k;
  acc_t<T> dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const acc_t<T> d = load(dy, row * C + c);
    dot += d * load(ye, a * C + c);
    store(dye, a * C + c, weight[s] * d);
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) g[s] = dot;
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

// The routing's slots and weights on the device (weights in acc_t<T>).
template <class T>
struct DeviceRouting {
  Scratch slot, weight;
  DeviceRouting(const kernels::MoeRouting& r, cudaStream_t s)
      : slot(std::max<size_t>(1, r.slot.size()) * sizeof(int64_t), s),
        weight(std::max<size_t>(1, r.weight.size()) * sizeof(acc_t<T>), s) {
    const std::vector<acc_t<T>> w(r.weight.begin(), r.weight.end());
    if (r.slot.empty()) return;
    CUDA_CHECK(cudaMemcpyAsync(slot.as<int64_t>(), r.slot.data(), r.slot.size() * sizeof(int64_t),
                               cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(weight.as<acc_t<T>>(), w.data(), w.size() * sizeof(acc_t<T>), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));  // w is a host temporary
  }
};

}  // namespace

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                         const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  AUTOSP_ASSERT(opt.plain(), "moe_experts_forward: gpt-oss's expert options have no CUDA kernel");
  const kernels::MoeRouting r = route(probs, R, E, k, norm, s);
  const DeviceRouting<T> d(r, s);
  const int64_t n_max = std::max<int64_t>(1, r.max_rows()), chunk = kernels::kMlpChunkRows;
  const int64_t r_max = std::min(n_max, chunk);
  Scratch xe(n_max * C * sizeof(T), s), ye(n_max * C * sizeof(T), s);
  Scratch g(r_max * I * sizeof(T), s), u(r_max * I * sizeof(T), s);
  CUDA_CHECK(cudaMemsetAsync(y, 0, R * C * sizeof(T), s));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.rows_of(e);
    if (n == 0) continue;
    const int64_t* slot = d.slot.template as<int64_t>() + r.offset[e];
    launch_kernel(gather_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, x, slot, xe.as<T>(), n, C, k);
    swiglu_mlp<T>(xe.as<T>(), w_gate[e], w_up[e], w_down[e], ye.as<T>(), n, C, I, chunk, g.as<T>(), u.as<T>(), s);
    launch_kernel(scatter_add_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, ye.as<T>(), slot,
                  d.weight.template as<acc_t<T>>(), y, n, C, k);
  }
}

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  AUTOSP_ASSERT(opt.plain(), "moe_experts_backward: gpt-oss's expert options have no CUDA kernel");
  const kernels::MoeRouting r = route(probs, R, E, k, norm, s);
  const DeviceRouting<T> d(r, s);
  const int64_t n_max = std::max<int64_t>(1, r.max_rows()), chunk = kernels::kMlpChunkRows;
  const int64_t r_max = std::min(n_max, chunk);
  Scratch xe(n_max * C * sizeof(T), s), ye(n_max * C * sizeof(T), s), dye(n_max * C * sizeof(T), s),
      dxe(n_max * C * sizeof(T), s);
  Scratch buf0(r_max * I * sizeof(T), s), buf1(r_max * I * sizeof(T), s), buf2(r_max * I * sizeof(T), s),
      buf3(r_max * I * sizeof(T), s);
  T* const bufs[4] = {buf0.as<T>(), buf1.as<T>(), buf2.as<T>(), buf3.as<T>()};
  const int64_t acc_n = swiglu_mlp_acc_elems<T>(C, I);
  Scratch acc(std::max<int64_t>(1, acc_n) * sizeof(float), s);
  Scratch gd(std::max<size_t>(1, r.slot.size()) * sizeof(acc_t<T>), s);  // each slot's weight gradient
  CUDA_CHECK(cudaMemsetAsync(dx, 0, R * C * sizeof(T), s));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.rows_of(e);
    T *dwg = dw_gate[e], *dwu = dw_up[e], *dwd = dw_down[e];
    if (n == 0) {  // no tokens: the expert's weight gradients are zero
      for (T* p : {dwg, dwu, dwd}) CUDA_CHECK(cudaMemsetAsync(p, 0, I * C * sizeof(T), s));
      continue;
    }
    const T *wg = w_gate[e], *wu = w_up[e], *wd = w_down[e];
    const int64_t* slot = d.slot.template as<int64_t>() + r.offset[e];
    launch_kernel(gather_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, x, slot, xe.as<T>(), n, C, k);
    swiglu_mlp<T>(xe.as<T>(), wg, wu, wd, ye.as<T>(), n, C, I, chunk, bufs[0], bufs[1], s);
    launch_kernel(weight_grads<T>, dim3(unsigned(n)), kBlock, 0, s, dy, ye.as<T>(), slot, d.weight.template as<acc_t<T>>(),
                  dye.as<T>(), gd.as<acc_t<T>>(), C, k);
    swiglu_mlp_backward<T>(dye.as<T>(), xe.as<T>(), wg, wu, wd, dxe.as<T>(), dwg, dwu, dwd, n, C, I, chunk, bufs,
                           acc_n > 0 ? acc.as<float>() : nullptr, s);
    launch_kernel(scatter_add_rows<T>, grid_for(n * C, kBlock), kBlock, 0, s, dxe.as<T>(), slot,
                  static_cast<const acc_t<T>*>(nullptr), dx, n, C, k);
  }
  // dprobs from the slots' weight gradients, on the host (moe_probs_grad), then uploaded.
  std::vector<acc_t<T>> gh(r.slot.size());
  if (!gh.empty())
    CUDA_CHECK(cudaMemcpyAsync(gh.data(), gd.as<acc_t<T>>(), gh.size() * sizeof(acc_t<T>), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<double> g(gh.begin(), gh.end());
  std::vector<double> dp(size_t(R * E));
  kernels::moe_probs_grad(r, norm, g.data(), dp.data());
  std::vector<T> dph(dp.size());
  for (size_t i = 0; i < dp.size(); ++i) dph[i] = device_value<T>(dp[i]);
  if (!dph.empty()) CUDA_CHECK(cudaMemcpyAsync(dprobs, dph.data(), dph.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));  // dph is a host temporary
}

#define AUTOSP_INSTANTIATE(T)                                                                                       \
  template void moe_experts_forward<T>(const T*, const T*, const T* const*, const T* const*, const T* const*, T*,  \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool,                          \
                                       const kernels::MoeOptions<T>&, cudaStream_t);                               \
  template void moe_experts_backward<T>(const T*, const T*, const T*, const T* const*, const T* const*,           \
                                        const T* const*, T*, T*, T* const*, T* const*, T* const*, int64_t,         \
                                        int64_t, int64_t, int64_t, int64_t, bool, const kernels::MoeOptions<T>&,   \
                                        cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
