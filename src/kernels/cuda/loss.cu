// CUDA cross-entropy: the summed loss into a device scalar, the count of labelled rows, and the
// gradient. Knows nothing of graphs; nothing synchronises with the host.
//
// Forward: one block per row computes a stable logsumexp in two passes (block max, then the block
// sum of exp(x - max)), like the CPU kernel, and writes its row's loss in double to scratch
// [rows]; then one block adds the row losses — each thread a fixed stride of rows in order, then
// a fixed tree — into the device scalar. Deterministic: the order depends on `rows` only.
// Backward: one block per row recomputes max and sum, then writes g · softmax - g · onehot.
// The tiled head + loss (runtime.tiled_loss) runs the forward's row pass on one chunk of logits at
// a time, into row losses [rows] of the whole op, and also finds each row's first maximum; its
// backward is the backward kernel above on each chunk, in place, between the chunk's GEMMs
// (linear_cross_entropy_backward, whose dw sums over the chunks in f32 for bf16).
#include "kernels/cuda/loss.cuh"

#include <algorithm>
#include <climits>

#include "kernels/cuda/matmul.cuh"

namespace autosp::cuda {

namespace {

constexpr int kRowBlock = 256;   // threads per row
constexpr int kSumBlock = 1024;  // threads of the final sum

}  // namespace

// ==== kernels ===================================================================================

namespace {

// max and Σ exp(x - max) of row xr [V], on every thread of the block.
template <class T>
__device__ __forceinline__ void row_logsumexp(const T* xr, int64_t V, acc_t<T>* shared, acc_t<T>& m, acc_t<T>& s) {
  using A = acc_t<T>;
  A mx = -A(INFINITY);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = dmax(mx, load(xr, j));
  m = block_max(mx, shared);
  A sum = A(0);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += dexp(load(xr, j) - m);
  s = block_sum(sum, shared);
}

template <class T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int64_t* labels, double* row_loss, int64_t V,
                                          int64_t ignore_index) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const int64_t r = blockIdx.x, y = labels[r];
  if (y == ignore_index) {  // uniform over the block
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  if (y < 0 || y >= V) {
    if (threadIdx.x == 0) row_loss[r] = NAN;
    return;
  }
  const T* xr = logits + r * V;  // [V]
  A m, s;
  row_logsumexp(xr, V, shared, m, s);
  if (threadIdx.x == 0) row_loss[r] = double(m) + log(double(s)) - double(load(xr, y));
}

template <class A>
__global__ void sum_rows_kernel(const double* row_loss, int64_t rows, A* loss) {
  __shared__ double shared[kWarp];
  double acc = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += row_loss[r];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = A(acc);
}

template <class C>
__global__ void count_valid_kernel(const int64_t* labels, int64_t n, int64_t ignore_index, C* count) {
  __shared__ long long shared[kWarp];
  long long k = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) k += labels[i] != ignore_index;
  k = block_sum(k, shared);
  if (threadIdx.x == 0) *count = C(k);
}

// The smallest v over the block (every thread gets it), like block_sum.
__device__ long long block_min(long long v, long long* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  for (int o = 16; o > 0; o >>= 1) { const long long u = __shfl_xor_sync(0xffffffffu, v, o); v = u < v ? u : v; }
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    long long s = lane < nwarps ? shared[lane] : LLONG_MAX;
    for (int o = 16; o > 0; o >>= 1) { const long long u = __shfl_xor_sync(0xffffffffu, s, o); s = u < s ? u : s; }
    if (lane == 0) shared[0] = s;
  }
  __syncthreads();
  return shared[0];
}

// One row of a chunk: its loss (0 when ignored, NaN for a bad label) and its argmax.
template <class T>
__global__ void linear_ce_rows_kernel(const T* logits, const int64_t* labels, double* row_loss, int64_t* predictions,
                                      int64_t V, int64_t ignore_index) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  __shared__ long long first[kWarp];
  const int64_t r = blockIdx.x, y = labels[r];
  const T* xr = logits + r * V;  // [V]
  A m, s;
  row_logsumexp(xr, V, shared, m, s);
  long long at = LLONG_MAX;
  for (int64_t j = threadIdx.x; j < V && at == LLONG_MAX; j += blockDim.x)
    if (load(xr, j) == m) at = j;
  at = block_min(at, first);
  if (threadIdx.x != 0) return;
  predictions[r] = at == LLONG_MAX ? 0 : at;  // NaN logits match nothing: 0
  row_loss[r] = y == ignore_index ? 0.0 : y < 0 || y >= V ? NAN : double(m) + log(double(s)) - double(load(xr, y));
}

