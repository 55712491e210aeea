// PEFT adapter directories in and out (adapter.h).
#include "train/adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "models/hf_config.h"
#include "models/lora.h"
#include "models/weights.h"
#include "tensor/check.h"
#include "tensor/safetensors.h"

namespace autosp {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::map<std::string, Shape> adapter_shapes(const Config& cfg) {
  std::map<std::string, Shape> out =
      lora_shapes(cfg.model, lora_target_weights(cfg.model, cfg.lora.target_modules), cfg.lora.r);
  const std::vector<std::string> saved = lora_saved_params(cfg.model, cfg.lora.modules_to_save);
  for (const ParamSpec& p : param_specs(cfg.model))
    if (std::find(saved.begin(), saved.end(), p.name) != saved.end()) out[p.name] = p.shape;
  return out;
}

namespace {

// The lora section as PEFT's adapter_config.json writes it (the keys PEFT 0.12's LoraConfig takes).
json adapter_config(const Config& cfg) {
  const LoraConfig& l = cfg.lora;
  const bool gpt2 = family(cfg.model.arch).layout == Layout::gpt2;
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", cfg.model_from.empty() ? json() : json(cfg.model_from)},
          {"r", l.r},
          {"lora_alpha", l.lora_alpha},
          {"lora_dropout", l.lora_dropout},
          {"target_modules", l.target_modules},
          {"use_rslora", l.use_rslora},
          {"modules_to_save", l.modules_to_save.empty() ? json() : json(l.modules_to_save)},
          {"init_lora_weights", cfg.resolved["lora"].value("init_lora_weights", json(true))},
          {"bias", "none"},
          {"fan_in_fan_out", gpt2},  // GPT-2's Conv1D stores W as [in, out]
          {"inference_mode", true}};
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError(str(path, ": cannot open (a PEFT adapter directory has ", kAdapterConfigFile, ")"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// adapter_config.json against the run's lora section and model.
void check_adapter_config(const json& a, const Config& cfg, const std::string& path) {
  auto bad = [&](const std::string& what) { throw UsageError(str(path, ": ", what)); };
  if (!a.is_object()) bad("not a JSON object");
  if (a.value("peft_type", json()) != "LORA")
    bad(str("peft_type ", a.value("peft_type", json()).dump(), ": expected \"LORA\""));
  const LoraConfig& l = cfg.lora;
  auto same = [&](const char* key, const json& run, const char* run_key) {
    const json v = a.value(key, json());
    const bool eq = v.is_number() && run.is_number() ? v.get<double>() == run.get<double>() : v == run;
    if (!eq) bad(str(key, " ", v.dump(), " differs from the run's ", run_key, " ", run.dump(), " (set ", run_key,
                     " to the adapter's)"));
  };
  same("r", l.r, "lora.r");
  same("lora_alpha", l.lora_alpha, "lora.lora_alpha");
  if (a.value("use_rslora", false) != l.use_rslora) same("use_rslora", l.use_rslora, "lora.use_rslora");
  const json t = a.value("target_modules", json());
  std::set<std::string> targets;
  if (t.is_string() && t == "all-linear") targets = {l.target_modules.begin(), l.target_modules.end()};
  else if (t.is_array())
    for (const json& e : t)
      if (e.is_string()) targets.insert(e.get<std::string>());
  if (targets != std::set<std::string>(l.target_modules.begin(), l.target_modules.end()))
    same("target_modules", t, "lora.target_modules");
  const json m = a.value("modules_to_save", json());
  if (!(m.is_null() && l.modules_to_save.empty()) && m != json(l.modules_to_save))
    same("modules_to_save", m, "lora.modules_to_save");
  if (a.value("bias", "none") != "none") bad(str("bias ", a["bias"].dump(), ": only \"none\" is supported"));
  // PEFT settings that change the math and that the rewrite does not do: refused, not ignored.
  if (a.value("use_dora", false) != false) bad("use_dora true: DoRA adapters are not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (a.contains(key) && !a[key].is_null() && !a[key].empty())
      bad(str(key, " ", a[key].dump(), ": per-module ranks and alphas are not supported"));
  for (const char* key : {"layers_to_transform", "layer_replication"})
    if (a.contains(key) && !a[key].is_null())
      bad(str(key, " ", a[key].dump(), ": not supported (every layer is adapted)"));
  const json base = a.value("base_model_name_or_path", json());
  std::error_code ec;
  if (base.is_string() && fs::is_regular_file(fs::path(base.get<std::string>()) / "config.json", ec)) {
    const json theirs = read_hf_model_dir(base.get<std::string>()).model;
    for (const char* key : {"arch", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "intermediate_size"})
      if (theirs.contains(key) && cfg.resolved["model"].contains(key) && theirs[key] != cfg.resolved["model"][key])
        bad(str("base_model_name_or_path ", base.dump(), " has ", key, " ", theirs[key].dump(), ", the run's model ",
                cfg.resolved["model"][key].dump(), ": the adapter was trained on another base"));
  }
}

}  // namespace

std::vector<std::string> save_adapter(const std::string& dir, const ParamMap& params, const Config& cfg) {
  ParamMap keyed;
  for (const auto& [name, t] : params) keyed[peft_key(name)] = t;
  save_weights((fs::path(dir) / kAdapterWeightsFile).string(), keyed);
  const std::string path = (fs::path(dir) / kAdapterConfigFile).string();
  std::ofstream f(path);
  f << adapter_config(cfg).dump(2) << "\n";
  if (!f.flush()) throw RuntimeFailure(str(path, ": write failed"));
  return {kAdapterWeightsFile, kAdapterConfigFile};
}

void write_merged_model(const std::string& dir, const Config& cfg, const ParamMap& params) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw UsageError(str("--merge-lora ", dir, ": exists and is not an empty directory (nothing is replaced)"));
  fs::create_directories(dir, ec);
  if (ec) throw UsageError(str("--merge-lora ", dir, ": cannot create: ", ec.message()));
  const ParamMap merged = merge_lora(cfg.model, params, cfg.lora.scale());
  save_hf_model(dir, merged, cfg.model, static_cast<uint64_t>(cfg.train.max_shard_mb * 1e6));
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ofstream f(path);
  f << hf_config_json(cfg.model, merged.begin()->second.dtype(), cfg.hf_carried).dump(2) << "\n";
  if (!f.flush()) throw RuntimeFailure(str(path, ": write failed"));
}

ParamMap load_adapter(const std::string& dir, const Config& cfg, DType dtype) {
  const std::string config_path = (fs::path(dir) / kAdapterConfigFile).string();
  check_adapter_config(parse_json(read_text(config_path), config_path), cfg, config_path);
  const std::string path = (fs::path(dir) / kAdapterWeightsFile).string();
  const SafetensorsFile file = load_safetensors(path);
  const std::map<std::string, Shape> want = adapter_shapes(cfg);
  ParamMap out;
  for (const auto& [key, t] : file.tensors) {
    const std::string name = from_peft_key(key);
    const auto it = want.find(name);
    if (it == want.end())
      throw UsageError(str(path, ": '", key, "' is not a tensor this run trains (lora.target_modules and ",
                           "lora.modules_to_save say which)"));
    if (t.shape() != it->second)
      throw UsageError(str(path, ": '", key, "' has shape ", shape_str(t.shape()), ", the run's model needs ",
                           shape_str(it->second), " (lora.r ", cfg.lora.r, ")"));
    if (!is_floating(t.dtype())) throw UsageError(str(path, ": '", key, "' is not a float tensor"));
    out[name] = t.to(dtype);
  }
  for (const auto& [name, shape] : want)
    if (!out.count(name)) throw UsageError(str(path, ": missing '", peft_key(name), "'"));
  return out;
}

}  // namespace autosp
