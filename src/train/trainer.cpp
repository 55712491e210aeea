// The training loop. train() sets a run up (device, communicators, program, starting state) and
// runs the steps; what a step does besides running the graph is one function each below: the
// copies between the host and the run device, the gradient all-reduce, the accuracy score, the
// progress and metrics lines, the checkpoint. At zero_optimization.stage 1 and 2 the gradients are
// reduce-scattered and the optimizer is ZeroAdamW (train/optimizer.h) over this rank's shard.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "comm/exit.h"
#include "comm/job_comms.h"
#include "device/cuda/device.h"
#include "engine/executor.h"
#include "engine/program.h"
#include "kernels/cpu/matmul.h"
#include "models/weights.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/fault.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/outputs.h"
#include "train/preempt.h"

namespace autosp {
namespace {

using Clock = std::chrono::steady_clock;

// ---- the run device and host copies ------------------------------------------------------------

// The device this rank runs on (runtime.device): the host, or the GPU of its node-local rank, which
// becomes the process's current device (a build without CUDA, or a machine without a GPU, is a
// UsageError saying so, and so is runtime.attention "cudnn" in a build without CUDA).
Device pick_device(const Config& cfg) {
  switch (cfg.runtime.device) {
    case DeviceKind::cpu: return Device{};
    case DeviceKind::cuda: {
      const Device dev{DeviceKind::cuda, select_device_for_local_rank()};
      check_attention_backend(cfg.runtime.attention);
      return dev;
    }
  }
  return Device{};
}

// Every tensor of `m` on the run device `dev` (copied when it is elsewhere: a no-op on the host).
void to_run_device(ParamMap& m, Device dev) {
  for (auto& [name, t] : m)
    if (t.device() != dev) t = to_device(t, dev);
}

// A host copy of `t` for the host code that reads it (loss, logits, checkpoints, --dump-grads, the
// returned parameters): `t` itself when it is on the host.
Tensor host_copy(const Tensor& t) { return t.device().kind == DeviceKind::cpu ? t : to_device(t, Device{}); }

ParamMap host_copy(const ParamMap& m) {
  ParamMap out;
  for (const auto& [name, t] : m) out[name] = host_copy(t);
  return out;
}

AdamW host_copy(const AdamW& opt) {
  AdamW out;
  out.exp_avg = host_copy(opt.exp_avg);
  out.exp_avg_sq = host_copy(opt.exp_avg_sq);
  out.step = opt.step;
  return out;
}

// ---- the batch ---------------------------------------------------------------------------------

// Token ids and labels checked against the vocabulary on the host, before they go to a device
// whose kernels do not check them (there a bad id is a NaN loss, not an error naming it).
void check_batch(const Batch& b, int64_t vocab) {
  const int64_t n = b.input_ids.numel();
  const int64_t* ids = b.input_ids.data<int64_t>();
  const int64_t* labels = b.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw UsageError(str("token id ", ids[i], " at position ", i, " of the batch is outside [0, ", vocab,
                           ") (model.vocab_size)"));
    if (labels[i] != kIgnoreIndex && (labels[i] < 0 || labels[i] >= vocab))
      throw UsageError(str("label ", labels[i], " at position ", i, " of the batch is outside [0, ", vocab,
                           ") (model.vocab_size)"));
  }
}

// ---- the starting state ------------------------------------------------------------------------

// What the run starts from: a checkpoint (--resume), weights (--init-from) or a fresh
// initialisation; parameters and optimizer state in `master`, on the host.
struct StartState {
  ParamMap params;
  AdamW opt;
  int64_t step = 0;  // steps already done
};

}  // namespace

ParamMap starting_params(const Config& cfg, const TrainArgs& args, DType master) {
  if (!args.resume.empty()) return load_checkpoint(args.resume, cfg, master).params;
  if (!args.init_from.empty()) return load_weights(args.init_from, cfg.model, master);
  // model.from: the directory's weights (its config.json made cfg.model)
  if (!cfg.model_from.empty()) return load_weights(cfg.model_from, cfg.model, master, /*check_dir_config=*/false);
  return init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), master);
}

