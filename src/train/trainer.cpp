// The training loop.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "comm/job_comms.h"
#include "kernels/cpu/matmul.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "device/cuda/device.h"
#include "train/data.h"
#include "engine/executor.h"
#include "train/fault.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "engine/program.h"
#include "tensor/safetensors.h"

namespace autosp {
namespace {

// The device this rank runs on (runtime.device): the host, or the GPU of its node-local rank, which
// becomes the process's current device (a build without CUDA, or a machine without a GPU, is a
// UsageError saying so).
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

// Every tensor of `m` moved to `dev` (copied when it is elsewhere).
void move_to(ParamMap& m, Device dev) {
  for (auto& [name, t] : m)
    if (t.device() != dev) t = to_device(t, dev);
}

// Host copies of `m`'s tensors (for checkpoints, --dump-grads and the returned parameters).
ParamMap on_host(const ParamMap& m) {
  ParamMap out;
  for (const auto& [name, t] : m) out[name] = t.device().kind == DeviceKind::cpu ? t : to_device(t, Device{});
  return out;
}

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

// The batch padded at the end to a sequence length P divides: pad tokens 0 with ignored labels
// (-100) and position 0. Causal attention never lets a real token see the padding, and the
// ignored labels keep the loss and gradients exact.
Batch pad_to_multiple(const Batch& b, int64_t p) {
  const int64_t B = b.input_ids.dim(0), S = b.input_ids.dim(1), Sp = (S + p - 1) / p * p;
  if (Sp == S) return b;
  auto pad = [&](const Tensor& t, int64_t fill) {
    Tensor out = Tensor::empty({B, Sp}, DType::i64);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < Sp; ++j) out.data<int64_t>()[i * Sp + j] = j < S ? t.data<int64_t>()[i * S + j] : fill;
    return out;
  };
  return {pad(b.input_ids, 0), pad(b.labels, -100), pad(b.position_ids, 0)};
}

}  // namespace

