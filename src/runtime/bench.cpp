// Forward benchmark and the PyTorch comparison.
#include "runtime/bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "kernels/cpu/matmul.h"
#include "models/model.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace autosp {
namespace {

TensorMap random_batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(B * S), labels(B * S), pos(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    ids[i] = static_cast<int64_t>(rng() % V);
    labels[i] = static_cast<int64_t>(rng() % V);
    pos[i] = i % S;
  }
  return {{"input_ids", Tensor::from_vector({B, S}, ids)},
          {"labels", Tensor::from_vector({B, S}, labels)},
          {"position_ids", Tensor::from_vector({B, S}, pos)}};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

nlohmann::json run_pytorch(const Config& cfg, const BenchOptions& opt, int threads) {
  const auto& m = cfg.model;
  std::string cmd = "/usr/bin/python3 " + opt.source_dir + "/scripts/bench_pytorch.py --arch " + m.arch +
                    " --layers " + std::to_string(m.num_hidden_layers) + " --hidden " + std::to_string(m.hidden_size) +
                    " --heads " + std::to_string(m.num_attention_heads) + " --kv-heads " +
                    std::to_string(m.num_key_value_heads) + " --intermediate " + std::to_string(m.intermediate_size) +
                    " --vocab " + std::to_string(m.vocab_size) + " --batch " + std::to_string(cfg.data.batch_size) +
                    " --seq " + std::to_string(cfg.data.seq_len) + " --threads " + std::to_string(threads) +
                    " --mode " + opt.mode + " --warmup " + std::to_string(opt.warmup) + " --iters " +
                    std::to_string(opt.iters);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw RuntimeFailure("cannot start " + cmd);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get())) out += buf.data();
  auto last = out.rfind('{');
  nlohmann::json j = last == std::string::npos ? nlohmann::json() : nlohmann::json::parse(out.substr(last), nullptr, false);
  if (!j.is_object() || !j.contains("step_ms"))
    throw RuntimeFailure(str("PyTorch baseline failed (", cmd, "): ", out.empty() ? "no output" : out));
  return j;
}


// A training step (forward, backward, AdamW) timed through the trainer itself.
std::pair<double, size_t> time_steps(const Config& cfg, const BenchOptions& opt, double& loss) {
  Config c = cfg;
  c.train.checkpoint_dir.clear();
  c.train.log_every = 1 << 30;
  TrainArgs ta;
  ta.steps = opt.warmup + opt.iters;
  ta.quiet = true;
  auto world = make_single_process_communicator();
  TrainResult r = train(c, ta, *world);
  std::vector<double> ms;
  size_t peak = 0;
  for (size_t i = static_cast<size_t>(opt.warmup); i < r.steps.size(); ++i) {
    ms.push_back(r.steps[i].step_ms);
    peak = std::max(peak, r.steps[i].peak_bytes);
  }
  loss = r.steps.front().loss;
  return {median(ms), peak};
}

}  // namespace

nlohmann::json run_bench(const Config& cfg, const BenchOptions& opt) {
  if (opt.mode != "forward" && opt.mode != "step")
    throw UsageError(str("--mode '", opt.mode, "': expected forward or step"));
  if (opt.iters < 1 || opt.warmup < 0) throw UsageError("--iters must be >= 1 and --warmup >= 0");
  if (cfg.runtime.device != "cpu") throw UsageError("autosp-bench: runtime.device must be cpu in this build");
  const DType dt = cfg.runtime.dtype == "float64" ? DType::f64 : DType::f32;
  if (cfg.runtime.threads > 0) cpu::set_num_threads(static_cast<int>(cfg.runtime.threads));
  const int threads = cpu::num_threads();
  double loss = 0, step = 0;
  size_t peak = 0;
  if (opt.mode == "step") {
    std::tie(step, peak) = time_steps(cfg, opt, loss);
  } else {

  auto g = build_forward(cfg.model, dt);
  TensorMap feeds = random_batch(cfg.data.batch_size, cfg.data.seq_len, cfg.model.vocab_size,
                                 static_cast<uint64_t>(cfg.train.seed));
  for (auto& [n, t] : init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), dt)) feeds[n] = t;
  Executor ex(*g);
  std::vector<double> ms;
  for (int i = 0; i < opt.warmup + opt.iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RunResult r = ex.run(feeds);
    auto t1 = std::chrono::steady_clock::now();
    if (i >= opt.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    loss = r.outputs.at("loss").to_doubles()[0];
    peak = std::max(peak, r.peak_bytes);
  }
  step = median(ms);
  }
  const double tokens = static_cast<double>(cfg.data.batch_size * cfg.data.seq_len);
  nlohmann::json row = {{"impl", "autosp"},       {"mode", opt.mode},
                        {"arch", cfg.model.arch}, {"batch", cfg.data.batch_size},
                        {"seq", cfg.data.seq_len}, {"threads", threads},
                        {"dtype", dtype_name(dt)}, {"loss", loss},
                        {"step_ms", step},        {"tokens_per_sec", tokens / (step / 1000.0)},
                        {"peak_bytes", peak}};
  if (opt.compare_pytorch) {
    nlohmann::json pt = run_pytorch(cfg, opt, threads);
    row["pytorch_step_ms"] = pt["step_ms"];
    row["pytorch_tokens_per_sec"] = pt["tokens_per_sec"];
    if (pt.contains("peak_rss_bytes")) row["pytorch_peak_rss_bytes"] = pt["peak_rss_bytes"];
    row["speedup"] = pt["step_ms"].get<double>() / step;
  }
  return row;
}

}  // namespace autosp