namespace {

StartState start_state(const Config& cfg, const TrainArgs& args, DType master, bool lead) {
  StartState s;
  if (!args.resume.empty()) {
    Checkpoint ck = load_checkpoint(args.resume, cfg, master);
    s.params = std::move(ck.params);
    s.opt = std::move(ck.optimizer);
    s.step = ck.step;
    if (lead) spdlog::info("resumed from {} at step {}", args.resume, s.step);
  } else {
    s.params = starting_params(cfg, args, master);
    if (lead && args.init_from.empty() && !cfg.model_from.empty())
      spdlog::info("weights from {} (model.from)", cfg.model_from);
    s.opt.init(s.params);
  }
  return s;
}

// ---- gradients ---------------------------------------------------------------------------------

// The step's gradients: which graph outputs they are and, on several ranks, their all-reduce over
// the world in buckets, each started the moment the backward has produced its last gradient
// (train/grad_sync.h).
struct Gradients {
  explicit Gradients(const RankProgram& p) : prog(p) {}

  const RankProgram& prog;
  std::vector<size_t> order;  // order[k]: the index into prog.param_names of the k-th gradient produced
  std::unique_ptr<GradSync> sync;                    // null on one rank
  std::unordered_map<const Node*, size_t> slot_of;  // a gradient node's slot in `sync`

  bool is_synced_gradient(const Node& n) const { return slot_of.count(&n) > 0; }
  // The executor's hook: a gradient goes to its bucket; started buckets progress.
  void offer(const Node& n, const Tensor& v) {
    if (!sync) return;
    if (auto it = slot_of.find(&n); it != slot_of.end()) sync->ready(it->second, v);
    sync->poll();
  }
  // By parameter name, after the run: summed over the world, or the graph's own on one rank.
  ParamMap collect(const RunResult& r) {
    ParamMap grads;
    if (sync) {
      std::vector<Tensor> summed = sync->finish();
      for (size_t k = 0; k < order.size(); ++k) grads[prog.param_names[order[k]]] = summed[k];
    } else {
      for (size_t i = 0; i < prog.param_names.size(); ++i) grads[prog.param_names[i]] = r.outputs.at(prog.grad_names[i]);
    }
    return grads;
  }
  GradSyncStats stats() const { return sync ? sync->stats() : GradSyncStats{}; }
  // ZeRO: gradients reduce-scattered, this rank's shard of each bucket (train/grad_sync.h).
  bool sharded() const { return sync && sync->layout().ranks > 1; }
  std::vector<std::string> names_in_slot_order() const {
    std::vector<std::string> names;
    for (size_t i : order) names.push_back(prog.param_names[i]);
    return names;
  }
};

// At ZeRO-3 the graph itself reduce-scatters every gradient (graph/passes/shard_parameters.h):
// its gradient outputs are this rank's summed shards and nothing is left to synchronise.
Gradients make_gradients(const RankProgram& prog, const ParamMap& params, const Config& cfg, Communicator& world) {
  Gradients g(prog);
  g.order.resize(prog.grad_names.size());
  std::iota(g.order.begin(), g.order.end(), size_t{0});
  auto position = [&](size_t i) { return prog.graph->position(prog.graph->find(prog.grad_names[i])); };
  std::sort(g.order.begin(), g.order.end(), [&](size_t a, size_t b) { return position(a) < position(b); });
  if (world.size() == 1 || cfg.zero_optimization.stage == 3) return g;
  std::vector<GradSync::Slot> slots;
  for (size_t k = 0; k < g.order.size(); ++k) {
    const Node* n = prog.graph->find(prog.grad_names[g.order[k]]);
    slots.push_back({params.at(prog.param_names[g.order[k]]).shape(), n->dtype()});
    g.slot_of[n] = k;
  }
  g.sync = std::make_unique<GradSync>(world, std::move(slots), cfg.runtime.overlap_grad_sync,
                                      static_cast<size_t>(cfg.runtime.grad_bucket_mb * 1024 * 1024),
                                      static_cast<int>(cfg.zero_optimization.stage));
  return g;
}

// AUTOSP_FAULT kind nan on a gradient wherever it lives: inject_nan writes host memory, so a device
// gradient goes through a host copy and back.
void inject_nan_into(const std::optional<Fault>& fault, int rank, int64_t step, const Tensor& grad) {
  if (!fault || fault->kind != FaultKind::nan) return;
  std::vector<Tensor> g{host_copy(grad)};
  inject_nan(fault, rank, step, g);
  if (g[0].device() != grad.device()) copy_on_device(to_device(g[0], grad.device()), grad);
}

// ---- validation ---------------------------------------------------------------------------------

// The validation program (the rank's forward after AutoSP: no backward, no gradient sync, no
// optimizer) with its executor and data; built only when train.eval_every > 0.
struct Validation {
  RankProgram prog;
  std::unique_ptr<Executor> ex;
  std::unique_ptr<DataSource> data;
};

std::optional<Validation> make_validation(const Config& cfg, DType dt, const PassContext& ctx) {
  if (cfg.train.eval_every <= 0) return std::nullopt;
  Validation v;
  v.prog = build_program(cfg, dt, Stage::autosp, ctx);
  v.ex = std::make_unique<Executor>(*v.prog.graph, ExecOptions{.attention = cfg.runtime.attention});
  v.data = make_val_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  return v;
}

// What the graph outputs for scoring, as rows on the host: the predictions (runtime.tiled_loss: each
// position's argmax, i64 [rows]) or the logits [rows, V].
Tensor scored_rows(const RunResult& r) {
  if (auto it = r.outputs.find("predictions"); it != r.outputs.end()) {
    const Tensor pred = host_copy(it->second);
    return pred.reshape({pred.numel()});
  }
  const Tensor logits = host_copy(r.outputs.at("logits"));
  return logits.reshape({logits.numel() / logits.dim(-1), logits.dim(-1)});
}

// argmax over the last dim of host logits [rows, V] (first maximum on ties); predictions [rows]
// are that already.
std::vector<int64_t> argmax_rows(const Tensor& logits) {
  if (logits.dtype() == DType::i64) {
    const int64_t* p = logits.data<int64_t>();
    return {p, p + logits.numel()};
  }
  const int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const std::vector<double> x = logits.to_doubles();
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * V;
    out[static_cast<size_t>(r)] = std::max_element(row, row + V) - row;
  }
  return out;
}

