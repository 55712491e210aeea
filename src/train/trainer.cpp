// The training loop, in the shape of llm.c's: train() sets a run up once (device, communicators,
// program, starting state, where the data continues) and then each step reads its batch, runs the
// joint graph once per micro-batch, has the training state (train/train_state.h: whole, or sharded
// by the ZeRO mode) take the gradients, clip and update, and reports, validates and checkpoints
// when due. What a step does besides that lives in one file each: train/accumulation (micro-batches,
// the target count, the gradient sum), train/run_device (host and device copies, the feeds), train/validation
// (validation and accuracy), train/step_log (the log lines and metrics), train/checkpoint (files
// and the directory's lifecycle), train/preempt (signals), train/fault (injected failures).
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "comm/exit.h"
#include "comm/job_comms.h"
#include "compiler/program.h"
#include "device/cuda/device.h"
#include "device/host.h"
#include "engine/executor.h"
#include "models/lora.h"
#include "models/weights.h"
#include "tensor/safetensors.h"
#include "graph/passes/feed_target_count.h"  // kTargetCount
#include "train/accumulation.h"
#include "train/adapter.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/expert_split.h"
#include "train/fault.h"
#include "train/outputs.h"
#include "train/preempt.h"
#include "train/preference.h"
#include "train/router_metrics.h"
#include "train/run_device.h"
#include "train/schedule.h"
#include "train/step_log.h"
#include "train/train_state.h"
#include "train/validation.h"

namespace autosp {

namespace {

// The model's own weights: --init-from, model.from's directory (its config.json made cfg.model) or
// the seeded initialisation.
ParamMap base_params(const Config& cfg, const TrainArgs& args, DType master) {
  if (!args.init_from.empty()) return load_weights(args.init_from, cfg.model, master);
  if (!cfg.model_from.empty()) return load_weights(cfg.model_from, cfg.model, master, /*check_dir_config=*/false);
  return init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), master);
}

// A LoRA run's trained tensors when it does not resume: the adapter lora.from names, or fresh ones.
// `warn`: log what the adapter's config holds that PEFT does not know (rank 0).
ParamMap start_adapters(const Config& cfg, DType master, bool warn = true) {
  if (!cfg.lora.from.empty()) return load_adapter(cfg.lora.from, cfg, master, warn);
  return init_lora_params(cfg.model, lora_target_weights(cfg.model, cfg.lora.target_modules), cfg.lora.r,
                          cfg.lora.init_lora_weights, static_cast<uint64_t>(cfg.train.seed), master);
}

// `adapters` (LoRA's A and B, modules_to_save's tensors) over `base`.
ParamMap with_adapters(ParamMap base, const ParamMap& adapters) {
  for (const auto& [name, t] : adapters) base[name] = t;
  return base;
}

}  // namespace

ParamMap starting_params(const Config& cfg, const TrainArgs& args, DType master) {
  if (!cfg.lora.enabled) {
    if (!args.resume.empty()) return load_checkpoint(args.resume, cfg, master).params;
    return base_params(cfg, args, master);
  }
  const ParamMap adapters =
      !args.resume.empty() ? load_checkpoint(args.resume, cfg, master).params : start_adapters(cfg, master);
  return with_adapters(base_params(cfg, args, master), adapters);
}

