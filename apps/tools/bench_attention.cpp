// The attention benchmark: ours, PyTorch's SDPA and sgemm, alternated per shape.
#include "tools/bench_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <unistd.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "tensor/check.h"
#include "tensor/convert.h"
#include "tools/bench.h"
#include "tools/py_worker.h"

namespace autosp {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void write_raw(const std::filesystem::path& p, const std::vector<float>& x) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size() * sizeof(float)));
  if (!f) throw RuntimeFailure(str("cannot write ", p.string()));
}

// GFLOP/s of one 2048³ sgemm (the median of three) at the current thread count.
double sgemm_gflops() {
  const int64_t n = 2048;
  static const std::vector<float> a = random_normal(size_t(n * n), 1), b = random_normal(size_t(n * n), 2);
  std::vector<float> c(size_t(n * n));
  std::vector<double> ms;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    cpu::gemm_batched<float>(false, false, 1, n, n, n, 1.0f, a.data(), 0, b.data(), 0, 0.0f, c.data(), 0);
    ms.push_back(ms_since(t0));
  }
  return 2.0 * double(n) * double(n) * double(n) / (median(ms) * 1e6);
}

// One shape's tensors and our outputs: q, dout [B, N, S, D]; k, v [B, Nkv, S, D].
struct Problem {
  int64_t B, N, Nkv, S, D;
  bool causal;
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
};

// Document starts [B, S] of documents with lengths uniform in [1, 2·mean - 1]; also returns the
// visible (query, key) pairs Σ len·(len+1)/2.
std::pair<std::vector<int64_t>, double> packed_documents(int64_t B, int64_t S, int64_t mean, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> len(1, std::max<int64_t>(1, 2 * mean - 1));
  std::vector<int64_t> starts(size_t(B * S));
  double pairs = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0; t0 < S;) {
      const int64_t n = std::min(len(gen), S - t0);
      for (int64_t t = t0; t < t0 + n; ++t) starts[size_t(b * S + t)] = t0;
      pairs += double(n) * double(n + 1) / 2;
      t0 += n;
    }
  return {starts, pairs};
}

// Our forward then backward, warmup + iters times; returns the medians (forward, backward) in ms.
std::pair<double, double> time_ours(Problem& p, int warmup, int iters, const int64_t* doc_start = nullptr,
                                    const AttentionVariant<float>& var = {}) {
  const double scale = 1.0 / std::sqrt(double(p.D));
  std::vector<double> fwd, bwd;
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = Clock::now();
    cpu::sdpa_forward<float>(p.q.data(), p.k.data(), p.v.data(), p.o.data(), p.lse.data(), p.B, p.N, p.Nkv, p.S, p.S,
                             p.D, scale, p.causal, doc_start, var);
    const double f = ms_since(t0);
    t0 = Clock::now();
    cpu::sdpa_backward<float>(p.q.data(), p.k.data(), p.v.data(), p.o.data(), p.lse.data(), p.dout.data(),
                              p.dq.data(), p.dk.data(), p.dv.data(), p.B, p.N, p.Nkv, p.S, p.S, p.D, scale, p.causal,
                              doc_start, nullptr, var);
    const double b = ms_since(t0);
    if (i >= warmup) fwd.push_back(f), bwd.push_back(b);
  }
  return {median(fwd), median(bwd)};
}

// The bf16 kernels (sdpa_forward_bf16 / sdpa_backward_bf16, the CPU's bf16 units) on p's tensors
// rounded to bf16, timed as time_ours; {0, 0} where the CPU lacks them.
std::pair<double, double> time_ours_bf16(const Problem& p, int warmup, int iters) {
  if (!cpu::sdpa_bf16_native(p.D)) return {0.0, 0.0};
  const auto bf16 = [](const std::vector<float>& x) {
    std::vector<uint16_t> y(x.size());
    cpu::cast<float, uint16_t>(x.data(), y.data(), int64_t(x.size()));
    return y;
  };
  const std::vector<uint16_t> q = bf16(p.q), k = bf16(p.k), v = bf16(p.v), dout = bf16(p.dout);
  std::vector<uint16_t> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(p.lse.size());
  // The backward's f32 workspace, allocated once (a training step's memory plan places it).
  std::vector<float> workspace(size_t(cpu::sdpa_backward_bf16_workspace(p.B, p.N, p.Nkv, p.S, p.S, p.D, p.causal)));
  const double scale = 1.0 / std::sqrt(double(p.D));
  std::vector<double> fwd, bwd;
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = Clock::now();
    cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), p.B, p.N, p.Nkv, p.S, p.S, p.D, scale,
                           p.causal);
    const double f = ms_since(t0);
    t0 = Clock::now();
    cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                            dv.data(), p.B, p.N, p.Nkv, p.S, p.S, p.D, scale, p.causal, nullptr, workspace.data());
    const double b = ms_since(t0);
    if (i >= warmup) fwd.push_back(f), bwd.push_back(b);
  }
  return {median(fwd), median(bwd)};
}

}  // namespace