// The first sequence of the world's first validation batch: every rank of dp rank 0 adds the
// argmax of its block of the sequence, the sum over the world (the blocks are disjoint) is the
// whole row's prediction; rank 0 formats the first row it got entirely right (else row 0).
std::string first_example(const Tensor& logits, const Batch& batch, int64_t S, const PassContext& ctx,
                          int64_t dp_rank, Communicator& host_world) {
  const int64_t B = batch.input_ids.dim(0), Sp = batch.input_ids.dim(1), block = Sp / ctx.sp_size;
  Tensor pred = Tensor::zeros({B, Sp}, DType::i64);
  if (dp_rank == 0) {
    const std::vector<int64_t> local = argmax_rows(logits);  // [B, block]
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < block; ++t)
        pred.data<int64_t>()[b * Sp + ctx.sp_rank * block + t] = local[static_cast<size_t>(b * block + t)];
  }
  host_world.all_reduce_sum(pred);
  if (host_world.rank() != 0) return "";
  auto row = [&](const Tensor& t, int64_t b) {
    const int64_t* p = t.data<int64_t>() + b * Sp;
    return std::vector<int64_t>(p, p + S);
  };
  int64_t pick = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto lab = row(batch.labels, b), pr = row(pred, b);
    bool all = true;
    for (int64_t t = 0; t < S; ++t) all &= lab[static_cast<size_t>(t)] == kIgnoreIndex || lab[static_cast<size_t>(t)] == pr[static_cast<size_t>(t)];
    if (all) {
      pick = b;
      break;
    }
  }
  return format_example(row(batch.input_ids, pick), row(batch.labels, pick), row(pred, pick));
}

