// The OpenMP loops over a strided index space (tensor/strided.h) that the host copies
// (tensor/strided.cpp, tensor/convert.cpp) and the CPU elementwise kernels share. Host code only:
// a .cu file must not include it.
//
// Threads take contiguous ranges of rows and walk them with an odometer instead of dividing per
// element; the innermost dim is one run with the operands' inner strides, which the callers
// specialise so the compiler vectorises the common strides.
#pragma once

#include <omp.h>

#include <cstdint>

#include "tensor/strided.h"

namespace autosp::cpu {

inline constexpr int64_t kGrain = 1 << 15;  // elements below which a loop runs on one thread

// [lo, hi) of n items for thread t of nt.
inline void thread_range(int64_t n, int t, int nt, int64_t& lo, int64_t& hi) {
  lo = n * t / nt;
  hi = n * (t + 1) / nt;
}

// Calls f(out_offset, op_offsets, n, op_inner_strides) for runs of the innermost dim, split over
// threads. out_offset is the linear index (the output is contiguous over the space).
template <class F>
void for_each_run(const Space& s, int nops, F f) {
  const int r = s.rank;
  const int64_t inner = s.shape[r - 1];
  int64_t inner_stride[2] = {s.stride[0][r - 1], s.stride[1][r - 1]};
  if (r == 1) {  // one flat run: split it
#pragma omp parallel if (s.numel > kGrain)
    {
      int64_t lo, hi;
      thread_range(inner, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
      if (hi > lo) {
        int64_t off[2] = {lo * inner_stride[0], lo * inner_stride[1]};
        f(lo, off, hi - lo, inner_stride);
      }
    }
    return;
  }
  const int64_t rows = s.numel / inner;
#pragma omp parallel if (s.numel > kGrain)
  {
    int64_t lo, hi;
    thread_range(rows, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
    if (hi > lo) {
      int64_t idx[kMaxRank] = {};  // odometer over the outer dims [0, r-1)
      int64_t off[2] = {0, 0};
      for (int64_t rem = lo, d = r - 2; d >= 0; --d) {
        idx[d] = rem % s.shape[d];
        rem /= s.shape[d];
        for (int o = 0; o < nops; ++o) off[o] += idx[d] * s.stride[o][d];
      }
      for (int64_t row = lo; row < hi; ++row) {
        f(row * inner, off, inner, inner_stride);
        for (int d = r - 2; d >= 0; --d) {  // advance the odometer
          for (int o = 0; o < nops; ++o) off[o] += s.stride[o][d];
          if (++idx[d] < s.shape[d]) break;
          for (int o = 0; o < nops; ++o) off[o] -= idx[d] * s.stride[o][d];
          idx[d] = 0;
        }
      }
    }
  }
}

}  // namespace autosp::cpu
