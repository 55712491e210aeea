// Validation and scoring: the validation program (the rank's forward: no backward, no gradient
// sync, no optimizer) run over train.eval_batches batches of the validation data, read like a
// training step's global batch so the result equals the P = 1 value; the synthetic task's accuracy
// on a training step's batch; and the first validation sequence formatted for the log. Every
// rank scores its block of the sequence (comm/mesh.h RankLayout) and the counts are summed over
// the world.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/job_comms.h"
#include "compiler/program.h"
#include "config/config.h"
#include "engine/executor.h"
#include "train/data.h"
#include "train/preference.h"
#include "train/trainer.h"

namespace autosp {

struct Validation {
  RankProgram prog;
  std::unique_ptr<Executor> ex;
  std::unique_ptr<DataSource> data;
};

// The positions of a sequence of S this rank holds, in its order: [sp_rank·S/sp, (sp_rank + 1)·S/sp),
// or with a ring its zigzag units (graph/passes/autosp/autosp.h).
std::vector<int64_t> rank_positions(const RankLayout& layout, int64_t S);

// This rank's labels [B, its positions] of the batch's [B, S], flattened (the rows of its logits).
Tensor local_labels(const Batch& batch, const RankLayout& layout);

// What the graph outputs for scoring, as rows on the host: the predictions (runtime.tiled_loss: each
// position's argmax, i64 [rows]) or the logits [rows, V].
Tensor scored_rows(const RunResult& r);

// argmax over the last dim of host logits [rows, V] (first maximum on ties); predictions [rows]
// (i64) are that already.
std::vector<int64_t> argmax_rows(const Tensor& logits);

// Built only when train.eval_every > 0.
std::optional<Validation> make_validation(const Config& cfg, DType dtype, const RankLayout& layout);

// Whether validation runs after step `step` (1-based) of `total`: every train.eval_every steps and
// after the last.
bool validation_due(const Config& cfg, int64_t step, int64_t total);

// Validation loss and accuracy with `params` (what the graph's parameter nodes are fed) into
// `rec`; `example` receives rank 0's first sequence (the first one it got entirely right) when
// non-null. With train.objective "dpo", `reference` gives the reference's sums of the validation
// pairs, and `rec` gets the DPO loss and TRL's metrics (eval_rewards/chosen, ...; no accuracy and
// no example): each the mean over the validation batches of the batch's mean over its pairs (every
// dp rank's batch k together), as TRL's evaluation logs them.
void evaluate(Validation& v, const Config& cfg, const ParamMap& params, JobComms& comms, Device dev,
              StepRecord& rec, ValExample* example, const DpoReference* reference = nullptr);

// The synthetic task's accuracy on a training step's batch over the world, from the step's
// outputs (this rank's logits, or predictions under runtime.tiled_loss).
double score_accuracy(const RunResult& r, const Batch& batch, const RankLayout& layout, Communicator& host_world);

}  // namespace autosp