namespace {

using Clock = std::chrono::steady_clock;

// Rank 0, before anything is loaded: flags that exclude each other, outputs that would clobber the
// run's inputs or a checkpoint, then the checkpoint directory locked and its lifecycle checked
// (what it moves waits for settle_checkpoint_dir, once everything else has been validated).
std::unique_ptr<DirLock> prepare_run(const Config& cfg, const TrainArgs& args, bool lead) {
  if (!args.resume.empty() && !args.init_from.empty()) throw UsageError("--resume and --init-from exclude each other");
  if (args.start_over && !args.resume.empty()) throw UsageError("--start-over and --resume exclude each other");
  if (args.start_over && cfg.train.checkpoint_dir.empty()) throw UsageError("--start-over needs train.checkpoint_dir");
  if (!lead) return nullptr;
  RunFiles run{{args.config_path, args.init_from, args.resume}, cfg.train.checkpoint_dir};
  for (const std::string& p : data_input_paths(cfg.data)) run.inputs.push_back(p);  // data.path or data.mix, val_path
  if (!args.metrics.empty()) check_output_path("--metrics", args.metrics, run);
  if (!args.dump_grads.empty()) check_output_path("--dump-grads", args.dump_grads, run, OutputKind::replaced);
  if (cfg.train.checkpoint_dir.empty()) return nullptr;
  return open_checkpoint_dir(cfg.train.checkpoint_dir, args.resume, args.start_over);
}

// What the run starts from, whole and on the host in the master dtype: a checkpoint (--resume),
// weights (--init-from, model.from) or a fresh initialisation; every rank takes rank 0's weights.
// It changes nothing on disk: a resume is validated further (its data position) after it.
struct StartState {
  ParamMap params;  // what trains (LoRA: the adapters and modules_to_save)
  ParamMap frozen;  // LoRA's frozen base: fed to the graph, never trained
  AdamW opt;
  int64_t step = 0;     // steps already done
  nlohmann::json meta;  // the checkpoint's meta.json (--resume), else null
  nlohmann::json lora_base;  // LoRA, rank 0: the base's record, which its checkpoints carry (adapter.h)
};

StartState start_state(const Config& cfg, const TrainArgs& args, const RankProgram& prog, Communicator& host_world) {
  const DType master = master_dtype(cfg.runtime.dtype);
  const bool lead = host_world.rank() == 0;
  StartState s;
  if (cfg.lora.enabled) {
    ParamMap base = base_params(cfg, args, master);
    // Rank 0's base, tensor by tensor in name order: the whole base, whose names every rank has
    // (under expert parallelism a rank's program, and so its frozen names, hold its own experts only).
    for (auto& [name, p] : base) host_world.broadcast(p, 0);
    // In the graph's dtype: bf16 under mixed precision (the frozen base needs no f32 master copy).
    for (const std::string& name : prog.frozen_names)
      s.frozen[name] = base.at(name).to(prog.graph->find(name)->dtype());
    if (lead) s.lora_base = lora_base_record(cfg, args.init_from, base);
    if (lead && args.init_from.empty() && cfg.model_from.empty()) {
      // --quiet keeps it off stderr; the run's log file (train.log) still has it.
      const auto log = args.quiet ? spdlog::get("train.log") : spdlog::default_logger();
      if (log)
        log->warn("lora: the base model is randomly initialised (no model.from or --init-from): the adapters "
                  "train on a random base");
    }
    if (lead)
      spdlog::info("lora: r {}, scale {}, {} frozen base tensors; the adapters {}", cfg.lora.r, cfg.lora.scale(),
                   prog.frozen_names.size(),
                   !args.resume.empty() ? "from --resume" : !cfg.lora.from.empty() ? "from " + cfg.lora.from : "fresh");
    if (args.resume.empty()) {
      // The base trains only where modules_to_save keeps it. Not prog.frozen_names alone: under
      // expert parallelism the other ranks' experts are not in this rank's program.
      const std::vector<std::string> saved = lora_saved_params(cfg.model, cfg.lora.modules_to_save);
      std::vector<std::string> frozen;
      for (const auto& [name, t] : base)
        if (std::find(saved.begin(), saved.end(), name) == saved.end()) frozen.push_back(name);
      s.params = with_adapters(std::move(base), start_adapters(cfg, master, lead));
      for (const std::string& name : frozen) s.params.erase(name);
      s.opt.init(s.params);
    }
  }
  if (!args.resume.empty()) {
    Checkpoint ck = load_checkpoint(args.resume, cfg, master);
    s.params = std::move(ck.params);
    s.opt = std::move(ck.optimizer);
    s.step = ck.step;
    s.meta = std::move(ck.meta);
    // A LoRA checkpoint continues on the base its adapters were trained on, or not at all: checked
    // before any step, so a refused resume writes no checkpoint.
    if (lead && cfg.lora.enabled) {
      const std::string meta_path = ck.dir + "/meta.json";
      if (!s.meta.contains("lora_base"))
        spdlog::warn("lora: {} records no base (written before checkpoints recorded it): the base is not checked "
                     "against the one its adapters were trained on", meta_path);
      else if (const std::string moved = check_lora_base(s.meta["lora_base"], s.lora_base, meta_path); !moved.empty())
        spdlog::info("{}", moved);
    }
    if (lead) spdlog::info("resumed from {} at step {}", args.resume, s.step);
  } else if (!cfg.lora.enabled) {
    s.params = starting_params(cfg, args, master);
    if (lead && args.init_from.empty() && !cfg.model_from.empty())
      spdlog::info("weights from {} (model.from)", cfg.model_from);
    s.opt.init(s.params);
  }
  for (auto& [name, p] : s.params) host_world.broadcast(p, 0);
  return s;
}

// Where each step reads in the run's global read order (train/data_order.h): step s's G = micro ·
// k · dp sequences start at g(s) = start + (s − start step)·G, and dp rank d reads the k·micro from
// g(s) + d·k·micro, so a fresh run reads what one step of batch k·micro would. A resumed run starts
// where the checkpoint's run stopped (resume_data: also after a change of dp size, batch or k, or
// of seq_len without shuffle; otherwise a UsageError saying why).
class DataCursor {
 public:
  DataCursor(const Config& cfg, const DataSource& data, const StartState& start, const ProcessMesh& mesh)
      : data_(data), start_step_(start.step),
        per_rank_(cfg.data.batch_size * cfg.train.gradient_accumulation_steps), global_(per_rank_ * mesh.dp),
        token_index_(cfg.lora.enabled && cfg.lora.lora_dropout > 0) {
    if (start.meta.is_null()) return;
    const nlohmann::json& saved = start.meta.contains("data_position") ? start.meta["data_position"] : nlohmann::json();
    if (saved.is_object()) {
      DataPosition now = data.position(0);
      now.global_batch = global_;
      const DataResume r = resume_data(parse_data_position(saved, "the checkpoint's meta.json"), now);
      start_ = r.next_sequence;
      log_ = r.log;
    } else {  // written before positions were recorded: its data was read at step × the global batch
      start_ = start.step * global_;
      log_ = str("data: the checkpoint records no data position (an older format); continuing at sequence ", start_,
                 " (step ", start.step, " × ", global_, " sequences a step)");
    }
  }
  const std::string& log() const { return log_; }
  // With lora_dropout, each token's index in the read order too (the dropout's mask counter).
  Batch read(int64_t step, int64_t dp_rank) const {
    const int64_t first = next(step) + dp_rank * per_rank_;
    Batch b = data_.read(first, per_rank_);
    if (token_index_) set_token_index(b, first);
    return b;
  }
  int64_t next(int64_t steps_done) const { return start_ + (steps_done - start_step_) * global_; }  // g(steps_done)
  // What a checkpoint after `steps_done` steps records (meta.json "data_position").
  nlohmann::json position(int64_t steps_done) const {
    DataPosition p = data_.position(next(steps_done));
    p.global_batch = global_;
    return data_position_json(p);
  }
  std::string epochs(int64_t steps_done) const { return format_epochs(data_.epochs(next(steps_done))); }