// Gemma's final softcap on n logits in place: x = c · tanh(x · (1/c)), in the accumulation type.
template <class T>
__global__ void cap_logits_kernel(T* x, int64_t n, acc_t<T> inv, acc_t<T> c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(x, i, tanh(load(x, i) * inv) * c);
}

// With softcap c > 0 the row holds capped logits z, and each dlogit is also multiplied by the
// cap's derivative 1 − (z/c)² (read from the same element before it is overwritten).
template <class T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int64_t* labels, T* dlogits, int64_t V,
                                              const acc_t<T>* grad, int64_t grad_stride, int64_t ignore_index,
                                              acc_t<T> softcap) {
  using A = acc_t<T>;
  __shared__ A shared[kWarp];
  const int64_t r = blockIdx.x, y = labels[r];
  const T* xr = logits + r * V;  // [V]
  T* dr = dlogits + r * V;       // [V]; may alias xr: every read of the row precedes block_sum's barrier
  if (y == ignore_index || y < 0 || y >= V) {
    const A fill = y == ignore_index ? A(0) : A(NAN);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store(dr, j, fill);
    return;
  }
  A m, s;
  row_logsumexp(xr, V, shared, m, s);
  const A g = grad[r * grad_stride], gs = g / s;  // one gradient for all rows (stride 0), or each row's
  const A inv = softcap > A(0) ? A(1) / softcap : A(0);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const A z = load(xr, j);
    A d = dexp(z - m) * gs;
    if (j == y) d -= g;
    if (softcap > A(0)) d *= A(1) - (z * inv) * (z * inv);
    store(dr, j, d);
  }
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void cross_entropy_sum(const T* logits, const int64_t* labels, acc_t<T>* loss, int64_t rows, int64_t V,
                       int64_t ignore_index, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy rows ", rows, " V ", V);
  AUTOSP_ASSERT(rows < (int64_t(1) << 31), "cross_entropy rows ", rows, " exceed the grid");
  if (rows == 0) {
    CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(acc_t<T>), stream));
    return;
  }
  Scratch row_loss(size_t(rows) * sizeof(double), stream);
  launch_kernel(cross_entropy_rows_kernel<T>, unsigned(rows), kRowBlock, 0, stream, logits, labels,
                row_loss.as<double>(), V, ignore_index);
  launch_kernel(sum_rows_kernel<acc_t<T>>, 1, kSumBlock, 0, stream, row_loss.as<double>(), rows, loss);
}

template <class C>
void count_valid(const int64_t* labels, int64_t n, int64_t ignore_index, C* count, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0, "count_valid n ", n);
  launch_kernel(count_valid_kernel<C>, 1, kSumBlock, 0, stream, labels, n, ignore_index, count);
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V,
                            const acc_t<T>* grad, int64_t ignore_index, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy_backward rows ", rows, " V ", V);
  AUTOSP_ASSERT(rows < (int64_t(1) << 31), "cross_entropy_backward rows ", rows, " exceed the grid");
  if (rows == 0) return;
  launch_kernel(cross_entropy_backward_kernel<T>, unsigned(rows), kRowBlock, 0, stream, logits, labels, dlogits, V,
                grad, int64_t{0}, ignore_index, acc_t<T>(0));
}

template <class T>
void cross_entropy_backward_rows(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V,
                                 const acc_t<T>* row_grads, int64_t ignore_index, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && rows < (int64_t(1) << 31) && V > 0, "cross_entropy_backward_rows rows ", rows, " V ", V);
  if (rows == 0) return;
  launch_kernel(cross_entropy_backward_kernel<T>, unsigned(rows), kRowBlock, 0, stream, logits, labels, dlogits, V,
                row_grads, int64_t{1}, ignore_index, acc_t<T>(0));
}

