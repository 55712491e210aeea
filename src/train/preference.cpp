// Preference training in the step (train/preference.h): the DPO feeds, the reference model and
// TRL's metrics.
#include "train/preference.h"

#include <cstdlib>
#include <map>
#include <optional>

#include "models/lora.h"
#include "train/expert_split.h"
#include "train/run_device.h"
#include "tensor/check.h"

namespace autosp {

namespace {

constexpr int64_t kIgnore = -100;

// Row b's pair slots: each pair id with a scored target, by first appearance.
std::map<int64_t, int64_t> row_slots(const int64_t* labels, const int64_t* pairs, int64_t S, int64_t b, int64_t K) {
  std::map<int64_t, int64_t> slot;  // |pair id| → k
  for (int64_t t = 0; t < S; ++t) {
    const int64_t p = std::llabs(pairs[t]);
    if (labels[t] == kIgnore || p == 0 || slot.count(p)) continue;
    const int64_t k = static_cast<int64_t>(slot.size());
    if (k == K)
      throw UsageError(str("data.pairs_path: sequence ", b, " of the batch holds more than ", K, " pairs (", S,
                           " tokens); pair ids are not those scripts/prepare_data.py --preference writes"));
    slot[p] = k;
  }
  return slot;
}

}  // namespace

std::map<std::string, Tensor> dpo_feeds(const Batch& batch, int64_t K, DType dtype) {
  AUTOSP_ASSERT(batch.pair_ids.defined(), "a DPO batch without pair ids");
  const Tensor labels = batch.labels.contiguous(), pairs = batch.pair_ids.contiguous();
  const int64_t B = labels.dim(0), S = labels.dim(1);
  std::vector<int64_t> slots(static_cast<size_t>(B * S), 0);
  std::vector<double> tokens(static_cast<size_t>(B * 2 * K), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* y = labels.data<int64_t>() + b * S;
    const int64_t* p = pairs.data<int64_t>() + b * S;
    const std::map<int64_t, int64_t> slot = row_slots(y, p, S, b, K);
    for (int64_t t = 0; t < S; ++t) {
      if (y[t] == kIgnore || p[t] == 0) continue;
      const int64_t k = slot.at(std::llabs(p[t]));
      slots[size_t(b * S + t)] = p[t] > 0 ? k + 1 : -(k + 1);
      tokens[size_t((b * 2 + (p[t] > 0 ? 0 : 1)) * K + k)] += 1;
    }
    for (const auto& [id, k] : slot)
      if (tokens[size_t(b * 2 * K + k)] == 0 || tokens[size_t((b * 2 + 1) * K + k)] == 0)
        throw UsageError(str("data.pairs_path: pair id ", id, " in sequence ", b, " of the batch has completion "
                             "targets on its ", tokens[size_t(b * 2 * K + k)] == 0 ? "rejected" : "chosen",
                             " side only (a pair's two sequences must share one window: scripts/prepare_data.py "
                             "--preference with the run's data.seq_len)"));
  }
  return {{"pair_slots", Tensor::from_vector<int64_t>({B, S}, slots)},
          {"seq_tokens", Tensor::from_vector<double>({B, 2, K}, tokens).to(dtype)}};
}

Tensor dpo_norms(const Batch& step_batch, const ProcessMesh& mesh, Communicator& host, DType dtype) {
  std::vector<double> n{0, 0};
  if (mesh.sp_rank == 0) {
    const Tensor labels = step_batch.labels.contiguous(), pairs = step_batch.pair_ids.contiguous();
    const int64_t B = labels.dim(0), S = labels.dim(1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t* y = labels.data<int64_t>() + b * S;
      const int64_t* p = pairs.data<int64_t>() + b * S;
      n[0] += static_cast<double>(row_slots(y, p, S, b, S).size());
      for (int64_t t = 0; t < S; ++t) n[1] += y[t] != kIgnore && p[t] > 0;
    }
  }
  Tensor total = Tensor::from_vector<double>({2}, n);
  host.all_reduce_sum(total);
  return total.to(dtype);
}

ParamMap dpo_reference_params(const Config& cfg, const RankProgram& prog, const ParamMap& base,
                              const ParamMap& adapters) {
  ParamMap out;
  for (const auto& [name, t] : base) {
    const Node* n = prog.graph->find(name);
    if (n) out[name] = t.to(n->dtype());
  }
  if (!cfg.lora.enabled) return out;
  for (const auto& [name, t] : adapters) {
    const Node* n = prog.graph->find(name);
    AUTOSP_ASSERT(n, "adapter tensor ", name, " is not in the program");
    if (!out.count(name)) out[name] = t.to(n->dtype());  // lora_A, lora_B (modules_to_save: the base's)
  }
  for (const std::string& w : lora_target_weights(cfg.model, cfg.lora.target_modules)) {
    Tensor& b = out.at(lora_b_name(w));
    b = Tensor::from_vector<double>(b.shape(), std::vector<double>(static_cast<size_t>(b.numel()), 0.0)).to(b.dtype());
  }
  return out;
}

DpoReference::DpoReference(const Config& cfg, const ProcessMesh& mesh, ParamMap params, Device dev)
    : prog_(build_program(cfg, cfg.runtime.dtype, Stage::rank_forward, mesh)), params_(std::move(params)), dev_(dev),
      dtype_(prog_.graph->find("ref_logps")->dtype()), slots_(prog_.graph->find("seq_tokens")->shape()[2].value()) {
  if (prog_.zero_mode == ZeroMode::sharded_parameters)
    params_ = ExpertSplit(cfg, mesh).zero3_shards(params_);
  to_run_device(params_, dev_);
  ExecOptions exec{.attention = cfg.runtime.attention};
  exec.transient_outputs.insert("logits");
  ex_ = std::make_unique<Executor>(*prog_.graph, std::move(exec));
  output_ = prog_.graph->find("sequence_logps.global") ? "sequence_logps.global" : "sequence_logps";
}

size_t DpoReference::precompute(DpoSplit split, const DataSource& data, int64_t batch, int64_t seq_multiple,
                                const CommGroups& groups) {
  RefLogps& table = tables_[size_t(split)];
  const int64_t n = data.sequences_per_epoch();
  AUTOSP_ASSERT(n > 0, "precomputing the reference needs a dataset with epochs");
  for (int64_t first = 0; first < n; first += batch) {
    const Batch b = pad_to_multiple(data.read(first, std::min(batch, n - first)), seq_multiple);
    std::map<std::string, Tensor> feeds = batch_feeds(b);
    to_run_device(feeds, dev_);
    const Tensor norms = Tensor::from_vector<double>({2}, {1, 1}).to(dtype_);
    const std::vector<double> ref = host_copy(run(feeds, b, norms, groups)).to_doubles();
    const Tensor labels = b.labels.contiguous(), pairs = b.pair_ids.contiguous();
    const int64_t rows = labels.dim(0), S = labels.dim(1);
    for (int64_t r = 0; r < rows; ++r)
      for (const auto& [id, k] : row_slots(labels.data<int64_t>() + r * S, pairs.data<int64_t>() + r * S, S, r, slots_))
        table[id] = {ref[size_t((r * 2) * slots_ + k)], ref[size_t((r * 2 + 1) * slots_ + k)]};
  }
  return table.size();
}

void DpoReference::drop_model() {
  ex_.reset();  // the step holds one model from here on
  params_.clear();
  prog_ = RankProgram();
}

std::string precompute_reference(DpoReference& reference, DpoSplit split, const std::string& path,
                                 const RefLogpsKey& key,
                                 const DataSource& data, int64_t batch, int64_t seq_multiple,
                                 const CommGroups& groups, Communicator& host) {
  std::string why;
  std::optional<RefLogps> stored = load_ref_logps(path, key, why);
  Tensor found = Tensor::from_vector<double>({1}, {stored ? 1.0 : 0.0});
  host.all_reduce_sum(found);  // every rank reads before rank 0 may write
  if (found.to_doubles()[0] == host.size()) {
    reference.use(split, std::move(*stored));
    return str("dpo: the reference's log-probabilities of ", reference.table(split).size(), " pairs read from ", path);
  }
  if (why.empty()) why = "another rank did not find it";
  const size_t pairs = reference.precompute(split, data, batch, seq_multiple, groups);
  std::string stored_at = str("; stored in ", path);
  if (host.rank() == 0) {
    try {
      save_ref_logps(path, key, reference.table(split));
    } catch (const std::exception& e) {
      stored_at = str("; not stored (", e.what(), "): a restart computes them again");
    }
  }
  return str("dpo: the reference's log-probabilities of ", pairs, " pairs precomputed (", path, ": ", why, ")",
             stored_at);
}

Tensor DpoReference::feed(std::map<std::string, Tensor>& feeds, const Batch& micro, const Tensor& norms,
                          const CommGroups& groups, DpoSplit split) const {
  const RefLogps& table = tables_[size_t(split)];
  if (ex_) return run(feeds, micro, norms, groups);
  std::map<std::string, Tensor> add = dpo_feeds(micro, slots_, dtype_);  // the table's sums by slot
  const Tensor labels = micro.labels.contiguous(), pairs = micro.pair_ids.contiguous();
  const int64_t rows = labels.dim(0), S = labels.dim(1);
  std::vector<double> ref(size_t(rows * 2 * slots_), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (const auto& [id, k] : row_slots(labels.data<int64_t>() + r * S, pairs.data<int64_t>() + r * S, S, r, slots_)) {
      const auto it = table.find(id);
      AUTOSP_ASSERT(it != table.end(), "pair id ", id, " has no precomputed reference");
      ref[size_t((r * 2) * slots_ + k)] = it->second.first;
      ref[size_t((r * 2 + 1) * slots_ + k)] = it->second.second;
    }
  add["ref_logps"] = Tensor::from_vector<double>({rows, 2, slots_}, ref).to(dtype_);
  add["dpo_norms"] = norms;
  to_run_device(add, feeds.at("input_ids").device());
  for (const auto& [name, t] : add) feeds[name] = t;
  return feeds.at("ref_logps");
}

Tensor DpoReference::run(std::map<std::string, Tensor>& feeds, const Batch& micro, const Tensor& norms,
                         const CommGroups& groups) const {
  const Device dev = feeds.at("input_ids").device();
  std::map<std::string, Tensor> add = dpo_feeds(micro, slots_, dtype_);
  add["dpo_norms"] = norms;
  add["ref_logps"] = Tensor::from_vector<double>(add["seq_tokens"].shape(),
                                                 std::vector<double>(size_t(add["seq_tokens"].numel()), 0.0))
                         .to(dtype_);
  to_run_device(add, dev);
  std::map<std::string, Tensor> own = feeds;  // the data (on the device), then the reference's weights
  for (const auto& [name, t] : add) own[name] = feeds[name] = t;
  for (const auto& [name, t] : params_) own[name] = t;
  Tensor ref = ex_->run(std::move(own), groups).outputs.at(output_);
  feeds["ref_logps"] = ref;
  return ref;
}

void DpoMetrics::add(const Tensor& policy, const Tensor& reference, const Tensor& tokens) {
  const std::vector<double> p = policy.to_doubles(), r = reference.to_doubles(), n = tokens.to_doubles();
  const int64_t B = policy.dim(0), K = policy.dim(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) {
      const size_t c = size_t(b * 2 * K + k), j = c + size_t(K);
      if (n[c] <= 0 || n[j] <= 0) continue;
      const double wc = ipo_ ? 1 / n[c] : 1, wr = ipo_ ? 1 / n[j] : 1;  // as the loss reads them
      const double chosen = beta_ * (p[c] - r[c]) * wc, rejected = beta_ * (p[j] - r[j]) * wr;
      const double add[7] = {1, chosen, rejected, chosen - rejected, chosen > rejected ? 1.0 : 0.0, p[c], p[j]};
      for (size_t i = 0; i < 7; ++i) sums_[i] += add[i];
    }
}

std::vector<std::pair<std::string, double>> DpoMetrics::finish(Communicator& host) {
  Tensor total = Tensor::from_vector<double>({7}, sums_);
  host.all_reduce_sum(total);
  const std::vector<double> s = total.to_doubles();
  sums_.assign(7, 0.0);
  const char* names[6] = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                          "logps/chosen", "logps/rejected"};
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < 6; ++i) out.emplace_back(names[i], s[0] > 0 ? s[i + 1] / s[0] : 0.0);
  return out;
}

}  // namespace autosp
