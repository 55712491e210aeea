// Who sends what to whom in expert parallelism's exchange (engine/expert_parallel.h), the same on
// the CPU (engine/expert_parallel.cpp) and on CUDA (engine/cuda/expert_parallel.cpp): G ranks, this
// one g, E experts, L = E / G local ones each; counts [G, E] every rank's rows per expert (the
// all-gathered counts); M the most rows a rank sends another (the all-to-all's chunk, in rows).
// Payload buffers are [G, M, width]: chunk d holds the rows for rank d's experts, by expert, then
// by token (slot order); what a rank receives in chunk s is what rank s sent it. Host code; knows
// nothing of devices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/moe_routing.h"
#include "tensor/check.h"

namespace autosp {

struct EpLayout {
  int G = 1, g = 0;
  int64_t E = 0, L = 0, M = 0;
  std::vector<int64_t> counts;

  EpLayout() = default;
  EpLayout(int G_, int g_, int64_t E_, std::vector<int64_t> all_counts)
      : G(G_), g(g_), E(E_), L(E_ / G_), counts(std::move(all_counts)) {
    AUTOSP_ASSERT(L * G == E, "expert parallelism: ", E, " experts over ", G, " ranks");
    AUTOSP_ASSERT(int64_t(counts.size()) == G * E, "expert parallelism: ", counts.size(), " counts for ", G, " x ", E);
    for (int s = 0; s < G; ++s)
      for (int d = 0; d < G; ++d) M = std::max(M, pair(s, d));
  }
  int64_t rows(int src, int64_t e) const { return counts[size_t(src * E + e)]; }
  // Rows rank `src` sends rank `dst` (its rows for dst's experts).
  int64_t pair(int src, int dst) const {
    int64_t n = 0;
    for (int64_t e = dst * L; e < (dst + 1) * L; ++e) n += rows(src, e);
    return n;
  }
  // Where local expert j's rows from `src` start in src's chunk (its rows are by expert).
  int64_t start(int src, int64_t j) const {
    int64_t n = 0;
    for (int64_t e = g * L; e < g * L + j; ++e) n += rows(src, e);
    return n;
  }
  // The most rows any local expert receives.
  int64_t max_local_rows() const {
    int64_t m = 0;
    for (int64_t j = 0; j < L; ++j) {
      int64_t n = 0;
      for (int s = 0; s < G; ++s) n += rows(s, g * L + j);
      m = std::max(m, n);
    }
    return m;
  }
  // The source side, for a buffer of [G, M] rows: which slot of the routing fills each row (-1: a
  // pad), so a gather by slot packs the send buffer.
  std::vector<int64_t> send_slots(const kernels::MoeRouting& r) const {
    std::vector<int64_t> s(size_t(G * M), -1);
    for (int d = 0; d < G; ++d) {
      const int64_t a0 = r.offset[size_t(d * L)], a1 = r.offset[size_t((d + 1) * L)];
      for (int64_t a = a0; a < a1; ++a) s[size_t(d * M + a - a0)] = r.slot[size_t(a)];
    }
    return s;
  }
  // The first row of expert e's block in the buffer that comes back (its rows are contiguous there).
  int64_t back_row(const kernels::MoeRouting& r, int64_t e) const {
    const int64_t d = e / L;
    return d * M + r.offset[size_t(e)] - r.offset[size_t(d * L)];
  }
  // The owner side: the received rows of each local expert, as rows of the [G, M] buffer (source
  // rank order, then as sent), expert j's at [offset[j], offset[j + 1]).
  void local_rows(std::vector<int64_t>& rows_out, std::vector<int64_t>& offset) const {
    rows_out.clear(), offset.assign(1, 0);
    for (int64_t j = 0; j < L; ++j) {
      for (int s = 0; s < G; ++s) {
        const int64_t a0 = start(s, j), cnt = rows(s, g * L + j);
        for (int64_t a = 0; a < cnt; ++a) rows_out.push_back(s * M + a0 + a);
      }
      offset.push_back(int64_t(rows_out.size()));
    }
  }
};

}  // namespace autosp
