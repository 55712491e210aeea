// Perplexity by position (train/evaluation.h).
#include "train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/program.h"
#include "graph/ops.h"  // kIgnoreIndex
#include "tensor/check.h"
#include "train/data.h"
#include "train/run_device.h"
#include "train/validation.h"

namespace autosp {
namespace {

// Adds each scored row's loss, -log softmax(logits[r])[label[r]] in double, to the bucket of its
// position. logits [rows, V] on the host (f32, f64; bf16 widened), labels [rows], pos[r]: row r's
// position in the sequence (rows are [B, positions] flattened, positions repeating per sequence).
void add_token_losses(const Tensor& logits_in, const Tensor& labels, const std::vector<int64_t>& pos,
                      int64_t width, std::vector<double>& sums, std::vector<int64_t>& counts) {
  const Tensor logits = logits_in.dtype() == DType::f64 ? logits_in.contiguous() : logits_in.to(DType::f32).contiguous();
  const int64_t V = logits.dim(-1), rows = logits.numel() / V, n = static_cast<int64_t>(pos.size());
  AUTOSP_ASSERT(labels.numel() == rows && rows % n == 0, "logits rows ", rows, " vs labels ", labels.numel());
  const int64_t* lab = labels.data<int64_t>();
  std::vector<double> loss(static_cast<size_t>(rows), std::numeric_limits<double>::quiet_NaN());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (lab[r] == kIgnoreIndex) continue;
    auto row_loss = [&](const auto* x) {
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(x[v]) - mx);
      return mx + std::log(sum) - static_cast<double>(x[lab[r]]);
    };
    loss[static_cast<size_t>(r)] = logits.dtype() == DType::f64 ? row_loss(logits.data<double>() + r * V)
                                                                : row_loss(logits.data<float>() + r * V);
  }
  for (int64_t r = 0; r < rows; ++r) {  // in row order: the sums do not depend on the thread count
    if (lab[r] == kIgnoreIndex) continue;
    const auto b = static_cast<size_t>(pos[static_cast<size_t>(r % n)] / width);
    sums[b] += loss[static_cast<size_t>(r)];
    ++counts[b];
  }
}

// Rows of `batch` whose sequence index first + row is `end` or more are not scored: the last
// round's dp ranks read past the requested sequences, and run anyway (the program's collectives
// span the world).
void ignore_rows_from(Batch& batch, int64_t first, int64_t end) {
  const int64_t B = batch.labels.dim(0), S = batch.labels.dim(1);
  batch.labels = batch.labels.contiguous().clone();
  for (int64_t b = std::max<int64_t>(0, end - first); b < B; ++b)
    std::fill_n(batch.labels.data<int64_t>() + b * S, S, kIgnoreIndex);
}

}  // namespace

Config eval_config(Config cfg) {
  if (cfg.data.val_path.empty()) {
    cfg.data.val_path = cfg.data.path;
    cfg.data.val_loss_mask_path = cfg.data.loss_mask_path;
  }
  cfg.zero_optimization.stage = 0;
  cfg.runtime.tiled_loss = false;
  return cfg;
}

int64_t eval_sequences(const Config& cfg, const PositionLossOptions& o) {
  if (o.bucket_width < 1) throw UsageError(str("--bucket-width ", o.bucket_width, ": expected ≥ 1"));
  if (o.sequences < 0) throw UsageError(str("--sequences ", o.sequences, ": expected ≥ 1 (or 0: one epoch)"));
  if (o.sequences > 0) return o.sequences;
  if (cfg.data.source == DataSourceKind::synthetic) return cfg.train.eval_batches * cfg.data.batch_size;
  const auto data = make_val_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  if (data->sequences_per_epoch() < 1)
    throw UsageError(str(data->describe(), ": holds no window of data.seq_len ", cfg.data.seq_len, " + 1 tokens"));
  return data->sequences_per_epoch();
}

PositionLoss perplexity_by_position(const Config& cfg, const ParamMap& params, JobComms& comms, Device dev,
                                    const PositionLossOptions& o) {
  const RankLayout& layout = comms.mesh;
  const int64_t N = eval_sequences(cfg, o), S = cfg.data.seq_len, B = cfg.data.batch_size;
  const RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::rank_forward, layout);
  const Executor ex(*prog.graph, ExecOptions{.attention = cfg.runtime.attention});
  const auto data = make_val_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  const int64_t buckets = (S + o.bucket_width - 1) / o.bucket_width, per_round = B * layout.dp;
  std::vector<double> sums(static_cast<size_t>(buckets), 0);
  std::vector<int64_t> counts(static_cast<size_t>(buckets), 0);
  PositionLoss out;
  for (int64_t first = 0; first < N; first += per_round) {
    const int64_t mine = first + layout.dp_rank * B;
    Batch raw = data->read(mine, B);
    ignore_rows_from(raw, mine, N);
    const Batch batch = pad_to_multiple(raw, layout.seq_multiple());
    const RunResult r = ex.run(run_feeds(batch, params, cfg.model.vocab_size, dev), comms.groups);
    comms.synchronize_device();
    out.peak_bytes = std::max(out.peak_bytes, r.peak_bytes);
    std::vector<int64_t> pos = rank_positions(layout, batch.labels.dim(1));
    const Tensor labels = local_labels(batch, layout);
    // Padding (S → a multiple of the ranks) has ignored labels and positions past S: never scored.
    add_token_losses(scored_rows(r), labels, pos, o.bucket_width, sums, counts);
    if (o.progress && comms.host_world->rank() == 0) o.progress(std::min(N, first + per_round), N);
  }
  Tensor world_sums = Tensor::from_vector<double>({buckets}, sums);
  Tensor world_counts = Tensor::from_vector<int64_t>({buckets}, counts);
  comms.host_world->all_reduce_sum(world_sums);
  comms.host_world->all_reduce_sum(world_counts);
  out.seq_len = S;
  out.bucket_width = o.bucket_width;
  out.sequences = N;
  for (int64_t b = 0; b < buckets; ++b)
    out.buckets.push_back({b * o.bucket_width, std::min(S, (b + 1) * o.bucket_width), world_counts.data<int64_t>()[b],
                           world_sums.data<double>()[b]});
  return out;
}

nlohmann::json PositionLoss::to_json() const {
  auto mean = [](double sum, int64_t n) { return n > 0 ? nlohmann::json(sum / static_cast<double>(n)) : nlohmann::json(); };
  auto ppl = [](double sum, int64_t n) { return n > 0 ? nlohmann::json(std::exp(sum / static_cast<double>(n))) : nlohmann::json(); };
  nlohmann::json rows = nlohmann::json::array();
  double sum = 0;
  int64_t tokens = 0;
  for (const PositionBucket& b : buckets) {
    rows.push_back({{"start", b.start}, {"end", b.end}, {"tokens", b.tokens}, {"loss", mean(b.loss_sum, b.tokens)},
                    {"perplexity", ppl(b.loss_sum, b.tokens)}});
    sum += b.loss_sum;
    tokens += b.tokens;
  }
  return {{"seq_len", seq_len}, {"bucket_width", bucket_width}, {"sequences", sequences}, {"tokens", tokens},
          {"loss", mean(sum, tokens)}, {"perplexity", ppl(sum, tokens)}, {"peak_bytes", peak_bytes},
          {"buckets", std::move(rows)}};
}

}  // namespace autosp
