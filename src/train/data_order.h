// The order in which a run reads its data, as pure functions of the global sequence index g (the
// g-th sequence of the run: sequence b of step k on dp rank d of a run without accumulation is
// g = (k·dp + d)·batch + b). Nothing here keeps state that grows with the run or the dataset, so a
// resumed run reads exactly what the first one would have read from any g on (train/data.h uses
// these; the trainer records a DataPosition in each checkpoint and continues from it).
//
//   windows      a token stream of n tokens holds N = ⌊(n − 1) / S⌋ whole sequences (S = seq_len):
//                window w is the S + 1 tokens from w·S. One epoch reads each window once; the
//                < S tokens after the last window are not read. Sequence g is read in epoch g / N.
//   shuffle      epoch e reads window π_e(g mod N), π_e a bijection of [0, N) keyed by (seed, e):
//                a Feistel network with cycle-walking, O(1) memory whatever N (no table).
//   mix          weights w_k (data.mix): g goes to dataset k by blocks of M = 10000 slots; a block
//                holds exactly round(w_k·M) slots of dataset k (largest remainders), ordered by
//                Megatron's greedy error-minimising rule, so every stretch of the run is near the
//                weights. Each dataset numbers its own sequences (its own epochs and shuffle).
//
// Knows nothing of files, tensors or devices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace autosp {

// N = ⌊(n − 1) / S⌋: the whole windows of S + 1 tokens at multiples of S in n tokens (0 when n ≤ S).
int64_t windows_in(int64_t n_tokens, int64_t seq_len);

// A bijection of [0, n) keyed by (seed, epoch): a 6-round Feistel network on the smallest even
// number of bits that covers n, each value at or past n walked on through the network until it
// lands in [0, n) (cycle-walking; fewer than 4 steps expected, since the domain is < 4n). Costs
// O(1) memory and a few hashes per call.
class Permutation {
 public:
  Permutation(int64_t n, uint64_t seed, uint64_t epoch);
  int64_t operator()(int64_t i) const;  // i in [0, n)
  int64_t size() const { return n_; }

 private:
  uint64_t round_trip(uint64_t x) const;
  int64_t n_;
  unsigned half_bits_ = 1;
  uint64_t keys_[6] = {};
};

// The key a mix's dataset k shuffles with: the seed itself for k = 0 (so data.path alone and a mix
// that lists it first shuffle it alike), a hash of (seed, k) otherwise.
uint64_t dataset_seed(uint64_t seed, int64_t k);

// The assignment of a mix's sequences to its datasets (see the top of this file).
class MixSchedule {
 public:
  static constexpr int64_t kBlock = 10000;  // M: slots per block (weights resolve to 1/M)
  // Weights > 0 in any scale (they are normalised); a weight whose round(w·M) is 0 is a UsageError
  // (it would never be read).
  explicit MixSchedule(const std::vector<double>& weights);
  struct Slot {
    int64_t dataset, index;  // the dataset of sequence g and g's index among that dataset's sequences
  };
  Slot at(int64_t g) const;
  // The sequences of `dataset` among [0, g): where that dataset's reading stands before g.
  int64_t count_before(int64_t dataset, int64_t g) const;
  int64_t slots(int64_t dataset) const { return per_block_[static_cast<size_t>(dataset)]; }  // per block
  int64_t datasets() const { return static_cast<int64_t>(per_block_.size()); }

 private:
  std::vector<int64_t> per_block_;                // [K] slots of each dataset in a block
  std::vector<int32_t> dataset_of_, rank_of_;     // [M] each slot's dataset and its rank among them
  std::vector<std::vector<int32_t>> positions_;   // [K] the slots of each dataset, ascending
};

// Where a read stands in one dataset's epochs: epoch e and the fraction of it read, for the log.
struct EpochProgress {
  std::string name;  // the dataset's path ("" for a source with one dataset)
  int64_t epoch = 0;
  double fraction = 0;  // in [0, 1)
};
// "epoch 2 (37%)", or for a mix "a/*.bin epoch 2 (37%), b.txt epoch 0 (81%)"; "" for none.
std::string format_epochs(const std::vector<EpochProgress>& progress);

// What a checkpoint records of the data so that a resumed run can continue it (and can tell when
// it cannot): the next global sequence index and everything the read order depends on.
struct DatasetStamp {
  std::string path;  // data.path, or the entry's path in data.mix
  double weight = 1;
  int64_t tokens = 0;  // the stream's size (bytes for text); 0 for synthetic
};
struct DataPosition {
  int64_t next_sequence = 0;  // g of the first sequence the run has not read yet
  int64_t global_batch = 0;   // sequences per optimizer step of the run that saved it (0: unknown)
  std::string source;         // data.source
  int64_t seq_len = 0;
  bool shuffle = false;
  int64_t seed = 0;           // the shuffle's seed (data.seed, or train.seed when that is -1)
  std::vector<DatasetStamp> datasets;  // data.path alone, or data.mix's entries in order
};
nlohmann::json data_position_json(const DataPosition& p);
// The position in `j` (a checkpoint's meta.json "data"); a malformed one is a UsageError naming `origin`.
DataPosition parse_data_position(const nlohmann::json& j, const std::string& origin);

// Where a resumed run continues: `saved` from the checkpoint, `now` the new run's data as
// DataSource::position(0) describes it, with global_batch set. Same index g when only the dp size,
// batch or accumulation changed (the global batch does not enter the read order); with another
// seq_len and no shuffle, the first new window at or after the token reached in the same epoch;
// at an epoch boundary of a single dataset, the same epoch under any seq_len, shuffle or seed.
// Otherwise a UsageError that says why (the data changed, seq_len or the shuffle changed within
// an epoch, a mix changed). `log` is one line for the log.
struct DataResume {
  int64_t next_sequence = 0;
  std::string log;
};
DataResume resume_data(const DataPosition& saved, const DataPosition& now);

}  // namespace autosp
