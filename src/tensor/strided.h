// The strided index space that the host copies and the CPU and CUDA elementwise kernels share (an
// output shape walked by up to two strided operands, simplified so loops run over as few dims as
// possible; namespace autosp, like the tensor library: the CUDA kernels receive a Space by value),
// and the strided element copies on the host (namespace autosp::cpu, named like the CPU kernels
// that use them). Tensor::contiguous()/clone() and the elementwise kernels share them, so there is
// one copy of each. Knows nothing of graphs, kernels or devices.
//
// All shapes are row-major; `rank` ≤ kMaxRank; strides are in elements.
#pragma once

#include <cstdint>

#include "tensor/check.h"

namespace autosp {

inline constexpr int kMaxRank = 8;

// A row-major index space walked by up to two strided operands (the output is contiguous over it).
struct Space {
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[2][kMaxRank] = {};
  int64_t numel = 1;
};

// Drops size-1 dims and merges adjacent dims that are contiguous for every operand. The result has
// rank ≥ 1; numel == 0 means there is nothing to do.
inline Space simplify_space(int rank, const int64_t* shape, int nops, const int64_t* const* strides) {
  AUTOSP_ASSERT(rank >= 0 && rank <= kMaxRank, "rank ", rank);
  Space s;
  for (int d = 0; d < rank; ++d) {
    AUTOSP_ASSERT(shape[d] >= 0, "negative dim ", shape[d]);
    s.numel *= shape[d];
    if (shape[d] == 1) continue;
    const int r = s.rank;
    bool merge = r > 0;
    for (int o = 0; o < nops && merge; ++o)
      merge = s.stride[o][r - 1] == strides[o][d] * shape[d];
    if (merge) {  // the previous dim steps exactly over this one: fold it in
      s.shape[r - 1] *= shape[d];
      for (int o = 0; o < nops; ++o) s.stride[o][r - 1] = strides[o][d];
    } else {
      s.shape[r] = shape[d];
      for (int o = 0; o < nops; ++o) s.stride[o][r] = strides[o][d];
      ++s.rank;
    }
  }
  if (s.rank == 0) {  // a scalar: one element
    s.rank = 1;
    s.shape[0] = 1;
  }
  return s;
}

// sum_to's index space: contiguous x [x_shape] summed to out [out_shape] (each of its dims x's or 1),
// with size-1 dims dropped and neighbours of the same kind (kept / summed) merged: n dims, none when
// every dim has size 1.
struct SumSpace {
  int n = 0;
  int64_t size[kMaxRank] = {};
  bool summed[kMaxRank] = {};
  int64_t x_numel = 1, out_numel = 1;
};

inline SumSpace simplify_sum(int rank, const int64_t* x_shape, const int64_t* out_shape) {
  AUTOSP_ASSERT(rank >= 0 && rank <= kMaxRank, "sum_to rank ", rank);
  SumSpace s;
  for (int d = 0; d < rank; ++d) {
    AUTOSP_ASSERT(x_shape[d] >= 0 && (out_shape[d] == x_shape[d] || out_shape[d] == 1), "sum_to dim ", d, ": x ",
                  x_shape[d], " out ", out_shape[d]);
    s.x_numel *= x_shape[d];
    s.out_numel *= out_shape[d];
    if (x_shape[d] == 1) continue;
    const bool summed = out_shape[d] == 1;
    if (s.n > 0 && s.summed[s.n - 1] == summed) {
      s.size[s.n - 1] *= x_shape[d];
    } else {
      s.size[s.n] = x_shape[d];
      s.summed[s.n] = summed;
      ++s.n;
    }
  }
  return s;
}

}  // namespace autosp

namespace autosp::cpu {

// dst (contiguous, row-major over `shape`) = src read with `src_strides`. Used for contiguous
// copies of views, transpose, permute, slice and concat. T is any trivially copyable element
// (instantiated for float, double, int32_t, int64_t, uint16_t).
template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst);

}  // namespace autosp::cpu
