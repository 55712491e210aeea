// PEFT adapter directories in and out (adapter.h).
#include "train/adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <spdlog/spdlog.h>

#include "models/hf_config.h"
#include "models/lora.h"
#include "models/weights.h"
#include "tensor/check.h"
#include "tensor/input_file.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"  // crc32c

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


// The keys of PEFT's LoraConfig (0.12 to 0.20) and of its PeftConfig base: any other key of an
// adapter_config.json is unknown (PEFT warns about those and ignores them; so does autosp).
const std::set<std::string> kPeftLoraKeys = {
    "peft_type", "task_type", "inference_mode", "base_model_name_or_path", "revision", "auto_mapping",
    "peft_version", "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out",
    "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern",
    "rank_pattern", "alpha_pattern", "megatron_config", "megatron_core", "trainable_token_indices", "loftq_config",
    "eva_config", "corda_config", "lora_ga_config", "use_dora", "velora_config", "alora_invocation_tokens",
    "use_qalora", "qalora_group_size", "monteclora_config", "layer_replication", "runtime_config", "lora_bias",
    "target_parameters", "use_bdlora", "arrow_config", "ensure_weight_tying"};

// Whether PEFT takes `v` as set: None, False, "", [] and {} are its "not given" (it tests them
// with `if config.x:`).
bool set_in_peft(const json& v) {
  return !(v.is_null() || v == false || (v.is_string() && v.get<std::string>().empty()) ||
           ((v.is_array() || v.is_object()) && v.empty()));
}

// exclude_modules: PEFT (check_target_module_exists) drops a module whose path is a listed name or
// ends with "." + one (module_matches, as for target_modules), or that the regex string matches.
// Exact where it excludes none of the run's targets (nothing changes); adapters on a subset of a
// target's modules are not something the run builds, so that is refused, naming the module.
void check_exclude_modules(const json& ex, const Config& cfg, const std::function<void(const std::string&)>& bad) {
  if (!set_in_peft(ex)) return;
  if (ex.is_string())
    bad(str("exclude_modules ", ex.dump(), ": PEFT's regex form is not supported (list the module names)"));
  if (!ex.is_array()) bad(str("exclude_modules ", ex.dump(), ": expected a list of module names"));
  std::vector<std::string> keys;
  for (const json& e : ex) {
    if (!e.is_string()) bad(str("exclude_modules ", ex.dump(), ": expected a list of module names"));
    keys.push_back(e.get<std::string>());
  }
  std::vector<std::string> hit;
  for (const std::string& w : lora_target_weights(cfg.model, cfg.lora.target_modules)) {
    const std::string_view module = module_of(w);
    if (std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return module_matches(module, k); }))
      hit.emplace_back(module);
  }
  if (!hit.empty())
    bad(str("exclude_modules ", ex.dump(), ": excludes ", hit.front(),
            hit.size() > 1 ? str(" and ", hit.size() - 1, " more") : std::string(),
            " of target_modules; adapters on only some of a target's modules are not supported"));
}

// init_lora_weights: how PEFT made the adapter before it trained. Those that leave the base as it is
// (true, false, "gaussian", "eva", "orthogonal") do not matter to a trained adapter; PiSSA, OLoRA,
// CorDA and LoRA-GA train on the residual base W − scale·B0·A0 and LoftQ on a quantised one, while
// autosp adds the adapter to the model's W: refused.
void check_init(const json& init, const std::function<void(const std::string&)>& bad) {
  if (init.is_boolean()) return;
  if (!init.is_string()) bad(str("init_lora_weights ", init.dump(), ": expected true, false or a method's name"));
  const std::string s = init.get<std::string>();
  if (s == "gaussian" || s == "eva" || s == "orthogonal") return;
  if (s == "loftq")
    bad("init_lora_weights \"loftq\": LoftQ trains the adapter on a quantised base (PEFT replaces W), and autosp "
        "adds it to the model's own W");
  if (s.starts_with("pissa") || s == "olora" || s == "corda" || s == "lora_ga")
    bad(str("init_lora_weights ", init.dump(), ": PEFT trains this adapter on the residual base W - scale*B0*A0 "
            "(it changes the base weights), and autosp adds it to the model's own W; convert it to a plain LoRA "
            "adapter with PEFT's save_pretrained(path_initial_model_for_weight_conversion=...)"));
  bad(str("init_lora_weights ", init.dump(), ": not an initialisation autosp knows (true, false, \"gaussian\", "
          "\"eva\", \"orthogonal\")"));
}

