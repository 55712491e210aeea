// The read order's pure functions (see data_order.h): windows, the keyed permutation, the mix
// schedule, epochs for the log, and the data position a checkpoint records with its resume rules.
#include "train/data_order.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "tensor/check.h"

namespace autosp {
namespace {

// splitmix64's finaliser: a bijective mix of 64 bits.
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t windows_in(int64_t n_tokens, int64_t seq_len) {
  AUTOSP_ASSERT(seq_len >= 1, "windows_in: seq_len ", seq_len);
  return n_tokens <= seq_len ? 0 : (n_tokens - 1) / seq_len;
}

// ---- the keyed permutation --------------------------------------------------------------------

Permutation::Permutation(int64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  AUTOSP_ASSERT(n >= 1, "Permutation: n ", n);
  unsigned bits = 2;
  while (bits < 62 && (uint64_t{1} << bits) < static_cast<uint64_t>(n)) bits += 2;  // even: two equal halves
  half_bits_ = bits / 2;
  uint64_t k = mix64(mix64(seed ^ 0x243F6A8885A308D3ull) ^ epoch);
  for (uint64_t& key : keys_) key = k = mix64(k);
}

// One pass of the Feistel network over the 2·half_bits domain: a bijection of it.
uint64_t Permutation::round_trip(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint64_t key : keys_) {
    const uint64_t f = mix64(right ^ key) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return left << half_bits_ | right;
}

int64_t Permutation::operator()(int64_t i) const {
  AUTOSP_ASSERT(i >= 0 && i < n_, "Permutation: index ", i, " outside [0, ", n_, ")");
  // Cycle-walking: the network permutes [0, 2^bits); following i's cycle until it is back in
  // [0, n) restricts that permutation to [0, n), still a bijection.
  uint64_t x = static_cast<uint64_t>(i);
  do x = round_trip(x);
  while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

uint64_t dataset_seed(uint64_t seed, int64_t k) {
  return k == 0 ? seed : mix64(seed ^ mix64(0xD1B54A32D192ED03ull * static_cast<uint64_t>(k)));
}

// ---- the mix schedule ---------------------------------------------------------------------------

MixSchedule::MixSchedule(const std::vector<double>& weights) {
  const size_t K = weights.size();
  if (K == 0) throw UsageError("data.mix: expected at least one dataset");
  double total = 0;
  for (size_t k = 0; k < K; ++k) {
    if (!(weights[k] > 0) || !std::isfinite(weights[k]))
      throw UsageError(str("data.mix[", k, "].weight = ", weights[k], ": expected a finite number > 0"));
    total += weights[k];
  }
  // Exactly M slots: each dataset its floor(w·M), then one more to the largest remainders.
  per_block_.assign(K, 0);
  std::vector<std::pair<double, size_t>> remainder;
  int64_t given = 0;
  for (size_t k = 0; k < K; ++k) {
    const double quota = weights[k] / total * static_cast<double>(kBlock);
    per_block_[k] = static_cast<int64_t>(std::floor(quota));
    given += per_block_[k];
    remainder.push_back({quota - std::floor(quota), k});
  }
  std::stable_sort(remainder.begin(), remainder.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < kBlock; ++i, ++given) ++per_block_[remainder[i % K].second];
  for (size_t k = 0; k < K; ++k)
    if (per_block_[k] == 0)
      throw UsageError(str("data.mix[", k, "].weight = ", weights[k], ": ", weights[k] / total,
                           " of the total, less than one sequence in ", kBlock, ", so it would never be read"));
  // Megatron's greedy rule: slot s goes to the dataset furthest behind its share, c_k·(s+1)/M − a_k
  // (ties to the first), among those with slots left, so each dataset gets exactly c_k.
  dataset_of_.resize(kBlock);
  rank_of_.resize(kBlock);
  positions_.assign(K, {});
  std::vector<int64_t> assigned(K, 0);
  for (int64_t s = 0; s < kBlock; ++s) {
    size_t best = K;
    int64_t best_error = 0;
    for (size_t k = 0; k < K; ++k) {
      if (assigned[k] == per_block_[k]) continue;
      const int64_t error = per_block_[k] * (s + 1) - assigned[k] * kBlock;
      if (best == K || error > best_error) best = k, best_error = error;
    }
    dataset_of_[static_cast<size_t>(s)] = static_cast<int32_t>(best);
    rank_of_[static_cast<size_t>(s)] = static_cast<int32_t>(assigned[best]++);
    positions_[best].push_back(static_cast<int32_t>(s));
  }
}

MixSchedule::Slot MixSchedule::at(int64_t g) const {
  AUTOSP_ASSERT(g >= 0, "MixSchedule: sequence ", g);
  const int64_t block = g / kBlock, r = g % kBlock;
  const size_t k = static_cast<size_t>(dataset_of_[static_cast<size_t>(r)]);
  return {static_cast<int64_t>(k), block * per_block_[k] + rank_of_[static_cast<size_t>(r)]};
}

int64_t MixSchedule::count_before(int64_t dataset, int64_t g) const {
  AUTOSP_ASSERT(g >= 0 && dataset >= 0 && dataset < datasets(), "MixSchedule: dataset ", dataset, ", sequence ", g);
  const auto& pos = positions_[static_cast<size_t>(dataset)];
  const int64_t block = g / kBlock, r = g % kBlock;
  return block * per_block_[static_cast<size_t>(dataset)] +
         (std::lower_bound(pos.begin(), pos.end(), static_cast<int32_t>(r)) - pos.begin());
}

// ---- epochs -------------------------------------------------------------------------------------

std::string format_epochs(const std::vector<EpochProgress>& progress) {
  std::string out;
  for (const EpochProgress& p : progress) {
    const int percent = static_cast<int>(std::floor(p.fraction * 100));
    out += str(out.empty() ? "" : ", ", p.name, p.name.empty() ? "" : " ", "epoch ", p.epoch, " (", percent, "%)");
  }
  return out;
}

// ---- data positions -----------------------------------------------------------------------------

nlohmann::json data_position_json(const DataPosition& p) {
  nlohmann::json datasets = nlohmann::json::array();
  for (const DatasetStamp& d : p.datasets)
    datasets.push_back({{"path", d.path}, {"weight", d.weight}, {"tokens", d.tokens}});
  return {{"next_sequence", p.next_sequence}, {"global_batch", p.global_batch}, {"source", p.source},
          {"seq_len", p.seq_len}, {"shuffle", p.shuffle}, {"seed", p.seed}, {"datasets", datasets}};
}

DataPosition parse_data_position(const nlohmann::json& j, const std::string& origin) {
  auto bad = [&](const std::string& what) { throw UsageError(str(origin, ": data position: ", what)); };
  if (!j.is_object()) bad("expected an object");
  auto integer = [&](const nlohmann::json& o, const char* key, int64_t lo) {
    if (!o.contains(key) || !o[key].is_number_integer()) bad(str("'", key, "': expected an integer"));
    const int64_t v = o[key].get<int64_t>();
    if (v < lo) bad(str("'", key, "' = ", v, ": expected ≥ ", lo));
    return v;
  };
  DataPosition p;
  p.next_sequence = integer(j, "next_sequence", 0);
  p.global_batch = integer(j, "global_batch", 0);
  p.seq_len = integer(j, "seq_len", 1);
  p.seed = integer(j, "seed", 0);
  if (!j.contains("source") || !j["source"].is_string()) bad("'source': expected a string");
  p.source = j["source"].get<std::string>();
  if (!j.contains("shuffle") || !j["shuffle"].is_boolean()) bad("'shuffle': expected true or false");
  p.shuffle = j["shuffle"].get<bool>();
  if (!j.contains("datasets") || !j["datasets"].is_array() || j["datasets"].empty())
    bad("'datasets': expected a non-empty list");
  for (const auto& d : j["datasets"]) {
    if (!d.is_object() || !d.contains("path") || !d["path"].is_string() || !d.contains("weight") ||
        !d["weight"].is_number() || !(d["weight"].get<double>() > 0))
      bad("'datasets': expected objects {\"path\": string, \"weight\": number > 0, \"tokens\": integer}");
    p.datasets.push_back({d["path"].get<std::string>(), d["weight"].get<double>(), integer(d, "tokens", 0)});
  }
  return p;
}

namespace {

const char* yes(bool b) { return b ? "true" : "false"; }

// "sequence g (epoch e, p%)" of a single stream of N windows, "sequence g" otherwise.
std::string where(int64_t g, int64_t windows) {
  if (windows <= 0) return str("sequence ", g);
  return str("sequence ", g, " (", format_epochs({{"", g / windows, static_cast<double>(g % windows) / windows}}), ")");
}

}  // namespace

DataResume resume_data(const DataPosition& saved, const DataPosition& now) {
  const int64_t g = saved.next_sequence;
  auto cannot = [&](const std::string& why) {
    throw UsageError(str("--resume: the checkpoint's data position (", g, " sequences read) cannot continue in this "
                         "run: ", why));
  };
  if (saved.source != now.source) cannot(str("data.source was \"", saved.source, "\", now \"", now.source, "\""));
  if (saved.datasets.empty() || now.datasets.empty()) cannot("a position without datasets");
  const bool mix = saved.datasets.size() > 1 || now.datasets.size() > 1;
  if (saved.datasets.size() != now.datasets.size())
    cannot(str("the run read ", saved.datasets.size(), " dataset(s), now ", now.datasets.size(),
               mix ? " (a mix continues only with the same data.mix)" : ""));
  std::string notes;
  for (size_t k = 0; k < saved.datasets.size(); ++k) {
    const DatasetStamp &a = saved.datasets[k], &b = now.datasets[k];
    if (a.tokens != b.tokens)
      cannot(str(b.path, ": the data changed: the checkpoint's run read ", a.tokens, " tokens from ", a.path,
                 ", this one finds ", b.tokens, " (the read order depends on the size; resume on the same data, or "
                 "start a new run from the checkpoint's weights with --init-from)"));
    if (std::abs(a.weight - b.weight) > 1e-12 * std::max(std::abs(a.weight), std::abs(b.weight)))
      cannot(str("data.mix[", k, "].weight was ", a.weight, ", now ", b.weight,
                 " (the mix assigns sequences by the weights; keep them, or start a new run with --init-from)"));
    if (a.path != b.path) notes += str("; ", a.path, " is now ", b.path, " (same size)");
  }
  std::string batch_note;
  if (saved.global_batch > 0 && now.global_batch > 0 && saved.global_batch != now.global_batch)
    batch_note = str("; global batch ", saved.global_batch, " → ", now.global_batch, " sequences");
  const bool same_order = saved.shuffle == now.shuffle && (!now.shuffle || saved.seed == now.seed);
  const bool synthetic = now.datasets.front().tokens == 0;  // generated: an endless stream of sequences
  const int64_t tokens = now.datasets.front().tokens;
  const int64_t old_windows = synthetic || mix ? 0 : windows_in(tokens, saved.seq_len);
  auto done = [&](int64_t next, const std::string& how) {
    return DataResume{next, str("data: resuming at ", how, batch_note, notes)};
  };

  if (synthetic) {  // every sequence is generated from (seed, g): nothing to realign
    const std::string s = saved.seq_len == now.seq_len ? "" : str(" (now of ", now.seq_len, " tokens)");
    return done(g, str("sequence ", g, s));
  }
  if (saved.seq_len == now.seq_len && same_order)
    return done(g, mix ? str("sequence ", g) : where(g, old_windows));
  if (g == 0) return done(0, "sequence 0 (nothing was read)");
  if (mix)
    cannot(str("a mix continues only with the same data.seq_len, data.shuffle and data.seed (seq_len ", saved.seq_len,
               " → ", now.seq_len, ", shuffle ", yes(saved.shuffle), " → ", yes(now.shuffle), ", seed ", saved.seed,
               " → ", now.seed,
               "): each dataset's reading stands mid-epoch"));
  const int64_t new_windows = windows_in(tokens, now.seq_len);
  if (new_windows < 1) cannot(str("data.seq_len ", now.seq_len, " needs more than the data's ", tokens, " tokens"));
  const int64_t epoch = g / old_windows, within = g % old_windows;
  int64_t next = 0;
  auto epoch_start = [&](int64_t e) {
    int64_t v = 0;
    if (__builtin_mul_overflow(e, new_windows, &v))
      cannot(str("epoch ", e, " of ", new_windows, " sequences overflows"));
    return v;
  };
  if (within == 0) {  // an epoch boundary: the next epoch reads everything, in any order
    next = epoch_start(epoch);
    return done(next, str("sequence ", next, " (the start of epoch ", epoch, ": ", new_windows, " sequences of ",
                          now.seq_len, " tokens", now.shuffle ? str(", shuffled with seed ", now.seed) : "", ")"));
  }
  if (saved.shuffle || now.shuffle) {
    if (saved.seq_len != now.seq_len)
      cannot(str("data.seq_len changed (", saved.seq_len, " → ", now.seq_len, ") within shuffled epoch ", epoch,
                 ": its sequences are a permutation of windows of ", saved.seq_len, " tokens, so which windows of ",
                 now.seq_len, " are still unread is not defined; resume with data.seq_len ", saved.seq_len,
                 " until the epoch ends (sequence ", (epoch + 1) * old_windows, ")"));
    cannot(saved.shuffle != now.shuffle
               ? str("data.shuffle changed (", yes(saved.shuffle), " → ", yes(now.shuffle), ") within epoch ", epoch,
                     ": the sequences still unread in it differ under the other order; resume with data.shuffle ",
                     yes(saved.shuffle), " until the epoch ends (sequence ", (epoch + 1) * old_windows, ")")
               : str("data.seed changed (", saved.seed, " → ", now.seed, ") within shuffled epoch ", epoch,
                     ": another permutation reads other sequences for the rest of it; resume with data.seed ",
                     saved.seed));
  }
  // Unshuffled, another seq_len: the first new window at or after the token reached in this epoch.
  const int64_t token = within * saved.seq_len;
  const int64_t window = (token + now.seq_len - 1) / now.seq_len;
  next = window < new_windows ? epoch_start(epoch) + window : epoch_start(epoch + 1);
  const std::string skipped = window < new_windows ? str(window * now.seq_len - token, " tokens skipped")
                                                   : str("the rest of the epoch holds no whole sequence");
  return done(next, str(where(next, new_windows), " (data.seq_len ", saved.seq_len, " → ", now.seq_len, ": token ",
                        token, " of epoch ", epoch, " was reached; ", skipped, ")"));
}

}  // namespace autosp
