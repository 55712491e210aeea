// CUDA elementwise kernels: unary maps and activation gradients, broadcasting binary ops, strided
// copies, fill, casts, sum_to and sum_squares. Knows nothing of graphs; broadcasting arrives as
// strides (0 = broadcast).
//
// Maps are grid-stride loops, one element per thread step; the op is a runtime switch (uniform
// across the grid), which keeps one kernel per element type. Strided ops first simplify the index
// space on the host exactly like the CPU kernels (drop size-1 dims, merge dims contiguous for
// every operand): same-shape contiguous operands become a flat loop, a contiguous copy becomes a
// cudaMemcpyAsync.
//
// sum_to: the simplified dims alternate between kept and summed. With R elements summed into each
// of the out_numel outputs, R is cut into `nc` chunks (nc from the sizes only). If the innermost
// dim is kept, one thread owns (output, chunk) and walks its chunk with an odometer — adjacent
// threads read adjacent elements; if the innermost dim is summed, one warp owns (output, chunk),
// its lanes stride over the chunk and combine with a fixed butterfly. With nc > 1 the chunk sums
// go to a partial buffer [nc, out_numel] that a second kernel adds in chunk order. So the result
// depends on the shapes only, never on timing, and nothing is added atomically.
// sum_squares: fixed chunks, each a block reduction in double, then one block adds them in order.
#include "kernels/cuda/elementwise.cuh"
#include "tensor/strided.h"

#include <algorithm>
#include <cstring>

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

// Offsets of linear index i (row-major over s.shape) for operands [0, nops).
template <int kOps>
__device__ __forceinline__ void offsets(const Space& s, int64_t i, int64_t* off) {
#pragma unroll
  for (int o = 0; o < kOps; ++o) off[o] = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t idx = i % s.shape[d];
    i /= s.shape[d];
#pragma unroll
    for (int o = 0; o < kOps; ++o) off[o] += idx * s.stride[o][d];
  }
}

// Raw element of the same size, for the type-agnostic copies.
template <class T>
using Bits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

}  // namespace

// ==== kernels ===================================================================================