// Validation loss and accuracy over batches 0 … eval_batches − 1 of the validation data, each
// read like a training step's global batch (the same for every SP/DP layout), so the result
// equals the P = 1 value. `example` receives rank 0's formatted first sequence when non-null.
void evaluate(Validation& v, const Config& cfg, const ParamMap& params, const PassContext& ctx,
              const ProcessMesh& mesh, JobComms& comms, Device dev, StepRecord& rec, std::string* example) {
  double loss_sum = 0;
  int64_t correct = 0, counted = 0;
  for (int64_t k = 0; k < cfg.train.eval_batches; ++k) {
    const Batch raw = v.data->get(k, mesh.dp_rank, mesh.dp);
    const Batch batch = pad_to_multiple(raw, ctx.sp_size);
    if (dev.kind == DeviceKind::cuda) check_batch(batch, cfg.model.vocab_size);
    TensorMap feeds = batch_feeds(batch);
    to_run_device(feeds, dev);
    for (const auto& [name, p] : params) feeds[name] = p;
    RunResult r = v.ex->run(feeds, comms.groups);
    comms.synchronize_device();
    loss_sum += host_copy(r.outputs.at(v.prog.loss)).to_doubles()[0];
    const Tensor logits = scored_rows(r);
    const int64_t Sp = batch.labels.dim(1), block = Sp / ctx.sp_size;
    const Tensor local = batch.labels.as_strided({batch.labels.dim(0), block}, batch.labels.strides(), ctx.sp_rank * block)
                             .contiguous();
    auto [c, n] = count_correct(logits, local.reshape({local.numel()}));
    correct += c;
    counted += n;
    if (k == 0 && example) *example = first_example(logits, batch, raw.labels.dim(1), ctx, mesh.dp_rank, *comms.host_world);
  }
  Tensor counts = Tensor::from_vector<int64_t>({2}, {correct, counted});
  comms.host_world->all_reduce_sum(counts);
  rec.evaluated = true;
  rec.val_loss = loss_sum / static_cast<double>(cfg.train.eval_batches);
  const int64_t total = counts.data<int64_t>()[1];
  rec.val_accuracy = total ? static_cast<double>(counts.data<int64_t>()[0]) / static_cast<double>(total) : 0.0;
}

// ---- what a step reports -----------------------------------------------------------------------

// The synthetic task's accuracy on the step's batch over the world: this rank's logits (or
// predictions) cover its block of the sequence; count there, sum over the world.
double score_accuracy(const RunResult& r, const Batch& batch, const PassContext& ctx, Communicator& host_world) {
  const int64_t S = batch.labels.dim(1), block = S / ctx.sp_size;
  Tensor local = batch.labels.as_strided({batch.labels.dim(0), block}, batch.labels.strides(), ctx.sp_rank * block)
                     .contiguous();
  auto [correct, counted] = count_correct(scored_rows(r), local.reshape({local.numel()}));
  Tensor counts = Tensor::from_vector<int64_t>({2}, {correct, counted});
  host_world.all_reduce_sum(counts);
  const int64_t total_counted = counts.data<int64_t>()[1];
  return total_counted ? static_cast<double>(counts.data<int64_t>()[0]) / static_cast<double>(total_counted) : 0.0;
}

// The run's steps as the progress line counts them.
struct Progress {
  int64_t start = 0, total = 0;  // steps done before this run, and the last step
  Clock::time_point began;
  std::string metrics_path;
};

