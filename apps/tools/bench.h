// Benchmarks behind autosp-bench.
//   run_bench:  one point in this process (forward or training step on random tokens with the
//               config's shapes), optionally against PyTorch eager (scripts/bench_pytorch.py under
//               Debian's /usr/bin/python3) on the same machine and thread count.
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
  std::string source_dir;    // where scripts/bench_pytorch.py lives
  double peak_tflops = 0;    // device peak for MFU (CUDA only; 0 = no MFU column)
};

// One JSON row: impl, mode, arch, batch, seq, threads, loss, step_ms (median), tokens_per_sec,
// peak_bytes, and with compare_pytorch: pytorch_step_ms, pytorch_tokens_per_sec, speedup.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opt);

// One sweep point on `world` (every rank calls it; the row is complete on rank 0). Fields:
// P, seq, batch, mode, threads, loss, step_ms (median over iters), tokens_per_sec (global batch),
// tflops (the whole job's: step_flops of the global batch / step time / 1e12), mfu (tflops / (peak
// × ranks); null on CPU), peak_bytes (allocator high-water,
// max over ranks), peak_rss_bytes (resident-set high-water over the pre-run baseline, max over
// ranks), all_to_all_bytes / all_reduce_bytes (rank 0, per step), comm_share (rank 0's time in
// collectives / its step time, over every step run), grad_sync_ms (rank 0's median time per step
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

}  // namespace autosp
