// Rank 0's run and step lines (train/step_log.h).
#include "train/step_log.h"

#include <algorithm>
#include <limits>

#include <spdlog/spdlog.h>

#include "device/cuda/device.h"
#include "engine/dispatch.h"
#include "models/flops.h"
#include "models/lora.h"
#include "tensor/check.h"

namespace autosp {

namespace {

// Three significant digits whatever the scale: a CPU's 0.0123 TFLOP/s and a node's 3210.
// " | name value" for each of an objective's metrics (DPO's rewards and log-probabilities).
std::string metrics_text(const std::vector<std::pair<std::string, double>>& metrics) {
  std::string out;
  for (const auto& [name, v] : metrics) out += fmt::format(" | {} {:.4f}", name, v);
  return out;
}

std::string tflops_text(double t) { return t >= 100 ? fmt::format("{:.0f}", t) : fmt::format("{:.3g}", t); }

// What made targets few, to check: the loss masks that were given (by key and path) and the
// document mask. `val`: the validation data's.
std::string masks_to_check(const DataConfig& d, bool val) {
  std::string masks;
  auto add = [&](const std::string& what) { masks += str(masks.empty() ? "" : " and ", what); };
  if (val && !d.val_loss_mask_path.empty()) add(str("data.val_loss_mask_path ", d.val_loss_mask_path));
  if (!val && !d.loss_mask_path.empty()) add(str("data.loss_mask_path ", d.loss_mask_path));
  if (!val)
    for (size_t k = 0; k < d.mix.size(); ++k)
      if (!d.mix[k].loss_mask_path.empty()) add(str("data.mix[", k, "].loss_mask_path ", d.mix[k].loss_mask_path));
  if (d.document_mask) add("data.document_mask");
  return masks.empty() ? std::string("the data") : masks;
}

}  // namespace

StepLog::StepLog(const TrainArgs& args, int64_t start, int64_t total, const Config& cfg, bool lead)
    : cfg_(cfg), lead_(lead), quiet_(args.quiet), start_(start), total_(total),
      began_(std::chrono::steady_clock::now()), metrics_path_(args.metrics), curves_(cfg, lead) {
  if (!lead || args.metrics.empty()) return;
  metrics_.open(args.metrics, std::ios::app);
  if (!metrics_) throw UsageError(str("--metrics ", args.metrics, ": cannot open for writing"));
}

StepThroughput::StepThroughput(const Config& cfg, int64_t dp, int world, Device dev) {
  const int64_t sequences = cfg.data.batch_size * cfg.train.gradient_accumulation_steps * dp;
  tokens_ = static_cast<double>(sequences * cfg.data.seq_len);
  LoraFlopParams lora;  // LoRA: the frozen base runs no weight-gradient GEMMs; the adapters train
  if (cfg.lora.enabled) lora = lora_flop_params(cfg.model, cfg.lora.target_modules, cfg.lora.modules_to_save, cfg.lora.r);
  flops_ = step_flops(cfg.model, sequences, cfg.data.seq_len, lora.frozen, lora.adapters);
  const double device_peak = cfg.runtime.peak_tflops > 0       ? cfg.runtime.peak_tflops
                             : dev.kind == DeviceKind::cuda ? dense_bf16_peak_tflops(dev.index)
                                                            : 0;
  peak_ = device_peak * world;
}

void StepThroughput::fill(StepRecord& rec) const {
  const double seconds = rec.step_ms / 1000.0;
  rec.tokens = static_cast<int64_t>(tokens_);
  if (rec.skipped) {  // it read its data and ran nothing: no throughput to report
    rec.tokens_per_sec = rec.tflops = std::numeric_limits<double>::quiet_NaN();
    rec.mfu = -1;
    return;
  }
  rec.tokens_per_sec = tokens_ / seconds;
  rec.tflops = flops_ / seconds / 1e12;
  rec.mfu = peak_ > 0 ? rec.tflops / peak_ : -1;
}

void StepLog::run_end(const TrainResult& result) const {
  if (!lead_ || !cfg_.runtime.profile_ops || result.steps.empty()) return;
  double step_ms = 0;
  for (const StepRecord& s : result.steps) step_ms += s.step_ms;
  spdlog::info("{}", op_profile_table(result.op_profile, static_cast<int64_t>(result.steps.size()), step_ms));
}

void StepLog::run_start(Device dev, const Graph& program, const std::string& data, size_t num_params,
                        const std::string& validation_data) const {
  if (!lead_) return;
  if (dev.kind == DeviceKind::cuda)
    spdlog::info("device: {} (local rank's GPU; attention {})", dev.str(), attention_backend_name(cfg_.runtime.attention));
  spdlog::info("data: {}; {} parameters; steps {}..{}", data, num_params, start_, total_);
  if (!validation_data.empty())
    spdlog::info("validation: every {} steps and after the last, {} batches of {}", cfg_.train.eval_every,
                 cfg_.train.eval_batches, validation_data);
  if (cfg_.runtime.dtype == DType::bf16)
    spdlog::info("dtype: bf16 mixed precision (f32 master weights and AdamW state, bf16 compute){}",
                 dev.kind == DeviceKind::cpu ? "; " + cpu_bf16_numerics(program) : "");
}

void StepLog::step(const StepRecord& rec) {
  if (lead_ && rec.skipped)
    spdlog::warn("step {}: no position of the batch is scored (every label is -100: an all-EOS window under "
                 "data.document_mask, or fully masked data); skipped without an update",
                 rec.step);
  targets_ += rec.targets, tokens_ += rec.tokens;
  const double fraction = tokens_ > 0 ? static_cast<double>(targets_) / static_cast<double>(tokens_) : 1;
  if (lead_ && !warned_few_targets_ && (rec.step == start_ + 1 || rec.step == total_) && fraction < kFewTargets &&
      cfg_.data.source != DataSourceKind::synthetic) {  // the synthetic task scores only its answers
    warned_few_targets_ = true;
    spdlog::warn("only {} of {} input tokens ({:.3f}%) after step {} are targets: the loss masks{} remove nearly "
                 "everything (check {} and how the masks were made)",
                 targets_, tokens_, 100 * fraction, rec.step, cfg_.data.document_mask ? " and document mask" : "",
                 masks_to_check(cfg_.data, false));
  }
  // The same for the validation data, once: its masks may remove everything while training's do not.
  if (lead_ && rec.evaluated && !warned_few_val_targets_ && cfg_.data.source != DataSourceKind::synthetic &&
      static_cast<double>(rec.val_targets) < kFewTargets * static_cast<double>(rec.val_tokens)) {
    warned_few_val_targets_ = true;
    spdlog::warn("validation after step {}: only {} of {} input tokens ({:.3f}%) of data.val_path {} are targets: "
                 "{} remove{} (check {} and how the masks were made){}",
                 rec.step, rec.val_targets, rec.val_tokens,
                 100 * static_cast<double>(rec.val_targets) / static_cast<double>(std::max<int64_t>(1, rec.val_tokens)),
                 cfg_.data.val_path, cfg_.data.val_loss_mask_path.empty() ? "the document mask" : "the validation loss masks",
                 str(cfg_.data.val_loss_mask_path.empty() ? "s" : "", rec.val_targets == 0 ? " everything" : " nearly everything"),
                 masks_to_check(cfg_.data, true),
                 rec.val_targets == 0 ? "; no validation loss or accuracy is reported" : "");
  }
  curves_.step(rec);
  const bool due = rec.step % cfg_.train.log_every == 0 || rec.step == total_ || rec.step == start_ + 1 ||
                   rec.evaluated || rec.skipped;
  if (!lead_ || !due) return;
  auto file_log = spdlog::get("train.log");
  if (!quiet_ || file_log) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
    const double eta = elapsed / static_cast<double>(rec.step - start_) * static_cast<double>(total_ - rec.step);
    // A skipped step has no loss, norm or throughput: it says so instead.
    const std::string objective = metrics_text(rec.objective_metrics);  // DPO's rewards and log-probabilities
    const std::string work =
        rec.skipped ? std::string("skipped: no targets")
                    : fmt::format("loss {:.4f}{}{} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s", rec.loss,
                                  rec.accuracy >= 0 ? fmt::format(" | acc {:.3f}", rec.accuracy) : "", objective,
                                  rec.lr, rec.grad_norm, rec.tokens_per_sec);
    const std::string line = fmt::format(
        "step {}/{} | {}{} | targets {}{} | {:.1f} ms (sync {:.1f}, data {:.1f}) | peak {:.1f} MiB{} | eta {}m{:02d}s",
        rec.step, total_, work, rec.skipped ? fmt::format(" | lr {:.3e}", rec.lr) : "", rec.targets,
        rec.skipped ? "" : fmt::format(" | {} TFLOP/s{}", tflops_text(rec.tflops),
                                       rec.mfu >= 0 ? fmt::format(" | MFU {:.1f}%", rec.mfu * 100) : ""),
        rec.step_ms, rec.grad_sync_ms, rec.data_ms, static_cast<double>(rec.peak_bytes) / (1024.0 * 1024.0),
        rec.epochs.empty() ? "" : " | " + rec.epochs, static_cast<int64_t>(eta) / 60, static_cast<int64_t>(eta) % 60);
    const std::string val =
        !rec.evaluated         ? ""
        : rec.val_targets == 0 ? fmt::format("step {}/{} | val: no targets (the masks remove every one)", rec.step, total_)
                               : fmt::format("step {}/{} | val loss {:.4f}{}", rec.step, total_, rec.val_loss,
                                             rec.val_accuracy >= 0 ? fmt::format(" | val acc {:.3f}", rec.val_accuracy)
                                                                   : metrics_text(rec.val_objective_metrics));
    if (!quiet_) spdlog::info("{}", line);
    else file_log->info("{}", line);
    if (!val.empty() && !quiet_) spdlog::info("{}", val);
    else if (!val.empty()) file_log->info("{}", val);
  }
  if (metrics_.is_open()) {
    nlohmann::json m = {{"step", rec.step},         {"loss", rec.loss},       {"lr", rec.lr},
                        {"grad_norm", rec.grad_norm}, {"tokens_per_sec", rec.tokens_per_sec},
                        {"step_ms", rec.step_ms},   {"peak_bytes", rec.peak_bytes},
                        {"tflops", rec.tflops},     {"grad_sync_ms", rec.grad_sync_ms},
                        {"data_ms", rec.data_ms},   {"targets", rec.targets},
                        {"tokens", rec.tokens}};
    if (rec.mfu >= 0) m["mfu"] = rec.mfu;
    if (!rec.epochs.empty()) m["epochs"] = rec.epochs;
    if (rec.accuracy >= 0) m["accuracy"] = rec.accuracy;
    if (rec.skipped) m["skipped"] = true;  // its loss and norm are NaN (null in JSON)
    for (const auto& [name, v] : rec.objective_metrics) m[name] = v;
    if (rec.evaluated) {  // without targets there is neither: both null
      m["val_loss"] = rec.val_targets > 0 ? nlohmann::json(rec.val_loss) : nlohmann::json();
      m["val_accuracy"] = rec.val_targets > 0 && rec.val_accuracy >= 0 ? nlohmann::json(rec.val_accuracy) : nlohmann::json();
      for (const auto& [name, v] : rec.val_objective_metrics) m[name] = v;
      m["val_targets"] = rec.val_targets;
    }
    metrics_ << m.dump() << "\n" << std::flush;
    if (!metrics_) throw RuntimeFailure(str("--metrics ", metrics_path_, ": write failed (disk full or I/O error)"));
  }
}

}  // namespace autosp
