// dpo.precompute_ref's file: the reference model's per-pair completion log-probability sums of one
// split, stored beside its pair-id shards, so that a restart (or another run on the same model and
// data) reads them instead of running the reference over the data again (decision 167).
//
//   <folder of data.pairs_path>/ref_logps_<split>.safetensors   (split: "train" for pairs_train_*.npy)
//     pair_ids  I64 [N]     the split's pair ids k + 1 (docs/data.md), ascending
//     logps     F64 [N, 2]  the reference's (chosen, rejected) sums
//     __metadata__          format "autosp-dpo-ref-logps/1" and the key below
//
// The key is everything the sums depend on, each part its own entry so that a stale file is named
// by what changed: `model` (a hash of the model's config), `weights` (a hash of the reference's
// weights, the LoRA adapters excepted: with them off the reference is the base), `data` (a hash of
// the split's token, mask and pair-id files' bytes), `seq_len` and `dtype`. The loss's settings
// (beta, loss_type, ...) are not in it: the sums do not depend on them. Knows nothing of ranks:
// the trainer decides who reads and who writes.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "tensor/tensor.h"

namespace autosp {

using RefLogps = std::map<int64_t, std::pair<double, double>>;  // |pair id| → (chosen, rejected)
using RefLogpsKey = std::map<std::string, std::string>;          // the key's entries, by name

// The file beside the pair ids that `pairs_pattern` (data.pairs_path or data.val_pairs_path) names.
std::string ref_logps_path(const std::string& pairs_pattern);

// The key of the sums that `reference` (the reference's weights, as the program takes them) computes
// on the files the patterns name, at cfg's model, data.seq_len and runtime.dtype.
RefLogpsKey ref_logps_key(const Config& cfg, const ParamMap& reference, const std::vector<std::string>& data_patterns);

// The table at `path` when its key is `key`. Without a file, or with another key, nothing, and `why`
// says which ("none yet", "the model weights differ", ...). A file that is not one of these (garbage,
// truncated, wrong tensors) is a UsageError that starts with the path.
std::optional<RefLogps> load_ref_logps(const std::string& path, const RefLogpsKey& key, std::string& why);

// Writes `table` under `key` atomically (a crash leaves the old file or none, never a partial one).
void save_ref_logps(const std::string& path, const RefLogpsKey& key, const RefLogps& table);

}  // namespace autosp