 private:
  const DataSource& data_;
  int64_t start_step_, per_rank_, global_;
  bool token_index_;
  int64_t start_ = 0;
  std::string log_;
};

// The executor's options for the joint program: the logits [B, S, V] are read after the step only
// to score the synthetic task's accuracy; otherwise they die at the loss's backward instead of
// living through the whole backward.
ExecOptions exec_options(const Config& cfg, const TrainState& state, bool score_accuracy_each_step) {
  ExecOptions exec{.attention = cfg.runtime.attention, .background_collectives = cfg.runtime.overlap_grad_sync};
  exec.transient_outputs = state.transient_outputs();
  if (!score_accuracy_each_step) exec.transient_outputs.insert("logits");
  return exec;
}

// AUTOSP_FAULT kind nan on a gradient wherever it lives: inject_nan writes host memory, so a device
// gradient goes through a host copy and back.
void inject_nan_into(const std::optional<Fault>& fault, int rank, int64_t step, const Tensor& grad) {
  if (!fault || fault->kind != FaultKind::nan) return;
  std::vector<Tensor> g{host_copy(grad)};
  inject_nan(fault, rank, step, g);
  if (g[0].device() != grad.device()) copy_on_device(to_device(g[0], grad.device()), grad);
}

// The graph's gradient outputs: where AUTOSP_FAULT kind nan strikes, at every ZeRO mode (the
// executor's hook sees each once it is final: summed, or this rank's reduce-scattered shard).
std::unordered_set<const Node*> gradient_nodes(const RankProgram& prog) {
  std::unordered_set<const Node*> out;
  for (const std::string& name : prog.grad_names) out.insert(prog.graph->find(name));
  return out;
}

// A non-finite loss or norm. Loss and norm are all-reduced, so every rank stops here together,
// before the update. The parameters that gave it are those after the previous step, which its
// checkpoint already holds: the advice names an older one.
[[noreturn]] void diverged(const StepRecord& rec, const Config& cfg) {
  const std::string& root = cfg.train.checkpoint_dir;
  const int64_t older = root.empty() ? -1 : newest_complete_step_before(root, rec.step - 1);
  const std::string advice =
      older >= 0 ? fmt::format("resume from a checkpoint before step {} with a lower train.lr or more "
                               "train.warmup_steps: --resume {}/step_{:08d}",
                               rec.step - 1, root, older)
      : root.empty() ? std::string("start again with a lower train.lr or more train.warmup_steps (set "
                                   "train.checkpoint_dir to keep checkpoints to resume from)")
                     : fmt::format("no checkpoint before step {} to resume from: start again with a lower "
                                   "train.lr or more train.warmup_steps", rec.step - 1);
  throw RuntimeFailure(str("step ", rec.step, ": loss ", rec.loss, ", gradient norm ", rec.grad_norm,
                           " is not finite; stopping before the update (the parameters after step ", rec.step - 1,
                           " give it: ", advice, ")"));
}

// Rank 0 writes the checkpoint of `step` under train.checkpoint_dir from the whole state (gathered
// on every rank: a collective), keeping the newest train.keep_checkpoints. AUTOSP_FAULT
// where:checkpoint fires once the files are durable, before the rename.
void save_step_checkpoint(const Config& cfg, int64_t step, TrainState& state, const DataCursor& cursor,
                          const nlohmann::json& lora_base, const std::optional<Fault>& fault, Communicator& world) {
  const AdamW opt = state.checkpoint_state();
  const ParamMap params = state.whole_params();
  if (world.rank() != 0) return;
  SaveOptions save;
  save.keep_last = cfg.train.keep_checkpoints;
  save.data_position = cursor.position(step);
  save.lora_base = lora_base;
  save.before_commit = [&] { inject_fault(fault, FaultWhere::checkpoint, world.rank(), step, world); };
  spdlog::info("saved checkpoint {}", save_checkpoint(cfg.train.checkpoint_dir, step, host_copy(params),
                                                      host_copy(opt), cfg, save));
}

bool checkpoint_due(const Config& cfg, int64_t step, int64_t total) {
  const int64_t every = cfg.train.checkpoint_every;
  return !cfg.train.checkpoint_dir.empty() && ((every > 0 && step % every == 0) || step == total);
}

// Preemption: every rank agrees on this step (one tiny all-reduce), rank 0 saves it unless it was
// just saved, and all leave together once the checkpoint is on disk.
bool preempted(const StopOnSignal& stop, const Config& cfg, int64_t step, bool saved, TrainState& state,
               const DataCursor& cursor, const nlohmann::json& lora_base,
               const std::optional<Fault>& fault, JobComms& comms, Communicator& world) {
  if (!stop.stop_agreed(*comms.host_world)) return false;
  if (world.rank() == 0)
    spdlog::warn("stopping after step {}: a preemption signal reached {}", step,
                 StopOnSignal::received() ? "this rank" : "another rank");
  if (cfg.train.checkpoint_dir.empty() && world.rank() == 0)
    spdlog::warn("no train.checkpoint_dir: nothing saved; the run restarts from step 0");
  else if (!cfg.train.checkpoint_dir.empty() && !saved)
    save_step_checkpoint(cfg, step, state, cursor, lora_base, fault, world);
  comms.host_world->barrier();
  mark_exit_agreed();
  return true;
}

// The fed loss denominator (graph/passes/feed_target_count.h): the step's global target count in
// the dtype of the program's input, on the run device.
Tensor target_count_feed(const RankProgram& prog, int64_t targets, Device dev) {
  const Node* in = prog.graph->find(passes::kTargetCount);
  AUTOSP_ASSERT(in, "the program has no ", passes::kTargetCount, " input");
  Tensor t = Tensor::from_vector<double>({}, {static_cast<double>(targets)}).to(in->dtype());
  return dev.kind == DeviceKind::cpu ? t : to_device(t, dev);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

TrainResult train(const Config& cfg, const TrainArgs& args, Communicator& world) {
  const int64_t total = cfg.train.steps;  // the run's step count (config/config.h)
  const Device dev = pick_device(cfg);
  const std::optional<Fault> fault = fault_from_env(world.size());  // AUTOSP_FAULT: failures for tests
  // NCCL or the world for device tensors, the mesh, every collective under the watchdog.
  const std::unique_ptr<JobComms> comms = make_job_comms(world, dev, cfg.sequence_parallel.autosp_size,
                                                         cfg.sequence_parallel.ring_size,
                                                         cfg.moe.expert_parallel_size);
  const ProcessMesh& mesh = comms->mesh;
  set_host_threads(static_cast<int>(cfg.runtime.threads));  // 0: OpenMP's default
  const std::unique_ptr<DirLock> lock = prepare_run(cfg, args, world.rank() == 0);
  StopOnSignal stop(cfg.train.save_timeout);  // SIGTERM, SIGINT, SIGUSR1: save after this step and stop

  const RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::joint, mesh);
  const int64_t k = cfg.train.gradient_accumulation_steps;
  auto data = make_data_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  std::optional<Validation> validation = make_validation(cfg, cfg.runtime.dtype, mesh);
  StartState start = start_state(cfg, args, prog, *comms->host_world);
  if (start.step > total)  // (every rank has rank 0's step: the same error everywhere, before anything is written)
    throw UsageError(str("--resume ", args.resume, ": the checkpoint is at step ", start.step, ", past the run's ", total,
                         " steps (train.steps, or --steps: the steps from 0, not the steps to add); give more than ",
                         start.step));
  // DPO's reference (train/preference.h): the starting model, or with LoRA the base, adapters off.
  const bool dpo = cfg.train.objective == Objective::dpo;
  std::unique_ptr<DpoReference> reference;
  if (dpo) {
    ParamMap base = cfg.lora.enabled ? start.frozen : base_params(cfg, args, master_dtype(cfg.runtime.dtype));
    if (cfg.lora.enabled && !cfg.lora.modules_to_save.empty())  // their base values, not the trained copies
      for (auto& [name, t] : base_params(cfg, args, master_dtype(cfg.runtime.dtype)))
        if (start.params.count(name)) base[name] = t;
    ParamMap weights = dpo_reference_params(cfg, prog, base, start.params);
    // dpo.precompute_ref: each split's sums, from its file beside the pairs or computed (train/dpo_ref_file.h).
    struct Split {
      DpoSplit split;
      const DataSource* data;
      std::vector<std::string> files;  // tokens, masks, pair ids
      RefLogpsKey key;
    };
    std::vector<Split> splits;
    if (cfg.dpo.precompute_ref) {
      splits.push_back({DpoSplit::train, data.get(), {cfg.data.path, cfg.data.loss_mask_path, cfg.data.pairs_path}, {}});
      if (validation)
        splits.push_back({DpoSplit::val, validation->data.get(),
                          {cfg.data.val_path, cfg.data.val_loss_mask_path, cfg.data.val_pairs_path}, {}});
      for (Split& s : splits) s.key = ref_logps_key(cfg, weights, s.files);
    }
    reference = std::make_unique<DpoReference>(cfg, mesh, std::move(weights), dev);
    for (const Split& s : splits) {
      const std::string line = precompute_reference(*reference, s.split, ref_logps_path(s.files[2]), s.key, *s.data,
                                                    cfg.data.batch_size, mesh.seq_multiple(), comms->groups,
                                                    *comms->host_world);
      if (world.rank() == 0) spdlog::info("{}", line);
    }
    if (cfg.dpo.precompute_ref) reference->drop_model();
  }
  const std::string policy_logps = prog.graph->find("sequence_logps.global") ? "sequence_logps.global" : "sequence_logps";
  DpoMetrics dpo_metrics(cfg);
  if (prog.zero_mode == ZeroMode::sharded_parameters)  // ZeRO-3 shards LoRA's frozen base like the parameters
    start.frozen = ExpertSplit(cfg, mesh).zero3_shards(start.frozen);
  to_run_device(start.frozen, dev);
  const DataCursor cursor(cfg, *data, start, mesh);
  if (world.rank() == 0 && !cursor.log().empty()) spdlog::info("{}", cursor.log());
  const size_t num_params = start.params.size();
  const std::unique_ptr<TrainState> state = make_train_state(prog.zero_mode, prog,
                                                             std::move(start.params), std::move(start.opt), cfg,
                                                             *comms, dev);
  // What the graph is fed besides the data: the training state's parameters and LoRA's frozen base.
  auto graph_params = [&] {
    return start.frozen.empty() ? state->graph_params() : with_adapters(start.frozen, state->graph_params());
  };
  const bool score_each_step = cfg.data.source == DataSourceKind::synthetic && args.accuracy;
  TrainResult result;
  ExecOptions exec = exec_options(cfg, *state, score_each_step);
  if (cfg.runtime.profile_ops) exec.profile = &result.op_profile;
  const Executor ex(*prog.graph, std::move(exec));
  const std::unordered_set<const Node*> gradients = gradient_nodes(prog);
  GradAccumulator accumulated;
  StepLog log(args, start.step, total, cfg, world.rank() == 0);
  log.run_start(dev, *prog.graph, data->describe(), num_params, validation ? validation->data->describe() : "");
  if (world.rank() == 0 && start.step == total && !args.dump_grads.empty())
    spdlog::warn("--dump-grads {}: not written: no step runs (steps {}..{})", args.dump_grads, start.step, total);
  const StepThroughput throughput(cfg, mesh.dp, world.size(), dev);
  // Everything the run needs has been read and validated, on every rank (the barrier): only now may
  // the start move checkpoints aside (--start-over, a branch), so a refused run changed nothing.
  comms->host_world->barrier();
  if (world.rank() == 0) settle_checkpoint_dir(cfg.train.checkpoint_dir, args.resume, args.start_over, start.step);

  for (int64_t step = start.step; step < total; ++step) {
    const auto t0 = Clock::now();
    StepRecord rec;
    rec.step = step + 1;
    comms->watchdog->set_step(rec.step);
    inject_fault(fault, FaultWhere::step, world.rank(), rec.step, world);
    // Every rank of an SP group reads the same sequences (k micro-batches' worth); the graph slices
    // its block. The step's targets are counted over the world before any backward.
    const Batch batch = pad_to_multiple(cursor.read(step, mesh.dp_rank), mesh.seq_multiple());
    rec.targets = global_target_count(batch, mesh, *comms->host_world);
    const Tensor norms = dpo ? dpo_norms(batch, mesh, *comms->host_world, reference->dtype()) : Tensor();
    rec.data_ms = ms_since(t0);
    rec.skipped = rec.targets == 0;  // no scored position anywhere: the loss would be 0/0
    rec.lr = lr_at(cfg.train, step, total);
    const GradSyncStats synced_before = state->sync_stats();
    if (!rec.skipped) {
      RouterMetrics router(prog, cfg.model);  // a mixture of experts' load-balancing loss and expert load
      RunResult r;
      const Tensor count = k > 1 && !dpo ? target_count_feed(prog, rec.targets, dev) : Tensor();
      for (int64_t i = 0; i < k; ++i) {  // the micro-batches; only the last one's gradients are synchronised
        const bool last = i == k - 1;
        r = RunResult();  // the previous micro-batch's outputs are not held through this one's run
        const Batch micro = micro_batch(batch, i, k);
        ParamMap feeds = run_feeds(micro, graph_params(), cfg.model.vocab_size, dev);
        if (k > 1 && !dpo) feeds[passes::kTargetCount] = count;
        const Tensor ref_logps = dpo ? reference->feed(feeds, micro, norms, comms->groups) : Tensor();
        const Tensor seq_tokens = dpo ? feeds.at("seq_tokens") : Tensor();
        r = ex.run(std::move(feeds), comms->groups, [&](const Node& n, const Tensor& v) {
          if (gradients.count(&n)) {
            if (i == 0) inject_nan_into(fault, world.rank(), rec.step, v);
            accumulated.take(n, v, i, k);
          }
          if (last) state->offer(n, v);
        });
        rec.loss += host_copy(r.outputs.at(prog.loss)).to_doubles()[0];  // k > 1: this micro-batch's share
        router.add(r);
        if (dpo && mesh.sp_rank == 0)
          dpo_metrics.add(host_copy(r.outputs.at(policy_logps)), host_copy(ref_logps), host_copy(seq_tokens));
        rec.peak_bytes = std::max(rec.peak_bytes, r.peak_bytes);
      }
      if (dpo) rec.objective_metrics = dpo_metrics.finish(*comms->host_world);
      for (auto& m : router.finish()) rec.objective_metrics.push_back(std::move(m));
      state->finish_backward(r);
      comms->synchronize_device();  // device results are read on the host once every collective has finished
      if (step == start.step && !args.dump_grads.empty()) {
        const ParamMap grads = state->whole_grads();  // whole at every ZeRO mode: a collective
        // Under the checkpoint's names: a LoRA run's as its adapter directory keys them (PEFT's).
        if (world.rank() == 0) save_safetensors(args.dump_grads, host_copy(cfg.lora.enabled ? peft_keyed(grads) : grads));
      }
      rec.grad_norm = state->grad_norm(*comms->host_world);
      if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) diverged(rec, cfg);
      state->update(cfg.train, rec.grad_norm, rec.lr);
      if (score_each_step) rec.accuracy = score_accuracy(r, micro_batch(batch, k - 1, k), mesh, *comms->host_world);
    } else {
      rec.loss = rec.grad_norm = std::numeric_limits<double>::quiet_NaN();
    }
    if (dev.kind == DeviceKind::cuda) synchronize();  // the step's queued device work belongs to its time
    rec.step_ms = ms_since(t0);
    throughput.fill(rec);
    rec.epochs = cursor.epochs(rec.step);
    rec.grad_sync_ms = (state->sync_stats().exposed_seconds - synced_before.exposed_seconds) * 1000.0;
    rec.grad_sync_wait_ms = (state->sync_stats().wait_seconds - synced_before.wait_seconds) * 1000.0;
    if (validation && validation_due(cfg, rec.step, total))
      evaluate(*validation, cfg, graph_params(), *comms, dev, rec, dpo ? nullptr : &result.val_example, reference.get());
    result.steps.push_back(rec);
    log.step(rec);
    const bool saved = checkpoint_due(cfg, rec.step, total);
    if (saved) save_step_checkpoint(cfg, rec.step, *state, cursor, start.lora_base, fault, world);
    if (preempted(stop, cfg, rec.step, saved, *state, cursor, start.lora_base, fault, *comms, world)) {
      result.preempted = true;
      break;
    }
  }
  result.parameter_bytes = bytes_of(graph_params());
  result.params = host_copy(state->whole_params());
  result.optimizer_state_bytes = state->state_bytes();
  result.grad_bucket_bytes = state->grad_bucket_bytes();
  result.accumulator_bytes = accumulated.bytes();
  log.run_end(result);
  return result;
}

}  // namespace autosp
