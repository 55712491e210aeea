// Benchmark points, the sweep driver and the PyTorch comparison.
#include "tools/bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <sys/wait.h>

#include "comm/counting.h"
#include "comm/mesh.h"
#include "kernels/cpu/matmul.h"
#include "models/model.h"
#include "tensor/input_file.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "tools/py_worker.h"
#include "tools/scaling.h"
#include "train/trainer.h"

namespace autosp {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<float> random_normal(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

namespace {

using json = nlohmann::json;

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

// ---- resident-set accounting (Linux /proc) ----

// A field of /proc/self/status ("VmRSS", "VmHWM") in bytes; 0 where unavailable.
size_t proc_status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return static_cast<size_t>(std::strtoull(line.c_str() + field.size() + 1, nullptr, 10)) * 1024;
  return 0;
}

// The resident-set baseline: the current RSS, with the kernel's high-water mark reset to it
// (writing 5 to clear_refs, Linux ≥ 4.0) so that VmHWM afterwards is the peak from here on.
size_t rss_baseline() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return proc_status_bytes("VmRSS");
}

size_t rss_peak_since(size_t baseline) {
  const size_t hwm = proc_status_bytes("VmHWM");
  return hwm > baseline ? hwm - baseline : 0;
}

// ---- child processes ----

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `cmd` through the shell; returns its stdout and sets `status` to its exit code.
std::string capture(const std::string& cmd, int& status) {
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw RuntimeFailure("cannot start " + cmd);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int rc = pclose(pipe);
  status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  return out;
}

// The last line of `out` that is a JSON object (children log to stderr, print rows to stdout).
json last_json_line(const std::string& out) {
  std::istringstream is(out);
  std::string line;
  json found;
  while (std::getline(is, line)) {
    if (line.empty() || line[0] != '{') continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_object()) found = std::move(j);
  }
  return found;
}

// bench_pytorch.py's flags for cfg's model, batch, threads, mode and activation checkpointing.
std::vector<std::string> pytorch_args(const Config& cfg, const BenchOptions& opt, int threads) {
  const auto& m = cfg.model;
  std::vector<std::string> a = {opt.source_dir + "/scripts/bench_pytorch.py", "--arch", std::string(arch_name(m.arch)), "--layers",
                                std::to_string(m.num_hidden_layers), "--hidden", std::to_string(m.hidden_size),
                                "--heads", std::to_string(m.num_attention_heads), "--kv-heads",
                                std::to_string(m.num_key_value_heads), "--intermediate", std::to_string(m.intermediate_size),
                                "--vocab", std::to_string(m.vocab_size), "--batch", std::to_string(cfg.data.batch_size),
                                "--seq", std::to_string(cfg.data.seq_len), "--threads", std::to_string(threads),
                                "--mode", opt.mode, "--clip", str(cfg.train.grad_clip),
                                cfg.runtime.activation_checkpointing ? "--checkpoint" : "--no-checkpoint", "--dtype",
                                cfg.runtime.dtype == DType::bf16 ? "bfloat16" : "float32"};
  const Family& f = family(m.arch);
  if (f.qk_norm || f.sandwich_norms)  // its baseline would need q/k norm, head_dim and Gemma's flags
    throw UsageError(str("the PyTorch baseline (scripts/bench_pytorch.py) has no ", f.name,
                         " model yet: bench it without --compare-pytorch"));
  if (f.tied_head == Presence::by_key) a.push_back(m.tie_word_embeddings ? "--tie" : "--no-tie");
  return a;
}

// One run of bench_pytorch.py (a sweep point's baseline) under the 2.x venv's python.
json run_pytorch(const Config& cfg, const BenchOptions& opt, int threads) {
  std::string cmd = shell_quote(opt.pytorch_python);
  for (const auto& a : pytorch_args(cfg, opt, threads)) cmd += " " + shell_quote(a);
  cmd += " --warmup " + std::to_string(opt.warmup) + " --iters " + std::to_string(opt.iters);
  int status = 0;
  const std::string out = capture(cmd, status);
  json j = last_json_line(out);
  if (status != 0 || !j.is_object() || !j.contains("step_ms"))
    throw RuntimeFailure(str("PyTorch baseline failed (exit ", status, ", ", cmd, "): ", out.empty() ? "no output" : out));
  return j;
}

