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
#include <memory>
#include <type_traits>

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

// out[a·width + c] = Σ_{r < rows} of what add_rows(r0, r1, c0, c1, acc) adds to acc[a·width + c] for
// the rows [r0, r1) of one chunk, for a < nacc and c in [c0, c1). `acc` is indexed like `out` and is
// zeroed before a chunk; add_rows must touch only columns [c0, c1) and must add the chunk's rows in
// order (r0 first) for each column, so a chunk's partial is the same whichever way it walks them (a
// row at a time, or a block of columns over all the chunk's rows in registers). col_cost is the
// number of elements add_rows reads per row and column (it sets the column block width).
// `whole_rows`: one column block, so add_rows sees every column of its rows at once (a kernel that
// writes a per-row result beside the sum, e.g. layernorm's dx); the chunk count then follows from
// that single block.
template <class AddRows>
void sum_row_blocks(int64_t rows, int64_t width, int nacc, int64_t col_cost, bool whole_rows, double* out,
                    AddRows add_rows) {
  if (width <= 0) return;
  const int64_t cb = whole_rows ? width
                                : std::clamp<int64_t>(kReduceColWork / std::max<int64_t>(col_cost, 1), 1,
                                                      kReduceMaxColBlock);
  const int64_t ncb = (width + cb - 1) / cb;
  // The split depends on rows, width, col_cost and whole_rows only (not nacc), so a sum comes out
  // the same whether or not other sums ride along.
  const int64_t work = rows * width * std::max<int64_t>(col_cost, 1);
  int64_t nchunks = 1;
  if (ncb < kReduceTasks)
    nchunks = std::min({(kReduceTasks + ncb - 1) / ncb, rows, std::max<int64_t>(1, work / kReduceGrain),
                        std::max<int64_t>(1, kReduceMaxPartial / (2 * width))});
  nchunks = std::max<int64_t>(nchunks, 1);
  // One chunk accumulates straight into out; more chunks into their own slots of `part` (left
  // uninitialised: each task zeroes its own columns).
  std::unique_ptr<double[]> part(nchunks > 1 ? new double[size_t(nchunks * nacc * width)] : nullptr);

#pragma omp parallel if (work > kReduceGrain)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < nchunks * ncb; ++task) {
      const int64_t ch = task / ncb, c0 = (task % ncb) * cb, c1 = std::min(width, c0 + cb);
      double* acc = nchunks > 1 ? part.get() + ch * nacc * width : out;  // [nacc, width]
      for (int a = 0; a < nacc; ++a) std::fill(acc + a * width + c0, acc + a * width + c1, 0.0);
      add_rows(rows * ch / nchunks, rows * (ch + 1) / nchunks, c0, c1, acc);
    }
    if (nchunks > 1) {  // out = Σ_ch part[ch], in chunk order (the for above ends with a barrier)
      const int64_t ob = std::min<int64_t>(cb, kReduceMaxColBlock), nob = (width + ob - 1) / ob;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < nob * nacc; ++b) {
        const int64_t a = b / nob, c0 = (b % nob) * ob, c1 = std::min(width, c0 + ob);
        double* o = out + a * width;
        std::copy(part.get() + a * width + c0, part.get() + a * width + c1, o + c0);
        for (int64_t ch = 1; ch < nchunks; ++ch) {
          const double* p = part.get() + (ch * nacc + a) * width;
          for (int64_t c = c0; c < c1; ++c) o[c] += p[c];
        }
      }
    }
  }
}

// sum_row_blocks a row at a time: add(r, c0, c1, acc) adds row r's columns [c0, c1).
template <class Add>
void sum_rows(int64_t rows, int64_t width, int nacc, int64_t col_cost, double* out, Add add) {
  sum_row_blocks(rows, width, nacc, col_cost, false, out,
                 [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, double* acc) {
                   for (int64_t r = r0; r < r1; ++r) add(r, c0, c1, acc);
                 });
}

}  // namespace autosp::cpu::detail
