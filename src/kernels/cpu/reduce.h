// Deterministic sums over rows for the CPU kernels (norm parameter gradients, sum_to). Internal to
// src/kernels/cpu; knows nothing of graphs.
//
// The split of the work is computed from the sizes alone, never from the thread count: rows are cut
// into a fixed number of chunks, each chunk's partial sums (double) go to their own slot, and the
// slots are added in chunk order. So a result is bitwise the same for any number of threads, and
// no float is ever added atomically. Columns are cut into blocks as well, so a reduction with few
// rows and many columns (or one row) is still spread over the threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"

namespace autosp::cpu::detail {

// A summed element read as double, and a double sum stored as T, for T in {float, double,
// uint16_t = bf16 bits}. bf16 is read exactly and stored through f32 (rounded to f32, then to
// bf16), as the bf16 emulation rounds the f32 kernel's result: the same bits without widening x.
template <class T>
inline double sum_input(T v) {
  if constexpr (std::is_same_v<T, uint16_t>) return double(bf16_to_f32(v));
  else return double(v);
}
template <class T>
inline T sum_output(double s) {
  if constexpr (std::is_same_v<T, uint16_t>) return f32_to_bf16(float(s));
  else return T(s);
}

inline constexpr int64_t kReduceGrain = 1 << 15;     // elements of work below which one thread runs
inline constexpr int64_t kReduceTasks = 64;          // tasks to aim for (chunks × column blocks)
inline constexpr int64_t kReduceColWork = 4096;      // elements one column block should cover per row
inline constexpr int64_t kReduceMaxColBlock = 1024;  // widest column block
inline constexpr int64_t kReduceMaxPartial = 1 << 22;  // doubles of partial sums for nacc ≤ 2 (32 MiB)

// out[a·width + c] = Σ_{r < rows} of what add(r, c0, c1, acc) adds to acc[a·width + c], for
// a < nacc and c in [c0, c1). `acc` is indexed like `out` (it is zeroed before the first row of
// a chunk); add must touch only columns [c0, c1). col_cost is the number of elements add reads
// per row and column (it sets the column block width).
template <class Add>
void sum_rows(int64_t rows, int64_t width, int nacc, int64_t col_cost, double* out, Add add) {
  if (width <= 0) return;
  const int64_t cb = std::clamp<int64_t>(kReduceColWork / std::max<int64_t>(col_cost, 1), 1, kReduceMaxColBlock);
  const int64_t ncb = (width + cb - 1) / cb;
  // The split depends on rows, width and col_cost only (not nacc), so a sum comes out the same
  // whether or not other sums ride along.
  const int64_t work = rows * width * std::max<int64_t>(col_cost, 1);
  int64_t nchunks = 1;
  if (ncb < kReduceTasks)
    nchunks = std::min({(kReduceTasks + ncb - 1) / ncb, rows, std::max<int64_t>(1, work / kReduceGrain),
                        std::max<int64_t>(1, kReduceMaxPartial / (2 * width))});
  nchunks = std::max<int64_t>(nchunks, 1);
  // One chunk accumulates straight into out; more chunks into their own slots of `part`.
  std::vector<double> part(nchunks > 1 ? size_t(nchunks * nacc * width) : 0);

#pragma omp parallel if (work > kReduceGrain)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nchunks * ncb; ++task) {
      const int64_t ch = task / ncb, c0 = (task % ncb) * cb, c1 = std::min(width, c0 + cb);
      double* acc = nchunks > 1 ? part.data() + ch * nacc * width : out;  // [nacc, width]
      for (int a = 0; a < nacc; ++a) std::fill(acc + a * width + c0, acc + a * width + c1, 0.0);
      const int64_t r0 = rows * ch / nchunks, r1 = rows * (ch + 1) / nchunks;
      for (int64_t r = r0; r < r1; ++r) add(r, c0, c1, acc);
    }
    if (nchunks > 1) {  // out = Σ_ch part[ch], in chunk order (the for above ends with a barrier)
#pragma omp for schedule(static)
      for (int64_t b = 0; b < ncb * nacc; ++b) {
        const int64_t a = b / ncb, c0 = (b % ncb) * cb, c1 = std::min(width, c0 + cb);
        double* o = out + a * width;
        std::copy(part.data() + a * width + c0, part.data() + a * width + c1, o + c0);
        for (int64_t ch = 1; ch < nchunks; ++ch) {
          const double* p = part.data() + (ch * nacc + a) * width;
          for (int64_t c = c0; c < c1; ++c) o[c] += p[c];
        }
      }
    }
  }
}

}  // namespace autosp::cpu::detail
