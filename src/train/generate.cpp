// Generation with a KV cache (see generate.h). Shapes: B = 1, S = prompt length, T = cached
// positions, Nkv = key/value heads, D = head dim, V = vocab.
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/check.h"

namespace autosp {
namespace {

Tensor ids_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>({1, static_cast<int64_t>(v.size())}, v);
}

std::vector<int64_t> positions(int64_t from, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = from + i;
  return p;
}

}  // namespace

Generator::Generator(const ModelConfig& m, DType dtype, ParamMap params)
    : m_(m), dtype_(dtype), params_(std::move(params)) {
  if (dtype != DType::f32 && dtype != DType::f64)
    throw UsageError(str("generation runs in float32 or float64, not ", dtype_name(dtype)));
  for (auto& [name, p] : params_)
    if (p.dtype() != dtype) p = p.to(dtype);
  prefill_ = build_forward(m, dtype, ForwardMode::prefill);
  decode_ = build_forward(m, dtype, ForwardMode::decode);
  prefill_ex_ = std::make_unique<Executor>(*prefill_);
  decode_ex_ = std::make_unique<Executor>(*decode_);
}

// logits [1, S, V] → its last row.
std::vector<double> Generator::last_logits(const RunResult& r) const {
  const Tensor& logits = r.outputs.at("logits");
  const int64_t V = logits.dim(-1), S = logits.dim(1);
  const Tensor last = logits.as_strided({V}, {1}, (S - 1) * V).contiguous();
  return last.to_doubles();
}

int64_t Generator::pick(const std::vector<double>& logits, const SampleOptions& o, std::mt19937_64& rng) const {
  const int64_t V = static_cast<int64_t>(logits.size());
  // A NaN (or +inf) logit has no order: argmax and the softmax would quietly give token 0.
  for (int64_t i = 0; i < V; ++i)
    if (std::isnan(logits[static_cast<size_t>(i)]) || logits[static_cast<size_t>(i)] == INFINITY)
      throw RuntimeFailure(str("the model's logit for token ", i, " is ", logits[static_cast<size_t>(i)],
                               ": its weights (or an activation) are not finite; nothing to sample from"));
  if (o.temperature <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  // HF's order: temperature, then top-k (keep logits ≥ the k-th largest), then softmax. The max is
  // subtracted before dividing by T (softmax and top-k do not change): every (logit − max)/T is
  // ≤ 0, so a tiny T (3e-308, a subnormal) cannot overflow to inf − inf = NaN; it leaves the
  // maximum at 0 and sends the rest to −inf, which is greedy.
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> z(logits.size());
  for (size_t i = 0; i < z.size(); ++i) z[i] = (logits[i] - top) / o.temperature;
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (double& x : z)
      if (x < kth) x = -INFINITY;
  }
  double total = 0;
  for (double& x : z) total += (x = std::exp(x));
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (int64_t i = 0; i < V; ++i) {
    if (z[static_cast<size_t>(i)] == 0) continue;
    if ((u -= z[static_cast<size_t>(i)]) < 0) return i;
  }
  // Rounding left u ≥ 0 past the last term: the last token with any mass.
  for (int64_t i = V - 1; i >= 0; --i)
    if (z[static_cast<size_t>(i)] > 0) return i;
  return 0;
}

void check_generation(const ModelConfig& m, const std::vector<int64_t>& prompt, const SampleOptions& o) {
  if (prompt.empty()) throw UsageError("the prompt is empty: give at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= m.vocab_size)
      throw UsageError(str("prompt token ", prompt[i], " at index ", i, " is outside [0, ", m.vocab_size,
                           ") (model.vocab_size)"));
  if (o.eos_token_id != -1 && (o.eos_token_id < 0 || o.eos_token_id >= m.vocab_size))
    throw UsageError(str("eos-token-id ", o.eos_token_id, " is outside [0, ", m.vocab_size,
                         ") (model.vocab_size; -1 for no stop), so it could never stop the generation"));
  if (o.max_new_tokens < 0) throw UsageError(str("max-new-tokens ", o.max_new_tokens, ": expected ≥ 0"));
  if (o.top_k < 0) throw UsageError(str("top-k ", o.top_k, ": expected ≥ 0"));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw UsageError(str("temperature ", o.temperature, ": expected a finite number ≥ 0"));
  // Positions run to prompt + max_new_tokens − 1; compared without forming the sum, which a huge
  // max_new_tokens would overflow past the check.
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (o.max_new_tokens > std::numeric_limits<int64_t>::max() - prompt_len)
    throw UsageError(str("max-new-tokens ", o.max_new_tokens, ": with the prompt's ", prompt_len,
                         " tokens the positions overflow int64"));
  auto past = [&](int64_t limit) { return prompt_len > limit || o.max_new_tokens > limit - prompt_len; };
  if (family(m.arch).positions == Positions::learned && past(m.max_position_embeddings))  // a row of the table each
    throw UsageError(str("max-new-tokens ", o.max_new_tokens, ": the prompt (", prompt_len, " tokens) and ",
                         o.max_new_tokens, " new tokens exceed ", arch_name(m.arch),
                         "'s position table (model.max_position_embeddings ", m.max_position_embeddings, ")"));
  // RoPE rotates by any position; a sliding window only where it changes nothing.
  if (m.sliding_window > 0 && past(m.sliding_window))
    throw UsageError(str("max-new-tokens ", o.max_new_tokens, ": the prompt (", prompt_len, " tokens) and ",
                         o.max_new_tokens, " new tokens exceed model.sliding_window ", m.sliding_window,
                         " (autosp attends over the whole sequence, so a window must cover it)"));
}

Generated Generator::generate(const std::vector<int64_t>& prompt, const SampleOptions& o) const {
  check_generation(m_, prompt, o);
  std::mt19937_64 rng(o.seed);
  Generated out;
  std::vector<int64_t> seq = prompt;
  auto feeds_for = [&](const std::vector<int64_t>& ids, int64_t first_pos) {
    TensorMap f = params_;
    f["input_ids"] = ids_tensor(ids);
    f["position_ids"] = ids_tensor(positions(first_pos, static_cast<int64_t>(ids.size())));
    return f;
  };
  // The cache: per layer, K and V [1, Nkv, T, D], cloned out of each run's results.
  TensorMap cache;
  auto keep_cache = [&](const RunResult& r) {
    for (int64_t l = 0; l < m_.num_hidden_layers; ++l)
      for (bool value : {false, true}) cache[kv_past_name(l, value)] = r.outputs.at(kv_present_name(m_, l, value)).clone();
  };

  RunResult r = prefill_ex_->run(feeds_for(seq, 0));
  if (o.kv_cache) keep_cache(r);
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    out.logits.push_back(last_logits(r));
    const int64_t next = pick(out.logits.back(), o, rng);
    out.tokens.push_back(next);
    seq.push_back(next);
    if (next == o.eos_token_id || n + 1 == o.max_new_tokens) break;
    if (o.kv_cache) {
      TensorMap f = feeds_for({next}, static_cast<int64_t>(seq.size()) - 1);
      for (const auto& [name, t] : cache) f[name] = t;
      r = decode_ex_->run(f);
      keep_cache(r);
    } else {
      r = prefill_ex_->run(feeds_for(seq, 0));
    }
  }
  return out;
}

}  // namespace autosp
