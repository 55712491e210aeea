// Perplexity by position (train/evaluation.h).
#include "train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

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
  if (cfg.data.source == DataSourceKind::synthetic) return o.sequences > 0 ? o.sequences : cfg.train.eval_batches * cfg.data.batch_size;
  const auto data = make_val_source(cfg.data, cfg.model.vocab_size, static_cast<uint64_t>(cfg.train.seed));
  const int64_t epoch = data->sequences_per_epoch();
  if (epoch < 1)
    throw UsageError(str(data->describe(), ": holds no window of data.seq_len ", cfg.data.seq_len, " + 1 tokens"));
  if (o.sequences > epoch)  // more would evaluate windows twice
    throw UsageError(str("--sequences ", o.sequences, ": the data holds ", epoch, " windows of ", cfg.data.seq_len,
                         " + 1 tokens (", data->describe(), ")"));
  return o.sequences > 0 ? o.sequences : epoch;
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

namespace autosp {
namespace {

// The most answer tokens a prompt may have (the scored slots each dp rank fills per round).
constexpr int64_t kMaxAnswer = 64;

struct PasskeyPieces {
  std::vector<int64_t> key, question, answer;
};

PasskeyPieces passkey_pieces(const PasskeyOptions& o, const std::string& key) {
  return {o.encode(str("The pass key is ", key, ". Remember it. ", key, " is the pass key. ")),
          o.encode("What is the pass key? The pass key is"), o.encode(str(" ", key))};
}

struct PasskeyPrompt {
  std::vector<int64_t> ids;  // prompt (length L), then the answer
  int64_t length = 0;        // L: where the answer starts
  size_t cell = 0;
  std::string key;
  std::vector<int64_t> answer;
};

// Filler up to L − key − question tokens, the key sentence at round(depth × filler), the question,
// the answer.
PasskeyPrompt make_prompt(const PasskeyOptions& o, const std::vector<int64_t>& filler, int64_t L, double depth,
                          const std::string& key) {
  const PasskeyPieces p = passkey_pieces(o, key);
  const auto F = L - static_cast<int64_t>(p.key.size() + p.question.size());
  if (F < 0 || p.answer.empty() || static_cast<int64_t>(p.answer.size()) > kMaxAnswer)
    throw UsageError(str("--passkey-lengths ", L, ": too short for the key sentence and the question (",
                         p.key.size() + p.question.size(), " tokens with key ", key, ")"));
  const auto at = static_cast<int64_t>(std::llround(depth * static_cast<double>(F)));
  PasskeyPrompt out{{}, L, 0, key, p.answer};
  auto fill = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) out.ids.push_back(filler[static_cast<size_t>(i) % filler.size()]);
  };
  fill(0, at);
  out.ids.insert(out.ids.end(), p.key.begin(), p.key.end());
  fill(at, F);
  out.ids.insert(out.ids.end(), p.question.begin(), p.question.end());
  out.ids.insert(out.ids.end(), p.answer.begin(), p.answer.end());
  return out;
}

// input = ids[0, n−1), labels the next token at the answer's positions only (-100 elsewhere, and
// everywhere when `scored` is false), positions 0…n−2.
Batch prompt_batch(const PasskeyPrompt& p, bool scored) {
  const auto S = static_cast<int64_t>(p.ids.size()) - 1;
  std::vector<int64_t> input(p.ids.begin(), p.ids.end() - 1), labels(static_cast<size_t>(S), kIgnoreIndex), pos(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t) {
    pos[static_cast<size_t>(t)] = t;
    if (scored && t + 1 >= p.length) labels[static_cast<size_t>(t)] = p.ids[static_cast<size_t>(t + 1)];
  }
  return {Tensor::from_vector<int64_t>({1, S}, input), Tensor::from_vector<int64_t>({1, S}, labels),
          Tensor::from_vector<int64_t>({1, S}, pos)};
}

std::string draw_key(std::mt19937_64& rng) { return std::to_string(10000 + rng() % 90000); }

}  // namespace

int64_t check_passkey(const Config& cfg, const PasskeyOptions& o) {
  if (o.lengths.empty()) throw UsageError("--passkey-lengths: no lengths");
  if (o.depths.empty()) throw UsageError("--passkey-depths: no depths");
  for (double d : o.depths)
    if (!(d >= 0 && d <= 1)) throw UsageError(str("--passkey-depths ", d, ": a depth is a fraction in [0, 1]"));
  if (o.trials < 1 || o.trials > 1 << 20) throw UsageError(str("--passkey-trials ", o.trials, ": expected 1 .. 2^20"));
  for (int64_t L : o.lengths)  // data.seq_len's range: a prompt is a sequence
    if (auto problem = config_value_problem("data.seq_len", L)) throw UsageError(str("--passkey-lengths ", L, ": ", *problem));
  const std::vector<int64_t> filler = o.filler.empty() ? o.encode(kPasskeyFiller) : o.filler;
  if (filler.empty()) throw UsageError("--passkey: the filler holds no tokens");
  int64_t longest = 0;
  for (int64_t L : o.lengths) {
    const PasskeyPrompt p = make_prompt(o, filler, L, 0.5, "12345");  // a too-short length throws here
    longest = std::max(longest, static_cast<int64_t>(p.ids.size()) - 1);
    for (int64_t id : p.ids)
      if (id < 0 || id >= cfg.model.vocab_size)
        throw UsageError(str("--passkey: token id ", id, " of the prompt is outside the model's vocabulary (",
                             cfg.model.vocab_size, "): the tokenizer is not the model's"));
  }
  for (int64_t id : filler)
    if (id < 0 || id >= cfg.model.vocab_size)
      throw UsageError(str("--passkey: filler token id ", id, " is outside the model's vocabulary (", cfg.model.vocab_size, ")"));
  const PositionsCheck pos = check_positions(cfg.model, longest, str("--passkey-lengths: a prompt of ", longest, " tokens"));
  if (!pos.refused.empty()) throw UsageError(pos.refused);
  return longest;
}

