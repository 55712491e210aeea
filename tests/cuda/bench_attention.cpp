// autosp-bench-attention: TFLOP/s of our flash attention (bf16, causal, head dim 128), forward,
// backward and both, at S = 4k … 64k, and of cuDNN's SDPA (kernels/cuda/cudnn_attention.cuh) on
// the same shapes and buffers, printed as a table for scripts/gpu-check.sh.
//
//   autosp-bench-attention [--max-seq S] [--iters N]
//
// B = 1 and the number of heads shrinks as S grows (N = max(2, 128k / S)), so every row does
// about the same number of attention FLOPs per token and the whole run stays short. FLOPs follow
// the FlashAttention convention: forward 4·B·N·S²·D, halved for causal; backward 2.5× forward
// (our backward does more — dq recomputes P and dP — but is charged the conventional count).
// Exits 1 with a message when there is no CUDA device, never waits for one. A cuDNN failure does
// not stop the run: its columns say "error" and the reason goes to stderr.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cudnn_attention.cuh"

namespace {

using autosp::cuda::bf16;

#define BENCH_CHECK(expr)                                                            \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "error: %s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// Fills n bf16 with values of a fixed pattern in [-1, 1) (the timing does not depend on them).
void fill_pattern(bf16* dev, size_t n, uint32_t seed) {
  std::vector<uint16_t> host(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float f = float(x >> 8) / float(1u << 24) * 2.f - 1.f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    host[i] = uint16_t(bits >> 16);
  }
  BENCH_CHECK(cudaMemcpy(dev, host.data(), n * 2, cudaMemcpyHostToDevice));
}

struct Row {
  int64_t S, N;
  double fwd_ms, bwd_ms;
  double cudnn_fwd_ms = -1, cudnn_bwd_ms = -1;  // -1: not run (unsupported or failed)
};

}  // namespace

