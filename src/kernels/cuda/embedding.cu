// CUDA embedding lookup: out[i, :] = weight[ids[i], :], and its deterministic backward. Knows
// nothing of graphs.
//
// Forward: a grid-stride copy, one element per thread step (adjacent threads, adjacent columns).
//
// Backward, without float atomics and in a fixed order:
//   1. keys[i] = ids[i] (V for an invalid id), pos[i] = i;
//   2. CUB's stable radix sort of (key, pos) over the bits that V needs: positions are now grouped
//      by id, increasing inside each group;
//   3. one thread per vocab row finds where its group starts (binary search), start [V + 1];
//   4. blocks of 128 columns × one vocab row: each thread sums dy over its row's positions in
//      order, in acc_t<T>, and writes dweight (zeros for unused rows).
// A frequent id is summed serially by the threads of its row (one per column); that row's work is
// its count × C, the same as the CPU kernel's.
#include "kernels/cuda/embedding.cuh"

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kColBlock = 128;  // columns per backward block

}  // namespace

// ==== kernels ===================================================================================

namespace {

template <class T>
__global__ void embedding_forward_kernel(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t V, int64_t C) {
  AUTOSP_GRID_STRIDE(e, n * C) {
    const int64_t i = e / C, c = e % C, id = ids[i];
    out[e] = (id >= 0 && id < V) ? weight[id * C + c] : from_acc<T>(acc_t<T>(NAN));
  }
}

__global__ void make_keys_kernel(const int64_t* ids, uint32_t* keys, int32_t* pos, int64_t n, int64_t V) {
  AUTOSP_GRID_STRIDE(i, n) {
    const int64_t id = ids[i];
    keys[i] = static_cast<uint32_t>((id >= 0 && id < V) ? id : V);
    pos[i] = static_cast<int32_t>(i);
  }
}

// start[v] = first index of sorted with sorted[idx] ≥ v, for v in [0, V].
__global__ void segment_starts_kernel(const uint32_t* sorted, int64_t n, int64_t V, int32_t* start) {
  AUTOSP_GRID_STRIDE(v, V + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(sorted[mid]) < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    start[v] = static_cast<int32_t>(lo);
  }
}

template <class T>
__global__ void embedding_backward_kernel(const T* dy, const int32_t* pos, const int32_t* start, T* dweight, int64_t V,
                                          int64_t C, int64_t ncb) {
  for (int64_t blk = blockIdx.x; blk < V * ncb; blk += gridDim.x) {
    const int64_t v = blk / ncb, c = (blk % ncb) * kColBlock + threadIdx.x;
    if (c >= C) continue;
    acc_t<T> acc = acc_t<T>(0);
    for (int32_t p = start[v]; p < start[v + 1]; ++p) acc += load(dy, int64_t(pos[p]) * C + c);
    store(dweight, v * C + c, acc);
  }
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t V, int64_t C,
                       cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0 && V >= 0 && C >= 0, "embedding n ", n, " V ", V, " C ", C);
  if (n == 0 || C == 0) return;
  launch_kernel(embedding_forward_kernel<T>, grid_for(n * C, kBlock), kBlock, 0, stream, weight, ids, out, n, V, C);
}

template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V, int64_t C,
                        cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0 && V >= 0 && C >= 0, "embedding_backward n ", n, " V ", V, " C ", C);
  AUTOSP_ASSERT(n < (int64_t(1) << 31) && V < (int64_t(1) << 31), "embedding_backward n ", n, " V ", V,
                " exceed int32");
  if (V == 0 || C == 0) return;
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(dweight, 0, size_t(V * C) * sizeof(T), stream));
    return;
  }
  Scratch keys_in(size_t(n) * sizeof(uint32_t), stream), keys_out(size_t(n) * sizeof(uint32_t), stream);
  Scratch pos_in(size_t(n) * sizeof(int32_t), stream), pos_out(size_t(n) * sizeof(int32_t), stream);
  Scratch start(size_t(V + 1) * sizeof(int32_t), stream);
  launch_kernel(make_keys_kernel, grid_for(n, kBlock), kBlock, 0, stream, ids, keys_in.as<uint32_t>(),
                pos_in.as<int32_t>(), n, V);
  int end_bit = 1;  // bits the keys (≤ V) need
  while (end_bit < 32 && (uint64_t(V) >> end_bit) != 0) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<uint32_t>(), keys_out.as<uint32_t>(),
                                             pos_in.as<int32_t>(), pos_out.as<int32_t>(), int(n), 0, end_bit, stream));
  Scratch temp(temp_bytes, stream);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<uint32_t>(),
                                             keys_out.as<uint32_t>(), pos_in.as<int32_t>(), pos_out.as<int32_t>(),
                                             int(n), 0, end_bit, stream));
  launch_kernel(segment_starts_kernel, grid_for(V + 1, kBlock), kBlock, 0, stream, keys_out.as<uint32_t>(), n, V,
                start.as<int32_t>());
  const int64_t ncb = (C + kColBlock - 1) / kColBlock;
  launch_kernel(embedding_backward_kernel<T>, grid_for(V * ncb * kColBlock, kColBlock), kColBlock, 0, stream, dy,
                pos_out.as<int32_t>(), start.as<int32_t>(), dweight, V, C, ncb);
}

#define AUTOSP_INSTANTIATE(T)                                                                                \
  template void embedding_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void embedding_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
