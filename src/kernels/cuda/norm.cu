// CUDA normalisation kernels over the last dim: layernorm, RMSNorm (Hugging Face LlamaRMSNorm) and
// softmax, forward and backward. Knows nothing of graphs.
//
// Forward and input gradients: one warp per row, 8 rows per block; lanes stride over C (coalesced)
// and combine with a fixed butterfly, so every row is reduced in the same order on every run.
// Statistics are two-pass (mean, then Σ(x - mean)²) in acc_t<T>; a row is re-read from global
// memory for each pass (it stays in L1/L2). Layernorm and RMSNorm share their kernels (rms = no
// mean, no bias). The fused add + norm (add_norm_forward) is the same warp-per-row kernel over
// v = x + r: the first pass also writes s and later passes read s back (L1/L2), so a bf16 y is
// normalised from the rounded sum that the unfused add would store and the unfused norm read: fused
// and unfused give the same bits (decision 270).
//
// Parameter gradients sum over rows, deterministically and without atomics:
//   1. one warp per row writes (mean, rstd) in acc_t to scratch [rows];
//   2. a grid of (32-column blocks × row chunks): each block of 32×8 threads sums its chunk of
//      rows for 32 columns (ty strides over rows), then adds its 8 row-lanes in order into
//      partial[chunk, C];
//   3. one thread per column adds the chunks in order.
// The number of chunks depends on rows and C only.
#include "kernels/cuda/norm.cuh"

#include <algorithm>

namespace autosp::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kColTile = 32;      // columns per parameter-gradient block
constexpr int kRowLanes = 8;      // rows walked in parallel per parameter-gradient block

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

// ==== kernels ===================================================================================

namespace {

// The forward's statistics of row xr [C]: mu (0 for RMSNorm) and rs, on every lane.
template <class T>
__device__ __forceinline__ void row_stats(const T* xr, int64_t C, bool rms, acc_t<T> eps, int lane, acc_t<T>& mu,
                                          acc_t<T>& rs) {
  using A = acc_t<T>;
  mu = A(0);
  if (!rms) {
    A s = A(0);
    for (int64_t c = lane; c < C; c += kWarp) s += load(xr, c);
    mu = warp_sum(s) / A(C);
  }
  A sq = A(0);
  for (int64_t c = lane; c < C; c += kWarp) {
    const A d = load(xr, c) - mu;
    sq += d * d;
  }
  rs = A(1) / dsqrt(warp_sum(sq) / A(C) + eps);
}

// One row's y = norm(x) by its warp (row_stats, then each lane's elements); mu and rs are returned.
template <class T>
__device__ __forceinline__ void norm_row(const T* xr, const T* w, const T* b, T* yr, int64_t C, acc_t<T> eps, bool rms,
                                         int lane, acc_t<T>& mu, acc_t<T>& rs) {
  using A = acc_t<T>;
  row_stats(xr, C, rms, eps, lane, mu, rs);
  for (int64_t c = lane; c < C; c += kWarp) {
    A v = (load(xr, c) - mu) * rs * load(w, c);
    if (b != nullptr) v += load(b, c);
    store(yr, c, v);
  }
}

template <class T>
__global__ void norm_forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t C,
                                    acc_t<T> eps, bool rms) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // the whole warp leaves
  acc_t<T> mu, rs;
  norm_row(x + r * C, w, b, y + r * C, C, eps, rms, lane, mu, rs);
  if (lane == 0) {
    if (mean != nullptr) store(mean, r, mu);
    if (rstd != nullptr) store(rstd, r, rs);
  }
}

// y = norm(s), s = x + r (+ rb: r's bias, rounded into r's type first as the unfused add stores
// it): one warp per row. s is written, then read back by the plain norm's row (each lane reads the
// elements it wrote): for bf16 the rounded s, as the unfused norm reads it.
template <class T>
__global__ void add_norm_forward_kernel(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y, T* s,
                                        int64_t rows, int64_t C, acc_t<T> eps, bool rms) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves
  const T *xr = x + row * C, *rr = r + row * C;  // [C]
  T* sr = s + row * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    const acc_t<T> rv = rb ? to_acc(from_acc<T>(load(rr, c) + load(rb, c))) : load(rr, c);
    store(sr, c, load(xr, c) + rv);
  }
  acc_t<T> mu, rs;
  norm_row<T>(sr, w, b, y + row * C, C, eps, rms, lane, mu, rs);
}