// Rank 0's lines for a logged step: the progress line (stderr; under --quiet only the run's
// train.log, apps/train.cpp) and the --metrics JSON object.
void log_step(const StepRecord& rec, const Progress& run, bool quiet, std::ofstream& metrics) {
  auto file_log = spdlog::get("train.log");
  if (!quiet || file_log) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - run.began).count();
    const double eta = elapsed / static_cast<double>(rec.step - run.start) * static_cast<double>(run.total - rec.step);
    const std::string line = fmt::format(
        "step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} ms | peak {:.1f} MiB | eta {}m{:02d}s",
        rec.step, run.total, rec.loss, rec.accuracy >= 0 ? fmt::format(" | acc {:.3f}", rec.accuracy) : "", rec.lr,
        rec.grad_norm, rec.tokens_per_sec, rec.step_ms, static_cast<double>(rec.peak_bytes) / (1024.0 * 1024.0),
        static_cast<int64_t>(eta) / 60, static_cast<int64_t>(eta) % 60);
    const std::string val =
        rec.evaluated ? fmt::format("step {}/{} | val loss {:.4f} | val acc {:.3f}", rec.step, run.total, rec.val_loss,
                                    rec.val_accuracy)
                      : "";
    if (!quiet) spdlog::info("{}", line);
    else file_log->info("{}", line);
    if (!val.empty() && !quiet) spdlog::info("{}", val);
    else if (!val.empty()) file_log->info("{}", val);
  }
  if (metrics.is_open()) {
    nlohmann::json m = {{"step", rec.step},         {"loss", rec.loss},       {"lr", rec.lr},
                        {"grad_norm", rec.grad_norm}, {"tokens_per_sec", rec.tokens_per_sec},
                        {"step_ms", rec.step_ms},   {"peak_bytes", rec.peak_bytes}};
    if (rec.accuracy >= 0) m["accuracy"] = rec.accuracy;
    if (rec.evaluated) m["val_loss"] = rec.val_loss, m["val_accuracy"] = rec.val_accuracy;
    metrics << m.dump() << "\n" << std::flush;
    if (!metrics) throw RuntimeFailure(str("--metrics ", run.metrics_path, ": write failed (disk full or I/O error)"));
  }
}

// Rank 0 writes the checkpoint of `step` under train.checkpoint_dir, keeping the newest
// train.keep_checkpoints; checkpoints are host files, so device state is copied down for them.
// AUTOSP_FAULT where:checkpoint fires once the files are durable, before the rename.
void save_step_checkpoint(const Config& cfg, int64_t step, const ParamMap& params, const AdamW& opt,
                          const std::optional<Fault>& fault, Communicator& world) {
  SaveOptions save;
  save.keep_last = cfg.train.keep_checkpoints;
  save.before_commit = [&] { inject_fault(fault, FaultWhere::checkpoint, world.rank(), step, world); };
  const std::string dir =
      save_checkpoint(cfg.train.checkpoint_dir, step, host_copy(params), host_copy(opt), cfg, save);
  spdlog::info("saved checkpoint {}", dir);
}

// ---- the checkpoint directory's lifecycle (docs/reliability.md) --------------------------------

// Rank 0, before anything is loaded: the run's own outputs may not clobber its inputs or a
// checkpoint.
void check_run_files(const Config& cfg, const TrainArgs& args) {
  const RunFiles run{{args.config_path, cfg.data.source == DataSourceKind::synthetic ? "" : cfg.data.path,
                      args.init_from, args.resume},
                     cfg.train.checkpoint_dir};
  if (!args.metrics.empty()) check_output_path("--metrics", args.metrics, run);
  if (!args.dump_grads.empty()) check_output_path("--dump-grads", args.dump_grads, run, OutputKind::replaced);
}

// Whether `resume` names `root` itself or one of its step_* directories.
bool resumes_from(const std::string& resume, const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(resume, ec), d = fs::weakly_canonical(root, ec);
  return r == d || r.parent_path() == d;
}

void prepare_checkpoint_dir(const Config& cfg, const TrainArgs& args) {
  const std::string& root = cfg.train.checkpoint_dir;
  const int64_t newest = newest_step(root);
  if (args.start_over) {
    if (const std::string aside = move_aside(root, -1); !aside.empty())
      spdlog::info("--start-over: moved the earlier run's checkpoints (to step {}) into {}", newest, aside);
    return;
  }
  if (newest < 0) return;
  if (args.resume.empty())
    throw UsageError(str("train.checkpoint_dir ", root, " already holds step_", fmt::format("{:08d}", newest),
                         " of an earlier run: --resume ", root, " to continue it, or --start-over to move its "
                         "checkpoints aside and start again"));
  if (!resumes_from(args.resume, root))
    throw UsageError(str("train.checkpoint_dir ", root, " holds checkpoints of another run than --resume ",
                         args.resume, ": give this run its own train.checkpoint_dir, or --start-over"));
}