void run_attention_bench(const AttentionBenchOptions& opt, const std::function<void(const json&)>& emit) {
  for (int64_t D : opt.dims)
    if (D < 1 || opt.hidden % D != 0 || (opt.hidden / D) % opt.group != 0)
      throw UsageError(str("--attn-dims ", D, ": hidden ", opt.hidden, " / D must be a whole number of heads, ",
                           "divisible by the GQA group ", opt.group));
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_num_threads(threads);
  std::unique_ptr<PyWorker> torch;
  if (opt.compare_pytorch)
    torch = std::make_unique<PyWorker>(std::vector<std::string>{
        venv_python(opt.source_dir), opt.source_dir + "/scripts/bench_attention.py", "--threads", std::to_string(threads)});
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / str("autosp-attn-", getpid());

  for (int64_t D : opt.dims) {
    for (int64_t S : opt.seqs) {
      Problem p{opt.batch, opt.hidden / D, opt.hidden / D / opt.group, S, D, opt.causal, {}, {}, {}, {}, {}, {}, {}, {}, {}};
      const size_t nq = size_t(p.B * p.N * S * D), nkv = size_t(p.B * p.Nkv * S * D);
      p.q = random_normal(nq, 10), p.k = random_normal(nkv, 11), p.v = random_normal(nkv, 12);
      p.dout = random_normal(nq, 13);
      p.o.resize(nq), p.dq.resize(nq), p.dk.resize(nkv), p.dv.resize(nkv), p.lse.resize(size_t(p.B * p.N * S));
      const double visible = opt.causal ? double(S) * double(S + 1) / 2 : double(S) * double(S);
      const double gflop_fwd = 4.0 * double(p.B * p.N * D) * visible / 1e9, gflop_bwd = 2.5 * gflop_fwd;

      const auto [starts, doc_pairs] =
          opt.doc_len > 0 ? packed_documents(p.B, S, opt.doc_len, 14) : std::pair{std::vector<int64_t>(), 0.0};
      std::vector<double> of, ob, tf, tb, gemm, r, rf, rb, mf, mb, mr, wf, wb, wr, pwf, pwb, pwr, flex, flexr, hf, hb, hr;
      json extra;
      for (int turn = 0; turn < opt.pairs; ++turn) {
        const auto [f, b] = time_ours(p, opt.warmup, opt.iters);
        of.push_back(f), ob.push_back(b);
        if (cpu::sdpa_bf16_native(D)) {  // our bf16 kernels on the same values rounded, alternated with f32
          const auto [fh, bh] = time_ours_bf16(p, opt.warmup, opt.iters);
          hf.push_back(fh), hb.push_back(bh), hr.push_back((f + b) / (fh + bh));
        }
        if (opt.doc_len > 0) {  // the same tensors with the document mask, alternated with the unmasked run
          const auto [fm, bm] = time_ours(p, opt.warmup, opt.iters, starts.data());
          mf.push_back(fm), mb.push_back(bm), mr.push_back((f + b) / (fm + bm));
        }
        if (opt.window > 0) {  // the same tensors with a sliding window, then PyTorch's flex attention with it
          const auto [fw, bw] = time_ours(p, opt.warmup, opt.iters, nullptr, {.window = opt.window});
          wf.push_back(fw), wb.push_back(bw), wr.push_back((f + b) / (fw + bw));
          if (torch) {
            const json t = torch->request({{"B", p.B}, {"N", p.N}, {"Nkv", p.Nkv}, {"S", S}, {"D", D}, {"causal", true},
                                           {"window", opt.window}, {"warmup", opt.warmup}, {"iters", opt.iters}});
            pwf.push_back(t["fwd_ms"].get<double>()), pwb.push_back(t["bwd_ms"].get<double>());
            pwr.push_back((pwf.back() + pwb.back()) / (fw + bw));
            flex.push_back(t["flex_fwd_ms"].get<double>()), flexr.push_back(flex.back() / fw);
          }
        }
        if (torch) {
          json req = {{"B", p.B}, {"N", p.N}, {"Nkv", p.Nkv}, {"S", S}, {"D", D}, {"causal", p.causal},
                      {"warmup", opt.warmup}, {"iters", opt.iters}};
          if (turn == 0 && opt.check) {  // PyTorch on our tensors, once per shape
            std::filesystem::create_directories(dir);
            for (auto [name, x] : {std::pair{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"dout", &p.dout}, {"o", &p.o},
                                   {"dq", &p.dq}, {"dk", &p.dk}, {"dv", &p.dv}})
              write_raw(dir / name, *x);
            req["dir"] = dir.string();
          }
          const json t = torch->request(req);
          if (t.contains("max_err")) extra["max_err"] = t["max_err"];
          extra["torch"] = t["torch"], extra["gqa"] = t["gqa"];
          tf.push_back(t["fwd_ms"].get<double>()), tb.push_back(t["bwd_ms"].get<double>());
          r.push_back((tf.back() + tb.back()) / (f + b)), rf.push_back(tf.back() / f), rb.push_back(tb.back() / b);
        }
        gemm.push_back(sgemm_gflops());
      }
      const double sg = median(gemm);
      const double ours = (gflop_fwd + gflop_bwd) / (median(of) + median(ob)) * 1e3;
      json row = {{"mode", "attention"}, {"B", p.B}, {"N", p.N}, {"Nkv", p.Nkv}, {"S", S}, {"D", D},
                  {"causal", p.causal}, {"threads", threads}, {"pairs", opt.pairs}, {"iters", opt.iters},
                  {"gflop_fwd", gflop_fwd}, {"gflop_bwd", gflop_bwd},
                  {"ours_fwd_ms", median(of)}, {"ours_bwd_ms", median(ob)}, {"ours_gflops", ours},
                  {"ours_fwd_gflops", gflop_fwd / median(of) * 1e3}, {"ours_bwd_gflops", gflop_bwd / median(ob) * 1e3},
                  {"sgemm_gflops", sg}, {"ours_of_sgemm", ours / sg}};
      if (!hr.empty())
        row.update({{"bf16_fwd_ms", median(hf)}, {"bf16_bwd_ms", median(hb)}, {"bf16_speedup", median(hr)},
                    {"bf16_speedup_min", *std::min_element(hr.begin(), hr.end())},
                    {"bf16_speedup_max", *std::max_element(hr.begin(), hr.end())}});
      if (opt.doc_len > 0)
        row.update({{"doc_len", opt.doc_len}, {"masked_gflop", 4.0 * double(p.B * p.N * D) * doc_pairs / 1e9 * 3.5},
                    {"masked_fwd_ms", median(mf)}, {"masked_bwd_ms", median(mb)}, {"mask_speedup", median(mr)},
                    {"mask_speedup_min", *std::min_element(mr.begin(), mr.end())},
                    {"mask_speedup_max", *std::max_element(mr.begin(), mr.end())}});
      if (opt.window > 0) {
        const double w = double(std::min(opt.window, S));
        const double pairs = w * double(S) - w * (w - 1) / 2;  // Σ_i min(i + 1, w)
        row.update({{"window", opt.window}, {"window_gflop", 4.0 * double(p.B * p.N * D) * pairs / 1e9 * 3.5},
                    {"window_fwd_ms", median(wf)}, {"window_bwd_ms", median(wb)}, {"window_speedup", median(wr)},
                    {"window_speedup_min", *std::min_element(wr.begin(), wr.end())},
                    {"window_speedup_max", *std::max_element(wr.begin(), wr.end())}});
        if (torch)
          row.update({{"pytorch_window_fwd_ms", median(pwf)}, {"pytorch_window_bwd_ms", median(pwb)},
                      {"window_vs_pytorch", median(pwr)},
                      {"window_vs_pytorch_min", *std::min_element(pwr.begin(), pwr.end())},
                      {"window_vs_pytorch_max", *std::max_element(pwr.begin(), pwr.end())},
                      {"flex_window_fwd_ms", median(flex)}, {"window_fwd_vs_flex", median(flexr)}});
      }
      if (torch) {
        const double pt = (gflop_fwd + gflop_bwd) / (median(tf) + median(tb)) * 1e3;
        row.update({{"pytorch_fwd_ms", median(tf)}, {"pytorch_bwd_ms", median(tb)}, {"pytorch_gflops", pt},
                    {"pytorch_of_sgemm", pt / sg}, {"speedup", median(r)}, {"speedup_fwd", median(rf)},
                    {"speedup_bwd", median(rb)}, {"speedup_min", *std::min_element(r.begin(), r.end())},
                    {"speedup_max", *std::max_element(r.begin(), r.end())}});
        row.update(extra);
      }
      emit(row);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace autosp