template <class T>
__global__ void softmax_forward_kernel(const T* x, T* y, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T* xr = x + r * C;  // [C]; y may alias x: each element is read before its lane writes it
  T* yr = y + r * C;
  A m = -A(INFINITY);
  for (int64_t c = lane; c < C; c += kWarp) m = dmax(m, load(xr, c));
  m = warp_max(m);
  A s = A(0);
  for (int64_t c = lane; c < C; c += kWarp) s += dexp(load(xr, c) - m);
  const A inv = A(1) / warp_sum(s);
  for (int64_t c = lane; c < C; c += kWarp) store(yr, c, dexp(load(xr, c) - m) * inv);
}

// dx of layernorm (rms = false) or RMSNorm (rms = true), recomputing the row statistics.
template <class T>
__global__ void norm_backward_input_kernel(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C,
                                           acc_t<T> eps, bool rms) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
  T* dxr = dx + r * C;
  A mu, rs;
  row_stats(xr, C, rms, eps, lane, mu, rs);
  A sg = A(0), sgx = A(0);  // Σ g and Σ g·(x - mu), g = dy · w
  for (int64_t c = lane; c < C; c += kWarp) {
    const A g = load(dyr, c) * load(w, c);
    sg += g;
    sgx += g * (load(xr, c) - mu);
  }
  sg = warp_sum(sg);
  sgx = warp_sum(sgx);
  if (rms) {  // dx = rs · g - x · rs³ · mean(g · x)
    const A k = rs * rs * rs * sgx / A(C);
    for (int64_t c = lane; c < C; c += kWarp) store(dxr, c, rs * load(dyr, c) * load(w, c) - load(xr, c) * k);
  } else {  // dx = rs · (g - mean(g) - xhat · mean(g · xhat))
    const A mean_g = sg / A(C), mean_gx = sgx * rs / A(C);
    for (int64_t c = lane; c < C; c += kWarp) {
      const A xhat = (load(xr, c) - mu) * rs;
      store(dxr, c, rs * (load(dyr, c) * load(w, c) - mean_g - xhat * mean_gx));
    }
  }
}

// Step 1 of the parameter gradients: (mean, rstd) of each row into stats [rows, 2].
template <class T>
__global__ void row_stats_kernel(const T* x, acc_t<T>* stats, int64_t rows, int64_t C, acc_t<T> eps, bool rms) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  acc_t<T> mu, rs;
  row_stats(x + r * C, C, rms, eps, lane, mu, rs);
  if (lane == 0) {
    stats[2 * r] = mu;
    stats[2 * r + 1] = rs;
  }
}

// Step 2: block (column tile, row chunk) → partial_w / partial_b [nchunks, C]. Block 32 × 8.
template <class T>
__global__ void param_partials_kernel(const T* dy, const T* x, const acc_t<T>* stats, int64_t rows, int64_t C,
                                      int64_t nchunks, acc_t<T>* partial_w, acc_t<T>* partial_b) {
  using A = acc_t<T>;
  __shared__ A sw[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kColTile + tx, chunk = blockIdx.y;
  const int64_t r0 = rows * chunk / nchunks, r1 = rows * (chunk + 1) / nchunks;
  A aw = A(0), ab = A(0);
  if (c < C) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const A g = load(dy, r * C + c);
      aw += g * ((load(x, r * C + c) - stats[2 * r]) * stats[2 * r + 1]);
      ab += g;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int k = 1; k < kRowLanes; ++k) {
      aw += sw[k][tx];
      ab += sb[k][tx];
    }
    partial_w[chunk * C + c] = aw;
    if (partial_b != nullptr) partial_b[chunk * C + c] = ab;
  }
}

