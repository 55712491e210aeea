// Text ↔ token ids for the apps: a Hugging Face tokenizer.json through a Python helper
// (scripts/tokenizer_worker.py under scripts/hf-venv.sh's venv), or a model's bytes when it was
// trained on data.source "text". autosp-sample encodes prompts and decodes what it generates;
// autosp-train decodes the end-of-run example with the tokenizer.json that scripts/prepare_data.py
// leaves beside the shards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tools/py_worker.h"

namespace autosp {

class TextCodec {
 public:
  // `tokenizer`: a tokenizer.json, or a directory holding one ("" = none; a path that is neither,
  // or a file the library cannot load, is a UsageError naming it); `bytes`: ids are bytes. `source_dir`: the repository, where
  // the helper and the venv script live.
  TextCodec(const std::string& source_dir, const std::string& tokenizer, bool bytes);
  bool can_encode() const { return worker_ || bytes_; }
  bool can_decode() const { return can_encode(); }
  std::vector<int64_t> encode(const std::string& text);
  std::string decode(const std::vector<int64_t>& ids);  // "" when it cannot decode

 private:
  bool bytes_;
  std::unique_ptr<PyWorker> worker_;
};

// The tokenizer.json scripts/prepare_data.py saved beside a token shard of `data_path` (a file or
// a glob: the directory of its first match), or "" when there is none.
std::string tokenizer_beside(const std::string& data_path);

}  // namespace autosp
