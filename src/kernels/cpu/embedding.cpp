// CPU embedding lookup: out[i, :] = weight[ids[i], :]. Knows nothing of graphs.
//
// Ids are validated up front (a bad id is the user's data: UsageError naming it); rows are then
// copied with memcpy, split over OpenMP threads.
#include "kernels/cpu/embedding.h"

#include <cstring>

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

template void embedding_forward<float>(const float*, const int64_t*, float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                        int64_t);

}  // namespace autosp::cpu
