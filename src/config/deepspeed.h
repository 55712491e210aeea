// A DeepSpeed config file as users bring it (autosp-train --deepspeed ds_config.json), applied onto
// our config: the model and the data stay in ours, DeepSpeed's training keys map onto our keys
// (docs/deepspeed.md has the table). The rules:
//   - the batch triple follows DeepSpeed's consistency rule (train_batch_size = micro × gas × dp,
//     dp = world / sequence parallel size; any two give the third) onto data.batch_size and
//     train.gradient_accumulation_steps; a mismatch names all three;
//   - inside the optimizer and scheduler sections, a parameter left out takes DeepSpeed's default,
//     unless the config (or --set) sets our key; a section left out leaves ours;
//   - "auto" takes our value (default or set); where we have none it is an error;
//   - a key both files set, to different values, is an error naming both;
//   - a key that would change the math and that we do not support is an error naming it; keys
//     that change nothing here are listed once, as ignored, in the notes;
//   - of two spellings of one section ("bf16" and its old name "bfloat16"), the one DeepSpeed
//     reads is taken and the other ignored, with a warning when the two differ.
// Every error is a UsageError naming the file and the key. Knows nothing of training.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace autosp {

// `cfg` (parsed from `cfg_origin` and --set; its cross-key rules may wait, parse_config's
// cross_key_rules = false, since the result is parsed again with them) with the DeepSpeed config
// `ds` (from `ds_origin`) applied, for a job of `world_size` ranks; its notes gain what was mapped
// and what was ignored.
Config apply_deepspeed(const Config& cfg, const nlohmann::json& ds, int world_size, const std::string& ds_origin,
                       const std::string& cfg_origin);
// The same from the file at `path`.
Config load_deepspeed(const Config& cfg, const std::string& path, int world_size, const std::string& cfg_origin);

}  // namespace autosp
