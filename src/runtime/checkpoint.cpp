// Atomic checkpoint directories.
#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "models/weights.h"
#include "tensor/safetensors.h"

namespace autosp {
namespace fs = std::filesystem;

namespace {

constexpr int kFormat = 1;

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw RuntimeFailure(str(p.string(), ": cannot open for fsync"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) throw RuntimeFailure(str(p.string(), ": fsync failed"));
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

fs::path resolve(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) throw UsageError(str(path, ": no such checkpoint directory"));
  if (fs::exists(p / "meta.json")) return p;
  fs::path best;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(e.path() / "meta.json") && name > best.filename().string())
      best = e.path();
  }
  if (best.empty()) throw UsageError(str(path, ": holds no checkpoint (no meta.json, no step_* directory)"));
  return best;
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const ParamMap& params, const AdamW& opt,
                            const nlohmann::json& resolved_config) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw RuntimeFailure(str(root, ": cannot create checkpoint directory: ", ec.message()));
  const fs::path final_dir = fs::path(root) / step_name(step);
  const fs::path tmp = fs::path(root) / ("." + step_name(step) + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw RuntimeFailure(str(tmp.string(), ": cannot create: ", ec.message()));

  save_weights((tmp / "model.safetensors").string(), params);
  std::map<std::string, Tensor> moments;
  for (const auto& [name, t] : opt.exp_avg) moments["exp_avg." + name] = t;
  for (const auto& [name, t] : opt.exp_avg_sq) moments["exp_avg_sq." + name] = t;
  save_safetensors((tmp / "optimizer.safetensors").string(), moments);
  // The data order is a pure function of the step and the seed, and nothing else draws random
  // numbers after initialisation, so (step, seed) is the whole RNG state.
  nlohmann::json meta = {{"format", kFormat},
                         {"step", step},
                         {"optimizer_step", opt.step},
                         {"data_position", step},
                         {"rng", {{"seed", resolved_config["train"]["seed"]}, {"state", "stateless (step, seed)"}}},
                         {"config", resolved_config}};
  {
    std::ofstream f(tmp / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f.flush()) throw RuntimeFailure(str((tmp / "meta.json").string(), ": write failed"));
  }
  fsync_path(tmp / "meta.json");
  fsync_path(tmp);

  // Replace an existing checkpoint of the same step only after the new one is complete.
  const fs::path old = fs::path(root) / ("." + step_name(step) + ".old." + std::to_string(::getpid()));
  if (fs::exists(final_dir)) fs::rename(final_dir, old, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw RuntimeFailure(str(final_dir.string(), ": cannot move checkpoint into place: ", ec.message()));
  fsync_path(root);
  fs::remove_all(old, ec);
  return final_dir.string();
}

Checkpoint load_checkpoint(const std::string& path, const Config& cfg, DType dtype) {
  const fs::path dir = resolve(path);
  const std::string meta_path = (dir / "meta.json").string();
  std::ifstream f(meta_path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json meta = nlohmann::json::parse(ss.str(), nullptr, false);
  auto bad = [&](const std::string& what) { throw UsageError(str(meta_path, ": ", what)); };
  if (!meta.is_object()) bad("not valid JSON");
  if (!meta.contains("format") || meta["format"] != kFormat) bad(str("unsupported checkpoint format (expected ", kFormat, ")"));
  for (const char* k : {"step", "optimizer_step"})
    if (!meta.contains(k) || !meta[k].is_number_integer() || meta[k].get<int64_t>() < 0)
      bad(str("'", k, "' must be a non-negative integer"));
  if (!meta.contains("config") || !meta["config"].is_object() || !meta["config"].contains("model"))
    bad("missing the config it was written with");
  if (meta["config"]["model"] != cfg.resolved["model"])
    bad(str("was written for model ", meta["config"]["model"].dump(), ", this run's model is ",
            cfg.resolved["model"].dump()));

  Checkpoint ck;
  ck.meta = meta;
  ck.step = meta["step"].get<int64_t>();
  ck.params = load_weights((dir / "model.safetensors").string(), cfg.model, dtype);
  SafetensorsFile opt = load_safetensors((dir / "optimizer.safetensors").string());
  const std::string opt_path = (dir / "optimizer.safetensors").string();
  for (const auto& [name, p] : ck.params)
    for (const char* kind : {"exp_avg.", "exp_avg_sq."}) {
      auto it = opt.tensors.find(kind + name);
      if (it == opt.tensors.end()) throw UsageError(str(opt_path, ": missing '", kind, name, "'"));
      if (it->second.shape() != p.shape())
        throw UsageError(str(opt_path, ": '", kind, name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                             shape_str(p.shape())));
      if (!is_floating(it->second.dtype())) throw UsageError(str(opt_path, ": '", kind, name, "' is not a float tensor"));
      (std::string(kind) == "exp_avg." ? ck.optimizer.exp_avg : ck.optimizer.exp_avg_sq)[name] =
          it->second.dtype() == dtype ? it->second : it->second.to(dtype);
    }
  if (opt.tensors.size() != 2 * ck.params.size())
    throw UsageError(str(opt_path, ": holds ", opt.tensors.size(), " tensors, expected ", 2 * ck.params.size()));
  ck.optimizer.step = meta["optimizer_step"].get<int64_t>();
  return ck;
}

}  // namespace autosp
