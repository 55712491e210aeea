// Benchmarks behind autosp-bench.
//   run_bench:  one point in this process (forward or training step on random tokens with the
//               config's shapes), optionally against PyTorch (scripts/bench_pytorch.py --serve):
//               2.x from the .venv-bench venv (scripts/pytorch-venv.sh) with eager SDPA, and
//               optionally torch.compile and Debian's 1.13 (/usr/bin/python3), on the same machine,
//               model, batch, optimizer and thread count, alternated in one run.
//   run_point:  one point on however many ranks this process's world has (mpirun), with the
//               communication counted by CountingCommunicator; rank 0's row holds the maxima over
//               ranks. This is what `autosp-bench --point` runs in each child of a sweep.
//   run_sweep:  models × P × seq_len; every point runs in a child process (`mpirun -np P` for
//               P > 1), rows go to stdout and to a CSV or JSON-lines file.
// The FLOP formula and the scaling projection are in apps/tools/scaling.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "config/config.h"

namespace autosp {

struct BenchOptions {
  std::string mode = "forward";
  int warmup = 1, iters = 5;
  bool compare_pytorch = false;
  int pairs = 3;                 // --compare-pytorch: alternated turns (autosp, then each baseline)
  bool pytorch_compile = false;  // also PyTorch 2.x under torch.compile
  bool pytorch_debian = false;   // also Debian's PyTorch 1.13 (materialised attention)
  std::string pytorch_python;    // the 2.x venv's python (venv_python), set with compare_pytorch
  std::string source_dir;    // where scripts/bench_pytorch.py lives
  double peak_tflops = 0;    // device peak for MFU (CUDA only; 0 = no MFU column)
};

// A config --compare-pytorch can time against the baseline (one batch a step on both sides: no
// gradient accumulation); else a UsageError saying why.
void check_comparable(const Config& cfg);

// One JSON row: impl, mode, arch, batch, seq, threads, loss, step_ms (median), tokens_per_sec,
// peak_bytes, and with compare_pytorch, per baseline X in pytorch (2.x eager), compile, debian:
// X_step_ms, X_tokens_per_sec (medians over the turns), X_peak_bytes (the worker's RSS high-water
// over its resident set after setup), X_torch (version), the ratio X's step ÷ ours as
// speedup (pytorch) or X_speedup (the median over turns of the ratio within each turn) with
// X_speedup_min / X_speedup_max; step_ms is then the median over the turns, and memory_ratio =
// peak_bytes ÷ pytorch_peak_bytes.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opt);

// One sweep point on `world` (every rank calls it; the row is complete on rank 0). Fields:
// P, seq, batch, mode, threads, loss, step_ms (median over iters), tokens_per_sec (global batch),
// tflops (the whole job's: step_flops of the global batch / step time / 1e12), mfu (tflops / (peak
// × ranks); null on CPU), peak_bytes (allocator high-water,
// max over ranks), peak_rss_bytes (resident-set high-water over the pre-run baseline, max over
// ranks), all_to_all_bytes / all_reduce_bytes (rank 0, per step), comm_share (rank 0's time in
// collectives / its step time, over every step run; the collectives' wall time includes waiting
// for the slower rank, also in the agreement between steps, so on an oversubscribed machine it
// can exceed 1), grad_sync_ms (rank 0's median time per step
// blocked on the gradient all-reduce: with runtime.overlap_grad_sync, what the backward did not hide),
// grad_sync_wait_ms (the part of it after the backward ended).
nlohmann::json run_point(const Config& cfg, const BenchOptions& opt, Communicator& world);

struct SweepOptions {
  std::vector<std::string> configs;   // one config file per model
  std::vector<std::string> overrides; // --set, applied to every model
  std::vector<int64_t> seqs, ranks;
  std::string out;                    // .csv or .jsonl ("" = stdout only)
  std::string self;                   // this executable (the children run `self --point`)
  BenchOptions bench;
};

// Validates every point first (a bad model/P/seq combination is a UsageError before anything
// runs), then runs them. `emit` gets each finished row. Returns the number of failed points
// (their rows carry an "error" field).
int run_sweep(const SweepOptions& opt, const std::function<void(const nlohmann::json&)>& emit);

// The sweep's CSV columns, in order.
const std::vector<std::string>& sweep_columns();
std::string csv_row(const nlohmann::json& row);

// The achieved TFLOP/s of the P = 1 row with the longest sequence in a sweep's JSON-lines file
// (for autosp-bench --project --compute-from).
double measured_tflops(const std::string& jsonl_path);

// The middle element of v (the upper one of two for an even count); 0 when v is empty. Shared by
// the benchmarks (bench.cpp and the bench_*.cpp of each --mode).
double median(std::vector<double> v);

// n draws of N(0, 1) from a generator seeded with `seed`: the benchmarks' operands.
std::vector<float> random_normal(size_t n, uint64_t seed);

}  // namespace autosp