namespace {

// gelu_tanh and its derivative in A = acc_t<T>, shared by the plain and the fused (bias) kernels:
// 0.5·(1 + tanh u) = sigmoid(2u) as on the CPU; f' = s + 2·x·s·(1 - s)·k·(1 + 3a·x²),
// s = sigmoid(2k(x + a·x³)) (see cpu/elementwise.cpp).
template <class A>
__device__ __forceinline__ A gelu_tanh_of(A v) {
  return v / (A(1) + dexp(-A(2 * 0.7978845608028654) * (v + A(0.044715) * v * v * v)));
}
template <class A>
__device__ __forceinline__ A gelu_tanh_grad(A v) {
  const A k = A(0.7978845608028654), a = A(0.044715);
  const A sg = A(1) / (A(1) + dexp(A(-2) * k * (v + a * v * v * v)));
  return sg + A(2) * v * sg * (A(1) - sg) * k * (A(1) + A(3) * a * v * v);
}

// y = gelu_tanh(x + b[i % C]) and dx = dy · gelu_tanh'(x + b[i % C]): grid-stride over n = rows·C.
template <class T>
__global__ void bias_gelu_tanh_kernel(const T* x, const T* b, T* y, int64_t n, int64_t C) {
  AUTOSP_GRID_STRIDE(i, n) store(y, i, gelu_tanh_of(load(x, i) + load(b, i % C)));
}
template <class T>
__global__ void bias_gelu_tanh_backward_kernel(const T* dy, const T* x, const T* b, T* dx, int64_t n, int64_t C) {
  AUTOSP_GRID_STRIDE(i, n) store(dx, i, load(dy, i) * gelu_tanh_grad(load(x, i) + load(b, i % C)));
}

// qkv_heads: one thread per element i of x [B, S, 3, N, D] (grid-stride over n = B·S·3·N·D), which
// goes to [b, n, s, d] of its part; the backward reads it back from there.
struct HeadPlace {
  int64_t part, at;  // q, k or v; the element's offset in that [B, N, S, D]
};
__device__ __forceinline__ HeadPlace head_place(int64_t i, int64_t S, int64_t N, int64_t D) {
  const int64_t C = N * D, c = i % (3 * C), row = i / (3 * C), bi = row / S, si = row % S;
  return {c / C, ((bi * N + (c % C) / D) * S + si) * D + c % D};
}
template <class T>
__global__ void qkv_heads_kernel(const T* x, const T* b, T* q, T* k, T* v, int64_t n, int64_t S, int64_t N,
                                 int64_t D) {
  AUTOSP_GRID_STRIDE(i, n) {
    const HeadPlace h = head_place(i, S, N, D);
    T* out = h.part == 0 ? q : (h.part == 1 ? k : v);
    store(out, h.at, load(x, i) + load(b, i % (3 * N * D)));
  }
}
template <class T>
__global__ void qkv_heads_backward_kernel(const T* dq, const T* dk, const T* dv, T* dx, int64_t n, int64_t S,
                                          int64_t N, int64_t D) {
  AUTOSP_GRID_STRIDE(i, n) {
    const HeadPlace h = head_place(i, S, N, D);
    const T* in = h.part == 0 ? dq : (h.part == 1 ? dk : dv);
    dx[i] = in[h.at];
  }
}

// h = silu(g) · u and its gradient (dg, du) in acc_t<T>, one rounding per output: grid-stride over n.
template <class T>
__global__ void swiglu_kernel(const T* g, const T* u, T* h, int64_t n) {
  using A = acc_t<T>;
  AUTOSP_GRID_STRIDE(i, n) {
    const A gv = load(g, i);
    store(h, i, gv / (A(1) + dexp(-gv)) * load(u, i));
  }
}
template <class T>
__global__ void swiglu_backward_kernel(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  using A = acc_t<T>;
  AUTOSP_GRID_STRIDE(i, n) {
    const A gv = load(g, i), uv = load(u, i), d = load(dy, i);
    const A s = A(1) / (A(1) + dexp(-gv));
    store(dg, i, d * uv * (s * (A(1) + gv * (A(1) - s))));
    store(du, i, d * (gv * s));
  }
}

// y = x / (1 − p) where the mask keeps element i = r·C + c, else 0: grid-stride over n = rows·C.
template <class T>
__global__ void dropout_kernel(const T* x, const int64_t* token, T* y, int64_t n, int64_t C, uint64_t seed,
                               uint64_t threshold, acc_t<T> scale) {
  AUTOSP_GRID_STRIDE(i, n) {
    const bool keep = kernels::dropout_keep(kernels::dropout_row(seed, token[i / C]), i % C, threshold);
    store(y, i, keep ? load(x, i) * scale : acc_t<T>(0));
  }
}

template <class T>
__global__ void unary_kernel(Unary op, const T* x, T* y, int64_t n, acc_t<T> s) {
  using A = acc_t<T>;
  AUTOSP_GRID_STRIDE(i, n) {
    const A v = load(x, i);
    A r = v;
    switch (op) {
      case Unary::neg:
        r = -v;
        break;
      case Unary::exp:
        r = dexp(v);
        break;
      case Unary::log:
        r = dlog(v);
        break;
      case Unary::tanh:
        r = dtanh(v);
        break;
      case Unary::sqrt:
        r = dsqrt(v);
        break;
      case Unary::rsqrt:
        r = A(1) / dsqrt(v);
        break;
      case Unary::square:
        r = v * v;
        break;
      case Unary::gelu_tanh:
        r = gelu_tanh_of(v);
        break;
      case Unary::silu:
        r = v / (A(1) + dexp(-v));
        break;
      case Unary::scale:
        r = v * s;
        break;
      case Unary::relu:
        r = v < A(0) ? A(0) : v;
        break;
    }
    store(y, i, r);
  }
}

template <class T>
__global__ void unary_backward_kernel(UnaryGrad op, const T* dy, const T* x, T* dx, int64_t n) {
  using A = acc_t<T>;
  AUTOSP_GRID_STRIDE(i, n) {
    const A v = load(x, i), g = load(dy, i);
    A d = A(0);
    if (op == UnaryGrad::gelu_tanh) {
      d = g * gelu_tanh_grad(v);
    } else {  // silu: f' = s·(1 + x·(1 - s))
      const A sg = A(1) / (A(1) + dexp(-v));
      d = g * (sg * (A(1) + v * (A(1) - sg)));
    }
    store(dx, i, d);
  }
}

template <class A>
__device__ __forceinline__ A binary_op(Binary op, A a, A b) {
  switch (op) {
    case Binary::add:
      return a + b;
    case Binary::sub:
      return a - b;
    case Binary::mul:
      return a * b;
    case Binary::div:
      return a / b;
    case Binary::max:
      return (a > b || a != a) ? a : b;  // NaN-propagating, like torch.maximum
    case Binary::min:
      return (a < b || a != a) ? a : b;
  }
  return a;
}

template <class T>
__global__ void binary_contiguous_kernel(Binary op, const T* a, const T* b, T* out, int64_t n) {
  AUTOSP_GRID_STRIDE(i, n) store(out, i, binary_op(op, load(a, i), load(b, i)));
}

template <class T>
__global__ void binary_strided_kernel(Binary op, Space s, const T* a, const T* b, T* out) {
  AUTOSP_GRID_STRIDE(i, s.numel) {
    int64_t off[2];
    offsets<2>(s, i, off);
    store(out, i, binary_op(op, load(a, off[0]), load(b, off[1])));
  }
}

template <class U>
__global__ void copy_strided_kernel(Space s, const U* src, U* dst) {
  AUTOSP_GRID_STRIDE(i, s.numel) {
    int64_t off[1];
    offsets<1>(s, i, off);
    dst[i] = src[off[0]];
  }
}

template <class U>
__global__ void fill_kernel(U* dst, int64_t n, U value) {
  AUTOSP_GRID_STRIDE(i, n) dst[i] = value;
}

template <class Dst, class Src>
__device__ __forceinline__ Dst convert(Src v) {
  if constexpr (std::is_same_v<Src, double> && std::is_same_v<Dst, bf16>) {
    return __double2bfloat16(v);  // rounded once (through float would round twice)
  } else if constexpr (std::is_same_v<Src, bf16> || std::is_same_v<Src, f16>) {
    return Dst(to_acc(v));
  } else if constexpr (std::is_same_v<Dst, bf16> || std::is_same_v<Dst, f16>) {
    return from_acc<Dst>(float(v));
  } else {
    return static_cast<Dst>(v);
  }
}

template <class Src, class Dst>
__global__ void cast_kernel(const Src* src, Dst* dst, int64_t n) {
  AUTOSP_GRID_STRIDE(i, n) dst[i] = convert<Dst>(src[i]);
}

// ---- sum_to ----

// The simplified reduction: x offset of (output o, summed index r) = kept part + summed part.
struct SumPlan {
  int nk = 0, ns = 0;  // kept / summed dims, outer to inner
  int64_t ksize[kMaxRank] = {}, kstride[kMaxRank] = {};
  int64_t ssize[kMaxRank] = {}, sstride[kMaxRank] = {};
  int64_t out_numel = 1, R = 1, nc = 1;  // outputs, elements per output, chunks of R
};

__device__ __forceinline__ int64_t kept_offset(const SumPlan& p, int64_t o) {
  int64_t off = 0;
  for (int d = p.nk - 1; d >= 0; --d) {
    off += (o % p.ksize[d]) * p.kstride[d];
    o /= p.ksize[d];
  }
  return off;
}

// Innermost dim kept: thread per (chunk c, output o), index c·out_numel + o.
template <class T>
__global__ void sum_to_threads_kernel(SumPlan p, const T* x, T* out, acc_t<T>* partial) {
  using A = acc_t<T>;
  AUTOSP_GRID_STRIDE(t, p.out_numel * p.nc) {
    const int64_t o = t % p.out_numel, c = t / p.out_numel;
    const int64_t base = kept_offset(p, o);
    const int64_t r0 = p.R * c / p.nc, r1 = p.R * (c + 1) / p.nc;
    int64_t idx[kMaxRank], soff = 0;  // odometer over the summed dims, started at r0
    for (int64_t rem = r0, d = p.ns - 1; d >= 0; --d) {
      idx[d] = rem % p.ssize[d];
      rem /= p.ssize[d];
      soff += idx[d] * p.sstride[d];
    }
    A acc = A(0);
    for (int64_t r = r0; r < r1; ++r) {
      acc += load(x, base + soff);
      for (int d = p.ns - 1; d >= 0; --d) {
        soff += p.sstride[d];
        if (++idx[d] < p.ssize[d]) break;
        soff -= idx[d] * p.sstride[d];
        idx[d] = 0;
      }
    }
    if (p.nc == 1)
      store(out, o, acc);
    else
      partial[t] = acc;
  }
}

// Innermost dim summed: warp per (chunk c, output o); lanes stride over the chunk.
template <class T>
__global__ void sum_to_warps_kernel(SumPlan p, const T* x, T* out, acc_t<T>* partial) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; t < p.out_numel * p.nc; t += warps) {
    const int64_t o = t % p.out_numel, c = t / p.out_numel;
    const int64_t base = kept_offset(p, o);
    const int64_t r0 = p.R * c / p.nc, r1 = p.R * (c + 1) / p.nc;
    A acc = A(0);
    for (int64_t r = r0 + lane; r < r1; r += kWarp) {
      int64_t soff = 0;
      for (int64_t rem = r, d = p.ns - 1; d >= 0; --d) {
        soff += (rem % p.ssize[d]) * p.sstride[d];
        rem /= p.ssize[d];
      }
      acc += load(x, base + soff);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      if (p.nc == 1)
        store(out, o, acc);
      else
        partial[t] = acc;
    }
  }
}

