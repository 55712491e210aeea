// Checkpoints: <root>/step_<NNNNNNNN>/ is a Hugging Face model directory — config.json in HF keys
// and model.safetensors ({"format": "pt"}), or model-0000i-of-0000n.safetensors shards and
// model.safetensors.index.json above train.max_shard_mb — so from_pretrained(step_N) loads it, plus
// optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>) and meta.json (format, step, the
// resolved config, data position, a LoRA run's base, and the size and CRC-32C of every other file).
//
// A checkpoint directory is written under a temporary name, fsynced and renamed into place (a
// re-save of the same step exchanges the two directories in one rename), so a crash at any point
// leaves step_N complete, old or new, never missing or partial; the newest `keep_last` are kept,
// older ones removed (renamed away first, so a crash while removing leaves no partial step_*
// directory). A dead writer's leftovers are cleaned before a write, not after. Loading verifies the
// checksums before reading anything, then validates everything against the run's config: a mismatch or a corrupt file is a UsageError naming the file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "train/optimizer.h"

namespace autosp {

struct Checkpoint {
  int64_t step = 0;  // number of completed steps
  ParamMap params;
  AdamW optimizer;
  nlohmann::json meta;
  std::string dir;  // the step_N directory it was read from (a root given resolves to its newest)
};

struct SaveOptions {
  int64_t keep_last = 0;                // keep the newest N step_* directories (0 = all)
  std::function<void()> before_commit;  // runs when the files are durable, before the rename (fault tests)
  // Fault tests: called at each point of the write, in order: "files" (data files written and
  // fsynced), "synced" (meta.json and the directory fsynced), then "exchanged" (a re-save: the
  // directories swapped) or "moved_aside" + "committed" (a re-save without RENAME_EXCHANGE) or
  // "committed" (a new step), then "pruned".
  std::function<void(const char* point)> at_point;
  // meta.json's "data_position": where the run's data continues (train/data_order.h DataPosition,
  // as the trainer writes it); null writes the step, as checkpoints before positions did.
  nlohmann::json data_position;
  // A LoRA run's meta.json "lora_base": which base its adapters train on (train/adapter.h
  // lora_base_record); null writes none.
  nlohmann::json lora_base;
};

// Returns the checkpoint's directory. `cfg` gives the model (config.json), train.max_shard_mb and
// train.seed; meta.json records cfg.resolved. Non-finite parameters or moments are a RuntimeFailure,
// and nothing is written. A write that fails leaves no temporary directory behind.
std::string save_checkpoint(const std::string& root, int64_t step, const ParamMap& params, const AdamW& opt,
                            const Config& cfg, const SaveOptions& options = {});

// `path` is a checkpoint directory (it has meta.json) or a root holding step_* directories (the
// newest is used; a newest step_* without meta.json is a UsageError).
Checkpoint load_checkpoint(const std::string& path, const Config& cfg, DType dtype);

// One live run per checkpoint directory: `<root>/.lock` locked (flock) for the object's lifetime and
// holding "<pid> <host>". A second live run gets a UsageError naming the holder; a lock whose owner
// died (the kernel released it) is taken over, with a log line naming the previous owner.
class DirLock {
 public:
  explicit DirLock(const std::string& root);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// The newest step_N under `root` (complete or not), or -1 when there is none.
int64_t newest_step(const std::string& root);
// The newest complete step_N (it has its meta.json) with N < `before`, or -1 when there is none.
int64_t newest_complete_step_before(const std::string& root, int64_t before);

// Moves the step_N directories under `root` with N > `newer_than` (every one for -1) into a new
// `root/previous-<UTC time>-<pid>/`, where nothing looks for checkpoints; returns that directory, or
// "" when nothing was moved. A run that starts over or branches from an older step keeps what it
// would otherwise prune or continue.
std::string move_aside(const std::string& root, int64_t newer_than);

// The checkpoint directory's lifecycle (docs/reliability.md), rank 0 only, in two halves, so that a
// run refused for any reason (exit 2) has moved nothing. open_checkpoint_dir, before anything is
// loaded: `root` locked for the run (the returned lock lives as long as the run), then a root that
// holds checkpoints of an earlier run needs `resume` naming it (or one of its step_* directories),
// or `start_over`; anything else is a UsageError saying which. It moves nothing.
std::unique_ptr<DirLock> open_checkpoint_dir(const std::string& root, const std::string& resume, bool start_over);
// The moves the run's start implies, made once everything the run needs has been read and
// validated on every rank (the trainer calls it right before the first step): `start_over` moves
// every step_* aside; resuming step `step` of `root` itself branches from it, moving the newer
// steps aside so they are neither pruned nor taken for this run's newest by a later --resume ROOT.
// A no-op otherwise.
void settle_checkpoint_dir(const std::string& root, const std::string& resume, bool start_over, int64_t step);

// CRC-32C (Castagnoli, as in iSCSI/ext4): crc32c("123456789") == 0xE3069283. `crc` continues a
// previous call's result.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32C and size of a file, read in chunks; an unreadable file is a UsageError.
uint32_t crc32c_file(const std::string& path, uint64_t* size = nullptr);

}  // namespace autosp
