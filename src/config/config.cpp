// Config schema and validation. The schema is one table (key path, type, range or choices, and
// how to set and get the key in Config); defaults come from the structs in config.h, and the
// resolved config is every row's getter, so a key is written once here. A string key with a fixed
// set of values is stored as its enum: the accepted strings are the enum's names (arch_name, ...),
// listed once below.
#include "config/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "models/hf_config.h"
#include "models/lora.h"
#include "tensor/check.h"
#include "tensor/input_file.h"

namespace autosp {

std::string_view data_source_name(DataSourceKind s) {
  switch (s) {
    case DataSourceKind::synthetic: return "synthetic";
    case DataSourceKind::tokens: return "tokens";
    case DataSourceKind::text: return "text";
  }
  return "unknown source";
}

std::string_view objective_name(Objective o) { return o == Objective::dpo ? "dpo" : "lm"; }

std::string_view lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::cosine: return "cosine";
    case LrSchedule::cosine_with_min_lr: return "cosine_with_min_lr";
    case LrSchedule::linear: return "linear";
    case LrSchedule::constant: return "constant";
    case LrSchedule::constant_with_warmup: return "constant_with_warmup";
    case LrSchedule::wsd: return "wsd";
    case LrSchedule::ds_warmup: return "ds_warmup";
    case LrSchedule::ds_warmup_decay: return "ds_warmup_decay";
    case LrSchedule::ds_warmup_cosine: return "ds_warmup_cosine";
  }
  return "unknown schedule";
}

std::string_view decay_type_name(DecayType d) {
  switch (d) {
    case DecayType::cosine: return "cosine";
    case DecayType::linear: return "linear";
    case DecayType::one_minus_sqrt: return "1-sqrt";
  }
  return "unknown decay type";
}

std::string_view warmup_type_name(WarmupType w) {
  switch (w) {
    case WarmupType::log: return "log";
    case WarmupType::linear: return "linear";
  }
  return "unknown warmup type";
}

ZeroMode zero_mode(const ZeroConfig& z, int world_size) {
  if (world_size <= 1) return ZeroMode::replicated;
  switch (z.stage) {
    case 1: return ZeroMode::sharded_moments;
    case 2: return ZeroMode::sharded_gradients;
    case 3: return ZeroMode::sharded_parameters;
    default: return ZeroMode::replicated;
  }
}

bool ulysses_fits(int64_t u, int64_t heads, int64_t kv_heads) {
  return u >= 1 && heads % u == 0 && kv_heads >= 1 && (kv_heads % u == 0 || u % kv_heads == 0);
}

int64_t auto_ring_size(int64_t sp, int64_t heads, int64_t kv_heads) {
  for (int64_t u = sp; u > 1; --u)
    if (sp % u == 0 && ulysses_fits(u, heads, kv_heads)) return sp / u;
  return sp;
}

double LoraConfig::scale() const {
  return lora_alpha / (use_rslora ? std::sqrt(static_cast<double>(r)) : static_cast<double>(r));
}

std::string_view zero_mode_name(ZeroMode m) {
  switch (m) {
    case ZeroMode::replicated: return "replicated";
    case ZeroMode::sharded_moments: return "sharded_moments";
    case ZeroMode::sharded_gradients: return "sharded_gradients";
    case ZeroMode::sharded_parameters: return "sharded_parameters";
  }
  return "unknown ZeRO mode";
}

namespace {

using json = nlohmann::json;
using Kind = ValueKind;

struct Key {
  std::string path;  // "model.hidden_size"
  Kind kind;
  double lo, hi;        // inclusive range for numbers
  std::string choices;  // "a|b|c" for strings, "" = any
  const ModelKey* model;  // a model.* key: its row of the model-key table (which families it applies to)
  std::function<void(Config&, const json&)> set;
  std::function<json(const Config&)> get;  // the value the resolved config records (null: left out)
};

constexpr double kBig = 9.0e15;

// data.mix: a list of {"path": non-empty string, "weight": number > 0}, each entry checked here
// (the setter's UsageError gets the config's origin in front); null or [] is no mix.
std::vector<DataMixEntry> parse_data_mix(const json& v) {
  std::vector<DataMixEntry> mix;
  if (v.is_null()) return mix;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    const std::string at = str("data.mix[", i, "]");
    const std::string form = R"(expected {"path": "file or glob", "weight": number > 0})";
    if (!e.is_object()) throw UsageError(str(at, " = ", e.dump(), ": ", form));
    for (auto& [key, value] : e.items())
      if (key != "path" && key != "weight" && key != "loss_mask_path" && key != "doc_ids_path")
        throw UsageError(str(at, ": unknown key '", key, "' (", form, R"(, optionally "loss_mask_path" and "doc_ids_path"))"));
    if (!e.contains("path") || !e["path"].is_string() || e["path"].get<std::string>().empty())
      throw UsageError(str(at, ".path: ", form));
    DataMixEntry entry;
    entry.path = e["path"].get<std::string>();
    if (e.contains("weight")) {
      const json& w = e["weight"];
      if (!w.is_number() || !(w.get<double>() > 0) || !(w.get<double>() <= 1e12))
        throw UsageError(str(at, ".weight = ", w.dump(), ": expected a number in (0, 1e12]"));
      entry.weight = w.get<double>();
    }
    if (e.contains("loss_mask_path")) {
      const json& m = e["loss_mask_path"];
      if (!m.is_string() || m.get<std::string>().empty())
        throw UsageError(str(at, ".loss_mask_path = ", m.dump(), ": expected a file or a glob of .npy loss masks"));
      entry.loss_mask_path = m.get<std::string>();
    }
    if (e.contains("doc_ids_path")) {
      const json& d = e["doc_ids_path"];
      if (!d.is_string() || d.get<std::string>().empty())
        throw UsageError(str(at, ".doc_ids_path = ", d.dump(), ": expected a file or a glob of .npy document ids"));
      entry.doc_ids_path = d.get<std::string>();
    }
    mix.push_back(std::move(entry));
  }
  return mix;
}

json data_mix_json(const std::vector<DataMixEntry>& mix) {
  if (mix.empty()) return nullptr;
  json out = json::array();
  for (const DataMixEntry& e : mix) {
    json entry = {{"path", e.path}, {"weight", e.weight}};
    if (!e.loss_mask_path.empty()) entry["loss_mask_path"] = e.loss_mask_path;
    if (!e.doc_ids_path.empty()) entry["doc_ids_path"] = e.doc_ids_path;
    out.push_back(std::move(entry));
  }
  return out;
}

// The values of each enum key, in the order its choices are listed in errors ("expected one of
// gpt2|llama"); each value's string is its name function's.
constexpr std::array kSources{DataSourceKind::synthetic, DataSourceKind::tokens, DataSourceKind::text};
constexpr std::array kDevices{DeviceKind::cpu, DeviceKind::cuda};
constexpr std::array kAttention{AttentionBackend::automatic, AttentionBackend::flash, AttentionBackend::cudnn};
constexpr std::array kDTypes{DType::f32, DType::f64, DType::bf16};
constexpr std::array kSchedules{LrSchedule::cosine, LrSchedule::cosine_with_min_lr, LrSchedule::linear,
                                LrSchedule::constant, LrSchedule::constant_with_warmup, LrSchedule::wsd,
                                LrSchedule::ds_warmup, LrSchedule::ds_warmup_decay, LrSchedule::ds_warmup_cosine};
constexpr std::array kDecayTypes{DecayType::cosine, DecayType::linear, DecayType::one_minus_sqrt};
constexpr std::array kWarmupTypes{WarmupType::log, WarmupType::linear};
constexpr std::array kObjectives{Objective::lm, Objective::dpo};

// F(section, name): a row's setter and getter of the field Config::section.name.
template <class S, class M>
auto field_set(S Config::*sec, M S::*member) {
  return [sec, member](Config& c, const json& v) { (c.*sec).*member = v.get<M>(); };
}
template <class S, class M>
auto field_get(S Config::*sec, M S::*member) {
  return [sec, member](const Config& c) { return json((c.*sec).*member); };
}
// A layout key that also takes "auto" (Config::auto_keys): "auto" leaves the field at its default
// and records the key; the getter gives "auto" back until resolve_auto has set the field.
template <class S, class M>
auto auto_set(const char* path, S Config::*sec, M S::*member) {
  return [path, sec, member](Config& c, const json& v) {
    if (v.is_string()) {
      c.auto_keys.insert(path);
      return;
    }
    c.auto_keys.erase(path);
    (c.*sec).*member = v.get<M>();
  };
}
template <class S, class M>
auto auto_get(const char* path, S Config::*sec, M S::*member) {
  return [path, sec, member](const Config& c) { return c.auto_keys.count(path) ? json("auto") : json((c.*sec).*member); };
}
#define AUTO(path, section, name)                                                     \
  auto_set(path, &Config::section, &decltype(Config::section)::name), \
      auto_get(path, &Config::section, &decltype(Config::section)::name)
