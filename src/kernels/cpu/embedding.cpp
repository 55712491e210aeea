// CPU embedding lookup: out[i, :] = weight[ids[i], :]. Knows nothing of graphs.
//
// Ids are validated up front (a bad id is the user's data: UsageError naming it); rows are then
// copied with memcpy, split over OpenMP threads.
//
// Backward: positions are grouped by id with a stable counting sort (O(n + V)), then dweight is
// cut into tiles of (kTileRows vocab rows × kTileCols columns) handed out dynamically. Each element
// of dweight is summed by one thread, in double, over its positions in increasing order, so the
// result is the same for any thread count and nothing is added atomically; a frequent id is still
// spread over its row's column tiles.
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tensor/check.h"

namespace autosp::cpu {

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t V, int64_t C) {
  AUTOSP_ASSERT(n >= 0 && V >= 0 && C >= 0, "embedding n ", n, " V ", V, " C ", C);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw UsageError(str("[embedding] id ", ids[i], " at position ", i, " is outside [0, ", V, ")"));
#pragma omp parallel for schedule(static) if (n * C > (1 << 15))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * C, weight + ids[i] * C, size_t(C) * sizeof(T));  // [C] row
}

template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V, int64_t C) {
  AUTOSP_ASSERT(n >= 0 && V >= 0 && C >= 0, "embedding_backward n ", n, " V ", V, " C ", C);
  constexpr int64_t kTileRows = 64, kTileCols = 512;
  // Positions grouped by id: those of id v are order[start[v] : start[v + 1]], increasing.
  std::vector<int64_t> start(static_cast<size_t>(V + 1), 0), order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    AUTOSP_ASSERT(ids[i] >= 0 && ids[i] < V, "embedding_backward id ", ids[i], " at position ", i);
    ++start[ids[i] + 1];
  }
  for (int64_t v = 0; v < V; ++v) start[v + 1] += start[v];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[ids[i]]++] = i;
  }
  const int64_t nrt = (V + kTileRows - 1) / kTileRows, nct = (C + kTileCols - 1) / kTileCols;
#pragma omp parallel if (V * C + n * C > (1 << 15))
  {
    double acc[kTileCols];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nrt * nct; ++task) {
      const int64_t v0 = (task / nct) * kTileRows, v1 = std::min(V, v0 + kTileRows);
      const int64_t c0 = (task % nct) * kTileCols, c1 = std::min(C, c0 + kTileCols), w = c1 - c0;
      for (int64_t v = v0; v < v1; ++v) {
        T* out = dweight + v * C + c0;  // [w] of row v
        if (start[v] == start[v + 1]) {
          std::fill(out, out + w, T(0));
          continue;
        }
        std::fill(acc, acc + w, 0.0);
        for (int64_t p = start[v]; p < start[v + 1]; ++p) {
          const T* g = dy + order[p] * C + c0;  // [w] of position order[p]
          for (int64_t c = 0; c < w; ++c) acc[c] += detail::sum_input(g[c]);
        }
        for (int64_t c = 0; c < w; ++c) out[c] = detail::sum_output<T>(acc[c]);
      }
    }
  }
}

template void embedding_forward<float>(const float*, const int64_t*, float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                        int64_t);

template void embedding_backward<float>(const float*, const int64_t*, float*, int64_t, int64_t, int64_t);
template void embedding_backward<double>(const double*, const int64_t*, double*, int64_t, int64_t, int64_t);
template void embedding_forward<uint16_t>(const uint16_t*, const int64_t*, uint16_t*, int64_t, int64_t, int64_t);
template void embedding_backward<uint16_t>(const uint16_t*, const int64_t*, uint16_t*, int64_t, int64_t,
                                           int64_t);

}  // namespace autosp::cpu
