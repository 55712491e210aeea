// autosp-bench --mode gemm: the f32 GEMM that the model's linear layers run (cpu::gemm_batched, our
// packed AVX-512 sgemm where the CPU has AVX-512F) against a direct cblas_sgemm (OpenBLAS, under
// whatever OPENBLAS_CORETYPE the environment sets), alternated per shape: `pairs` turns of ours →
// OpenBLAS, each `warmup` untimed and `iters` timed calls. Knows nothing of models or graphs.
//
// Shapes: GPT-2 tiny's linear layers at B·T = 1024 rows (configs/gpt2-tiny.json, C = 256): for each
// layer [K_in → N_out] its forward x·W (1024 × N_out × K_in), its input gradient dY·Wᵀ (trans_b,
// 1024 × K_in × N_out) and its weight gradient xᵀ·dY (trans_a, K_in × N_out × 1024), and a 2048³.
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

namespace autosp {

struct GemmBenchOptions {
  int threads = 0;  // 0: the machine's cores
  int warmup = 1, iters = 20, pairs = 5;
};

// One row per shape: ta, tb, M, N, K, threads, ours_ms / openblas_ms (medians of the turns' mean
// call time), ours_gflops / openblas_gflops, speedup (median over the turns of OpenBLAS ÷ ours),
// packed (whether ours ran the packed sgemm) and max_rel_diff (max |ours − OpenBLAS| / max |OpenBLAS|);
// bf16_path, bf16_ms, bf16_gflops, bf16_speedup (median over the turns of ours f32 ÷ ours bf16).
void run_gemm_bench(const GemmBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace autosp