// out[o] = Σ_c partial[c·out_numel + o], c in order.
template <class T>
__global__ void sum_chunks_kernel(const acc_t<T>* partial, int64_t nc, int64_t out_numel, T* out) {
  AUTOSP_GRID_STRIDE(o, out_numel) {
    acc_t<T> acc = partial[o];
    for (int64_t c = 1; c < nc; ++c) acc += partial[c * out_numel + o];
    store(out, o, acc);
  }
}

// ---- sum_squares ----

template <class T>
__global__ void sum_squares_chunks_kernel(const T* x, int64_t n, int64_t nchunks, double* partial) {
  __shared__ double shared[kWarp];
  const int64_t c = blockIdx.x, lo = n * c / nchunks, hi = n * (c + 1) / nchunks;
  double acc = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const double v = double(to_acc(x[i]));
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[c] = acc;
}

__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double shared[kWarp];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void unary(Unary op, const T* x, T* y, int64_t n, double scalar, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "unary n ", n);
  if (n == 0) return;
  launch_kernel(unary_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, op, x, y, n, acc_t<T>(scalar));
}

template <class T>
void unary_backward(UnaryGrad op, const T* dy, const T* x, T* dx, int64_t n, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "unary_backward n ", n);
  AUTOSP_ASSERT(op == UnaryGrad::gelu_tanh || op == UnaryGrad::silu, "unknown unary grad op ", int(op));
  if (n == 0) return;
  launch_kernel(unary_backward_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, op, dy, x, dx, n);
}

