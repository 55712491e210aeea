// Reading a small text input the user names: a run config, a DeepSpeed config, a PEFT
// adapter_config.json, a checkpoint's meta.json, a Hugging Face config.json. One way for all, so
// that none of them can block forever.
//
// A regular file is read whole. A FIFO or a pipe (bash's `--config <(...)` hands over /dev/fd/N)
// is opened without blocking and read as its writer writes; each wait for more is bounded by
// pipe_wait_seconds(), and a wait that runs out is a UsageError that says nothing writes to it
// (a FIFO with no writer would otherwise block the open, then the read, for ever). Anything else
// (a directory, a device, a socket) is refused as not a regular file before it is opened.
// This file knows nothing of what the text means (the callers parse it).
#pragma once

#include <cstdint>
#include <string>

namespace autosp {

// The bound on each wait for a pipe's writer: AUTOSP_PIPE_TIMEOUT seconds, default 10 (a number
// in (0, 1e7]; anything else is a UsageError naming the variable).
double pipe_wait_seconds();

// The text of `path`, at most `max_bytes` long. `what` names what the file should be, with its
// article ("a config file", "a DeepSpeed config"): it ends the messages of a path that is absent,
// a directory or not a regular file. Every failure is a UsageError whose text starts "path: ".
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes = uint64_t{64} << 20);

// What `path` is, for a message: "a regular file", "a directory", "a FIFO", "a character device",
// "a block device", "a socket", "" when there is nothing there (stat follows symbolic links).
std::string file_kind(const std::string& path);

}  // namespace autosp
