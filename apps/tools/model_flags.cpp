// The model flags autosp-sample and autosp-eval share (tools/model_flags.h).
#include "tools/model_flags.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "tensor/check.h"
#include "tensor/input_file.h"
#include "train/checkpoint.h"

namespace autosp {
namespace fs = std::filesystem;

void add_model_flags(cxxopts::Options& opts) {
  opts.add_options()("checkpoint", "a checkpoint step_N directory, or a root (its newest step)",
                     cxxopts::value<std::string>())(
      "config", "run config JSON (default: the checkpoint's own)", cxxopts::value<std::string>())(
      "set", "override a config key (key.path=value), repeatable", cxxopts::value<std::vector<std::string>>())(
      "init-from", "safetensors weights (Hugging Face names) instead of a checkpoint", cxxopts::value<std::string>())(
      "model", "a Hugging Face model directory (its config.json and weights), as model.from",
      cxxopts::value<std::string>());
}

std::string step_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw UsageError(str("--checkpoint ", path, ": not a directory"));
  if (fs::exists(fs::path(path) / "meta.json", ec)) return path;
  const int64_t step = newest_step(path);
  if (step < 0) throw UsageError(str("--checkpoint ", path, ": neither a checkpoint (no meta.json) nor a root with step_* directories"));
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return (fs::path(path) / name).string();
}

Config checkpoint_config(const std::string& dir, const std::vector<std::string>& sets) {
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  const nlohmann::json meta = parse_json(read_input_file(meta_path, "a checkpoint's meta.json"), meta_path);
  if (!meta.is_object() || !meta.contains("config") || !meta["config"].is_object())
    throw UsageError(str(meta_path, ": no 'config' object (not an autosp checkpoint?)"));
  Config cfg = parse_config(meta["config"], sets, meta_path);
  // The saved config is the resolved one: it holds every key, as if each had been given, so the
  // warnings about keys a setting leaves unread would name keys the user never wrote. Only those
  // about keys of --set are kept.
  std::set<std::string> set_keys;
  for (const std::string& s : sets) set_keys.insert(s.substr(0, s.find('=')));
  std::erase_if(cfg.warnings, [&](const std::string& w) {
    for (const auto& [section, keys] : meta["config"].items()) {
      if (!keys.is_object()) continue;
      for (const auto& [name, value] : keys.items()) {
        const std::string key = str(section, ".", name);
        if (!set_keys.count(key) && w.rfind(str(meta_path, ": ", key, " "), 0) == 0) return true;
      }
    }
    return false;
  });
  return cfg;
}

ModelFlags model_from_flags(const cxxopts::ParseResult& args, const std::vector<std::string>& sets) {
  auto opt = [&](const char* k) { return flag_text(args, k); };
  if (args.count("checkpoint") + args.count("config") + args.count("model") != 1)
    throw UsageError("give one of --checkpoint DIR, --model HF_DIR, or --config FILE (with --init-from or "
                     "--checkpoint for the weights, or model.from)");
  if (args.count("checkpoint") && args.count("init-from")) throw UsageError("--checkpoint and --init-from exclude each other");
  ModelFlags out;
  out.args.init_from = opt("init-from");
  if (args.count("checkpoint")) out.args.resume = step_dir(opt("checkpoint"));
  out.cfg = args.count("config")  ? load_config(opt("config"), sets)
            : args.count("model") ? parse_config(nlohmann::json{{"model", {{"from", opt("model")}}}}, sets)
                                  : checkpoint_config(out.args.resume, sets);
  return out;
}

}  // namespace autosp