void add_pytorch_columns(json& row, const json& pt) {
  const double step = row["step_ms"].get<double>();
  row["pytorch_step_ms"] = pt["step_ms"];
  row["pytorch_tokens_per_sec"] = pt["tokens_per_sec"];
  if (pt.contains("peak_rss_bytes")) row["pytorch_peak_rss_bytes"] = pt["peak_rss_bytes"];
  if (pt.contains("peak_bytes")) row["pytorch_peak_bytes"] = pt["peak_bytes"];
  row["speedup"] = pt["step_ms"].get<double>() / step;
  if (pt.contains("peak_bytes") && row.contains("peak_rss_bytes") && pt["peak_bytes"].get<double>() > 0)
    row["memory_ratio"] = row["peak_rss_bytes"].get<double>() / pt["peak_bytes"].get<double>();
}

void check_options(const Config& cfg, const BenchOptions& opt) {
  if (opt.mode != "forward" && opt.mode != "step")
    throw UsageError(str("--mode '", opt.mode, "': expected forward or step"));
  if (opt.iters < 1 || opt.warmup < 0) throw UsageError("--iters must be >= 1 and --warmup >= 0");
  // A step runs through the trainer, which runs on CUDA too; --mode forward feeds host tensors.
  if (cfg.runtime.device == DeviceKind::cuda && opt.mode != "step")
    throw UsageError("autosp-bench: runtime.device \"cuda\" needs --mode step (--mode forward runs on cpu)");
}

// What one rank measured in a point.
struct PointTiming {
  double step_ms = 0;      // median over the timed iterations
  double total_ms = 0;     // every iteration, warm-up included (the denominator of comm_share)
  int64_t runs = 0;        // iterations run, warm-up included
  size_t peak_bytes = 0;   // allocator high-water over the timed iterations
  double loss = 0;
  double grad_sync_ms = 0;  // median time blocked on the gradient all-reduce per timed step (trainer)
  double grad_sync_wait_ms = 0;  // median of the part of it after the backward
  OpProfile op_profile;          // runtime.profile_ops: every step's kernels, warm-up included
};

// Training steps through the trainer itself (forward, backward, gradient all-reduce, AdamW).
PointTiming time_steps(const Config& cfg, const BenchOptions& opt, Communicator& world) {
  Config c = cfg;
  c.train.checkpoint_dir.clear();
  c.train.log_every = 1 << 30;
  // The timed steps (the schedule's rules are not checked again: a timing does not depend on the lr).
  c.train.steps = opt.warmup + opt.iters;
  TrainArgs ta;
  ta.quiet = true;
  ta.accuracy = false;  // an evaluation on the host, not part of the step being timed
  TrainResult r = train(c, ta, world);
  PointTiming t;
  std::vector<double> ms, sync_ms, wait_ms;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    t.total_ms += r.steps[i].step_ms;
    if (i < static_cast<size_t>(opt.warmup)) continue;
    ms.push_back(r.steps[i].step_ms);
    sync_ms.push_back(r.steps[i].grad_sync_ms);
    wait_ms.push_back(r.steps[i].grad_sync_wait_ms);
    t.peak_bytes = std::max(t.peak_bytes, r.steps[i].peak_bytes);
  }
  t.runs = static_cast<int64_t>(r.steps.size());
  t.step_ms = median(ms);
  t.grad_sync_ms = median(sync_ms);
  t.grad_sync_wait_ms = median(wait_ms);
  t.loss = r.steps.front().loss;
  t.op_profile = r.op_profile;
  return t;
}