PasskeyResult passkey(const Config& cfg, const ParamMap& params, JobComms& comms, Device dev, const PasskeyOptions& o) {
  check_passkey(cfg, o);
  const RankLayout& layout = comms.mesh;
  const std::vector<int64_t> filler = o.filler.empty() ? o.encode(kPasskeyFiller) : o.filler;
  PasskeyResult out;
  std::vector<PasskeyPrompt> prompts;
  std::mt19937_64 rng(o.seed);
  for (int64_t L : o.lengths)
    for (double d : o.depths) {
      out.cells.push_back({L, d, 0, 0, {}});
      for (int64_t k = 0; k < o.trials; ++k) {
        prompts.push_back(make_prompt(o, filler, L, d, draw_key(rng)));
        prompts.back().cell = out.cells.size() - 1;
      }
    }
  const RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::rank_forward, layout);
  const Executor ex(*prog.graph, ExecOptions{.attention = cfg.runtime.attention});
  const auto N = static_cast<int64_t>(prompts.size());
  for (int64_t first = 0; first < N; first += layout.dp) {
    // Each dp rank runs prompt first + dp_rank (past the end: prompt 0, unscored) and fills its row
    // of the round's answers: argmax + 1 at each answer position it holds (0: held elsewhere).
    const int64_t mine = first + layout.dp_rank;
    const PasskeyPrompt& p = prompts[static_cast<size_t>(mine < N ? mine : 0)];
    const Batch batch = pad_to_multiple(prompt_batch(p, mine < N), layout.seq_multiple());
    const RunResult r = ex.run(run_feeds(batch, params, cfg.model.vocab_size, dev), comms.groups);
    comms.synchronize_device();
    out.peak_bytes = std::max(out.peak_bytes, r.peak_bytes);
    const std::vector<int64_t> pred = argmax_rows(scored_rows(r));
    const std::vector<int64_t> pos = rank_positions(layout, batch.labels.dim(1));
    const Tensor labels = local_labels(batch, layout);
    Tensor answers = Tensor::zeros({layout.dp, kMaxAnswer}, DType::i64);
    for (size_t t = 0; t < pos.size(); ++t)
      if (labels.data<int64_t>()[t] != kIgnoreIndex)
        answers.data<int64_t>()[layout.dp_rank * kMaxAnswer + pos[t] + 1 - p.length] = pred[t] + 1;
    comms.host_world->all_reduce_sum(answers);  // the SP ranks' disjoint positions; each dp rank its row
    for (int64_t d = 0; d < layout.dp && first + d < N; ++d) {
      const PasskeyPrompt& q = prompts[static_cast<size_t>(first + d)];
      PasskeyCell& cell = out.cells[q.cell];
      std::vector<int64_t> said;
      for (size_t k = 0; k < q.answer.size(); ++k) {
        said.push_back(answers.data<int64_t>()[d * kMaxAnswer + static_cast<int64_t>(k)] - 1);
        if (said.back() != q.answer[k]) break;  // greedy decoding would continue from its own token
      }
      ++cell.trials;
      cell.correct += said == q.answer;
      cell.answers.emplace_back(q.key, std::move(said));
    }
    if (o.progress && comms.host_world->rank() == 0) o.progress(std::min(N, first + layout.dp), N);
  }
  return out;
}

nlohmann::json PasskeyResult::to_json() const {
  nlohmann::json cells_json = nlohmann::json::array();
  int64_t correct = 0, trials = 0;
  for (const PasskeyCell& c : cells) {
    nlohmann::json answers = nlohmann::json::array();
    for (const auto& [key, said] : c.answers) answers.push_back({{"key", key}, {"said_ids", said}});
    cells_json.push_back({{"length", c.length}, {"depth", c.depth}, {"correct", c.correct}, {"trials", c.trials},
                          {"accuracy", static_cast<double>(c.correct) / static_cast<double>(std::max<int64_t>(1, c.trials))},
                          {"answers", std::move(answers)}});
    correct += c.correct, trials += c.trials;
  }
  return {{"task", "passkey"}, {"accuracy", static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, trials))},
          {"trials", trials}, {"peak_bytes", peak_bytes}, {"cells", std::move(cells_json)}};
}

}  // namespace autosp