// adapter_config.json against the run's lora section and model.
void check_adapter_config(const json& a, const Config& cfg, const std::string& path, bool warn) {
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
  if (t.is_string() && t != "all-linear")
    bad(str("target_modules ", t.dump(), ": PEFT's regex form is not supported (list the module names)"));
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
  check_exclude_modules(a.value("exclude_modules", json()), cfg, bad);
  check_init(a.value("init_lora_weights", json(true)), bad);
  const std::vector<std::pair<const char*, const char*>> unsupported = {
      {"lora_bias", "lora_B has a bias (its lora_B.bias tensors), which autosp's adapters do not have"},
      {"trainable_token_indices", "PEFT then also trains single rows of the embedding (trainable tokens), which "
                                  "autosp does not do"},
      {"target_parameters", "LoRA on nn.Parameter weights (such as stacked experts) is not supported"},
      {"alora_invocation_tokens", "an activated LoRA acts only after its invocation tokens, which autosp does not do"},
      {"use_qalora", "QALoRA pools the adapter's input (GPTQ models), which autosp does not do"},
      {"use_bdlora", "block-diagonal LoRA is not supported"},
      {"arrow_config", "Arrow's routing over several adapters is not supported"},
      {"velora_config", "VeLoRA is not supported"},
      {"monteclora_config", "MonteCLoRA is not supported"}};
  for (const auto& [key, why] : unsupported)
    if (a.contains(key) && set_in_peft(a[key])) bad(str(key, " ", a[key].dump(), ": ", why));
  if (a.value("ensure_weight_tying", json(false)) == true && set_in_peft(a.value("modules_to_save", json())))
    bad("ensure_weight_tying true with modules_to_save: tying the saved copies is not supported");
  std::vector<std::string> unknown;
  for (const auto& [key, v] : a.items())
    if (!kPeftLoraKeys.count(key)) unknown.push_back(key);
  if (warn && !unknown.empty()) {
    std::string keys;
    for (const std::string& k : unknown) keys += str(keys.empty() ? "" : ", ", k);
    spdlog::warn("{}: unknown keys {} (not PEFT LoraConfig's): ignored, as PEFT ignores them", path, keys);
  }
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
  save_weights((fs::path(dir) / kAdapterWeightsFile).string(), peft_keyed(params));
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

ParamMap load_adapter(const std::string& dir, const Config& cfg, DType dtype, bool warn) {
  const std::string config_path = (fs::path(dir) / kAdapterConfigFile).string();
  const std::string text = read_input_file(config_path, str("a PEFT adapter's ", kAdapterConfigFile), uint64_t{16} << 20);
  check_adapter_config(parse_json(text, config_path), cfg, config_path, warn);
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

namespace {

// Element i of a contiguous host f32 or f64 tensor, as f32.
float element_f32(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f64 ? static_cast<float>(t.data<double>()[i]) : t.data<float>()[i];
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// How a record names its base in a message: "the base model.from \"DIR\"", "the base
// --init-from \"FILE\"" or "a randomly initialised base (...)".
std::string base_words(const json& r) {
  const std::string source = r.value("source", "");
  if (source == "random")
    return str("a randomly initialised base (no model.from; train.seed ", r.value("seed", json()).dump(), ")");
  return str("the base ", source, " ", r.value("path", json()).dump());
}

}  // namespace

json lora_base_record(const Config& cfg, const std::string& init_from, const ParamMap& base) {
  constexpr int64_t kSamples = 4096;
  uint32_t crc = 0;
  int64_t elements = 0;
  for (const auto& [name, t0] : base) {
    Tensor t = t0;  // the master dtype (f32 or f64) as loaded; any other float dtype as f32
    if (t.dtype() != DType::f32 && t.dtype() != DType::f64) t = t.to(DType::f32);
    if (!t.is_contiguous()) t = t.clone();
    crc = crc32c(name.data(), name.size() + 1, crc);  // with its terminating NUL
    crc = crc32c(t.shape().data(), t.shape().size() * sizeof(int64_t), crc);
    const int64_t n = t.numel();
    elements += n;
    const int64_t k = std::min(n, kSamples);
    std::vector<float> sample(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j)  // evenly spaced, the first and the last element among them
      sample[static_cast<size_t>(j)] = element_f32(t, k == 1 ? 0 : j * (n - 1) / (k - 1));
    crc = crc32c(sample.data(), sample.size() * sizeof(float), crc);
  }
  json r = {{"tensors", base.size()}, {"elements", elements}, {"fingerprint", hex32(crc)}};
  if (!init_from.empty()) r["source"] = "--init-from", r["path"] = init_from;
  else if (!cfg.model_from.empty()) r["source"] = "model.from", r["path"] = cfg.model_from;
  else r["source"] = "random", r["seed"] = cfg.train.seed;
  return r;
}

std::string check_lora_base(const json& recorded, const json& now, const std::string& meta_path) {
  if (!recorded.is_object() || !recorded.contains("fingerprint") || !recorded["fingerprint"].is_string())
    throw UsageError(str(meta_path, ": 'lora_base' is not a record of the base (source, fingerprint)"));
  const std::string theirs = recorded["fingerprint"].get<std::string>(), ours = now["fingerprint"].get<std::string>();
  if (theirs == ours && recorded.value("elements", json()) == now["elements"]) {
    if (recorded.value("path", json()) == now.value("path", json())) return "";
    return str("lora: ", base_words(now), " has the weights the checkpoint's adapters were trained on (",
               base_words(recorded), ", fingerprint ", ours, ")");
  }
  const std::string source = recorded.value("source", "");
  const std::string path = recorded.value("path", json()).dump();
  const std::string need = source == "model.from" ? str("set model.from ", path, " to continue that run")
                           : source == "random"
                               ? std::string("resume without model.from (and with the same train.seed)")
                               : str("a resume cannot take --init-from: set model.from to a model directory holding ",
                                     path, "'s weights");
  const std::string given =
      now.value("source", "") == "random"
          ? std::string("this run has no model.from (its base would be randomly initialised)")
          : str("this run's base, model.from ", now.value("path", json()).dump(), ", holds other weights (fingerprint ",
                ours, ")");
  throw UsageError(str(meta_path, ": the adapters were trained on ", base_words(recorded), " (fingerprint ", theirs,
                       "); ", given, ": model.from must give that base; ", need));
}

ParamMap peft_keyed(const ParamMap& params) {
  ParamMap out;
  for (const auto& [name, t] : params) out[peft_key(name)] = t;
  return out;
}

}  // namespace autosp
