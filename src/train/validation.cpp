// Validation and the accuracy score (train/validation.h).
#include "train/validation.h"

#include <algorithm>
#include <limits>

#include "graph/passes/autosp/autosp.h"
#include "train/accumulation.h"
#include "train/run_device.h"

namespace autosp {
namespace {

// (correct, counted) summed over the world.
std::pair<int64_t, int64_t> world_counts(int64_t correct, int64_t counted, Communicator& host_world) {
  Tensor counts = Tensor::from_vector<int64_t>({2}, {correct, counted});
  host_world.all_reduce_sum(counts);
  return {counts.data<int64_t>()[0], counts.data<int64_t>()[1]};
}

double fraction(std::pair<int64_t, int64_t> counts) {
  return counts.second ? static_cast<double>(counts.first) / static_cast<double>(counts.second) : 0.0;
}

// The first sequence of the world's first validation batch: every rank of dp rank 0 adds the
// argmax of its block of the sequence, the sum over the world (the blocks are disjoint) is the
// whole row's prediction; rank 0 formats the first row it got entirely right (else row 0).
ValExample first_example(const Tensor& logits, const Batch& batch, int64_t S, const RankLayout& layout,
                         Communicator& host_world, bool synthetic) {
  const int64_t B = batch.input_ids.dim(0), Sp = batch.input_ids.dim(1);
  const std::vector<int64_t> pos = rank_positions(layout, Sp);
  const auto block = static_cast<int64_t>(pos.size());
  Tensor pred = Tensor::zeros({B, Sp}, DType::i64);
  if (layout.dp_rank == 0) {
    const std::vector<int64_t> local = argmax_rows(logits);  // [B, block]
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < block; ++t)
        pred.data<int64_t>()[b * Sp + pos[static_cast<size_t>(t)]] = local[static_cast<size_t>(b * block + t)];
  }
  host_world.all_reduce_sum(pred);
  if (host_world.rank() != 0) return {};
  auto row = [&](const Tensor& t, int64_t b) {
    const int64_t* p = t.data<int64_t>() + b * Sp;
    return std::vector<int64_t>(p, p + S);
  };
  int64_t pick = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto lab = row(batch.labels, b), pr = row(pred, b);
    bool all = true;
    for (int64_t t = 0; t < S; ++t)
      all &= lab[static_cast<size_t>(t)] == kIgnoreIndex || lab[static_cast<size_t>(t)] == pr[static_cast<size_t>(t)];
    if (all) {
      pick = b;
      break;
    }
  }
  ValExample ex{row(batch.input_ids, pick), row(batch.labels, pick), row(pred, pick), ""};
  if (synthetic) ex.formatted = format_example(ex.input, ex.labels, ex.predicted);
  return ex;
}

// evaluate() for train.objective "dpo" (train/validation.h).
void evaluate_dpo(Validation& v, const Config& cfg, const ParamMap& params, const DpoReference& reference,
                  JobComms& comms, Device dev, StepRecord& rec) {
  const ProcessMesh& mesh = comms.mesh;
  const std::string policy = v.prog.graph->find("sequence_logps.global") ? "sequence_logps.global" : "sequence_logps";
  std::vector<std::pair<std::string, double>> sums;  // each metric summed over the batches with pairs
  double loss_sum = 0;
  int64_t batches = 0, tokens = 0;
  rec.evaluated = true;
  rec.val_targets = 0;
  for (int64_t k = 0; k < cfg.train.eval_batches; ++k) {
    const Batch raw = v.data->get(k, mesh.dp_rank, mesh.dp);
    const Batch batch = pad_to_multiple(raw, mesh.seq_multiple());
    tokens += raw.input_ids.numel();
    rec.val_targets += global_target_count(batch, mesh, *comms.host_world);
    const Tensor norms = dpo_norms(batch, mesh, *comms.host_world, reference.dtype());
    if (norms.to_doubles()[0] == 0) continue;  // no pair in any rank's batch k: no loss (the same on every rank)
    std::map<std::string, Tensor> feeds = run_feeds(batch, params, cfg.model.vocab_size, dev);
    const Tensor ref = reference.feed(feeds, batch, norms, comms.groups, DpoSplit::val);
    const Tensor seq_tokens = feeds.at("seq_tokens");
    const RunResult r = v.ex->run(std::move(feeds), comms.groups);
    comms.synchronize_device();
    loss_sum += host_copy(r.outputs.at(v.prog.loss)).to_doubles()[0];
    DpoMetrics metrics(cfg);
    if (mesh.sp_rank == 0) metrics.add(host_copy(r.outputs.at(policy)), host_copy(ref), host_copy(seq_tokens));
    const std::vector<std::pair<std::string, double>> means = metrics.finish(*comms.host_world);
    if (sums.empty())
      for (const auto& [name, value] : means) sums.emplace_back("eval_" + name, 0.0);
    for (size_t i = 0; i < means.size(); ++i) sums[i].second += means[i].second;
    ++batches;
  }
  rec.val_tokens = tokens * mesh.dp;  // the ranks of an SP group read the same sequences
  rec.val_loss = batches > 0 ? loss_sum / static_cast<double>(batches) : std::numeric_limits<double>::quiet_NaN();
  rec.val_accuracy = -1;
  for (auto& [name, sum] : sums) sum /= static_cast<double>(batches);
  rec.val_objective_metrics = std::move(sums);
}

}  // namespace