template <class T>
void bias_gelu_tanh(const T* x, const T* b, T* y, int64_t rows, int64_t C, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh rows ", rows, " C ", C);
  const int64_t n = rows * C;
  if (n == 0) return;
  launch_kernel(bias_gelu_tanh_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, x, b, y, n, C);
}

template <class T>
void qkv_heads(const T* x, const T* b, T* q, T* k, T* v, int64_t B, int64_t S, int64_t N, int64_t D,
               cudaStream_t stream) {
  AUTOSP_ASSERT(B >= 0 && S >= 0 && N > 0 && D > 0, "qkv_heads B ", B, " S ", S, " N ", N, " D ", D);
  const int64_t n = B * S * 3 * N * D;
  if (n == 0) return;
  launch_kernel(qkv_heads_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, x, b, q, k, v, n, S, N, D);
}

template <class T>
void qkv_heads_backward(const T* dq, const T* dk, const T* dv, T* dx, T* db, int64_t B, int64_t S, int64_t N,
                        int64_t D, cudaStream_t stream) {
  AUTOSP_ASSERT(B >= 0 && S >= 0 && N > 0 && D > 0, "qkv_heads_backward B ", B, " S ", S, " N ", N, " D ", D);
  const int64_t n = B * S * 3 * N * D;
  if (n > 0)
    launch_kernel(qkv_heads_backward_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, dq, dk, dv, dx, n, S, N, D);
  const int64_t x_shape[2] = {B * S, 3 * N * D}, out_shape[2] = {1, 3 * N * D};
  sum_to(dx, 2, x_shape, out_shape, db, stream);
}

template <class T>
void swiglu(const T* g, const T* u, T* h, int64_t n, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "swiglu n ", n);
  if (n == 0) return;
  launch_kernel(swiglu_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, g, u, h, n);
}

template <class T>
void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "swiglu_backward n ", n);
  if (n == 0) return;
  launch_kernel(swiglu_backward_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, dy, g, u, dg, du, n);
}

template <class T>
void dropout(const T* x, const int64_t* token, T* y, int64_t rows, int64_t C, uint64_t seed, uint64_t threshold,
             double scale, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "dropout rows ", rows, " C ", C);
  const int64_t n = rows * C;
  if (n == 0) return;
  launch_kernel(dropout_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, x, token, y, n, C, seed, threshold,
                acc_t<T>(scale));
}

