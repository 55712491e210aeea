// Strided host copies: the contiguous copy of any view, in place of an element-by-element loop.
// The index space is simplified first (tensor/strided.h), so a contiguous run is one memcpy per
// thread; a transpose-like copy (the innermost dim strided, another dim dense) goes in tiles.
#include "tensor/strided.h"

#include <algorithm>
#include <cstring>

#include "tensor/strided_loops.h"

namespace autosp::cpu {

namespace {

// A transpose-like copy: the innermost dim reads src with a stride while dim p reads it densely.
// Copies (p, inner) in kTile × kTile tiles, so the src lines a tile touches are reused from cache
// instead of being fetched once per element.
template <class T>
void copy_tiled(const Space& s, int p, const T* src, T* dst) {
  constexpr int64_t kTile = 32;
  const int r = s.rank;
  int64_t dst_stride[kMaxRank];  // dst is contiguous over s.shape
  dst_stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) dst_stride[d] = dst_stride[d + 1] * s.shape[d + 1];
  const int64_t np = s.shape[p], nj = s.shape[r - 1], sj = s.stride[0][r - 1], dp = dst_stride[p];
  const int64_t ptiles = (np + kTile - 1) / kTile, outer = s.numel / (np * nj);
#pragma omp parallel for schedule(static) if (s.numel > kGrain)
  for (int64_t task = 0; task < outer * ptiles; ++task) {
    int64_t src_off = 0, dst_off = 0;  // of this task's outer index (all dims but p and inner)
    for (int64_t rem = task / ptiles, d = r - 2; d >= 0; --d) {
      if (d == p) continue;
      const int64_t i = rem % s.shape[d];
      rem /= s.shape[d];
      src_off += i * s.stride[0][d];
      dst_off += i * dst_stride[d];
    }
    const int64_t p0 = (task % ptiles) * kTile, p1 = std::min(np, p0 + kTile);
    for (int64_t j0 = 0; j0 < nj; j0 += kTile) {
      const int64_t j1 = std::min(nj, j0 + kTile);
      for (int64_t pp = p0; pp < p1; ++pp) {
        const T* from = src + src_off + pp;  // src stride along p is 1
        T* to = dst + dst_off + pp * dp;
        for (int64_t j = j0; j < j1; ++j) to[j] = from[j * sj];
      }
    }
  }
}

}  // namespace

template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst) {
  const int64_t* strides[1] = {src_strides};
  const Space s = simplify_space(rank, shape, 1, strides);
  if (s.numel == 0) return;
  const int64_t inner_stride = s.stride[0][s.rank - 1];
  if (inner_stride != 0 && inner_stride != 1) {  // a dense dim further out means a transpose
    for (int p = s.rank - 2; p >= 0; --p)
      if (s.stride[0][p] == 1) return copy_tiled(s, p, src, dst);
  }
  for_each_run(s, 1, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    const T* from = src + off[0];
    T* to = dst + o;
    const int64_t step = st[0];
    if (step == 1) {
      std::memcpy(to, from, size_t(n) * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) to[i] = from[i * step];
    }
  });
}

template void copy_strided<float>(int, const int64_t*, const float*, const int64_t*, float*);
template void copy_strided<double>(int, const int64_t*, const double*, const int64_t*, double*);
template void copy_strided<int32_t>(int, const int64_t*, const int32_t*, const int64_t*, int32_t*);
template void copy_strided<int64_t>(int, const int64_t*, const int64_t*, const int64_t*, int64_t*);
template void copy_strided<uint16_t>(int, const int64_t*, const uint16_t*, const int64_t*, uint16_t*);

}  // namespace autosp::cpu
