// Text ↔ token ids (tools/text_codec.h).
#include "tools/text_codec.h"

#include <filesystem>

#include "tensor/check.h"
#include "tensor/input_file.h"
#include "train/data.h"  // expand_path

namespace autosp {

namespace fs = std::filesystem;

TextCodec::TextCodec(const std::string& source_dir, const std::string& given, bool bytes) : bytes_(bytes) {
  if (given.empty()) return;
  std::error_code ec;
  // A model directory (Hugging Face's, or a checkpoint's) holds its tokenizer.json.
  const std::string tokenizer = fs::is_directory(given, ec) ? (fs::path(given) / "tokenizer.json").string() : given;
  // The worker opens the file itself, so a FIFO is refused here rather than waited on (it would
  // block the worker for ever with nothing writing to it).
  const std::string kind = file_kind(tokenizer);
  if (kind.empty())
    throw UsageError(str("--tokenizer ", given, tokenizer == given ? ": no such file" : ": no tokenizer.json in that directory"));
  if (kind != "a regular file")
    throw UsageError(str("--tokenizer ", tokenizer, ": not a regular file (", kind, "; the tokenizer is read by a helper process: give a file)"));
  worker_ = std::make_unique<PyWorker>(std::vector<std::string>{venv_python(source_dir, "hf-venv.sh"),
                                                                 source_dir + "/scripts/tokenizer_worker.py", tokenizer});
  // The worker first says whether the file loaded, so a bad file is named before anything is
  // generated (with --prompt-ids too: the tokenizer would only be needed afterwards, to decode).
  const nlohmann::json hello = worker_->read_reply();
  if (hello.contains("bad_tokenizer"))
    throw UsageError(str("--tokenizer ", tokenizer, ": not a Hugging Face tokenizer.json (",
                         hello["bad_tokenizer"].get<std::string>(), ")"));
}

std::vector<int64_t> TextCodec::encode(const std::string& text) {
  if (worker_) return worker_->request({{"encode", text}})["ids"].get<std::vector<int64_t>>();
  if (!bytes_)
    throw UsageError("--prompt needs --tokenizer (the tokenizer.json beside the data's shards), or a model trained "
                     "on data.source \"text\"; or give --prompt-ids");
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string TextCodec::decode(const std::vector<int64_t>& ids) {
  if (worker_) return worker_->request({{"decode", ids}})["text"].get<std::string>();
  if (!bytes_) return "";
  std::string s;
  for (int64_t id : ids) s += id >= 0 && id < 256 ? static_cast<char>(id) : '?';
  return s;
}

std::string tokenizer_beside(const std::string& data_path) {
  std::vector<std::string> files;
  try {
    files = expand_path(data_path);
  } catch (const UsageError&) {
    return "";
  }
  if (files.empty()) return "";
  const fs::path t = fs::path(files.front()).parent_path() / "tokenizer.json";
  std::error_code ec;
  return fs::is_regular_file(t, ec) ? t.string() : "";
}

}  // namespace autosp
