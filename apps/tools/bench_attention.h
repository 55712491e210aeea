// autosp-bench --mode attention: our CPU sdpa kernel (kernels/cpu/attention.h), forward and
// backward, against PyTorch 2.x's torch.nn.functional.scaled_dot_product_attention on the same
// tensors (scripts/bench_attention.py in the .venv-bench venv), and the machine's sgemm rate, all
// in one alternated run: for each shape, `pairs` times ours → PyTorch → sgemm.
//
// Shapes: B = batch, N = hidden / D query heads, Nkv = N / group kv heads (GQA), S = Sq = Skv, D.
// FLOPs (FlashAttention's convention): forward 4·B·N·D·pairs, backward 2.5× that (5 GEMMs, the
// recomputation of Q·Kᵀ counted), where pairs = S² or, causal, S·(S+1)/2 visible (query, key) pairs.
// With doc_len, each turn also times ours on packed documents (lengths drawn uniformly from
// [1, 2·doc_len - 1], a document mask): the row adds masked_{fwd,bwd}_ms, the visible pairs
// Σ len·(len+1)/2 as masked_gflop, and mask_speedup = unmasked ÷ masked time.
// With window, each turn also times ours with that sliding window (kernels/attention_variant.h)
// and, with compare_pytorch, PyTorch's SDPA with the window as a boolean mask (forward and
// backward) and flex_attention's forward with a sliding-window block mask (no CPU backward): the row
// adds window_{fwd,bwd}_ms, window_gflop (its visible pairs), window_speedup = our full causal ÷
// our windowed time, pytorch_window_{fwd,bwd}_ms with window_vs_pytorch = PyTorch's masked ÷ our
// windowed time, and flex_window_fwd_ms with window_fwd_vs_flex = flex's forward ÷ ours (medians).
// Knows nothing of models or graphs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace autosp {

struct AttentionBenchOptions {
  std::vector<int64_t> seqs{1024, 4096, 16384};
  std::vector<int64_t> dims{16, 64, 128};
  int64_t batch = 1, hidden = 256, group = 2;
  bool causal = true;
  int64_t doc_len = 0;         // > 0: also time a document mask of this mean document length
  int64_t window = 0;          // > 0: also time a sliding window of this many keys (ours and PyTorch's flex)
  int threads = 0;             // 0: the machine's cores
  int warmup = 1, iters = 2;   // per turn
  int pairs = 3;               // alternated turns of each side per shape
  bool compare_pytorch = true; // false: ours and sgemm only (no venv needed)
  bool check = true;           // PyTorch runs on our tensors and reports max |ours - PyTorch|
  std::string source_dir;      // where scripts/ lives
};

// One row per (S, D), handed to `emit` as soon as it is measured: the shape, threads, gflop_fwd /
// gflop_bwd (the FLOPs above, in GFLOP), medians over the turns of ours_{fwd,bwd}_ms and
// pytorch_{fwd,bwd}_ms, ours_gflops / pytorch_gflops (forward + backward), sgemm_gflops (a
// 2048³ sgemm through cpu::gemm_batched at the same threads), ours_of_sgemm / pytorch_of_sgemm,
// and speedup / speedup_fwd / speedup_bwd: the median over the turns of PyTorch's time ÷ ours.
// Where the CPU has the bf16 attention (AVX512-BF16, even D): bf16_{fwd,bwd}_ms of our bf16 kernels
// on the same values rounded, each turn right after the f32 run, and bf16_speedup (with _min,
// _max): the median over the turns of f32 time ÷ bf16 time.
void run_attention_bench(const AttentionBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace autosp