int main(int argc, char** argv) {
  int64_t max_seq = 65536;
  int iters = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--max-seq" && i + 1 < argc) {
      max_seq = std::atoll(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--max-seq S] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::fprintf(stderr, "error: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);

  const int64_t D = 128, B = 1;
  std::vector<Row> rows;
  try {
    for (int64_t S = 4096; S <= max_seq; S *= 2) {
      const int64_t N = std::max<int64_t>(2, 131072 / S);
      const size_t n = size_t(B * N * S * D);
      bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
      float* lse;
      for (bf16** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
        BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(p), n * sizeof(bf16)));
      BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), size_t(B * N * S) * sizeof(float)));
      fill_pattern(q, n, 1);
      fill_pattern(k, n, 2);
      fill_pattern(v, n, 3);
      fill_pattern(dout, n, 4);
      const double scale = 1.0 / std::sqrt(double(D));
      cudaEvent_t e0, e1, e2;
      BENCH_CHECK(cudaEventCreate(&e0));
      BENCH_CHECK(cudaEventCreate(&e1));
      BENCH_CHECK(cudaEventCreate(&e2));
      auto fwd = [&] { autosp::cuda::sdpa_forward<bf16>(q, k, v, o, lse, B, N, N, S, S, D, scale, true, nullptr); };
      auto bwd = [&] {
        autosp::cuda::sdpa_backward<bf16>(q, k, v, o, lse, dout, dq, dk, dv, B, N, N, S, S, D, scale, true, nullptr);
      };
      fwd();  // warm-up (and the shared-memory attributes)
      bwd();
      BENCH_CHECK(cudaDeviceSynchronize());
      float fwd_ms = 0, bwd_ms = 0;
      for (int it = 0; it < iters; ++it) {
        BENCH_CHECK(cudaEventRecord(e0));
        fwd();
        BENCH_CHECK(cudaEventRecord(e1));
        bwd();
        BENCH_CHECK(cudaEventRecord(e2));
        BENCH_CHECK(cudaEventSynchronize(e2));
        float a = 0, b = 0;
        BENCH_CHECK(cudaEventElapsedTime(&a, e0, e1));
        BENCH_CHECK(cudaEventElapsedTime(&b, e1, e2));
        fwd_ms += a;
        bwd_ms += b;
      }
      Row row{S, N, fwd_ms / iters, bwd_ms / iters};
      // cuDNN SDPA on the same buffers (its own o and lse; the backward reads them).
      const std::string why = autosp::cuda::cudnn_sdpa_unsupported<bf16>(B, N, N, S, S, D, true);
      if (!why.empty()) {
        std::fprintf(stderr, "cuDNN SDPA skipped at S %lld: %s\n", (long long)S, why.c_str());
      } else {
        try {
          auto cfwd = [&] {
            autosp::cuda::cudnn_sdpa_forward<bf16>(q, k, v, o, lse, B, N, N, S, S, D, scale, true, nullptr);
          };
          auto cbwd = [&] {
            autosp::cuda::cudnn_sdpa_backward<bf16>(q, k, v, o, lse, dout, dq, dk, dv, B, N, N, S, S, D, scale, true,
                                                    nullptr);
          };
          cfwd();  // warm-up: builds and caches the plans
          cbwd();
          BENCH_CHECK(cudaDeviceSynchronize());
          float cf = 0, cb = 0;
          for (int it = 0; it < iters; ++it) {
            BENCH_CHECK(cudaEventRecord(e0));
            cfwd();
            BENCH_CHECK(cudaEventRecord(e1));
            cbwd();
            BENCH_CHECK(cudaEventRecord(e2));
            BENCH_CHECK(cudaEventSynchronize(e2));
            float a = 0, b = 0;
            BENCH_CHECK(cudaEventElapsedTime(&a, e0, e1));
            BENCH_CHECK(cudaEventElapsedTime(&b, e1, e2));
            cf += a;
            cb += b;
          }
          row.cudnn_fwd_ms = cf / iters;
          row.cudnn_bwd_ms = cb / iters;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "cuDNN SDPA failed at S %lld: %s\n", (long long)S, e.what());
        }
      }
      rows.push_back(row);
      std::fprintf(stderr, "S %lld done\n", (long long)S);
      for (bf16* p : {q, k, v, o, dout, dq, dk, dv}) BENCH_CHECK(cudaFree(p));
      BENCH_CHECK(cudaFree(lse));
      BENCH_CHECK(cudaEventDestroy(e0));
      BENCH_CHECK(cudaEventDestroy(e1));
      BENCH_CHECK(cudaEventDestroy(e2));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }

  std::printf("\nflash attention vs cuDNN SDPA, bf16, causal, D = 128, B = 1 (TFLOP/s; FlashAttention FLOP "
              "convention)\n");
  std::printf("%-8s %-6s %10s %10s %10s %10s %12s %14s %10s\n", "S", "heads", "fwd ms", "bwd ms", "fwd TF/s",
              "bwd TF/s", "fwd+bwd TF/s", "cuDNN f+b TF/s", "vs cuDNN");
  double best_ratio = -1;
  for (const Row& r : rows) {
    const double fwd_flops = 4.0 * double(B * r.N) * double(r.S) * double(r.S) * double(D) / 2.0;
    const double bwd_flops = 2.5 * fwd_flops;
    const double ours = (fwd_flops + bwd_flops) / ((r.fwd_ms + r.bwd_ms) * 1e9);
    char cudnn_col[32] = "error", ratio_col[32] = "-";
    if (r.cudnn_fwd_ms > 0) {
      const double theirs = (fwd_flops + bwd_flops) / ((r.cudnn_fwd_ms + r.cudnn_bwd_ms) * 1e9);
      std::snprintf(cudnn_col, sizeof cudnn_col, "%.1f", theirs);
      std::snprintf(ratio_col, sizeof ratio_col, "%.2fx", ours / theirs);
      best_ratio = std::max(best_ratio, ours / theirs);
    }
    std::printf("%-8lld %-6lld %10.2f %10.2f %10.1f %10.1f %12.1f %14s %10s\n", (long long)r.S, (long long)r.N,
                r.fwd_ms, r.bwd_ms, fwd_flops / (r.fwd_ms * 1e9), bwd_flops / (r.bwd_ms * 1e9), ours, cudnn_col,
                ratio_col);
  }
  // One line scripts/gpu-check.sh picks up.
  if (best_ratio > 0)
    std::printf("cudnn-summary: ours / cuDNN fwd+bwd = %.2fx at best over S = 4k..%lldk\n", best_ratio,
                (long long)(max_seq / 1024));
  else
    std::printf("cudnn-summary: cuDNN SDPA did not run (see stderr)\n");
  return 0;
}
