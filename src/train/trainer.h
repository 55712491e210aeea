// The training loop behind autosp-train: builds the joint forward+backward graph once, then per
// step reads a batch, runs the graph on each of its micro-batches (train.gradient_accumulation_steps),
// all-reduces gradients over the world, clips, steps AdamW, logs (rank 0) and checkpoints. Everything a test wants to check is returned in TrainResult.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "engine/executor.h"
#include "tensor/tensor.h"

namespace autosp {

struct TrainArgs {
  // The run's step count is the config's train.steps (--steps sets it; config/config.h with_steps).
  std::string init_from;         // safetensors weights to start from
  std::string resume;            // checkpoint directory (or root) to continue from
  std::string metrics;           // JSON lines file, one object per logged step (rank 0)
  std::string dump_grads;        // safetensors of the first step's gradients (rank 0)
  std::string config_path;       // the config file (an input: --metrics and --dump-grads may not overwrite it)
  // A train.checkpoint_dir that holds step_* directories needs --resume, or this: its checkpoints
  // move aside into previous-<time>-<pid>/ and the run starts again (docs/reliability.md).
  bool start_over = false;
  bool quiet = false;            // no per-step log lines
  // Score the synthetic task's accuracy each step (StepRecord::accuracy). It copies this rank's
  // logits to the host and scans them there (at S = 32k and a 32k vocabulary, 2 GiB and seconds
  // per step), so autosp-bench, which times steps, turns it off.
  bool accuracy = true;
};

struct StepRecord {
  int64_t step = 0;  // 1-based number of the completed step
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_sec = 0, step_ms = 0;
  double data_ms = 0;            // reading the step's batch and counting its targets
  double tflops = 0;             // the job's model TFLOP/s (models/flops.h step_flops of the global batch)
  double mfu = -1;               // tflops / (peak × ranks) (train/step_log.h StepThroughput); -1: no peak known
  int64_t targets = 0;           // the step's scored targets over the world (the loss's denominator)
  int64_t tokens = 0;            // the step's input tokens over the world, scored or not (what tokens/s counts)
  std::string epochs;            // where the data stands after the step: "epoch 1 (37%)" (train/data_order.h)
  double grad_sync_ms = 0;       // time blocked on the gradient all-reduce (train/grad_sync.h)
  double grad_sync_wait_ms = 0;  // the part of it after the backward (GradSyncStats::wait_seconds)
  size_t peak_bytes = 0;
  double accuracy = -1;  // synthetic task accuracy on this batch (-1 for other sources or when not scored)
  // What the objective reports besides the loss, in order (train.objective "dpo": TRL's
  // rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen,
  // logps/rejected, means over the step's pairs; train/preference.h). Empty for "lm".
  std::vector<std::pair<std::string, double>> objective_metrics;
  // No rank's batch had a scored position (every label -100), so the loss would be 0/0: the step
  // ran no graph and made no update (the data and the learning-rate schedule move on); loss, norm
  // and the throughput (tokens_per_sec, tflops) are NaN, mfu -1; tokens still counts what was read.
  bool skipped = false;
  // Validation after this step (train.eval_every, and after the last step): the mean over the
  // train.eval_batches validation batches that have targets of each batch's loss (the global token
  // mean, like the training loss), and the fraction of labelled positions whose argmax is the
  // label; with no target in any batch (masks that remove everything) neither exists: val_loss
  // NaN, val_accuracy -1. The targets and input tokens are counted over the world. Forward only:
  // training's parameters, optimizer state and data order are untouched.
  bool evaluated = false;
  double val_loss = 0, val_accuracy = -1;
  // train.objective "dpo": TRL's metrics on the validation pairs, eval_ prefixed
  // (eval_rewards/chosen, ...; train/validation.h), and no val_accuracy (-1). Empty for "lm".
  std::vector<std::pair<std::string, double>> val_objective_metrics;
  int64_t val_targets = 0, val_tokens = 0;
};

// A validation sequence for the log (rank 0): its tokens, labels and the model's argmax at each
// position, and for the synthetic task format_example's line (train/data.h).
struct ValExample {
  std::vector<int64_t> input, labels, predicted;  // [S]
  std::string formatted;                          // synthetic data only
};

struct TrainResult {
  std::vector<StepRecord> steps;  // every step run by this process
  ParamMap params;                // final parameters
  // Stopped early by a preemption signal (train/preempt.h) on any rank, after the checkpoint of the
  // last step (when train.checkpoint_dir is set); the app then exits with kExitPreempted.
  bool preempted = false;
  // This rank's optimizer-state bytes (the AdamW moments: whole at zero_optimization.stage 0, its
  // shard at 1, 2 and 3), the gradient bucket buffers it held after the last step (ZeRO-2: none;
  // ZeRO-3 has no buckets) and the parameters it holds between steps (whole below stage 3, its
  // shards at 3).
  size_t optimizer_state_bytes = 0, grad_bucket_bytes = 0, parameter_bytes = 0;
  // The gradient accumulator's buffers (train/accumulation.h; none with one micro-batch per step).
  size_t accumulator_bytes = 0;
  // Per op kind, the kernels' time over every step run (runtime.profile_ops; else empty).
  OpProfile op_profile;
  // The last validation's first sequence that the model got entirely right (else its first
  // sequence); rank 0 only, empty without validation.
  ValExample val_example;
};

TrainResult train(const Config& cfg, const TrainArgs& args, Communicator& world);

// The parameters a run starts from, in `master` dtype on the host: the checkpoint args.resume
// names, else the weights args.init_from, else model.from's directory, else the seeded
// initialisation. What train() starts from,
// and how autosp-sample loads a model.
ParamMap starting_params(const Config& cfg, const TrainArgs& args, DType master);

}  // namespace autosp