template <class T>
void cap_logits(T* logits, int64_t n, double softcap, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0 && softcap > 0, "cap_logits n ", n, " softcap ", softcap);
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kRowBlock - 1) / kRowBlock, 65535);
  launch_kernel(cap_logits_kernel<T>, unsigned(blocks), kRowBlock, 0, stream, logits, n, acc_t<T>(1.0 / softcap),
                acc_t<T>(softcap));
}

template <class T>
void linear_ce_rows(const T* logits, const int64_t* labels, double* row_loss, int64_t* predictions, int64_t rows,
                    int64_t V, int64_t ignore_index, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && rows < (int64_t(1) << 31) && V > 0, "linear_ce_rows rows ", rows, " V ", V);
  if (rows == 0) return;
  launch_kernel(linear_ce_rows_kernel<T>, unsigned(rows), kRowBlock, 0, stream, logits, labels, row_loss, predictions,
                V, ignore_index);
}

template <class A>
void sum_row_losses(const double* row_loss, int64_t rows, A* loss, cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0, "sum_row_losses rows ", rows);
  launch_kernel(sum_rows_kernel<A>, 1, kSumBlock, 0, stream, row_loss, rows, loss);
}
template void sum_row_losses<float>(const double*, int64_t, float*, cudaStream_t);
template void sum_row_losses<double>(const double*, int64_t, double*, cudaStream_t);

template <class T>
void linear_cross_entropy_backward(const T* x, const T* w, const int64_t* labels, const acc_t<T>* grad, T* dx, T* dw,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk, int64_t ignore_index, T* logits,
                                   float* acc, cudaStream_t stream, double softcap) {
  AUTOSP_ASSERT(rows >= 0 && chunk > 0, "linear_cross_entropy_backward rows ", rows, " chunk ", chunk);
  ChunkedGradient<T> gw{dw, acc, V, C};
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r = std::min(chunk, rows - r0);
    const T* x_c = x + r0 * C;
    gemm_batched<T>(false, true, 1, r, V, C, 1.0, x_c, 0, w, 0, 0.0, logits, 0, stream);
    if (softcap > 0) {
      cap_logits<T>(logits, r * V, softcap, stream);
      launch_kernel(cross_entropy_backward_kernel<T>, unsigned(r), kRowBlock, 0, stream, logits, labels + r0, logits, V,
                    grad, int64_t{0}, ignore_index, acc_t<T>(softcap));
    } else {
      cross_entropy_backward<T>(logits, labels + r0, logits, r, V, grad, ignore_index, stream);
    }
    gemm_batched<T>(false, false, 1, r, C, V, 1.0, logits, 0, w, 0, 0.0, dx + r0 * C, 0, stream);
    if (dw) gw.add(true, false, r, logits, x_c, stream);
  }
  if (dw) gw.finish(stream);  // zeros when rows = 0 (no dw: a frozen head)
}

#define AUTOSP_INSTANTIATE(T)                                                                                       \
  template void linear_ce_rows<T>(const T*, const int64_t*, double*, int64_t*, int64_t, int64_t, int64_t,           \
                                  cudaStream_t);                                                                    \
  template void cross_entropy_sum<T>(const T*, const int64_t*, acc_t<T>*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void cross_entropy_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, const acc_t<T>*, int64_t, \
                                          cudaStream_t);                                                            \
  template void cross_entropy_backward_rows<T>(const T*, const int64_t*, T*, int64_t, int64_t, const acc_t<T>*,      \
                                               int64_t, cudaStream_t);                                              \
  template void linear_cross_entropy_backward<T>(const T*, const T*, const int64_t*, const acc_t<T>*, T*, T*,        \
                                                 int64_t, int64_t, int64_t, int64_t, int64_t, T*, float*, cudaStream_t, \
                                                 double);                                                           \
  template void cap_logits<T>(T*, int64_t, double, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

template void count_valid<float>(const int64_t*, int64_t, int64_t, float*, cudaStream_t);
template void count_valid<double>(const int64_t*, int64_t, int64_t, double*, cudaStream_t);

}  // namespace autosp::cuda