#define F(section, name)                                          \
  field_set(&Config::section, &decltype(Config::section)::name), \
      field_get(&Config::section, &decltype(Config::section)::name)

// A string key stored as an enum: the choices are the names of `values`; check_value has checked
// the string against them before the setter runs, and the getter gives the name back.
template <class S, class E, size_t N>
Key enum_key(const char* path, S Config::*sec, E S::*member, const std::array<E, N>& values,
             std::string_view (*name)(E)) {
  std::string choices;
  for (E e : values) choices += str(choices.empty() ? "" : "|", name(e));
  auto set = [=](Config& c, const json& v) {
    for (E e : values)
      if (name(e) == v.get<std::string>()) (c.*sec).*member = e;
  };
  auto get = [=](const Config& c) { return json(name((c.*sec).*member)); };
  return {path, Kind::string, 0, 0, choices, nullptr, set, get};
}

// The model.* rows: one per model key (models/model_keys.h).
std::vector<Key> model_rows() {
  std::vector<Key> rows;
  for (const ModelKey& k : model_keys())
    rows.push_back({"model." + k.name, k.kind, k.lo, k.hi, k.choices, &k,
                    [&k](Config& c, const json& v) { k.set(c.model, v); },
                    [&k](const Config& c) { return model_json(c.model).value(k.name, json()); }});
  return rows;
}

// The dpo.* rows (TRL's DPOConfig names); like lora's, null unless train.objective is "dpo".
std::vector<Key> dpo_rows() {
  auto on = [](const Config& c, json v) { return c.train.objective == Objective::dpo ? v : json(); };
  return {
      {"dpo.beta", Kind::number, 0, 1e6, "", nullptr, [](Config& c, const json& v) { c.dpo.beta = v.get<double>(); },
       [on](const Config& c) { return on(c, c.dpo.beta); }},
      {"dpo.loss_type", Kind::string, 0, 0, "sigmoid|ipo", nullptr,
       [](Config& c, const json& v) { c.dpo.loss_type = v.get<std::string>(); },
       [on](const Config& c) { return on(c, c.dpo.loss_type); }},
      {"dpo.label_smoothing", Kind::number, 0, 0.5, "", nullptr,
       [](Config& c, const json& v) { c.dpo.label_smoothing = v.get<double>(); },
       [on](const Config& c) { return on(c, c.dpo.label_smoothing); }},
      {"dpo.rpo_alpha", Kind::number, 0, 1e6, "", nullptr,
       [](Config& c, const json& v) { c.dpo.rpo_alpha = v.get<double>(); },
       [on](const Config& c) { return on(c, c.dpo.rpo_alpha); }},
      {"dpo.precompute_ref", Kind::boolean, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.dpo.precompute_ref = v.get<bool>(); },
       [on](const Config& c) { return on(c, c.dpo.precompute_ref); }},
  };
}

