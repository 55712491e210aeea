// The GEMM benchmark: gemm_batched<float> (our packed sgemm) against cblas_sgemm and our bf16 GEMM
// (gemm_bf16_batched on the CPU's best path), alternated; where that path is AMX, the AVX512-BF16
// path too, in the same rounds (amx_speedup: AVX512-BF16's time over AMX's).
#include "tools/bench_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tensor/convert.h"
#include "tools/bench.h"

namespace autosp {
namespace {

using Clock = std::chrono::steady_clock;

struct GemmShape {
  bool ta, tb;
  int64_t M, N, K;
};

std::vector<GemmShape> gpt2_tiny_shapes() {
  const int64_t rows = 1024;  // B · T = 4 · 256
  // [K_in, N_out]: attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, the tied lm_head (x · wteᵀ).
  const int64_t layers[][2] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}, {256, 512}};
  std::vector<GemmShape> shapes;
  for (const auto& l : layers) {
    shapes.push_back({false, false, rows, l[1], l[0]});  // forward x · W
    shapes.push_back({false, true, rows, l[0], l[1]});   // dx = dY · Wᵀ
    shapes.push_back({true, false, l[0], l[1], rows});   // dW = xᵀ · dY
  }
  shapes.push_back({false, false, 2048, 2048, 2048});
  // The GEMM-bound Llama of issue 49 (hidden 768, intermediate 2048, vocab 8192) at B·S = 2048 rows,
  // weights [out, in] as the model holds them: the MLP's gate forward x·Wᵀ, its input gradient
  // dG·W, its weight gradient dGᵀ·x, and the head x·Wᵀ.
  shapes.push_back({false, true, 2048, 2048, 768});
  shapes.push_back({false, false, 2048, 768, 2048});
  shapes.push_back({true, false, 2048, 768, 2048});
  shapes.push_back({false, true, 2048, 8192, 768});
  return shapes;
}

// Mean milliseconds of `iters` calls after `warmup` untimed ones.
template <class F>
double time_ms(int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / iters;
}

}  // namespace

void run_gemm_bench(const GemmBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit) {
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_num_threads(threads);
  std::mt19937_64 gen(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const cpu::Bf16Gemm bf16_path = cpu::bf16_gemm_best();
  const bool vs_dp = bf16_path == cpu::Bf16Gemm::amx && cpu::bf16_gemm_available(cpu::Bf16Gemm::avx512_bf16);
  for (const GemmShape& s : gpt2_tiny_shapes()) {
    std::vector<float> a(size_t(s.M * s.K)), b(size_t(s.K * s.N)), ours(size_t(s.M * s.N)), blas(ours.size()),
        bf16_out(ours.size());
    for (float& x : a) x = dist(gen);
    for (float& x : b) x = dist(gen);
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    cpu::cast<float, uint16_t>(a.data(), a16.data(), int64_t(a.size()));
    cpu::cast<float, uint16_t>(b.data(), b16.data(), int64_t(b.size()));
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto run_ours = [&] {
      cpu::gemm_batched<float>(s.ta, s.tb, 1, s.M, s.N, s.K, 1.0f, a.data(), 0, b.data(), 0, 0.0f, ours.data(), 0);
    };
    auto run_blas = [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, blasint(s.M),
                  blasint(s.N), blasint(s.K), 1.0f, a.data(), blasint(lda), b.data(), blasint(ldb), 0.0f,
                  blas.data(), blasint(s.N));
    };
    const auto bf16_on = [&](cpu::Bf16Gemm path) {
      return [&, path] {
        cpu::gemm_bf16_batched(path, s.ta, s.tb, 1, s.M, s.N, s.K, 1.0f, a16.data(), 0, b16.data(), 0, 0.0f,
                               bf16_out.data(), 0);
      };
    };
    std::vector<double> ours_ms, blas_ms, bf16_ms, ratio, bf16_ratio, dp_ms, amx_ratio;
    for (int p = 0; p < opt.pairs; ++p) {
      ours_ms.push_back(time_ms(opt.warmup, opt.iters, run_ours));
      blas_ms.push_back(time_ms(opt.warmup, opt.iters, run_blas));
      bf16_ms.push_back(time_ms(opt.warmup, opt.iters, bf16_on(bf16_path)));
      ratio.push_back(blas_ms.back() / ours_ms.back());
      bf16_ratio.push_back(ours_ms.back() / bf16_ms.back());
      if (!vs_dp) continue;
      dp_ms.push_back(time_ms(opt.warmup, opt.iters, bf16_on(cpu::Bf16Gemm::avx512_bf16)));
      amx_ratio.push_back(dp_ms.back() / bf16_ms.back());
    }
    double diff = 0, scale = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      diff = std::max(diff, double(std::abs(ours[i] - blas[i])));
      scale = std::max(scale, double(std::abs(blas[i])));
    }
    const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) / 1e9;
    const double om = median(ours_ms), bm = median(blas_ms), hm = median(bf16_ms);
    nlohmann::json row = {{"mode", "gemm"}, {"ta", s.ta}, {"tb", s.tb}, {"M", s.M}, {"N", s.N}, {"K", s.K}, {"threads", threads},
          {"ours_ms", om}, {"openblas_ms", bm}, {"ours_gflops", gflop / om * 1e3}, {"openblas_gflops", gflop / bm * 1e3},
          {"speedup", median(ratio)}, {"packed", cpu::packed_sgemm_available()},
          {"max_rel_diff", scale > 0 ? diff / scale : 0.0}, {"bf16_path", cpu::bf16_gemm_name(bf16_path)},
          {"bf16_ms", hm}, {"bf16_gflops", gflop / hm * 1e3}, {"bf16_speedup", median(bf16_ratio)}};
    if (vs_dp) row["avx512_bf16_ms"] = median(dp_ms), row["amx_speedup"] = median(amx_ratio);
    emit(row);
  }
}

}  // namespace autosp
