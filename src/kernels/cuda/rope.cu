// CUDA rotary position embedding, rotate-half form (Hugging Face Llama). Knows nothing of graphs.
//
// One thread per rotated pair (b, n, s, i < D/2): it computes its angle and writes y[i] and
// y[i + D/2]. Like the CPU kernel, every step is in acc_t<T> in Hugging Face's order —
// inv_freq = 1 / theta^(2i/D), angle = pos · inv_freq, cos and sin times yarn's attention factor
// (1 otherwise), y = (x · cos) + (rotate_half(x) · sin) — and products are rounded before the add
// (explicit _rn intrinsics, so nvcc does not fuse them into an FMA). inv_freq is computed on the host by the CPU kernel's function (kernels::rope_inv_freq,
// rope_scaling included) and passed as a kernel parameter: a 1-ulp difference in inv_freq would
// move an angle of a late position by far more than the tolerance. cos/sin are recomputed per
// head; they are cheap next to the memory traffic.
// Backward is the forward with sin negated (the rotation by -angle).
#include "kernels/cuda/rope.cuh"

#include <cmath>

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
constexpr int kMaxHalf = 128;  // D ≤ 256

template <class A>
struct InvFreq {
  A v[kMaxHalf];  // [D/2]
};
__device__ __forceinline__ void dsincos(float a, float* s, float* c) { sincosf(a, s, c); }
__device__ __forceinline__ void dsincos(double a, double* s, double* c) { sincos(a, s, c); }

}  // namespace

// ==== kernels ===================================================================================

namespace {

// y = x·cos + rotate_half(x)·(sign·sin) over pairs (b, n, s, i), i < H = D/2.
template <class T>
__global__ void rope_kernel(const T* x, const int64_t* position_ids, T* y, int64_t N, int64_t S, int64_t D,
                            int64_t pairs, InvFreq<acc_t<T>> inv_freq, acc_t<T> attention, acc_t<T> sign) {
  using A = acc_t<T>;
  const int64_t H = D / 2;
  AUTOSP_GRID_STRIDE(t, pairs) {
    const int64_t i = t % H, s = (t / H) % S, bn = t / (H * S), b = bn / N;
    const A angle = mul_rn(A(position_ids[b * S + s]), inv_freq.v[i]);
    A sn, cs;
    dsincos(angle, &sn, &cs);
    cs = mul_rn(cs, attention);  // yarn's attention factor (1 otherwise: exact)
    sn = sign * mul_rn(sn, attention);
    const int64_t off = (bn * S + s) * D;  // x, y [B, N, S, D]
    const A lo = load(x, off + i), hi = load(x, off + i + H);
    store(y, off + i, add_rn(mul_rn(lo, cs), mul_rn(-hi, sn)));
    store(y, off + i + H, add_rn(mul_rn(hi, cs), mul_rn(lo, sn)));
  }
}

template <class T>
void rope_rotate(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S, int64_t D,
                 double theta, const RopeScaling& scaling, double sign, cudaStream_t stream) {
  AUTOSP_ASSERT(B >= 0 && N >= 0 && S >= 0, "rope sizes B ", B, " N ", N, " S ", S);
  AUTOSP_ASSERT(D > 0 && D % 2 == 0, "rope head dim ", D, " must be even");
  AUTOSP_ASSERT(D / 2 <= kMaxHalf, "rope head dim ", D, " > ", 2 * kMaxHalf);
  AUTOSP_ASSERT(x != y, "rope x and y may not alias");
  using A = acc_t<T>;
  const int64_t pairs = B * N * S * (D / 2);
  if (pairs == 0) return;
  InvFreq<A> inv_freq{};
  kernels::rope_inv_freq(inv_freq.v, D, theta, scaling);  // the CPU kernel's values, bit for bit
  launch_kernel(rope_kernel<T>, grid_for(pairs, kBlock), kBlock, 0, stream, x, position_ids, y, N, S, D, pairs,
                inv_freq, A(kernels::rope_attention_factor(scaling)), A(sign));
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void rope_forward(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S, int64_t D,
                  double theta, const RopeScaling& scaling, cudaStream_t stream) {
  rope_rotate(x, position_ids, y, B, N, S, D, theta, scaling, 1.0, stream);
}

template <class T>
void rope_backward(const T* dy, const int64_t* position_ids, T* dx, int64_t B, int64_t N, int64_t S, int64_t D,
                   double theta, const RopeScaling& scaling, cudaStream_t stream) {
  rope_rotate(dy, position_ids, dx, B, N, S, D, theta, scaling, -1.0, stream);
}

#define AUTOSP_INSTANTIATE(T)                                                                              \
  template void rope_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, double,  \
                                const RopeScaling&, cudaStream_t);                                    \
  template void rope_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, int64_t, double, \
                                 const RopeScaling&, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