// The forward pass with the loss, through this rank's AutoSP program when the world has several ranks.
PointTiming time_forward(const Config& cfg, const BenchOptions& opt, Communicator& world, const RankLayout& layout) {
  const DType dt = cfg.runtime.dtype;
  if (cfg.data.seq_len % layout.seq_multiple() != 0)
    throw UsageError(str("--mode forward: data.seq_len ", cfg.data.seq_len, " is not a multiple of ",
                         layout.seq_multiple(), " (P = ", layout.sp, ", ring ", layout.ring,
                         "; only the training step pads)"));
  ProcessMesh mesh = make_mesh(world, layout.sp, layout.ring, cfg.moe.expert_parallel_size);
  const CommGroups groups = mesh.groups(world);
  RankProgram prog = build_program(cfg, dt, Stage::rank_forward, mesh);
  TensorMap feeds = random_batch(cfg.data.batch_size, cfg.data.seq_len, cfg.model.vocab_size,
                                 static_cast<uint64_t>(cfg.train.seed) + static_cast<uint64_t>(mesh.dp_rank));
  for (auto& [n, p] : init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), master_dtype(dt))) feeds[n] = p;
  Executor ex(*prog.graph);
  PointTiming t;
  std::vector<double> ms;
  for (int i = 0; i < opt.warmup + opt.iters; ++i) {
    world.barrier();
    auto t0 = std::chrono::steady_clock::now();
    RunResult r = ex.run(feeds, groups);
    const double dt_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    t.total_ms += dt_ms;
    t.loss = r.outputs.at(prog.loss).to_doubles()[0];
    if (i < opt.warmup) continue;
    ms.push_back(dt_ms);
    t.peak_bytes = std::max(t.peak_bytes, r.peak_bytes);
  }
  t.runs = opt.warmup + opt.iters;
  t.step_ms = median(ms);
  return t;
}

// The maximum of `v` over the ranks of `world`.
std::vector<int64_t> max_over_ranks(Communicator& world, const std::vector<int64_t>& v) {
  if (world.size() == 1) return v;
  Tensor in = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v);
  Tensor all = Tensor::empty({static_cast<int64_t>(v.size()) * world.size()}, DType::i64);
  world.all_gather(in, all);
  std::vector<int64_t> out = v;
  for (int r = 0; r < world.size(); ++r)
    for (size_t i = 0; i < v.size(); ++i) out[i] = std::max(out[i], all.data<int64_t>()[r * v.size() + i]);
  return out;
}

std::string model_name(const std::string& config_path) { return std::filesystem::path(config_path).stem().string(); }

}  // namespace

json run_point(const Config& cfg, const BenchOptions& opt, Communicator& world) {
  check_options(cfg, opt);
  if (cfg.runtime.threads > 0) cpu::set_num_threads(static_cast<int>(cfg.runtime.threads));
  CountingCommunicator counted(world);
  // This rank's place in the mesh (world = dp × sp): what the trainer's mesh and time_forward's have.
  const RankLayout layout =
      rank_layout(world.size(), world.rank(), cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size);
  const size_t rss0 = rss_baseline();
  const PointTiming t = opt.mode == "step" ? time_steps(cfg, opt, counted) : time_forward(cfg, opt, counted, layout);
  const size_t rss = rss_peak_since(rss0);
  const CommStats s = counted.stats();
  // The last: ring attention's point-to-point bytes per step, on the rank that sends the most.
  const auto peaks = max_over_ranks(world, {static_cast<int64_t>(t.peak_bytes), static_cast<int64_t>(rss),
                                            s.send_recv.bytes / t.runs});

  const int64_t P = layout.sp, dp = layout.dp;
  // A training step reads k micro-batches (train.gradient_accumulation_steps); a forward one batch.
  const int64_t B = cfg.data.batch_size * (opt.mode == "step" ? cfg.train.gradient_accumulation_steps : 1);
  const int64_t S = cfg.data.seq_len;
  const double step_s = t.step_ms / 1000.0;
  const double flops = opt.mode == "step" ? step_flops(cfg.model, B * dp, S) : step_flops(cfg.model, B * dp, S) / 3.0;
  const double comm_s = s.all_to_all.seconds + s.all_reduce.seconds + s.all_gather.seconds;
  json row = {{"impl", "autosp"},
              {"mode", opt.mode},
              {"arch", arch_name(cfg.model.arch)},
              {"P", P},
              {"world", world.size()},
              {"seq", S},
              {"batch", B},
              {"threads", cpu::num_threads()},
              {"dtype", dtype_name(cfg.runtime.dtype)},
              {"loss", t.loss},
              {"step_ms", t.step_ms},
              {"tokens_per_sec", static_cast<double>(B * dp * S) / step_s},
              {"tflops", flops / step_s / 1e12},
              {"mfu", nullptr},
              {"peak_bytes", peaks[0]},
              {"peak_rss_bytes", peaks[1]},
              {"all_to_all_bytes", s.all_to_all.bytes / t.runs},
              {"all_reduce_bytes", s.all_reduce.bytes / t.runs},
              {"all_to_all_calls", s.all_to_all.calls / t.runs},
              {"send_recv_bytes", peaks[2]},
              {"comm_share", t.total_ms > 0 ? comm_s * 1000.0 / t.total_ms : 0.0},
              {"grad_sync_ms", t.grad_sync_ms},
              {"grad_sync_wait_ms", t.grad_sync_wait_ms}};
  if (!t.op_profile.by_op.empty()) {  // per step, over every step run (warm-up included)
    json ops = json::array();
    for (const auto& [op, e] : t.op_profile.by_op)
      ops.push_back({{"op", op}, {"ms", e.ms / double(t.runs)}, {"calls", double(e.calls) / double(t.runs)}});
    row["op_profile"] = ops;
  }
  if (cfg.runtime.device == DeviceKind::cuda && opt.peak_tflops > 0)
    row["mfu"] = row["tflops"].get<double>() / (opt.peak_tflops * world.size());  // tflops is the whole job's
  return row;
}

