// The files a run writes besides its checkpoints (--metrics, --dump-grads) are checked before the
// first step: one may not be a file the run reads (the config, the data, --init-from weights, a
// checkpoint it resumes from) nor lie inside a checkpoint (a step_* or temporary directory of
// train.checkpoint_dir, or any directory holding a meta.json), nor be the checkpoint directory's
// own lock or run log. Paths are compared after resolving symlinks and `..`, and existing files
// also by identity (a hard link is the same file). A violation is a UsageError naming the flag.
#pragma once

#include <string>
#include <vector>

namespace autosp {

struct RunFiles {
  std::vector<std::string> inputs;  // files or directories the run reads; a glob pattern stands for its matches
  std::string checkpoint_dir;       // train.checkpoint_dir ("" when the run saves none)
};

// How an output is written: appended to (--metrics: a device or FIFO such as /dev/stdout is fine),
// or replaced whole by a rename (--dump-grads: an existing device, FIFO or socket would be
// replaced by a regular file, so it is refused).
enum class OutputKind { appended, replaced };

void check_output_path(const std::string& flag, const std::string& path, const RunFiles& run,
                       OutputKind kind = OutputKind::appended);

}  // namespace autosp