template <class T>
void bias_gelu_tanh_backward(const T* dy, const T* x, const T* b, T* dx, int64_t rows, int64_t C, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh_backward rows ", rows, " C ", C);
  const int64_t n = rows * C;
  if (n == 0) return;
  launch_kernel(bias_gelu_tanh_backward_kernel<T>, grid_for(n, kBlock), kBlock, 0, stream, dy, x, b, dx, n, C);
}

template <class T>
void binary(Binary op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides, const T* b,
            const int64_t* b_strides, T* out, cudaStream_t stream) {
  const int64_t* strides[2] = {a_strides, b_strides};
  const Space s = simplify_space(rank, out_shape, 2, strides);
  if (s.numel == 0) return;
  if (s.rank == 1 && s.stride[0][0] == 1 && s.stride[1][0] == 1) {
    launch_kernel(binary_contiguous_kernel<T>, grid_for(s.numel, kBlock), kBlock, 0, stream, op, a, b, out, s.numel);
  } else {
    launch_kernel(binary_strided_kernel<T>, grid_for(s.numel, kBlock), kBlock, 0, stream, op, s, a, b, out);
  }
}

template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst,
                  cudaStream_t stream) {
  const int64_t* strides[1] = {src_strides};
  const Space s = simplify_space(rank, shape, 1, strides);
  if (s.numel == 0) return;
  if (s.rank == 1 && s.stride[0][0] == 1) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(s.numel) * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  using U = Bits<T>;
  launch_kernel(copy_strided_kernel<U>, grid_for(s.numel, kBlock), kBlock, 0, stream, s,
                reinterpret_cast<const U*>(src), reinterpret_cast<U*>(dst));
}

template <class T>
void fill(T* dst, int64_t n, T value, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "fill n ", n);
  if (n == 0) return;
  using U = Bits<T>;
  U bits;
  std::memcpy(&bits, &value, sizeof(U));
  launch_kernel(fill_kernel<U>, grid_for(n, kBlock), kBlock, 0, stream, reinterpret_cast<U*>(dst), n, bits);
}

template <class Src, class Dst>
void cast(const Src* src, Dst* dst, int64_t n, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "cast n ", n);
  if (n == 0) return;
  launch_kernel(cast_kernel<Src, Dst>, grid_for(n, kBlock), kBlock, 0, stream, src, dst, n);
}