// Step 3: out[c] = Σ_chunk partial[chunk, c] in chunk order.
template <class T>
__global__ void sum_chunks_kernel(const acc_t<T>* partial, int64_t nchunks, int64_t C, T* out) {
  AUTOSP_GRID_STRIDE(c, C) {
    acc_t<T> acc = partial[c];
    for (int64_t k = 1; k < nchunks; ++k) acc += partial[k * C + c];
    store(out, c, acc);
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* dy, const T* y, T* dx, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const T *dyr = dy + r * C, *yr = y + r * C;  // [C]; dx may alias dy
  T* dxr = dx + r * C;
  A dot = A(0);
  for (int64_t c = lane; c < C; c += kWarp) dot += load(dyr, c) * load(yr, c);
  dot = warp_sum(dot);
  for (int64_t c = lane; c < C; c += kWarp) store(dxr, c, load(yr, c) * (load(dyr, c) - dot));
}

// dw (and db unless null) of layernorm (rms = false) or RMSNorm.
template <class T>
void norm_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps, bool rms,
                 cudaStream_t stream) {
  using A = acc_t<T>;
  if (C == 0) return;
  if (rows == 0) {
    CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(C) * sizeof(T), stream));
    if (db != nullptr) CUDA_CHECK(cudaMemsetAsync(db, 0, size_t(C) * sizeof(T), stream));
    return;
  }
  const int64_t ncb = (C + kColTile - 1) / kColTile;
  const int64_t nchunks = std::clamp<int64_t>((1024 + ncb - 1) / ncb, 1, std::clamp<int64_t>(rows / 16, 1, 1024));
  const int nacc = db != nullptr ? 2 : 1;
  Scratch stats(size_t(2 * rows) * sizeof(A), stream);
  Scratch partial(size_t(nacc * nchunks * C) * sizeof(A), stream);
  A* pw = partial.as<A>();
  A* pb = db != nullptr ? pw + nchunks * C : nullptr;
  launch_kernel(row_stats_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, x, stats.as<A>(), rows, C,
                A(eps), rms);
  AUTOSP_ASSERT(ncb < (int64_t(1) << 31), "norm params C ", C);
  launch_kernel(param_partials_kernel<T>, dim3(unsigned(ncb), unsigned(nchunks)), dim3(kColTile, kRowLanes), 0, stream,
                dy, x, stats.as<A>(), rows, C, nchunks, pw, pb);
  launch_kernel(sum_chunks_kernel<T>, grid_for(C, 256), 256, 0, stream, pw, nchunks, C, dw);
  if (db != nullptr) {
    launch_kernel(sum_chunks_kernel<T>, grid_for(C, 256), 256, 0, stream, pb, nchunks, C, db);
  }
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t C, double eps,
                       cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(norm_forward_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, x, w, b, y, mean, rstd,
                rows, C, acc_t<T>(eps), false);
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t C, double eps, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(norm_forward_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, x, w, nullptr, y, nullptr,
                rstd, rows, C, acc_t<T>(eps), true);
}

template <class T>
void add_norm_forward(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y, T* s, int64_t rows, int64_t C,
                      double eps, bool rms, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, rms ? "add_rmsnorm" : "add_layernorm", " rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(add_norm_forward_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, x, r, rb, w, b, y, s, rows,
                C, acc_t<T>(eps), rms);
}

template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t C, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "softmax rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(softmax_forward_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, x, y, rows, C);
}

template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps,
                              cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm_backward rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(norm_backward_input_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, dy, x, w, dx, rows,
                C, acc_t<T>(eps), false);
}

template <class T>
void layernorm_backward_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps,
                               cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm_backward rows ", rows, " C ", C);
  norm_params(dy, x, dw, db, rows, C, eps, false, stream);
}

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t rows, int64_t C, double eps,
                        cudaStream_t stream) {
  layernorm_backward_input(dy, x, w, dx, rows, C, eps, stream);
  layernorm_backward_params(dy, x, dw, db, rows, C, eps, stream);
}

template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps,
                            cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm_backward rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(norm_backward_input_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, dy, x, w, dx, rows,
                C, acc_t<T>(eps), true);
}

template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, T* dw, int64_t rows, int64_t C, double eps, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm_backward rows ", rows, " C ", C);
  norm_params(dy, x, dw, static_cast<T*>(nullptr), rows, C, eps, true, stream);
}

template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t C, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "softmax_backward rows ", rows, " C ", C);
  if (rows == 0) return;
  launch_kernel(softmax_backward_kernel<T>, row_blocks(rows), kRowsPerBlock * kWarp, 0, stream, dy, y, dx, rows, C);
}

#define AUTOSP_INSTANTIATE(T)                                                                                          \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double,               \
                                     cudaStream_t);                                                                    \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double, cudaStream_t);                \
  template void add_norm_forward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t,      \
                                    double, bool, cudaStream_t);                                                       \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, cudaStream_t);                                      \
  template void layernorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double, cudaStream_t); \
  template void layernorm_backward_params<T>(const T*, const T*, T*, T*, int64_t, int64_t, double, cudaStream_t);      \
  template void layernorm_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double,            \
                                      cudaStream_t);                                                                 \
  template void rmsnorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double, cudaStream_t);   \
  template void rmsnorm_backward_weight<T>(const T*, const T*, T*, int64_t, int64_t, double, cudaStream_t);            \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