std::vector<int64_t> rank_positions(const RankLayout& layout, int64_t S) {
  std::vector<int64_t> out;
  if (layout.ring == 1) {
    for (int64_t t = layout.sp_rank * (S / layout.sp); t < (layout.sp_rank + 1) * (S / layout.sp); ++t) out.push_back(t);
    return out;
  }
  const int64_t unit = S / (2 * int64_t{layout.sp});
  for (const auto& [a, b] : zigzag_units(layout.sp, layout.ring, layout.sp_rank))
    for (int64_t t = a * unit; t < b * unit; ++t) out.push_back(t);
  return out;
}

Tensor local_labels(const Batch& batch, const RankLayout& layout) {
  const int64_t B = batch.labels.dim(0), S = batch.labels.dim(1);
  const std::vector<int64_t> pos = rank_positions(layout, S);
  const Tensor all = batch.labels.contiguous().to(DType::i64);
  const auto n = static_cast<int64_t>(pos.size());
  Tensor out = Tensor::zeros({B * n}, DType::i64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) out.data<int64_t>()[b * n + t] = all.data<int64_t>()[b * S + pos[static_cast<size_t>(t)]];
  return out;
}

Tensor scored_rows(const RunResult& r) {
  if (auto it = r.outputs.find("predictions"); it != r.outputs.end()) {
    const Tensor pred = host_copy(it->second);
    return pred.reshape({pred.numel()});
  }
  const Tensor logits = host_copy(r.outputs.at("logits"));
  return logits.reshape({logits.numel() / logits.dim(-1), logits.dim(-1)});
}

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

std::optional<Validation> make_validation(const Config& cfg, DType dtype, const RankLayout& layout) {
  if (cfg.train.eval_every <= 0) return std::nullopt;
  Validation v;
  v.prog = build_program(cfg, dtype, Stage::rank_forward, layout);
  ExecOptions exec{.attention = cfg.runtime.attention};
  if (cfg.train.objective == Objective::dpo) exec.transient_outputs.insert("logits");  // it reads the sums
  v.ex = std::make_unique<Executor>(*v.prog.graph, std::move(exec));
  v.data = make_val_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  return v;
}

bool validation_due(const Config& cfg, int64_t step, int64_t total) {
  return cfg.train.eval_every > 0 && (step % cfg.train.eval_every == 0 || step == total);
}

void evaluate(Validation& v, const Config& cfg, const ParamMap& params, JobComms& comms, Device dev,
              StepRecord& rec, ValExample* example, const DpoReference* reference) {
  if (reference) return evaluate_dpo(v, cfg, params, *reference, comms, dev, rec);
  const RankLayout& layout = comms.mesh;
  const int64_t K = cfg.train.eval_batches;
  std::vector<double> losses;
  // This rank's correct predictions, then each batch's scored positions (its block of the
  // sequences), summed over the world at the end in one all-reduce.
  std::vector<int64_t> counts(static_cast<size_t>(K + 1), 0);
  int64_t tokens = 0;  // input tokens this dp rank read, scored or not
  for (int64_t k = 0; k < K; ++k) {
    const Batch raw = v.data->get(k, layout.dp_rank, layout.dp);
    const Batch batch = pad_to_multiple(raw, layout.seq_multiple());
    RunResult r = v.ex->run(run_feeds(batch, params, cfg.model.vocab_size, dev), comms.groups);
    comms.synchronize_device();
    losses.push_back(host_copy(r.outputs.at(v.prog.loss)).to_doubles()[0]);
    const Tensor logits = scored_rows(r);
    auto [c, n] = count_correct(logits, local_labels(batch, layout));
    counts[0] += c;
    counts[static_cast<size_t>(k + 1)] = n;
    tokens += raw.input_ids.numel();
    if (k == 0 && example)
      *example = first_example(logits, batch, raw.labels.dim(1), layout, *comms.host_world,
                               cfg.data.source == DataSourceKind::synthetic);
  }
  Tensor summed = Tensor::from_vector<int64_t>({K + 1}, counts);
  comms.host_world->all_reduce_sum(summed);
  const int64_t* world = summed.data<int64_t>();
  // A batch without a target anywhere has no loss (its token mean is 0/0): the mean is over the
  // batches with targets, and with none at all there is no loss and no accuracy to report.
  double loss_sum = 0;
  int64_t scored_batches = 0;
  rec.evaluated = true;
  rec.val_targets = 0;
  for (int64_t k = 0; k < K; ++k) {
    rec.val_targets += world[k + 1];
    if (world[k + 1] > 0) loss_sum += losses[static_cast<size_t>(k)], ++scored_batches;
  }
  rec.val_tokens = tokens * layout.dp;  // the ranks of an SP group read the same sequences
  rec.val_loss = scored_batches > 0 ? loss_sum / static_cast<double>(scored_batches)
                                    : std::numeric_limits<double>::quiet_NaN();
  rec.val_accuracy = rec.val_targets > 0 ? static_cast<double>(world[0]) / static_cast<double>(rec.val_targets) : -1;
}

double score_accuracy(const RunResult& r, const Batch& batch, const RankLayout& layout, Communicator& host_world) {
  auto [correct, counted] = count_correct(scored_rows(r), local_labels(batch, layout));
  return fraction(world_counts(correct, counted, host_world));
}

}  // namespace autosp
