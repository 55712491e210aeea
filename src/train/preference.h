// Preference training (train.objective "dpo") in the step: what the DPO graph is fed besides the
// data, the reference model that computes its reference log-probabilities, and the metrics TRL's
// DPOTrainer logs. The graph side is models/model.h GraphOptions::dpo_slots and the ops
// sequence_logps and dpo_loss; exactness under sequence parallelism is
// graph/passes/autosp/normalize_loss's.
//
// A micro-batch row holds whole pairs (scripts/prepare_data.py --preference puts both sequences
// of a pair into one window). Its pairs get slots 0, 1, ... in the order their first scored
// target appears; pair_slots[t] is +(k + 1) / −(k + 1) on the targets of slot k's chosen / rejected
// completion, 0 elsewhere. The loss is the mean over the step's pairs (all micro-batches of every
// dp rank, TRL's mean over its batch), so the norms [2] (the step's pairs, its chosen completion
// targets) are counted on the host before the first micro-batch runs, like the LM loss's targets.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"
#include "compiler/program.h"
#include "config/config.h"
#include "engine/executor.h"
#include "tensor/tensor.h"
#include "train/data.h"
#include "train/dpo_ref_file.h"

namespace autosp {

// A micro-batch's DPO feeds: pair_slots i64 [B, S] and seq_tokens [B, 2, K] (each sequence's
// completion targets) in `dtype`. A row whose pair has scored targets on one side only (its window
// cut it), or that holds more than K pairs, is a UsageError naming the row and the pair id.
std::map<std::string, Tensor> dpo_feeds(const Batch& b, int64_t K, DType dtype);

// The step's norms [2] in `dtype`: its pairs and chosen completion targets over the world (each
// SP group's rank 0 counts its batch; a collective on `host`).
Tensor dpo_norms(const Batch& step_batch, const ProcessMesh& mesh, Communicator& host, DType dtype);

// The reference model: the forward of the same program (rank_forward: AutoSP, ZeRO-3's gathers)
// fed the starting weights, or with LoRA the frozen base with every lora_B zero (the adapters off,
// as PEFT's disable_adapter). It runs each micro-batch before the policy and hands its sequence
// sums to the policy's graph as ref_logps.
//
// With dpo.precompute_ref, precompute() runs the reference once over every window of a split's
// data (each rank all of them, so every SP group's collectives line up; dp ranks repeat the work)
// and keeps each pair's two sums by pair id (or use() takes them from dpo.precompute_ref's file);
// drop_model() then frees the reference's program and weights, so the step holds one model, and
// feed() looks the sums up instead of running it. A split's pair ids are its own (the training
// and the validation pairs both count from 1), so each split has its table.
enum class DpoSplit { train, val };

class DpoReference {
 public:
  DpoReference(const Config& cfg, const ProcessMesh& mesh, ParamMap params, Device dev);
  // The number of pairs precomputed.
  size_t precompute(DpoSplit split, const DataSource& data, int64_t batch, int64_t seq_multiple,
                    const CommGroups& groups);
  void use(DpoSplit split, RefLogps table) { tables_[size_t(split)] = std::move(table); }  // a file's sums
  const RefLogps& table(DpoSplit split) const { return tables_[size_t(split)]; }
  void drop_model();  // after the precomputation: feed() reads the tables from here on
  // Adds a micro-batch's DPO inputs to the policy's `feeds` (its data and parameters are there, on
  // the run device): pair_slots, seq_tokens (dpo_feeds), the step's dpo_norms (given on the host),
  // and ref_logps, which the reference computes here (a collective under sequence parallelism) or
  // the precomputed table gives. Returns ref_logps.
  Tensor feed(std::map<std::string, Tensor>& feeds, const Batch& micro, const Tensor& norms,
              const CommGroups& groups, DpoSplit split = DpoSplit::train) const;
  DType dtype() const { return dtype_; }  // the DPO inputs' dtype

 private:
  Tensor run(std::map<std::string, Tensor>& feeds, const Batch& micro, const Tensor& norms,
             const CommGroups& groups) const;
  RankProgram prog_;
  std::unique_ptr<Executor> ex_;
  ParamMap params_;
  std::string output_;
  Device dev_;
  DType dtype_;
  int64_t slots_;
  std::array<RefLogps, 2> tables_;  // precomputed, by DpoSplit: |pair id| → (chosen, rejected)
};

// dpo.precompute_ref on every rank (a collective on `host`): the sums from `path` when every rank
// finds it there under `key` (train/dpo_ref_file.h), else precomputed by every rank and written by
// world rank 0 (a file it cannot write is a warning: the sums stay in memory). Returns a line for
// the log that says which, and why.
std::string precompute_reference(DpoReference& reference, DpoSplit split, const std::string& path,
                                 const RefLogpsKey& key,
                                 const DataSource& data, int64_t batch, int64_t seq_multiple,
                                 const CommGroups& groups, Communicator& host);

// The reference's weights from a run's starting point: `base` (the model before any training:
// model.from, --init-from or the seed's initialisation; with LoRA the frozen base and the base
// values of the modules_to_save tensors) in the program's dtypes; with LoRA plus `adapters`
// (their shapes) with each lora_B zero.
ParamMap dpo_reference_params(const Config& cfg, const RankProgram& prog, const ParamMap& base,
                              const ParamMap& adapters);

// TRL's metrics over a step's pairs: each micro-batch adds its policy and reference sums and
// tokens [B, 2, K] (host tensors; only an SP group's rank 0 adds, so each pair counts once), and
// finish() sums them over the world and returns the means.
class DpoMetrics {
 public:
  explicit DpoMetrics(const Config& cfg) : beta_(cfg.dpo.beta), ipo_(cfg.dpo.loss_type == "ipo") {}
  void add(const Tensor& policy, const Tensor& reference, const Tensor& tokens);
  std::vector<std::pair<std::string, double>> finish(Communicator& host);

 private:
  double beta_;
  bool ipo_;
  std::vector<double> sums_ = std::vector<double>(7, 0.0);  // pairs, then one sum per metric
};

}  // namespace autosp