// Resuming an older step of `root` branches from it: the newer steps move aside, so they are
// neither pruned nor taken for this run's newest by a later --resume ROOT.
void branch_from(const Config& cfg, const TrainArgs& args, int64_t step) {
  const std::string& root = cfg.train.checkpoint_dir;
  if (root.empty() || args.resume.empty() || !resumes_from(args.resume, root)) return;
  if (const std::string aside = move_aside(root, step); !aside.empty())
    spdlog::info("branching from step {}: the newer checkpoints of {} moved into {}", step, root, aside);
}

}  // namespace

TrainResult train(const Config& cfg, const TrainArgs& args, Communicator& world) {
  const Device dev = pick_device(cfg);
  const DType dt = cfg.runtime.dtype, master = master_dtype(dt);  // compute; parameters and optimizer state
  const PassContext ctx = pass_context(cfg, world.size(), world.rank());
  // AUTOSP_FAULT injects failures in tests; the watchdog of `comms` makes the other ranks end the job.
  const std::optional<Fault> fault = fault_from_env(world.size());
  // NCCL or the world for device tensors, the mesh, every collective under the watchdog (comm/job_comms.h).
  const std::unique_ptr<JobComms> comms = make_job_comms(world, dev, static_cast<int>(ctx.sp_size));
  const ProcessMesh& mesh = comms->mesh;
  if (cfg.runtime.threads > 0) cpu::set_num_threads(static_cast<int>(cfg.runtime.threads));
  const bool lead = world.rank() == 0;
  const int64_t total = args.steps.value_or(cfg.train.steps);
  if (total < 0) throw UsageError(str("--steps ", total, ": expected >= 0"));
  if (!args.resume.empty() && !args.init_from.empty()) throw UsageError("--resume and --init-from exclude each other");
  if (args.start_over && !args.resume.empty()) throw UsageError("--start-over and --resume exclude each other");
  if (args.start_over && cfg.train.checkpoint_dir.empty()) throw UsageError("--start-over needs train.checkpoint_dir");
  // One live run per checkpoint directory (the lock lives as long as the run), then its lifecycle.
  std::optional<DirLock> lock;
  if (lead) {
    check_run_files(cfg, args);
    if (!cfg.train.checkpoint_dir.empty()) {
      lock.emplace(cfg.train.checkpoint_dir);
      prepare_checkpoint_dir(cfg, args);
    }
  }
  StopOnSignal stop(cfg.train.save_timeout);  // SIGTERM, SIGINT, SIGUSR1: save after this step and stop

  RankProgram prog = build_program(cfg, dt, Stage::joint, ctx);
  ExecOptions exec{.attention = cfg.runtime.attention, .background_collectives = cfg.runtime.overlap_grad_sync};
  // ZeRO-2: a gradient lives on only in its bucket's reduce-scattered shard.
  if (cfg.zero_optimization.stage == 2 && world.size() > 1)
    exec.transient_outputs = {prog.grad_names.begin(), prog.grad_names.end()};
  // The logits [B, S, V] are read after the step only to score the synthetic task's accuracy;
  // otherwise they die at the loss's backward instead of living through the whole backward.
  const bool score_accuracy_each_step = cfg.data.source == DataSourceKind::synthetic && args.accuracy;
  if (!score_accuracy_each_step) exec.transient_outputs.insert("logits");
  Executor ex(*prog.graph, exec);
  auto data = make_data_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  std::optional<Validation> validation = make_validation(cfg, dt, ctx);

  StartState state = start_state(cfg, args, master, lead);
  TrainResult result;
  result.params = std::move(state.params);
  AdamW& opt = state.opt;
  const int64_t start = state.step;
  if (lead) branch_from(cfg, args, start);
  for (auto& [name, p] : result.params) comms->host_world->broadcast(p, 0);  // every rank starts from rank 0's weights
  const size_t num_params = result.params.size();
  // ZeRO-3: from here on this rank holds only its shards of the parameters and AdamW state.
  std::optional<Zero3State> z3;
  if (cfg.zero_optimization.stage == 3 && world.size() > 1) {
    z3.emplace(result.params, opt, world.size(), world.rank(), dev);
    result.params.clear();
    opt = AdamW{};
  }
  // What the graph's parameter nodes are fed; whole parameters (a collective at ZeRO-3) for
  // checkpoints.
  auto graph_params = [&]() -> const ParamMap& { return z3 ? z3->shards() : result.params; };
  auto whole_params = [&] { return z3 ? z3->whole_params(*comms->world) : result.params; };
  // Parameters, gradients and AdamW state live on the run device from here on.
  to_run_device(result.params, dev);
  Gradients gradients = make_gradients(prog, result.params, cfg, *comms->world);
  // ZeRO-1/2: this rank keeps only its shard of the AdamW state (whole from a checkpoint of any
  // world size or stage, resharded here).
  std::optional<ZeroAdamW> zopt;
  if (gradients.sharded()) {
    zopt.emplace(gradients.sync->layout(), gradients.names_in_slot_order(), comms->world->rank());
    zopt->load(opt, dev);
    opt = AdamW{};
  } else {
    to_run_device(opt.exp_avg, dev);
    to_run_device(opt.exp_avg_sq, dev);
  }
  // The whole optimizer state for a checkpoint (ZeRO: gathered from every rank, a collective).
  auto checkpoint_state = [&] {
    return zopt ? zopt->consolidate(*comms->world) : z3 ? z3->consolidate(*comms->world) : opt;
  };
  if (lead && dev.kind == DeviceKind::cuda)
    spdlog::info("device: {} (local rank's GPU; attention {})", dev.str(), attention_backend_name(cfg.runtime.attention));
  if (lead) spdlog::info("data: {}; {} parameters; steps {}..{}", data->describe(), num_params, start, total);
  if (lead && validation)
    spdlog::info("validation: every {} steps and after the last, {} batches of {}", cfg.train.eval_every,
                 cfg.train.eval_batches, validation->data->describe());
  if (lead && dt == DType::bf16)
    spdlog::info("dtype: bf16 mixed precision (f32 master weights and AdamW state, bf16 compute){}",
                 dev.kind == DeviceKind::cpu ? "; emulated on cpu: f32 kernels, each result rounded to bf16" : "");

  std::ofstream metrics;
  if (lead && !args.metrics.empty()) {
    metrics.open(args.metrics, std::ios::app);
    if (!metrics) throw UsageError(str("--metrics ", args.metrics, ": cannot open for writing"));
  }
  const int64_t tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * mesh.dp;

  const Progress run{start, total, Clock::now(), args.metrics};
  for (int64_t step = start; step < total; ++step) {
    const auto t0 = Clock::now();
    comms->watchdog->set_step(step + 1);
    inject_fault(fault, FaultWhere::step, world.rank(), step + 1, world);
    // Every rank of an SP group reads the same sequences; the graph slices its block.
    Batch batch = pad_to_multiple(data->get(step, mesh.dp_rank, mesh.dp), ctx.sp_size);
    if (dev.kind == DeviceKind::cuda) check_batch(batch, cfg.model.vocab_size);
    TensorMap feeds = batch_feeds(batch);
    to_run_device(feeds, dev);
    for (const auto& [name, p] : graph_params()) feeds[name] = p;
    const GradSyncStats synced_before = gradients.stats();
    RunResult r = ex.run(feeds, comms->groups, [&](const Node& n, const Tensor& v) {
      if (gradients.is_synced_gradient(n)) inject_nan_into(fault, world.rank(), step + 1, v);
      gradients.offer(n, v);
    });
    ParamMap grads = zopt ? ParamMap{} : gradients.collect(r);
    const std::vector<Tensor> shards = zopt ? gradients.sync->finish_shards() : std::vector<Tensor>{};
    // Device results are read on the host only once every collective has finished.
    comms->synchronize_device();
    const Tensor loss_t = host_copy(r.outputs.at(prog.loss));
    if (step == start && !args.dump_grads.empty()) {  // whole gradients at every stage
      const ParamMap whole = zopt ? zopt->unshard(shards, *comms->world) : z3 ? z3->unshard(grads, *comms->world) : grads;
      if (lead) save_safetensors(args.dump_grads, host_copy(whole));
    }

    StepRecord rec;
    rec.step = step + 1;
    rec.loss = loss_t.to_doubles()[0];
    rec.grad_norm = zopt ? zopt->grad_norm(shards, *comms->host_world)
                    : z3 ? z3->grad_norm(grads, *comms->host_world)
                         : global_grad_norm(grads);
    // Loss and norm are all-reduced, so every rank stops here together, before a bad update
    // reaches the parameters or a checkpoint.
    if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm))
      throw RuntimeFailure(str("step ", rec.step, ": loss ", rec.loss, ", gradient norm ", rec.grad_norm,
                               " is not finite; stopping before the update (try a lower train.lr or more "
                               "train.warmup_steps, and --resume from the last checkpoint)"));
    rec.lr = lr_at(cfg.train, step, total);
    if (zopt) {
      clip_grads(shards, rec.grad_norm, cfg.train.grad_clip);
      zopt->update(result.params, shards, cfg.train, rec.lr, *comms->world);
    } else {
      clip_grads(grads, rec.grad_norm, cfg.train.grad_clip);
      if (z3) z3->update(grads, cfg.train, rec.lr);
      else opt.update(result.params, grads, cfg.train, rec.lr);
    }
    if (score_accuracy_each_step)
      rec.accuracy = score_accuracy(r, batch, ctx, *comms->host_world);
    // The step's device work (AdamW is still queued here) belongs to its time, not the next step's.
    if (dev.kind == DeviceKind::cuda) synchronize();
    rec.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    rec.tokens_per_sec = static_cast<double>(tokens_per_step) / (rec.step_ms / 1000.0);
    rec.peak_bytes = r.peak_bytes;
    rec.grad_sync_ms = (gradients.stats().exposed_seconds - synced_before.exposed_seconds) * 1000.0;
    rec.grad_sync_wait_ms = (gradients.stats().wait_seconds - synced_before.wait_seconds) * 1000.0;
    if (validation && (rec.step % cfg.train.eval_every == 0 || rec.step == total))
      evaluate(*validation, cfg, graph_params(), ctx, mesh, *comms, dev, rec, &result.val_example);
    result.steps.push_back(rec);

    const bool log_now = rec.step % cfg.train.log_every == 0 || rec.step == total || step == start || rec.evaluated;
    if (lead && log_now) log_step(rec, run, args.quiet, metrics);
    const bool checkpoint_now =
        !cfg.train.checkpoint_dir.empty() &&
        ((cfg.train.checkpoint_every > 0 && rec.step % cfg.train.checkpoint_every == 0) || rec.step == total);
    if (checkpoint_now) {
      const AdamW state_now = checkpoint_state();
      const ParamMap params_now = whole_params();
      if (lead) save_step_checkpoint(cfg, rec.step, params_now, state_now, fault, world);
    }
    // Preemption: every rank agrees on this step (one tiny all-reduce), rank 0 saves it, and all
    // leave together once the checkpoint is on disk.
    if (stop.stop_agreed(*comms->host_world)) {
      const bool save_now = !cfg.train.checkpoint_dir.empty() && !checkpoint_now;
      const AdamW state_now = save_now ? checkpoint_state() : AdamW{};
      const ParamMap params_now = save_now ? whole_params() : ParamMap{};
      if (lead) {
        spdlog::warn("stopping after step {}: a preemption signal reached {}", rec.step,
                     StopOnSignal::received() ? "this rank" : "another rank");
        if (cfg.train.checkpoint_dir.empty())
          spdlog::warn("no train.checkpoint_dir: nothing saved; the run restarts from step 0");
        else if (save_now)
          save_step_checkpoint(cfg, rec.step, params_now, state_now, fault, world);
      }
      comms->host_world->barrier();
      mark_exit_agreed();
      result.preempted = true;
      break;
    }
  }
  for (const auto& [name, t] : graph_params()) result.parameter_bytes += t.nbytes();
  result.params = host_copy(whole_params());
  if (zopt) {
    result.optimizer_state_bytes = zopt->state_bytes();
  } else if (z3) {
    result.optimizer_state_bytes = z3->state_bytes();
  } else {
    for (const ParamMap* m : {&opt.exp_avg, &opt.exp_avg_sq})
      for (const auto& [name, t] : *m) result.optimizer_state_bytes += t.nbytes();
  }
  if (gradients.sync) result.grad_bucket_bytes = gradients.sync->bucket_bytes_held();
  return result;
}

}  // namespace autosp