TrainResult train(const Config& cfg, const TrainArgs& args, Communicator& world) {
  const Device dev = pick_device(cfg);
  const bool on_gpu = dev.kind == DeviceKind::cuda;
  const DType dt = cfg.runtime.dtype, master = master_dtype(dt);  // compute; parameters and optimizer state
  const PassContext ctx = pass_context(cfg, world.size(), world.rank());
  // AUTOSP_FAULT injects failures in tests; the watchdog of `comms` makes the other ranks end the job.
  const std::optional<Fault> fault = fault_from_env(world.size());
  // NCCL or the world for device tensors, the mesh, every collective under the watchdog (comm/job_comms.h).
  const std::unique_ptr<JobComms> comms = make_job_comms(world, dev, static_cast<int>(ctx.sp_size));
  const ProcessMesh& mesh = comms->mesh;
  Communicator& host_world = *comms->host_world;
  if (cfg.runtime.threads > 0) cpu::set_num_threads(static_cast<int>(cfg.runtime.threads));
  const bool lead = world.rank() == 0;
  const int64_t total = args.steps.value_or(cfg.train.steps);
  if (total < 0) throw UsageError(str("--steps ", total, ": expected >= 0"));
  if (!args.resume.empty() && !args.init_from.empty()) throw UsageError("--resume and --init-from exclude each other");

  RankProgram prog = build_program(cfg, dt, Stage::joint, ctx);
  Executor ex(*prog.graph, ExecOptions{.attention = cfg.runtime.attention});
  auto data = make_data_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));

  TrainResult result;
  AdamW opt;
  int64_t start = 0;
  if (!args.resume.empty()) {
    Checkpoint ck = load_checkpoint(args.resume, cfg, master);
    result.params = std::move(ck.params);
    opt = std::move(ck.optimizer);
    start = ck.step;
    if (lead) spdlog::info("resumed from {} at step {}", args.resume, start);
  } else {
    result.params = args.init_from.empty() ? init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), master)
                                           : load_weights(args.init_from, cfg.model, master);
    opt.init(result.params);
  }
  for (auto& [name, p] : result.params) host_world.broadcast(p, 0);  // every rank starts from rank 0's weights
  if (on_gpu) {  // parameters, gradients and AdamW state live on the device from here on
    move_to(result.params, dev);
    move_to(opt.exp_avg, dev);
    move_to(opt.exp_avg_sq, dev);
    if (lead) spdlog::info("device: {} (local rank's GPU; attention {})", dev.str(),
                           attention_backend_name(cfg.runtime.attention));
  }
  if (lead) spdlog::info("data: {}; {} parameters; steps {}..{}", data->describe(), result.params.size(), start, total);
  if (lead && dt == DType::bf16)
    spdlog::info("dtype: bf16 mixed precision (f32 master weights and AdamW state, bf16 compute){}",
                 dev.kind == DeviceKind::cpu ? "; emulated on cpu: f32 kernels, each result rounded to bf16" : "");

  // The gradient all-reduce over the world, in buckets in the order the backward produces the
  // gradients (grad_order[k] = the index into prog.param_names of the k-th gradient produced).
  std::vector<size_t> grad_order(prog.grad_names.size());
  std::iota(grad_order.begin(), grad_order.end(), size_t{0});
  auto position = [&](size_t i) { return prog.graph->position(prog.graph->find(prog.grad_names[i])); };
  std::sort(grad_order.begin(), grad_order.end(), [&](size_t a, size_t b) { return position(a) < position(b); });
  std::unique_ptr<GradSync> sync;
  std::unordered_map<const Node*, size_t> slot_of;
  if (world.size() > 1) {
    std::vector<GradSync::Slot> slots;
    for (size_t k = 0; k < grad_order.size(); ++k) {
      const Node* n = prog.graph->find(prog.grad_names[grad_order[k]]);
      slots.push_back({result.params.at(prog.param_names[grad_order[k]]).shape(), n->dtype()});
      slot_of[n] = k;
    }
    sync = std::make_unique<GradSync>(*comms->world, std::move(slots), cfg.runtime.overlap_grad_sync,
                                      static_cast<size_t>(cfg.runtime.grad_bucket_mb * 1024 * 1024));
  }

  std::ofstream metrics;
  if (lead && !args.metrics.empty()) {
    metrics.open(args.metrics, std::ios::app);
    if (!metrics) throw UsageError(str("--metrics ", args.metrics, ": cannot open for writing"));
  }
  const int64_t tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * mesh.dp;

  const auto run_start = std::chrono::steady_clock::now();
  for (int64_t step = start; step < total; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    comms->watchdog->set_step(step + 1);
    inject_fault(fault, FaultWhere::step, world.rank(), step + 1, world);
    // Every rank of an SP group reads the same sequences; the graph slices its block.
    Batch batch = pad_to_multiple(data->get(step, mesh.dp_rank, mesh.dp), ctx.sp_size);
    TensorMap feeds = {{"input_ids", batch.input_ids}, {"labels", batch.labels}, {"position_ids", batch.position_ids}};
    if (on_gpu) {
      check_batch(batch, cfg.model.vocab_size);
      for (auto& [name, t] : feeds) t = to_device(t, dev);
    }
    for (const auto& [name, p] : result.params) feeds[name] = p;
    // Each gradient goes to its bucket the moment the backward produces it (grad_sync.h).
    const GradSyncStats synced_before = sync ? sync->stats() : GradSyncStats{};
    RunResult r = ex.run(feeds, comms->groups, [&](const Node& n, const Tensor& v) {
      if (!sync) return;
      if (auto it = slot_of.find(&n); it != slot_of.end()) {
        if (fault && fault->kind == FaultKind::nan) {  // inject_nan writes host memory
          std::vector<Tensor> g{on_gpu ? to_device(v, Device{}) : v};
          inject_nan(fault, world.rank(), step + 1, g);
          if (on_gpu) copy_on_device(to_device(g[0], dev), v);
        }
        sync->ready(it->second, v);
      }
      sync->poll();
    });
    ParamMap grads;
    if (sync) {
      std::vector<Tensor> summed = sync->finish();
      for (size_t k = 0; k < grad_order.size(); ++k) grads[prog.param_names[grad_order[k]]] = summed[k];
    } else {
      for (size_t i = 0; i < prog.param_names.size(); ++i) grads[prog.param_names[i]] = r.outputs.at(prog.grad_names[i]);
    }
    // Device results are read on the host only once every collective has finished (a hung peer
    // then fails the NCCL deadline instead of blocking a copy forever).
    comms->synchronize_device();
    const Tensor loss_t = on_gpu ? to_device(r.outputs.at(prog.loss), Device{}) : r.outputs.at(prog.loss);
    if (lead && step == start && !args.dump_grads.empty()) save_safetensors(args.dump_grads, on_host(grads));

    StepRecord rec;
    rec.step = step + 1;
    rec.loss = loss_t.to_doubles()[0];
    rec.grad_norm = global_grad_norm(grads);
    // Loss and norm are all-reduced, so every rank stops here together, before a bad update
    // reaches the parameters or a checkpoint.
    if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm))
      throw RuntimeFailure(str("step ", rec.step, ": loss ", rec.loss, ", gradient norm ", rec.grad_norm,
                               " is not finite; stopping before the update (try a lower train.lr or more "
                               "train.warmup_steps, and --resume from the last checkpoint)"));
    clip_grads(grads, rec.grad_norm, cfg.train.grad_clip);
    rec.lr = lr_at(cfg.train, step, total);
    opt.update(result.params, grads, cfg.train, rec.lr);
    if (cfg.data.source == DataSourceKind::synthetic && args.accuracy) {
      // This rank's logits cover its block of the sequence: count there, sum over the world.
      const Tensor logits = on_gpu ? to_device(r.outputs.at("logits"), Device{}) : r.outputs.at("logits");
      const int64_t S = batch.labels.dim(1), block = S / ctx.sp_size;
      Tensor local = batch.labels.as_strided({batch.labels.dim(0), block}, batch.labels.strides(), ctx.sp_rank * block).contiguous();
      auto [correct, counted] = count_correct(logits.reshape({logits.numel() / logits.dim(-1), logits.dim(-1)}),
                                              local.reshape({local.numel()}));
      Tensor counts = Tensor::from_vector<int64_t>({2}, {correct, counted});
      host_world.all_reduce_sum(counts);
      const int64_t total_counted = counts.data<int64_t>()[1];
      rec.accuracy = total_counted ? static_cast<double>(counts.data<int64_t>()[0]) / static_cast<double>(total_counted) : 0.0;
    }
    // The step's device work (AdamW is still queued here) belongs to its time, not the next step's.
    if (on_gpu) synchronize();
    rec.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    rec.tokens_per_sec = static_cast<double>(tokens_per_step) / (rec.step_ms / 1000.0);
    rec.peak_bytes = r.peak_bytes;
    if (sync) {
      rec.grad_sync_ms = (sync->stats().exposed_seconds - synced_before.exposed_seconds) * 1000.0;
      rec.grad_sync_wait_ms = (sync->stats().wait_seconds - synced_before.wait_seconds) * 1000.0;
    }
    result.steps.push_back(rec);

    const bool log_now = rec.step % cfg.train.log_every == 0 || rec.step == total || step == start;
    if (lead && log_now) {
      // --quiet keeps progress lines off stderr; the run's train.log (apps/train.cpp) still gets them.
      auto file_log = spdlog::get("train.log");
      if (!args.quiet || file_log) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
        const double eta = elapsed / static_cast<double>(rec.step - start) * static_cast<double>(total - rec.step);
        const std::string line = fmt::format(
            "step {}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} ms | peak {:.1f} MiB | eta {}m{:02d}s",
            rec.step, total, rec.loss, rec.accuracy >= 0 ? fmt::format(" | acc {:.3f}", rec.accuracy) : "", rec.lr,
            rec.grad_norm, rec.tokens_per_sec, rec.step_ms, static_cast<double>(rec.peak_bytes) / (1024.0 * 1024.0),
            static_cast<int64_t>(eta) / 60, static_cast<int64_t>(eta) % 60);
        if (!args.quiet) spdlog::info("{}", line);
        else file_log->info("{}", line);
      }
      if (metrics.is_open()) {
        nlohmann::json m = {{"step", rec.step},         {"loss", rec.loss},       {"lr", rec.lr},
                            {"grad_norm", rec.grad_norm}, {"tokens_per_sec", rec.tokens_per_sec},
                            {"step_ms", rec.step_ms},   {"peak_bytes", rec.peak_bytes}};
        if (rec.accuracy >= 0) m["accuracy"] = rec.accuracy;
        metrics << m.dump() << "\n" << std::flush;
      }
    }
    const bool ckpt_now = !cfg.train.checkpoint_dir.empty() &&
                          ((cfg.train.checkpoint_every > 0 && rec.step % cfg.train.checkpoint_every == 0) || rec.step == total);
    if (lead && ckpt_now) {
      SaveOptions save;
      save.keep_last = cfg.train.keep_checkpoints;
      save.before_commit = [&] { inject_fault(fault, FaultWhere::checkpoint, world.rank(), rec.step, world); };
      // Checkpoints are host files: device state is copied down for them.
      AdamW host_opt;
      if (on_gpu) {
        host_opt.exp_avg = on_host(opt.exp_avg);
        host_opt.exp_avg_sq = on_host(opt.exp_avg_sq);
        host_opt.step = opt.step;
      }
      std::string dir = save_checkpoint(cfg.train.checkpoint_dir, rec.step, on_gpu ? on_host(result.params) : result.params,
                                        on_gpu ? host_opt : opt, cfg.resolved, save);
      spdlog::info("saved checkpoint {}", dir);
    }
  }
  if (on_gpu) result.params = on_host(result.params);
  return result;
}

}  // namespace autosp