template <class T>
void sum_to(const T* x, int rank, const int64_t* x_shape, const int64_t* out_shape, T* out, cudaStream_t stream) {
  using A = acc_t<T>;
  const auto [n, size, summed, x_numel, out_numel] = simplify_sum(rank, x_shape, out_shape);  // simplified dims
  if (out_numel == 0) return;
  if (x_numel == 0) {  // an empty sum: zeros (all-zero bits are 0 in every T)
    CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(out_numel) * sizeof(T), stream));
    return;
  }
  if (out_numel == x_numel) {  // nothing is summed: a copy
    CUDA_CHECK(cudaMemcpyAsync(out, x, size_t(x_numel) * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  SumPlan p;
  for (int d = 0; d < n; ++d) (summed[d] ? p.ns : p.nk) += 1;
  int64_t stride = 1;  // x is contiguous: walk the dims inner to outer
  for (int d = n - 1, k = p.nk, s = p.ns; d >= 0; --d) {
    if (summed[d]) {
      --s;
      p.ssize[s] = size[d];
      p.sstride[s] = stride;
    } else {
      --k;
      p.ksize[k] = size[d];
      p.kstride[k] = stride;
    }
    stride *= size[d];
  }
  p.out_numel = out_numel;
  p.R = x_numel / out_numel;
  const bool inner_summed = summed[n - 1];
  if (inner_summed) {  // warps: aim for 2^13 of them, chunks of at least 256 elements
    p.nc = std::clamp<int64_t>(((int64_t(1) << 13) + out_numel - 1) / out_numel, 1,
                               std::clamp<int64_t>(p.R / 256, 1, 4096));
  } else {  // threads: aim for 2^16 of them, chunks of at least 32 elements
    p.nc = std::clamp<int64_t>(((int64_t(1) << 16) + out_numel - 1) / out_numel, 1,
                               std::clamp<int64_t>(p.R / 32, 1, 4096));
  }
  Scratch partial(p.nc > 1 ? size_t(p.nc * out_numel) * sizeof(A) : 0, stream);
  const int64_t work = out_numel * p.nc;
  if (inner_summed) {
    launch_kernel(sum_to_warps_kernel<T>, grid_for(work * kWarp, kBlock), kBlock, 0, stream, p, x, out,
                  partial.as<A>());
  } else {
    launch_kernel(sum_to_threads_kernel<T>, grid_for(work, kBlock), kBlock, 0, stream, p, x, out, partial.as<A>());
  }
  if (p.nc > 1) {
    launch_kernel(sum_chunks_kernel<T>, grid_for(out_numel, kBlock), kBlock, 0, stream, partial.as<A>(), p.nc,
                  out_numel, out);
  }
}

template <class T>
void sum_squares(const T* x, int64_t n, double* out, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "sum_squares n ", n);
  const int64_t nchunks = std::clamp<int64_t>(n / (int64_t(1) << 16), 1, 1024);
  Scratch partial(size_t(nchunks) * sizeof(double), stream);
  launch_kernel(sum_squares_chunks_kernel<T>, unsigned(nchunks), kBlock, 0, stream, x, n, nchunks,
                partial.as<double>());
  launch_kernel(sum_partials_kernel, 1, 1024, 0, stream, partial.as<double>(), nchunks, out);
}

#define AUTOSP_INSTANTIATE_FLOAT(T)                                                                            \
  template void unary<T>(Unary, const T*, T*, int64_t, double, cudaStream_t);                                  \
  template void unary_backward<T>(UnaryGrad, const T*, const T*, T*, int64_t, cudaStream_t);                   \
  template void bias_gelu_tanh<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);                     \
  template void dropout<T>(const T*, const int64_t*, T*, int64_t, int64_t, uint64_t, uint64_t, double,          \
                           cudaStream_t);                                                                       \
  template void bias_gelu_tanh_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, cudaStream_t);  \
  template void swiglu<T>(const T*, const T*, T*, int64_t, cudaStream_t);                                      \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, cudaStream_t);               \
  template void binary<T>(Binary, int, const int64_t*, const T*, const int64_t*, const T*, const int64_t*, T*, \
                          cudaStream_t);                                                                       \
  template void sum_to<T>(const T*, int, const int64_t*, const int64_t*, T*, cudaStream_t);                    \
  template void sum_squares<T>(const T*, int64_t, double*, cudaStream_t);                                  \
  template void qkv_heads<T>(const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void qkv_heads_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,       \
                                      int64_t, cudaStream_t);
AUTOSP_INSTANTIATE_FLOAT(float)
AUTOSP_INSTANTIATE_FLOAT(double)
AUTOSP_INSTANTIATE_FLOAT(bf16)
#undef AUTOSP_INSTANTIATE_FLOAT

#define AUTOSP_INSTANTIATE_COPY(T)                                                                \
  template void copy_strided<T>(int, const int64_t*, const T*, const int64_t*, T*, cudaStream_t); \
  template void fill<T>(T*, int64_t, T, cudaStream_t);
AUTOSP_INSTANTIATE_COPY(float)
AUTOSP_INSTANTIATE_COPY(double)
AUTOSP_INSTANTIATE_COPY(bf16)
AUTOSP_INSTANTIATE_COPY(int32_t)
AUTOSP_INSTANTIATE_COPY(int64_t)
AUTOSP_INSTANTIATE_COPY(uint16_t)
#undef AUTOSP_INSTANTIATE_COPY

template void cast<float, bf16>(const float*, bf16*, int64_t, cudaStream_t);
template void cast<bf16, float>(const bf16*, float*, int64_t, cudaStream_t);
template void cast<float, f16>(const float*, f16*, int64_t, cudaStream_t);
template void cast<f16, float>(const f16*, float*, int64_t, cudaStream_t);
template void cast<float, double>(const float*, double*, int64_t, cudaStream_t);
template void cast<double, float>(const double*, float*, int64_t, cudaStream_t);
template void cast<double, bf16>(const double*, bf16*, int64_t, cudaStream_t);
template void cast<bf16, double>(const bf16*, double*, int64_t, cudaStream_t);
template void cast<int32_t, int64_t>(const int32_t*, int64_t*, int64_t, cudaStream_t);
template void cast<int64_t, int32_t>(const int64_t*, int32_t*, int64_t, cudaStream_t);

}  // namespace autosp::cuda
