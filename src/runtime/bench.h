// Benchmarks behind autosp-bench: time the model's forward pass on random tokens with the config's
// shapes, and optionally run the same model in PyTorch eager (scripts/bench_pytorch.py under
// Debian's /usr/bin/python3) on the same machine and thread count for a ratio from the same run.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"

namespace autosp {

struct BenchOptions {
  std::string mode = "forward";
  int warmup = 1, iters = 5;
  bool compare_pytorch = false;
  std::string source_dir;  // where scripts/bench_pytorch.py lives
};

// One JSON row: impl, mode, arch, batch, seq, threads, loss, step_ms (median), tokens_per_sec,
// peak_bytes, and with compare_pytorch: pytorch_step_ms, pytorch_tokens_per_sec, speedup.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opt);

}  // namespace autosp