// The lora.* rows (PEFT's LoraConfig names). Their getters give null unless the section is given, so
// the resolved config of a run without LoRA is what it always was. The lists' setters check
// their items (a UsageError the parse turns into a problem naming the key).
std::vector<Key> lora_rows() {
  auto on = [](const Config& c, json v) { return c.lora.enabled ? v : json(); };
  auto names = [](const json& v, const char* key) {
    std::vector<std::string> out;
    for (const json& e : v) {
      if (!e.is_string() || e.get<std::string>().empty())
        throw UsageError(str(key, " = ", v.dump(), ": expected a list of module names (strings)"));
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  return {
      {"lora.r", Kind::integer, 1, 1 << 16, "", nullptr, [](Config& c, const json& v) { c.lora.r = v.get<int64_t>(); },
       [on](const Config& c) { return on(c, c.lora.r); }},
      {"lora.lora_alpha", Kind::number, 0, 1e6, "", nullptr,
       [](Config& c, const json& v) { c.lora.lora_alpha = v.get<double>(); },
       [on](const Config& c) { return on(c, c.lora.lora_alpha); }},
      {"lora.lora_dropout", Kind::number, 0, 0.999999, "", nullptr,
       [](Config& c, const json& v) { c.lora.lora_dropout = v.get<double>(); },
       [on](const Config& c) { return on(c, c.lora.lora_dropout); }},
      {"lora.target_modules", Kind::list_or_string, 0, 0, "", nullptr,
       [names](Config& c, const json& v) {
         c.lora.all_linear = v.is_string() && v.get<std::string>() == "all-linear";
         if (v.is_string() && !c.lora.all_linear)
           throw UsageError(str("lora.target_modules = ", v.dump(), ": expected \"all-linear\" or a list of module ",
                                "names (PEFT's regular-expression form is not supported)"));
         c.lora.target_modules = c.lora.all_linear ? std::vector<std::string>{} : names(v, "lora.target_modules");
         if (!c.lora.all_linear && c.lora.target_modules.empty())
           throw UsageError("lora.target_modules = []: expected at least one module name, or \"all-linear\"");
       },
       [on](const Config& c) { return on(c, c.lora.all_linear ? json("all-linear") : json(c.lora.target_modules)); }},
      {"lora.use_rslora", Kind::boolean, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.lora.use_rslora = v.get<bool>(); },
       [on](const Config& c) { return on(c, c.lora.use_rslora); }},
      {"lora.modules_to_save", Kind::list, 0, 0, "", nullptr,
       [names](Config& c, const json& v) { c.lora.modules_to_save = v.is_null() ? std::vector<std::string>{}
                                                                                  : names(v, "lora.modules_to_save"); },
       [on](const Config& c) { return on(c, c.lora.modules_to_save); }},
      {"lora.init_lora_weights", Kind::boolean_or_string, 0, 0, "", nullptr,
       [](Config& c, const json& v) {
         const std::string s = v.is_boolean() ? (v.get<bool>() ? "true" : "false") : v.get<std::string>();
         if (s != "true" && s != "false" && s != "gaussian")
           throw UsageError(str("lora.init_lora_weights = ", v.dump(), ": expected true, false or \"gaussian\" (",
                                "PEFT's data-driven initialisations, such as \"pissa\" or \"loftq\", are not supported)"));
         c.lora.init_lora_weights = s;
       },
       [on](const Config& c) {
         const std::string& s = c.lora.init_lora_weights;
         return on(c, s == "gaussian" ? json(s) : json(s == "true"));
       }},
      {"lora.from", Kind::string, 0, 0, "", nullptr, [](Config& c, const json& v) { c.lora.from = v.get<std::string>(); },
       [on](const Config& c) { return on(c, c.lora.from.empty() ? json() : json(c.lora.from)); }},
  };
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    std::vector<Key> k = model_rows();
    std::vector<Key> rest = {
      enum_key("data.source", &Config::data, &DataConfig::source, kSources, data_source_name),
      {"data.path", Kind::string, 0, 0, "", nullptr, F(data, path)},
      {"data.val_path", Kind::string, 0, 0, "", nullptr, F(data, val_path)},
      {"data.seq_len", Kind::integer, 1, 1 << 26, "", nullptr, F(data, seq_len)},
      {"data.batch_size", Kind::integer, 1, 1 << 20, "", nullptr, F(data, batch_size)},
      {"data.eos_token_id", Kind::integer, -1, 1 << 24, "", nullptr, F(data, eos_token_id)},  // -1: none (the default)
      {"data.document_mask", Kind::boolean, 0, 0, "", nullptr, F(data, document_mask)},
      // [{"path": glob, "weight": w}, ...]; none is null, which the resolved config leaves out.
      {"data.mix", Kind::list, 0, 0, "", nullptr, [](Config& c, const json& v) { c.data.mix = parse_data_mix(v); },
       [](const Config& c) { return data_mix_json(c.data.mix); }},
      {"data.shuffle", Kind::boolean, 0, 0, "", nullptr, F(data, shuffle)},
      {"data.seed", Kind::integer, -1, kBig, "", nullptr, F(data, seed)},  // -1: train.seed (the default)
      // Loss masks beside data.path and data.val_path (train/data.h); left out of the resolved
      // config when unset, so checkpoints written before them still resume.
      {"data.loss_mask_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.loss_mask_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.loss_mask_path.empty() ? json() : json(c.data.loss_mask_path); }},
      {"data.pairs_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.pairs_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.pairs_path.empty() ? json() : json(c.data.pairs_path); }},
      {"data.val_pairs_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.val_pairs_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.val_pairs_path.empty() ? json() : json(c.data.val_pairs_path); }},
      {"data.doc_ids_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.doc_ids_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.doc_ids_path.empty() ? json() : json(c.data.doc_ids_path); }},
      {"data.val_doc_ids_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.val_doc_ids_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.val_doc_ids_path.empty() ? json() : json(c.data.val_doc_ids_path); }},
      {"data.val_loss_mask_path", Kind::string, 0, 0, "", nullptr,
       [](Config& c, const json& v) { c.data.val_loss_mask_path = v.get<std::string>(); },
       [](const Config& c) { return c.data.val_loss_mask_path.empty() ? json() : json(c.data.val_loss_mask_path); }},
      {"train.steps", Kind::integer, 0, kBig, "", nullptr, F(train, steps)},
      {"train.gradient_accumulation_steps", Kind::integer, 1, 1 << 20, "", nullptr, F(train, gradient_accumulation_steps)},
      {"train.lr", Kind::number, 0, 10, "", nullptr, F(train, lr)},
      {"train.min_lr", Kind::number, 0, 10, "", nullptr, F(train, min_lr)},
      {"train.warmup_steps", Kind::integer, 0, kBig, "", nullptr, F(train, warmup_steps)},
      enum_key("train.objective", &Config::train, &TrainConfig::objective, kObjectives, objective_name),
      enum_key("train.lr_schedule", &Config::train, &TrainConfig::lr_schedule, kSchedules, lr_schedule_name),
      {"train.schedule_steps", Kind::integer, 0, kBig, "", nullptr, F(train, schedule_steps)},
      {"train.decay_fraction", Kind::number, 0, 1, "", nullptr, F(train, decay_fraction)},
      enum_key("train.decay_type", &Config::train, &TrainConfig::decay_type, kDecayTypes, decay_type_name),
      enum_key("train.warmup_type", &Config::train, &TrainConfig::warmup_type, kWarmupTypes, warmup_type_name),
      {"train.warmup_min_lr", Kind::number, 0, 10, "", nullptr, F(train, warmup_min_lr)},
      {"train.weight_decay", Kind::number, 0, 10, "", nullptr, F(train, weight_decay)},
      {"train.beta1", Kind::number, 0, 0.999999, "", nullptr, F(train, beta1)},
      {"train.beta2", Kind::number, 0, 0.999999999, "", nullptr, F(train, beta2)},
      // eps = 0 divides 0 by 0 where a gradient is zero: the update is undefined, not merely sharp.
      {"train.eps", Kind::number, 1e-30, 1, "", nullptr, F(train, eps)},
      {"train.grad_clip", Kind::number, 0, 1e9, "", nullptr, F(train, grad_clip)},
      {"train.seed", Kind::integer, 0, kBig, "", nullptr, F(train, seed)},
      {"train.log_every", Kind::integer, 1, kBig, "", nullptr, F(train, log_every)},
      {"train.eval_every", Kind::integer, 0, kBig, "", nullptr, F(train, eval_every)},
      {"train.eval_batches", Kind::integer, 1, 1 << 20, "", nullptr, F(train, eval_batches)},
      {"train.checkpoint_dir", Kind::string, 0, 0, "", nullptr, F(train, checkpoint_dir)},
      {"train.tensorboard_dir", Kind::string, 0, 0, "", nullptr, F(train, tensorboard_dir)},
      {"train.csv_dir", Kind::string, 0, 0, "", nullptr, F(train, csv_dir)},
      {"train.checkpoint_every", Kind::integer, 0, kBig, "", nullptr, F(train, checkpoint_every)},
      {"train.keep_checkpoints", Kind::integer, 0, kBig, "", nullptr, F(train, keep_checkpoints)},
      {"train.max_shard_mb", Kind::number, 1e-3, 1e9, "", nullptr, F(train, max_shard_mb)},
      {"train.save_timeout", Kind::number, 0.1, 86400, "", nullptr, F(train, save_timeout)},
      enum_key("runtime.device", &Config::runtime, &RuntimeConfig::device, kDevices, device_kind_name),
      enum_key("runtime.attention", &Config::runtime, &RuntimeConfig::attention, kAttention, attention_backend_name),
      enum_key("runtime.dtype", &Config::runtime, &RuntimeConfig::dtype, kDTypes, dtype_torch_name),
      {"runtime.threads", Kind::integer, 0, 1024, "", nullptr, F(runtime, threads)},
      {"runtime.activation_checkpointing", Kind::boolean_or_auto, 0, 0, "", nullptr,
       AUTO("runtime.activation_checkpointing", runtime, activation_checkpointing)},
      {"runtime.tiled_mlp", Kind::boolean_or_auto, 0, 0, "", nullptr, AUTO("runtime.tiled_mlp", runtime, tiled_mlp)},
      {"runtime.tiled_loss", Kind::boolean_or_auto, 0, 0, "", nullptr, AUTO("runtime.tiled_loss", runtime, tiled_loss)},
      {"runtime.fuse_kernels", Kind::boolean, 0, 0, "", nullptr, F(runtime, fuse_kernels)},
      {"runtime.moe_keep_projections", Kind::boolean, 0, 0, "", nullptr, F(runtime, moe_keep_projections)},
      {"runtime.overlap_grad_sync", Kind::boolean, 0, 0, "", nullptr, F(runtime, overlap_grad_sync)},
      {"runtime.grad_bucket_mb", Kind::number, 0.001, 1 << 20, "", nullptr, F(runtime, grad_bucket_mb)},
      {"runtime.peak_tflops", Kind::number, 0, 1e9, "", nullptr, F(runtime, peak_tflops)},
      {"runtime.profile_ops", Kind::boolean, 0, 0, "", nullptr, F(runtime, profile_ops)},
      {"sequence_parallel.autosp_size", Kind::integer_or_auto, 1, 1 << 16, "", nullptr,
       AUTO("sequence_parallel.autosp_size", sequence_parallel, autosp_size)},
      {"sequence_parallel.ring_size", Kind::integer_or_auto, 1, 1 << 16, "", nullptr,
       [](Config& c, const json& v) {
         c.sequence_parallel.ring_auto = v.is_string();
         c.sequence_parallel.ring_size = v.is_string() ? 1 : v.get<int64_t>();
       },
       [](const Config& c) {
         return c.sequence_parallel.ring_auto ? json("auto") : json(c.sequence_parallel.ring_size);
       }},
      {"zero_optimization.stage", Kind::integer_or_auto, 0, 3, "", nullptr,
       AUTO("zero_optimization.stage", zero_optimization, stage)},
      {"moe.expert_parallel_size", Kind::integer_or_auto, 1, 1 << 16, "", nullptr,
       AUTO("moe.expert_parallel_size", moe, expert_parallel_size)},
    };
    for (Key& row : lora_rows()) rest.push_back(std::move(row));
    for (Key& row : dpo_rows()) rest.push_back(std::move(row));
    k.insert(k.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
    return k;
  }();
  return keys;
}
#undef F
#undef AUTO

const char* kind_name(Kind k) { return value_kind_name(k); }

std::string json_path(const std::string& path) {
  std::string p = "/";
  for (char c : path) p += c == '.' ? '/' : c;
  return p;
}

// What is wrong with `v` as the value of key `k` ("model.hidden_size = \"big\": expected an
// integer"), or nothing.
std::optional<std::string> value_problem(const Key& k, const json& v) {
  auto bad = [&](const std::string& what) { return std::optional(str(k.path, " = ", v.dump(), ": ", what)); };
  // A key that null lifts (model.sliding_window: no window).
  if (v.is_null() && k.model && k.model->nullable) return std::nullopt;
  switch (k.kind) {
    case Kind::integer:
      if (!v.is_number_integer()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::number:
      if (!v.is_number()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::boolean:
      if (!v.is_boolean()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::string:
      if (!v.is_string()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::object:
      if (!v.is_object() && !v.is_null()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::list:
      if (!v.is_array() && !v.is_null()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::integer_or_auto:
      if (!v.is_number_integer() && !(v.is_string() && v.get<std::string>() == "auto"))
        return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::boolean_or_auto:
      if (!v.is_boolean() && !(v.is_string() && v.get<std::string>() == "auto"))
        return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::list_or_string:
      if (!v.is_array() && !v.is_string()) return bad(str("expected ", kind_name(k.kind)));
      break;
    case Kind::boolean_or_string:
      if (!v.is_boolean() && !v.is_string()) return bad(str("expected ", kind_name(k.kind)));
      break;
  }
  if (k.kind == Kind::integer || k.kind == Kind::number || (k.kind == Kind::integer_or_auto && v.is_number())) {
    double x = v.get<double>();
    if (!(x >= k.lo && x <= k.hi)) {
      if (k.kind != Kind::number)  // exact bounds, not 1.67772e+07
        return bad(str("expected an integer in [", static_cast<int64_t>(k.lo), ", ", static_cast<int64_t>(k.hi), "]"));
      return bad(str("expected a value in [", k.lo, ", ", k.hi, "]"));
    }
  }
  if (k.kind == Kind::string && !k.choices.empty()) {
    std::string choices = k.choices;
    std::string s = v.get<std::string>();
    std::stringstream ss(choices);
    std::string c;
    bool ok = false;
    while (std::getline(ss, c, '|')) ok |= c == s;
    if (!ok) return bad(str("expected one of ", choices));
  }
  return std::nullopt;
}

void apply_override(json& j, const std::string& origin, const std::string& ov) {
  auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(str(origin, ": --set '", ov, "': expected key.path=value"));
  std::string key = ov.substr(0, eq), text = ov.substr(eq + 1);
  json v;
  try {
    v = parse_json(text, "--set");
  } catch (const UsageError&) {
    v = text;  // not JSON: a string
  }
  try {
    (void)v.dump();  // every string in the resolved config must print (and go into checkpoints)
  } catch (const json::exception&) {
    throw UsageError(str(origin, ": --set ", key, ": the value is not valid UTF-8"));
  }
  const auto dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size() || key.find('.', dot + 1) != std::string::npos)
    throw UsageError(str(origin, ": --set ", key, ": expected section.key"));
  // Plain object keys, not a JSON pointer: "/x/99999999999" would resize an array to that length.
  json& section = j[key.substr(0, dot)];
  if (section.is_null()) section = json::object();
  if (!section.is_object())
    throw UsageError(str(origin, ": --set ", key, ": '", key.substr(0, dot), "' must be an object"));
  section[key.substr(dot + 1)] = v;
}

// Other tools' names of our model keys (HF's GPT2Config and Llama spellings, and the aliases the
// model-key table lists) → ours.
const std::map<std::string, std::string>& model_aliases() {
  static const std::map<std::string, std::string> a = [] {
    std::map<std::string, std::string> m;
    for (const ModelKey& k : model_keys()) {
      std::stringstream names(str(k.hf, " ", k.hf_gpt2, " ", k.aliases));
      for (std::string n; names >> n;)
        if (n != k.name) m[n] = k.name;
    }
    return m;
  }();
  return a;
}

// "'sec.key'" with a hint: an alias, a close spelling in its section, the same key in another
// section, or where a Hugging Face key belongs.
std::string describe_unknown(const std::string& section, const std::string& key, const std::set<std::string>& known,
                             const std::set<std::string>& sections) {
  const std::string full = key.empty() ? section : section + "." + key;
  auto hint = [&](const std::string& s) { return str("'", full, "' (did you mean '", s, "'?)"); };
  auto closest = closest_name;
  if (key.empty()) {
    const std::string s = closest(section, {sections.begin(), sections.end()});
    return s.empty() ? str("'", full, "'") : hint(s);
  }
  if (section == "model") {
    auto a = model_aliases().find(key);
    if (a != model_aliases().end()) return hint("model." + a->second);
  }
  std::vector<std::string> same_section, same_key;
  for (const auto& k : known) {
    const auto dot = k.find('.');
    if (k.substr(0, dot) == section) same_section.push_back(k.substr(dot + 1));
    if (k.substr(dot + 1) == key) same_key.push_back(k);
  }
  const std::string s = closest(key, same_section);
  if (!s.empty()) return hint(section + "." + s);
  if (!same_key.empty()) return hint(same_key.front());
  if (section == "model")
    return str("'", full, "' (a Hugging Face config.json key? read that file with \"model\": {\"from\": DIR})");
  return str("'", full, "'");
}

// Every unknown section and key, each a problem of its own.
void check_known_keys(const json& j, const std::string& origin, Problems& problems) {
  std::set<std::string> known_sections, known_keys;
  for (const auto& k : schema()) {
    std::string p = k.path;
    known_sections.insert(p.substr(0, p.find('.')));
    known_keys.insert(p);
  }
  known_keys.insert("model.from");
  for (auto& [section, body] : j.items()) {
    if (!known_sections.count(section)) {
      problems.add(str("unknown key ", describe_unknown(section, "", known_keys, known_sections)));
      continue;
    }
    if (!body.is_object()) throw UsageError(str(origin, ": '", section, "' must be an object"));
    for (auto& [key, v] : body.items())
      if (!known_keys.count(section + "." + key))
        problems.add(str("unknown key ", describe_unknown(section, key, known_keys, known_sections)));
  }
}

// The HF keys a config.json carries that do not change the math, listed once in the log.
void note_unused_hf_keys(const HfModelConfig& hf, const std::string& where, Config& c) {
  if (hf.math_free.empty()) return;
  std::string keys;
  for (const auto& k : hf.math_free) keys += str(keys.empty() ? "" : ", ", k);
  c.notes.push_back(str(where, ": not used by autosp (Hugging Face keys that do not change the math): ", keys));
}

// model.from: the directory's config.json (in HF keys) becomes the model section; a key written
// beside `from` overrides the file's value.
void expand_model_from(json& j, Config& c, const std::string& origin) {
  if (!j.contains("model") || !j["model"].is_object() || !j["model"].contains("from")) return;
  const json& from = j["model"]["from"];
  if (!from.is_string() || from.get<std::string>().empty())
    throw UsageError(str(origin, ": model.from = ", from.dump(), ": expected a Hugging Face model directory (a string)"));
  const std::string dir = from.get<std::string>();
  HfModelConfig hf;
  try {
    hf = read_hf_model_dir(dir);
  } catch (const UsageError& e) {
    throw UsageError(str(origin, ": model.from: ", e.what()));
  }
  json merged = hf.model;
  for (auto& [k, v] : j["model"].items()) {
    if (k == "from") continue;
    if (merged.contains(k) && merged[k] != v)
      c.notes.push_back(str("model.", k, " = ", v.dump(), " overrides ", dir, "/config.json (", merged[k].dump(), ")"));
    merged[k] = v;
  }
  note_unused_hf_keys(hf, str("model.from ", dir), c);
  for (auto& w : hf.warnings) c.warnings.push_back(std::move(w));
  c.model_from = dir;
  c.hf_carried = std::move(hf.carried);
  j["model"] = merged;
}

// lora.from: the adapter directory's adapter_config.json gives the lora keys the section leaves
// out, as PeftModel.from_pretrained takes its config from there (train/adapter.h checks the rest).
void expand_lora_from(json& j, const std::string& origin) {
  if (!j.contains("lora") || !j["lora"].is_object() || !j["lora"].contains("from")) return;
  const json& from = j["lora"]["from"];
  if (!from.is_string() || from.get<std::string>().empty()) return;  // the row's own check names it
  const std::string path = (std::filesystem::path(from.get<std::string>()) / "adapter_config.json").string();
  std::string text;
  try {
    text = read_input_file(path, "a PEFT adapter directory's adapter_config.json");
  } catch (const UsageError& e) {
    throw UsageError(str(origin, ": lora.from: ", e.what()));
  }
  const json a = parse_json(text, path);
  if (!a.is_object()) throw UsageError(str(origin, ": lora.from: ", path, ": not a JSON object"));
  for (const char* key : {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora", "modules_to_save"})
    if (!j["lora"].contains(key) && a.contains(key) && !a[key].is_null()) j["lora"][key] = a[key];
}

// The schedule's cross-key rules (schedule_reads says which keys each schedule reads).
void check_schedule(const Config& c, Problems& problems) {
  const TrainConfig& t = c.train;
  auto bad = [&](const std::string& what) { problems.add(what); };
  const std::string name(lr_schedule_name(t.lr_schedule));
  const std::vector<std::string_view> reads = schedule_reads(t.lr_schedule);
  auto read = [&](std::string_view key) { return std::find(reads.begin(), reads.end(), key) != reads.end(); };
  const bool ds = read("train.warmup_type");  // DeepSpeed's kinds: only they have a warm-up shape
  if (read("train.min_lr") && t.min_lr > t.lr) bad(str("train.min_lr ", t.min_lr, " exceeds train.lr ", t.lr));
  if (ds && t.warmup_steps < 1)
    bad(str("train.lr_schedule \"", name, "\" needs train.warmup_steps >= 1 (DeepSpeed's warmup_num_steps is positive)"));
  if (t.lr_schedule == LrSchedule::wsd) {  // the run's steps (train.steps, set by --steps) or its own span
    const int64_t steps = t.schedule_steps > 0 ? t.schedule_steps : t.steps;
    const int64_t decay = std::llround(t.decay_fraction * static_cast<double>(steps));
    if (t.warmup_steps + decay > steps)
      bad(str("train.lr_schedule \"wsd\": train.warmup_steps ", t.warmup_steps, " + the decay's ", decay,
              " steps (train.decay_fraction ", t.decay_fraction, ") exceed the schedule's ", steps, " steps (",
              t.schedule_steps > 0 ? "train.schedule_steps" : "the run's: train.steps or --steps", ")"));
  }
}

// "a, b and c"
std::string and_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += str(i == 0 ? "" : i + 1 == items.size() ? " and " : ", ", items[i]);
  return out;
}

// train.objective "dpo" and its section: what the DPO objective needs and what it does not take yet.
void check_dpo(const Config& c, const std::function<void(const std::string&)>& bad) {
  const bool dpo = c.train.objective == Objective::dpo;
  if (!dpo) {
    if (!c.data.pairs_path.empty() || !c.data.val_pairs_path.empty())
      bad("data.pairs_path and data.val_pairs_path are for train.objective \"dpo\" (train.objective is \"lm\")");
    return;
  }
  if (c.data.pairs_path.empty())
    bad("train.objective \"dpo\" needs data.pairs_path: the pair ids beside the token shards (scripts/prepare_data.py "
        "--preference writes them; its data.json names them)");
  if (!c.data.mix.empty()) bad("train.objective \"dpo\" reads data.path, not data.mix");
  if (c.data.loss_mask_path.empty())
    bad("train.objective \"dpo\" needs data.loss_mask_path: the completion masks (without them the prompts would "
        "score too; scripts/prepare_data.py --preference writes them)");
  if (c.data.source != DataSourceKind::tokens) bad("train.objective \"dpo\" needs data.source \"tokens\"");
  if (c.dpo.beta <= 0) bad(str("dpo.beta ", c.dpo.beta, " must be > 0"));
  if (c.dpo.loss_type != "sigmoid" && c.dpo.loss_type != "ipo")
    bad(str("dpo.loss_type \"", c.dpo.loss_type, "\": expected \"sigmoid\" (DPO) or \"ipo\""));
  if (c.dpo.loss_type == "ipo" && c.dpo.label_smoothing != 0)
    bad("dpo.label_smoothing applies to dpo.loss_type \"sigmoid\" (TRL's conservative DPO), not \"ipo\"");
  if (c.runtime.device != DeviceKind::cpu)
    bad("train.objective \"dpo\" runs on runtime.device \"cpu\" for now (its CUDA kernels have not run on a GPU yet)");
  if (!c.data.val_path.empty() && c.data.val_pairs_path.empty())
    bad("train.objective \"dpo\" with data.val_path needs data.val_pairs_path: the validation pairs' ids "
        "(scripts/prepare_data.py --preference writes them; its data.json names them)");
  if (!c.data.val_path.empty() && c.data.val_loss_mask_path.empty())
    bad("train.objective \"dpo\" with data.val_path needs data.val_loss_mask_path: the validation completions' masks");
  if (!c.data.val_pairs_path.empty() && c.data.val_path.empty())
    bad("data.val_pairs_path needs data.val_path (the validation token files it pairs)");
}

// The lora section against the model: its targets resolved ("all-linear", or PEFT's default for
// the family when left out) and each one a projection of the family, each modules_to_save entry a
// module of the model, and what the rewrite cannot take (the tiled MLP's hidden projections).
void check_lora(Config& c, const std::function<void(const std::string&)>& bad) {
  LoraConfig& l = c.lora;
  const Family& f = family(c.model.arch);
  const std::vector<std::string> own(f.linear_modules.begin(), f.linear_modules.end());
  if (l.all_linear) l.target_modules = own;
  else if (l.target_modules.empty()) l.target_modules.assign(f.lora_default_targets.begin(), f.lora_default_targets.end());
  for (const std::string& t : l.target_modules) {
    if (c.runtime.tiled_mlp && (t == "gate_proj" || t == "up_proj" || t == "down_proj"))
      bad(str("lora.target_modules '", t, "' with runtime.tiled_mlp: the tiled MLP is one op that hides the MLP's ",
              "projections; leave gate_proj, up_proj and down_proj out of the targets, or set runtime.tiled_mlp false"));
    if (std::find(own.begin(), own.end(), t) != own.end()) continue;
    std::vector<std::string> others;
    for (const Family& g : families())
      if (std::find(g.linear_modules.begin(), g.linear_modules.end(), t) != g.linear_modules.end())
        others.emplace_back(g.name);
    if (!others.empty())
      bad(str("lora.target_modules: '", t, "' is a projection of ", others.front(), ", not of ", f.name, " (its ",
              "projections: ", and_list(own), ", or \"all-linear\")"));
    else {
      const std::string near = closest_name(t, own);
      bad(str("lora.target_modules: unknown module '", t, "'", near.empty() ? "" : str(" (did you mean '", near, "'?)"),
              "; ", f.name, "'s projections are ", and_list(own), ", or \"all-linear\""));
    }
  }
  // The model's modules come from its graph (models/lora.h): built only when there is a name to check.
  const std::vector<std::string> modules = l.modules_to_save.empty() ? std::vector<std::string>{} : model_modules(c.model);
  for (const std::string& k : l.modules_to_save) {
    if (std::none_of(modules.begin(), modules.end(), [&](const std::string& m) { return saved_module_matches(m, k); })) {
      std::vector<std::string> outside;  // the modules outside the layers: what LongLoRA and its kin save
      for (const std::string& m : modules)
        if (m.find(".h.") == std::string::npos && m.find(".layers.") == std::string::npos) outside.push_back(m);
      bad(str("lora.modules_to_save: '", k, "' names no module of the ", f.name, " model (",
              c.model.tie_word_embeddings ? "its head is tied to the embedding; " : "", "outside the layers it has ",
              and_list(outside), ")"));
    } else if (std::find(l.target_modules.begin(), l.target_modules.end(), k) != l.target_modules.end()) {
      bad(str("lora.modules_to_save: '", k, "' is also in lora.target_modules (a module gets an adapter or trains whole)"));
    }
  }
}

// Settings the config gives (its file or --set: `given`) that the run will not read, because
// another setting leaves them out: one warning each, as for a key of another architecture. Every
// schedule key its schedule does not read, data.seed where nothing shuffles, the checkpoint keys
// without a checkpoint directory, the validation batch count without validation.
std::vector<std::string> unread_settings(const Config& c, const json& given, const std::string& origin) {
  std::vector<std::string> out;
  auto unread = [&](std::string_view path, const std::string& why) {
    if (given.is_object() && given.contains(json::json_pointer(json_path(std::string(path)))))
      out.push_back(str(origin, ": ", path, " ", why, "; ignored"));
  };
  const std::vector<std::string_view> reads = schedule_reads(c.train.lr_schedule);
  std::string list;  // "train.lr, train.warmup_steps and train.schedule_steps"
  for (size_t i = 0; i <= reads.size(); ++i)
    list += str(i == 0 ? "" : i == reads.size() ? " and " : ", ", i == 0 ? std::string_view("train.lr") : reads[i - 1]);
  for (std::string_view key : schedule_keys())
    if (std::find(reads.begin(), reads.end(), key) == reads.end())
      unread(key, str("does not apply to train.lr_schedule \"", lr_schedule_name(c.train.lr_schedule), "\" (it reads ",
                      reads.empty() ? "only " : "", list, ")"));
  if (c.data.source == DataSourceKind::synthetic)
    unread("data.seed", "does nothing for data.source \"synthetic\" (it keys data.shuffle's order of a file)");
  else if (!c.data.shuffle)
    unread("data.seed", "keys data.shuffle's order, and data.shuffle is false");
  if (c.train.checkpoint_dir.empty())
    for (const char* key : {"train.checkpoint_every", "train.keep_checkpoints", "train.max_shard_mb"})
      unread(key, "does nothing without train.checkpoint_dir");
  if (c.train.eval_every == 0)
    unread("train.eval_batches", "does nothing while train.eval_every is 0 (no validation runs)");
  return out;
}

}  // namespace

const std::vector<std::string_view>& schedule_keys() {
  static const std::vector<std::string_view> keys = {"train.warmup_steps", "train.min_lr", "train.schedule_steps",
                                                     "train.decay_fraction", "train.decay_type", "train.warmup_type",
                                                     "train.warmup_min_lr"};
  return keys;
}

std::vector<std::string_view> schedule_reads(LrSchedule s) {
  switch (s) {
    case LrSchedule::cosine:
    case LrSchedule::cosine_with_min_lr: return {"train.warmup_steps", "train.min_lr", "train.schedule_steps"};
    case LrSchedule::linear: return {"train.warmup_steps", "train.schedule_steps"};
    case LrSchedule::constant: return {};
    case LrSchedule::constant_with_warmup: return {"train.warmup_steps"};
    case LrSchedule::wsd:
      return {"train.warmup_steps", "train.min_lr", "train.schedule_steps", "train.decay_fraction", "train.decay_type"};
    case LrSchedule::ds_warmup: return {"train.warmup_steps", "train.warmup_type", "train.warmup_min_lr"};
    case LrSchedule::ds_warmup_decay:
      return {"train.warmup_steps", "train.warmup_type", "train.warmup_min_lr", "train.schedule_steps"};
    case LrSchedule::ds_warmup_cosine:
      return {"train.warmup_steps", "train.warmup_type", "train.warmup_min_lr", "train.min_lr", "train.schedule_steps"};
  }
  return {};
}

Config with_steps(Config c, int64_t steps, const std::string& origin) {
  if (auto problem = config_value_problem("train.steps", json(steps)))
    throw UsageError(str(origin, " ", steps, ": ", *problem));
  c.train.steps = steps;
  c.resolved["train"]["steps"] = steps;
  Problems problems(origin);
  check_schedule(c, problems);
  problems.raise();
  return c;
}

std::string recipe_text(const Config& c, int world_size) {
  auto from = [&](const std::string& key) -> std::string {
    if (auto it = c.sources.find(key); it != c.sources.end()) return it->second;
    if (c.given.is_object() && c.given.contains(json::json_pointer(json_path(key)))) return "run config";
    return "default";
  };
  auto item = [&](const std::string& key, const std::string& name, const std::string& value) {
    return str(name, name.empty() ? "" : " ", value, " ← ", from(key));
  };
  auto num = [](double v) { return json(v).dump(); };
  const TrainConfig& t = c.train;
  std::string r = "recipe (each value ← where it came from):";
  r += str("\n  optimizer: AdamW (decay on tensors of rank >= 2); ", item("train.lr", "lr", num(t.lr)), "; ",
           item("train.beta1", "beta1", num(t.beta1)), "; ", item("train.beta2", "beta2", num(t.beta2)), "; ",
           item("train.eps", "eps", num(t.eps)), "; ", item("train.weight_decay", "weight_decay", num(t.weight_decay)));
  r += str("\n  lr schedule: ", item("train.lr_schedule", "", std::string(lr_schedule_name(t.lr_schedule))));
  for (std::string_view k : schedule_reads(t.lr_schedule)) {
    const std::string key(k);
    json v = c.resolved.value(json::json_pointer(json_path(key)), json());
    std::string shown = v.dump();
    if (key == "train.schedule_steps" && t.schedule_steps == 0) shown = str("0 (the run's: train.steps ", t.steps, ")");
    if (v.is_string()) shown = v.get<std::string>();
    r += str("; ", item(key, key.substr(key.find('.') + 1), shown));
  }
  r += str("\n  clipping: ", item("train.grad_clip", "",
                                    t.grad_clip > 0 ? str("global norm ", num(t.grad_clip)) : std::string("none (0)")));
  const int64_t sp = c.sequence_parallel.autosp_size;
  const int64_t dp = sp > 0 && world_size % sp == 0 ? world_size / sp : 0;
  r += str("\n  batch: ", item("data.batch_size", "micro-batch", str(c.data.batch_size)), "; ",
           item("train.gradient_accumulation_steps", "accumulation", str(t.gradient_accumulation_steps)), "; dp ", dp,
           " (", world_size, world_size == 1 ? " rank / " : " ranks / ", item("sequence_parallel.autosp_size", "sequence parallel", str(sp)), ")");
  if (dp > 0)
    r += str(" = ", c.data.batch_size * t.gradient_accumulation_steps * dp, " sequences of ", c.data.seq_len,
             " tokens a step");
  r += str("\n  ZeRO: ", item("zero_optimization.stage", "stage", str(c.zero_optimization.stage)), " (",
           zero_mode_name(zero_mode(c.zero_optimization, world_size)), " on ", world_size, " rank",
           world_size == 1 ? "" : "s", ")");
  const std::string dtype(dtype_torch_name(c.runtime.dtype));
  r += str("\n  precision: ", item("runtime.dtype", "", c.runtime.dtype == DType::bf16
                                                            ? "bfloat16 compute, float32 master weights and AdamW state"
                                                            : dtype));
  return r;
}

PositionsCheck check_positions(const ModelConfig& m, int64_t seq, const std::string& what) {
  PositionsCheck out;
  const int64_t max = m.max_position_embeddings;
  if (seq <= max) return out;
  const Family& f = family(m.arch);
  if (f.positions == Positions::learned)
    out.refused = str(what, " exceeds model.max_position_embeddings ", max, " (", f.name,
                      "'s positions are a learned table of ", max, " rows; train at most ", max, " tokens)");
  else if (m.rope_scaling.rope_type.empty())
    out.warning = str(what, " exceeds model.max_position_embeddings ", max, " and the model has no rope_scaling: ",
                      "positions from ", max, " on are ones it was not trained on (extend the context with ",
                      "model.rope_scaling, or set model.max_position_embeddings if it was trained that long)");
  return out;
}

std::optional<std::string> config_value_problem(const std::string& path, const json& v) {
  for (const auto& k : schema()) {
    if (path != k.path) continue;
    std::optional<std::string> problem = value_problem(k, v);
    if (!problem) return std::nullopt;
    return problem->substr(str(k.path, " = ", v.dump(), ": ").size());  // "path = v: what" less "path = v: "
  }
  return str("'", path, "' is not a config key");
}

std::vector<std::string> config_key_paths() {
  std::vector<std::string> paths;
  for (const auto& k : schema()) paths.emplace_back(k.path);
  return paths;
}

namespace {

// A mixture of experts' cross-key rules (Family::moe): k of E experts, the layers mlp_only_layers
// names, and the load-balancing loss's switch.
void check_moe(const ModelConfig& m, const std::function<void(const std::string&)>& bad) {
  const Family& f = family(m.arch);
  if (f.moe == Moe::none) return;
  const std::string experts = str("model.", experts_key(f.moe));
  if (m.num_experts_per_tok > m.num_experts)
    bad(str("model.num_experts_per_tok ", m.num_experts_per_tok, " exceeds ", experts, " ", m.num_experts,
            " (each token chooses that many distinct experts)"));
  for (int64_t l : m.mlp_only_layers)
    if (l >= m.num_hidden_layers)
      bad(str("model.mlp_only_layers names layer ", l, ", but model.num_hidden_layers is ", m.num_hidden_layers));
}

// The load-balancing loss (model.output_router_logits): for the LM objective; a zero coefficient
// trains on the LM loss alone but still computes and logs the loss (a note says so).
void check_router_aux_loss(Config& c, const std::function<void(const std::string&)>& bad) {
  const ModelConfig& m = c.model;
  if (family(m.arch).moe == Moe::none || !m.output_router_logits) return;
  if (c.train.objective == Objective::dpo)  // decision 216
    bad("model.output_router_logits with train.objective \"dpo\": TRL adds router_aux_loss_coef x the "
        "load-balancing loss over the non-padding tokens of the chosen and rejected rows, but the router statistics "
        "here count every token of a window, its padding too; not built yet: set it false (TRL: "
        "router_aux_loss_coef 0)");
  if (m.router_aux_loss_coef == 0)
    c.notes.push_back("model.output_router_logits with model.router_aux_loss_coef 0: the load-balancing loss is "
                      "computed and logged (moe/aux_loss) but adds nothing to the loss or the gradients");
}

// moe.expert_parallel_size (decision 162): E splits a mixture of experts' experts, so the model
// has experts and E divides them; the world size is checked when the mesh is made (comm/mesh.h).
// EP runs on the CPU and on CUDA (decision 225); any ZeRO stage composes with it (decision 185).
void check_expert_parallel(const Config& c, const std::function<void(const std::string&)>& bad) {
  const int64_t E = c.moe.expert_parallel_size;
  if (E == 1) return;
  const Family& f = family(c.model.arch);
  if (f.moe == Moe::none) {
    bad(str("moe.expert_parallel_size ", E, " needs a mixture of experts; model.arch \"", f.name, "\" has none"));
    return;
  }
  const std::string experts = str("model.", experts_key(f.moe));
  if (c.model.num_experts % E != 0)
    bad(str("moe.expert_parallel_size ", E, " does not divide ", experts, " ", c.model.num_experts,
            " (each rank of an expert group holds the same number of experts)"));
}

}  // namespace

Config parse_config(const json& input, const std::vector<std::string>& overrides, const std::string& origin,
                    bool cross_key_rules) {
  if (!input.is_object()) throw UsageError(str(origin, ": expected a JSON object at the top level"));
  Config c;
  json j = input;
  if (is_hf_config(input)) {  // a bare Hugging Face config.json: its architecture, fresh weights
    HfModelConfig hf = translate_hf_config(input, origin);
    c.notes.push_back(str(origin, " is a Hugging Face config.json: training its architecture from freshly initialised "
                          "weights (for its weights too, give \"model\": {\"from\": DIR} in a run config)"));
    note_unused_hf_keys(hf, origin, c);
    for (auto& w : hf.warnings) c.warnings.push_back(std::move(w));
    c.hf_carried = std::move(hf.carried);
    j = json{{"model", hf.model}};
  }
  for (const auto& ov : overrides) apply_override(j, origin, ov);
  c.given = j;
  c.lora.enabled = j.contains("lora");
  expand_model_from(j, c, origin);
  expand_lora_from(j, origin);
  // Every problem of the file is said at once: unknown keys and bad values first (the rules
  // across keys would only repeat them), then every rule across keys.
  Problems problems(origin);
  check_known_keys(j, origin, problems);

  auto given = [&](const char* model_key) { return j.contains("model") && j["model"].contains(model_key); };
  // First: which keys apply depends on it. An unknown arch is one more problem: the other values
  // are still checked (which of them apply is then not asked).
  bool arch_known = true;
  if (given("arch")) {
    if (auto problem = value_problem(schema()[0], j["model"]["arch"])) {
      problems.add(*problem);
      arch_known = false;
    } else {
      schema()[0].set(c, j["model"]["arch"]);
    }
  }
  const Family& f = family(c.model.arch);
  std::vector<std::string> refused;  // settings of other families of this layout, given a value of their own
  // Keys of another layout's families (GPT-2 and model.rope_theta): ignored, with a warning unless
  // they hold the value autosp uses anyway (checked once the family's own values are set below).
  std::vector<std::pair<const Key*, json>> foreign;
  for (const auto& k : schema()) {
    json::json_pointer ptr(json_path(k.path));
    if (!j.contains(ptr) || &k == &schema()[0]) continue;
    const json& v = j[ptr];
    if (auto problem = value_problem(k, v)) {
      problems.add(*problem);
      continue;
    }
    if (arch_known && k.model && !key_applies(*k.model, f)) {
      // A setting of another family of the same layout (Llama's mlp_bias on Qwen2) is refused, after
      // the rules that read it, unless it holds this family's own value (false); one of another
      // layout's is ignored.
      std::vector<std::string_view> others;
      for (const Family& g : families())
        if (g.layout == f.layout && key_applies(*k.model, g)) others.push_back(g.name);
      std::string list;  // "llama, mistral and qwen3"
      for (size_t i = 0; i < others.size(); ++i) list += str(i == 0 ? "" : i + 1 == others.size() ? " and " : ", ", others[i]);
      if (others.empty()) {
        foreign.emplace_back(&k, v);
        continue;
      }
      if (!(v.is_boolean() && !v.get<bool>()) && !v.is_null())
        refused.push_back(str(k.path, " is a ", list, " setting, not ", f.name, "'s"));
    }
    // An integer written where a number is expected is fine; store it as double.
    try {
      k.set(c, k.kind == Kind::number ? json(v.get<double>()) : v);
    } catch (const UsageError& e) {  // a setter that validates (model.rope_scaling)
      problems.add(e.what());
    }
  }
  problems.raise();
  // What the family fixes or defaults where the config is silent.
  auto& m = c.model;
  if (!f.gqa || !given("num_key_value_heads")) m.num_key_value_heads = m.num_attention_heads;
  if (f.tied_head != Presence::by_key) m.tie_word_embeddings = f.tied_head == Presence::always;
  else if (!given("tie_word_embeddings")) m.tie_word_embeddings = f.tie_default;
  if (!given("norm_eps")) m.norm_eps = f.norm_eps;
  if (!given("sliding_window_pattern")) m.sliding_window_pattern = f.window_pattern;
  // A key of another layout at the value autosp uses anyway (GPT-2's tie_word_embeddings true, as
  // the resolved config and a translated config.json write it) is silent; another value is not
  // applied, and says so.
  for (const auto& [k, v] : foreign) {
    const json own = k->model->get(m);
    const bool same = (own.is_number() && v.is_number()) ? own.get<double>() == v.get<double>() : own == v;
    if (!same) c.warnings.push_back(str(origin, ": ", k->path, " does not apply to arch ", f.name, "; ignored"));
  }

  // Cross-key rules (none when another file completes this config: it is parsed again, with them).
  auto bad = [&](const std::string& what) {
    if (cross_key_rules) problems.add(what);
  };
  if (m.head_dim_config == 0 && m.hidden_size % m.num_attention_heads != 0)
    bad(str("model.hidden_size ", m.hidden_size, " is not divisible by model.num_attention_heads ",
            m.num_attention_heads));
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    bad(str("model.num_attention_heads ", m.num_attention_heads, " is not divisible by model.num_key_value_heads ",
            m.num_key_value_heads));
  if (const PositionsCheck pos = check_positions(m, c.data.seq_len, str("data.seq_len ", c.data.seq_len));
      !pos.refused.empty())
    bad(pos.refused);
  else if (!pos.warning.empty() && cross_key_rules)
    c.warnings.push_back(str(origin, ": ", pos.warning));
  if (f.positions == Positions::rope && m.head_dim() % 2 != 0)
    bad(str(m.head_dim_config > 0 ? "model.head_dim " : "the head dim ", m.head_dim(), " must be even for RoPE"));
  if (c.runtime.tiled_mlp && f.mlp == Mlp::swiglu && present(f.mlp_bias, m.mlp_bias))
    bad("runtime.tiled_mlp: the tiled MLP has no biases (model.mlp_bias is true)");
  // The window's layers (ModelConfig::layer_window): layer_types names every layer once.
  if (!m.layer_types.empty() && static_cast<int64_t>(m.layer_types.size()) != m.num_hidden_layers)
    bad(str("model.layer_types has ", m.layer_types.size(), " entries for model.num_hidden_layers ",
            m.num_hidden_layers, ": expected one per layer"));
  // nn.Embedding(V, C, padding_idx) takes an index in [-V, V) (a negative one from the end).
  if (m.pad_token_id && f.padding_idx && (*m.pad_token_id < -m.vocab_size || *m.pad_token_id >= m.vocab_size))
    bad(str("model.pad_token_id ", *m.pad_token_id, " is outside [-", m.vocab_size, ", ", m.vocab_size,
            ") (model.vocab_size; it is the embedding's padding_idx)"));
  for (const std::string& r : refused) bad(r);
  check_moe(m, bad);
  check_router_aux_loss(c, bad);
  if (c.data.source != DataSourceKind::synthetic && c.data.path.empty() && c.data.mix.empty())
    bad(str("data.path is required for data.source \"", data_source_name(c.data.source), "\" (or data.mix)"));
  if (!c.data.mix.empty()) {
    if (!c.data.path.empty())
      bad("data.path and data.mix exclude each other: list data.path's files as an entry of data.mix");
    if (c.data.source == DataSourceKind::synthetic)
      bad("data.mix does not apply to data.source \"synthetic\" (it mixes token or text files)");
  }
  if (c.data.source == DataSourceKind::synthetic && (!c.data.loss_mask_path.empty() || !c.data.val_loss_mask_path.empty()))
    bad("data.loss_mask_path and data.val_loss_mask_path do not apply to data.source \"synthetic\" (its labels are the task's)");
  if (!c.data.loss_mask_path.empty() && c.data.path.empty())
    bad(c.data.mix.empty() ? str("data.loss_mask_path needs data.path (the token files it masks)")
                           : str("data.loss_mask_path goes with data.path; with data.mix give each entry its own "
                                 "\"loss_mask_path\""));
  if (!c.data.val_loss_mask_path.empty() && c.data.val_path.empty())
    bad("data.val_loss_mask_path needs data.val_path (the validation token files it masks)");
  // Document ids: where they apply, and what they do.
  bool doc_ids = !c.data.doc_ids_path.empty() || !c.data.val_doc_ids_path.empty();
  for (const DataMixEntry& e : c.data.mix) doc_ids = doc_ids || !e.doc_ids_path.empty();
  if (doc_ids && c.data.source != DataSourceKind::tokens)
    bad(str("data.doc_ids_path applies to data.source \"tokens\" (the shards scripts/prepare_data.py writes), not \"",
            data_source_name(c.data.source), "\""));
  if (!c.data.doc_ids_path.empty() && c.data.path.empty())
    bad(c.data.mix.empty() ? str("data.doc_ids_path needs data.path (the token files whose documents it marks)")
                           : str("data.doc_ids_path goes with data.path; with data.mix give each entry its own "
                                 "\"doc_ids_path\""));
  if (!c.data.val_doc_ids_path.empty() && c.data.val_path.empty())
    bad("data.val_doc_ids_path needs data.val_path (the validation token files whose documents it marks)");
  if (doc_ids && c.train.objective == Objective::dpo)
    bad("data.doc_ids_path does not apply to train.objective \"dpo\": its pair ids (data.pairs_path) delimit the documents");
  if (doc_ids && !c.data.document_mask)
    c.warnings.push_back("data.doc_ids_path is set but data.document_mask is false: the document ids are not used");
  if (c.data.shuffle && c.data.source == DataSourceKind::synthetic)
    c.warnings.push_back("data.shuffle does nothing for data.source \"synthetic\" (every sequence is drawn at random)");
  if (c.data.source == DataSourceKind::synthetic && !c.data.val_path.empty())
    bad("data.val_path does not apply to data.source \"synthetic\" (its validation sequences are generated)");
  if (c.train.eval_every > 0 && c.data.source != DataSourceKind::synthetic && c.data.val_path.empty())
    bad(str("train.eval_every ", c.train.eval_every, " needs data.val_path for data.source \"",
            data_source_name(c.data.source), "\""));
  if (!c.data.val_path.empty() && c.train.eval_every == 0)
    c.warnings.push_back("data.val_path is set but train.eval_every is 0: no validation runs");
  if (c.data.source == DataSourceKind::text && m.vocab_size < 256)
    bad(str("data.source \"text\" needs model.vocab_size >= 256"));
  if (c.data.eos_token_id >= m.vocab_size)
    bad(str("data.eos_token_id ", c.data.eos_token_id, " is outside the vocabulary (model.vocab_size ", m.vocab_size, ")"));
  if (c.data.document_mask) {
    if (c.data.eos_token_id < 0)
      bad("data.document_mask needs data.eos_token_id: the token that ends each document");
    if (c.data.source == DataSourceKind::synthetic)
      bad("data.document_mask needs packed documents (data.source \"tokens\" or \"text\"); the synthetic task has none");
    if (c.runtime.attention == AttentionBackend::cudnn)
      bad("data.document_mask: runtime.attention \"cudnn\" cannot apply the document mask; use \"flash\"");
  }
  auto& sp = c.sequence_parallel;
  // With autosp_size "auto" the search picks P (and R, if ring_size is "auto" too) at start-up.
  const bool sp_auto = c.auto_keys.count("sequence_parallel.autosp_size") > 0;
  if (sp.ring_auto && !sp_auto) {
    sp.ring_size = auto_ring_size(sp.autosp_size, m.num_attention_heads, m.num_key_value_heads);
    c.notes.push_back(str("sequence_parallel.ring_size \"auto\": Ulysses ", sp.autosp_size / sp.ring_size, " x ring ",
                          sp.ring_size, " for ", m.num_attention_heads, " query heads and ", m.num_key_value_heads,
                          " key/value heads at autosp_size ", sp.autosp_size));
  }
  if (sp_auto) {
    // checked by the search
  } else if (sp.autosp_size % sp.ring_size != 0)
    bad(str("sequence_parallel.ring_size ", sp.ring_size, " does not divide sequence_parallel.autosp_size ",
            sp.autosp_size, " (the ", sp.autosp_size, " ranks are Ulysses x ring)"));
  else if (sp.ring_size > 1 &&
           !ulysses_fits(sp.autosp_size / sp.ring_size, m.num_attention_heads, m.num_key_value_heads))
    bad(str("sequence_parallel.ring_size ", sp.ring_size, " with autosp_size ", sp.autosp_size, " leaves Ulysses ",
            sp.autosp_size / sp.ring_size, " ranks for ", m.num_attention_heads, " query heads and ",
            m.num_key_value_heads, " key/value heads (the Ulysses degree must divide the query heads, and the ",
            "key/value heads must be a multiple of it or divide it); \"auto\" would pick ring_size ",
            auto_ring_size(sp.autosp_size, m.num_attention_heads, m.num_key_value_heads)));
  if (c.runtime.tiled_mlp && f.mlp != Mlp::swiglu)
    bad(str("runtime.tiled_mlp is for Llama's SwiGLU MLP; model.arch \"", f.name, "\" has none"));
  if (c.lora.enabled) check_lora(c, bad);
  check_dpo(c, bad);
  check_expert_parallel(c, bad);
  if (cross_key_rules) {
    check_schedule(c, problems);
    for (std::string& w : unread_settings(c, c.given, origin)) c.warnings.push_back(std::move(w));
  }
  if (c.runtime.attention == AttentionBackend::cudnn && c.runtime.device != DeviceKind::cuda)
    bad(str("runtime.attention \"cudnn\" needs runtime.device \"cuda\" (it is \"", device_kind_name(c.runtime.device),
            "\")"));
  problems.raise();

  // The resolved config: every key, as its row's getter gives it. A null (model.rope_scaling when
  // none) is left out, as checkpoints have always recorded it, so theirs still compare equal.
  json r;
  r["model"] = model_json(c.model);  // the model keys' own rule for what is left out (models/model_keys.h)
  for (const auto& k : schema()) {
    AUTOSP_ASSERT(k.get, "config key ", k.path, " has no getter in the schema");
    if (k.model) continue;
    json v = k.get(c);
    if (!v.is_null()) r[json::json_pointer(json_path(k.path))] = std::move(v);
  }
  c.resolved = r;
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool cross_key_rules) {
  return parse_config(parse_json(read_input_file(path, "a config file"), path), overrides, path, cross_key_rules);
}

json parse_json(const std::string& text, const std::string& origin) {
  constexpr int kMaxDepth = 32;
  // The keys seen in each open object: a repeated key is an error (nlohmann keeps the last one, so
  // a second "train" section would silently drop the first).
  std::vector<std::set<std::string>> keys;
  auto limit_depth = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) throw UsageError(str(origin, ": JSON nested deeper than ", kMaxDepth, " levels"));
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
          throw UsageError(str(origin, ": duplicate key '", parsed.get<std::string>(),
                               "' (JSON would keep only the last one)"));
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, limit_depth);
  } catch (const json::exception& e) {
    throw UsageError(str(origin, ": not valid JSON: ", e.what()));
  }
}

}  // namespace autosp