void check_comparable(const Config& cfg) {
  if (cfg.train.gradient_accumulation_steps > 1)
    throw UsageError("--compare-pytorch times one batch per step on both sides: leave "
                     "train.gradient_accumulation_steps at 1 (or raise data.batch_size)");
}

json run_bench(const Config& cfg, const BenchOptions& opt) {
  check_options(cfg, opt);
  if (cfg.sequence_parallel.autosp_size != 1)
    throw UsageError(str("sequence_parallel.autosp_size ", cfg.sequence_parallel.autosp_size,
                         ": a single autosp-bench run is one process; use --sweep-ranks for P > 1"));
  auto world = make_single_process_communicator();
  if (!opt.compare_pytorch) return run_point(cfg, opt, *world);
  check_comparable(cfg);

  // The baselines, each a worker that keeps its model between turns: PyTorch 2.x eager (SDPA),
  // optionally torch.compile and Debian's 1.13 (materialised attention, its only kind).
  if (cfg.runtime.threads > 0) cpu::set_num_threads(static_cast<int>(cfg.runtime.threads));
  const std::vector<std::string> args = pytorch_args(cfg, opt, cpu::num_threads());
  struct Side {
    std::string prefix;  // of its columns
    std::unique_ptr<PyWorker> worker;
    std::vector<double> ms, ratio;
    json last;
  };
  std::vector<Side> sides;
  auto add_side = [&](const std::string& prefix, const std::string& python, std::vector<std::string> extra) {
    std::vector<std::string> argv = {python};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--serve");
    sides.push_back({prefix, std::make_unique<PyWorker>(argv), {}, {}, {}});
    sides.back().worker->read_reply();  // {"ready": true}: set up
  };
  add_side("pytorch", opt.pytorch_python, {"--attention", "sdpa"});
  if (opt.pytorch_compile) add_side("compile", opt.pytorch_python, {"--attention", "sdpa", "--compile"});
  if (opt.pytorch_debian) add_side("debian", "/usr/bin/python3", {"--attention", "math"});

  // Alternate: autosp, then each baseline, `pairs` times; each ratio is from one turn.
  json row;
  std::vector<double> ours;
  for (int turn = 0; turn < opt.pairs; ++turn) {
    row = run_point(cfg, opt, *world);
    ours.push_back(row["step_ms"].get<double>());
    for (Side& s : sides) {
      // The first turn compiles (torch.compile) in its warm-up: at least one untimed step.
      s.last = s.worker->request({{"warmup", turn == 0 ? std::max(opt.warmup, 1) : opt.warmup}, {"iters", opt.iters}});
      s.ms.push_back(s.last["step_ms"].get<double>());
      s.ratio.push_back(s.ms.back() / ours.back());
    }
  }
  const double tokens = static_cast<double>(cfg.data.batch_size * cfg.data.seq_len);
  row["step_ms"] = median(ours);
  row["tokens_per_sec"] = tokens / (median(ours) / 1e3);
  row["pairs"] = opt.pairs;
  for (const Side& s : sides) {
    const std::string p = s.prefix + "_";
    row[p + "step_ms"] = median(s.ms);
    row[p + "tokens_per_sec"] = tokens / (median(s.ms) / 1e3);
    row[p + "peak_bytes"] = s.last["peak_bytes"];  // the worker's high-water since its setup: every turn
    row[p + "torch"] = s.last["torch"];
    // What the baseline ran: bf16 is autocast over f32 masters (decision 127), as ours keeps them.
    row[p + "precision"] = s.last.value("dtype", "") == "bfloat16" ? "torch.autocast bfloat16" : s.last.value("dtype", "");
    row[p == "pytorch_" ? "speedup" : p + "speedup"] = median(s.ratio);
    row[p + "speedup_min"] = *std::min_element(s.ratio.begin(), s.ratio.end());
    row[p + "speedup_max"] = *std::max_element(s.ratio.begin(), s.ratio.end());
  }
  if (row["pytorch_peak_bytes"].get<double>() > 0)
    row["memory_ratio"] = row["peak_bytes"].get<double>() / row["pytorch_peak_bytes"].get<double>();
  return row;
}

