// One side of scripts/kernel_ab.sh: compiled twice, once against the old kernel file (with
// -Dautosp=autosp_old, so its symbols do not clash) and once against the new, each time exposing
// the kernel under the C name WRAPNAME (run_old, run_new) for the driver.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"

namespace autosp::detail {
[[noreturn]] void assert_fail(const char* e, const char* f, int l, const std::string& m) {
  std::fprintf(stderr, "%s %s:%d %s\n", e, f, l, m.c_str());
  std::abort();
}
}  // namespace autosp::detail

#define AB_CAT2(a, b) a##b
#define AB_CAT(a, b) AB_CAT2(a, b)

// C [M, N] = op(A) · op(B) through the packed sgemm, 2 threads.
extern "C" void AB_CAT(WRAPNAME, _gemm)(bool ta, bool tb, long M, long N, long K, const float* a, const float* b,
                                        float* c) {
  autosp::cpu::packed_sgemm(ta, tb, M, N, K, 1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c, N, 2);
}

// Causal attention [B, N, S, D], forward (bwd = 0) or backward.
extern "C" void AB_CAT(WRAPNAME, _attention)(int bwd, const float* q, const float* k, const float* v, float* o,
                                             float* lse, const float* dout, float* dq, float* dk, float* dv, long B,
                                             long N, long S, long D) {
  const double scale = 1.0 / 5.65;
  if (!bwd) autosp::cpu::sdpa_forward<float>(q, k, v, o, lse, B, N, N, S, S, D, scale, true, nullptr);
  else
    autosp::cpu::sdpa_backward<float>(q, k, v, o, lse, dout, dq, dk, dv, B, N, N, S, S, D, scale, true, nullptr,
                                      nullptr);
}
