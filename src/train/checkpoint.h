// Checkpoints: <root>/step_<NNNNNNNN>/ holding model.safetensors (Hugging Face names),
// optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>) and meta.json (format, step, the
// resolved config, data position, and the size and CRC-32C of both safetensors files).
//
// A checkpoint directory is written under a temporary name, fsynced and renamed into place, so a
// crash mid-write never leaves a partial checkpoint where a good one was; the newest `keep_last`
// are kept, older ones removed (renamed away first, so a crash while removing leaves no partial
// step_* directory). Loading verifies the checksums before reading anything, then validates
// everything against the run's config: a mismatch or a corrupt file is a UsageError naming the file.
#pragma once

#include <cstdint>
#include <functional>
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
};

struct SaveOptions {
  int64_t keep_last = 0;                // keep the newest N step_* directories (0 = all)
  std::function<void()> before_commit;  // runs when the files are durable, before the rename (fault tests)
};

// Returns the checkpoint's directory.
std::string save_checkpoint(const std::string& root, int64_t step, const ParamMap& params, const AdamW& opt,
                            const nlohmann::json& resolved_config, const SaveOptions& options = {});

// `path` is a checkpoint directory (it has meta.json) or a root holding step_* directories (the
// newest complete one is used).
Checkpoint load_checkpoint(const std::string& path, const Config& cfg, DType dtype);

// CRC-32C (Castagnoli, as in iSCSI/ext4): crc32c("123456789") == 0xE3069283. `crc` continues a
// previous call's result.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32C and size of a file, read in chunks; an unreadable file is a UsageError.
uint32_t crc32c_file(const std::string& path, uint64_t* size = nullptr);

}  // namespace autosp
