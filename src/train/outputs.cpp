// Output paths against the run's inputs and checkpoints.
#include "train/outputs.h"

#include <filesystem>

#include "tensor/check.h"
#include "train/data.h"

namespace autosp {
namespace fs = std::filesystem;
namespace {

fs::path canonical_or_weak(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : c;
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (a == b) return true;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

// `p` equals `dir` or lies below it.
bool within(const fs::path& p, const fs::path& dir) {
  auto [d, q] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return d == dir.end();
}

}  // namespace

void check_output_path(const std::string& flag, const std::string& path, const RunFiles& run, OutputKind kind) {
  const fs::path out = canonical_or_weak(path);
  auto refuse = [&](const std::string& why) {
    throw UsageError(str(flag, " ", path, ": ", why, "; write it somewhere else"));
  };
  std::error_code ec;
  if (fs::is_directory(out, ec)) refuse("is a directory");
  if (kind == OutputKind::replaced && fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    refuse("is not a regular file (writing it would replace it with one)");
  for (const std::string& in : run.inputs) {
    if (in.empty()) continue;
    for (const std::string& file : expand_path(in)) {
      const fs::path p = canonical_or_weak(file);
      if (same_file(out, p)) refuse(str("is ", in, ", which this run reads"));
      if (fs::is_directory(p, ec) && within(out, p)) refuse(str("is inside ", in, ", which this run reads"));
    }
  }
  // Inside a checkpoint: any ancestor directory holding meta.json, or a step_*/temporary directory.
  for (fs::path d = out.parent_path(); !d.empty(); d = d.parent_path()) {
    const std::string name = d.filename().string();
    if (fs::exists(d / "meta.json", ec) || name.rfind("step_", 0) == 0 || name.rfind(".step_", 0) == 0)
      refuse(str("is inside the checkpoint ", d.string()));
    if (d == d.root_path()) break;
  }
  if (!run.checkpoint_dir.empty()) {
    const fs::path root = canonical_or_weak(run.checkpoint_dir);
    for (const char* own : {".lock", "train.log"})
      if (same_file(out, root / own)) refuse(str("is the checkpoint directory's ", own));
    if (same_file(out, root)) refuse("is train.checkpoint_dir");
  }
  // Said before the run starts, not when the file is first written (--dump-grads: after step 1).
  if (const fs::path dir = fs::path(path).parent_path(); !dir.empty() && !fs::is_directory(dir, ec))
    refuse(str(dir.string(), " is not a directory"));
}

}  // namespace autosp