// ---- the sweep ----

const std::vector<std::string>& sweep_columns() {
  static const std::vector<std::string> cols = {
      "model",         "P",          "seq",          "batch",          "mode",
      "threads",       "tokens_per_sec", "step_ms",  "tflops",         "mfu",
      "peak_bytes",    "peak_rss_bytes", "all_to_all_bytes", "all_reduce_bytes", "comm_share",
      "grad_sync_ms",  "grad_sync_wait_ms",
      "loss",          "pytorch_tokens_per_sec", "pytorch_step_ms", "pytorch_peak_bytes", "speedup",
      "memory_ratio",  "error"};
  return cols;
}

std::string csv_row(const json& row) {
  std::string line;
  for (const auto& c : sweep_columns()) {
    if (!line.empty() || &c != &sweep_columns().front()) line += ",";
    if (!row.contains(c) || row[c].is_null()) continue;
    const json& v = row[c];
    if (v.is_string()) {
      std::string s = v.get<std::string>(), q = "\"";
      for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch == '\n' ? ' ' : ch);
      line += q + "\"";
    } else {
      line += v.dump();
    }
  }
  return line;
}

int run_sweep(const SweepOptions& opt, const std::function<void(const json&)>& emit) {
  if (opt.configs.empty()) throw UsageError("a sweep needs --config or --models");
  if (opt.ranks.empty() || opt.seqs.empty()) throw UsageError("a sweep needs --sweep-seq and --sweep-ranks");
  const BenchOptions& b = opt.bench;
#ifndef AUTOSP_WITH_MPI
  for (int64_t P : opt.ranks)
    if (P > 1) throw UsageError(str("--sweep-ranks ", P, ": points with P > 1 run under mpirun and need an MPI build"));
#endif
  std::ofstream out;
  bool csv = false;
  if (!opt.out.empty()) {
    const std::string ext = std::filesystem::path(opt.out).extension().string();
    if (ext != ".csv" && ext != ".jsonl")
      throw UsageError(str("--out ", opt.out, ": expected a .csv or .jsonl file name"));
    csv = ext == ".csv";
  }

  // Validate every point before running any: the config loads, P divides the heads (the AutoSP
  // pipeline builds for rank 0 of P), the thread count per rank.
  struct Point {
    std::string config, model;
    int64_t P, seq;
    Config cfg;
    std::vector<std::string> sets;
  };
  std::vector<Point> points;
  for (const auto& path : opt.configs) {
    const Config base = load_config(path, opt.overrides);
    check_options(base, b);
    const int64_t total_threads = base.runtime.threads > 0 ? base.runtime.threads
                                                           : std::max<int64_t>(1, std::thread::hardware_concurrency());
    for (int64_t P : opt.ranks) {
      for (int64_t S : opt.seqs) {
        std::vector<std::string> sets = opt.overrides;
        sets.push_back(str("data.seq_len=", S));
        sets.push_back(str("sequence_parallel.autosp_size=", P));
        sets.push_back(str("runtime.threads=", std::max<int64_t>(1, total_threads / P)));
        Config cfg = load_config(path, sets);
        const DType dt = cfg.runtime.dtype;
        try {
          (void)build_program(cfg, dt, Stage::rank_forward,
                              rank_layout(P, 0, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size));
        } catch (const UsageError& e) {
          throw UsageError(str(path, " at P = ", P, ", seq ", S, ": ", e.what()));
        }
        if (b.mode == "forward" && S % P != 0)
          throw UsageError(str("--sweep-seq ", S, " is not a multiple of P = ", P, " (--mode forward does not pad)"));
        points.push_back({path, model_name(path), P, S, std::move(cfg), std::move(sets)});
      }
    }
  }
  if (!opt.out.empty()) {
    out.open(opt.out, std::ios::trunc);
    if (!out) throw UsageError(str("--out ", opt.out, ": cannot open for writing"));
    if (csv) {
      std::string header;
      for (const auto& c : sweep_columns()) header += (header.empty() ? "" : ",") + c;
      out << header << "\n" << std::flush;
    }
  }

  // Children of a sweep must be allowed to run mpirun as root (containers).
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const char* mpirun_env = std::getenv("AUTOSP_MPIRUN");
  const std::string mpirun = mpirun_env && *mpirun_env ? mpirun_env : "mpirun";
  int failed = 0;
  for (const Point& p : points) {
    std::string cmd;
    if (p.P > 1) cmd = mpirun + " --oversubscribe --mca orte_abort_on_non_zero_status 1 -np " + std::to_string(p.P) + " ";
    cmd += shell_quote(opt.self) + " --point --config " + shell_quote(p.config) + " --mode " + b.mode + " --warmup " +
           std::to_string(b.warmup) + " --iters " + std::to_string(b.iters);
    for (const auto& s : p.sets) cmd += " --set " + shell_quote(s);
    int status = 0;
    const std::string text = capture(cmd, status);
    json row = last_json_line(text);
    if (status != 0 || !row.is_object() || !row.contains("step_ms")) {
      row = {{"P", p.P}, {"seq", p.seq}, {"batch", p.cfg.data.batch_size}, {"mode", b.mode},
             {"error", str("exit ", status, status == 3 ? " (runtime failure, e.g. out of memory)" : "")}};
      ++failed;
    } else if (b.compare_pytorch && p.P == 1) {
      try {
        add_pytorch_columns(row, run_pytorch(p.cfg, b, row["threads"].get<int>()));
      } catch (const RuntimeFailure& e) {
        row["error"] = str("pytorch: ", e.what());
        ++failed;
      }
    }
    json ordered = {{"model", p.model}};
    ordered.update(row);
    if (out.is_open()) out << (csv ? csv_row(ordered) : ordered.dump()) << "\n" << std::flush;
    emit(ordered);
  }
  return failed;
}

double measured_tflops(const std::string& path) {
  std::string text;
  try {
    text = read_input_file(path, "a sweep's .jsonl output");
  } catch (const UsageError& e) {
    throw UsageError(str("--compute-from ", e.what()));
  }
  std::istringstream f(text);
  std::string line;
  double best = 0;
  int64_t best_seq = -1;
  while (std::getline(f, line)) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("tflops") || !j["tflops"].is_number() || j.value("P", 0) != 1) continue;
    if (j.value("mode", "step") != "step") continue;
    const int64_t seq = j.value("seq", int64_t{0});
    if (seq > best_seq) {
      best_seq = seq;
      best = j["tflops"].get<double>();
    }
  }
  if (best_seq < 0 || !(best > 0))
    throw UsageError(str("--compute-from ", path, ": no P = 1 step row with a tflops value (a sweep's .jsonl output)"));
  return best;
}

}  // namespace autosp
