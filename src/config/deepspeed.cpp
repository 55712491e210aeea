// DeepSpeed's config keys onto ours. One Mapper walks the file once: each top-level key has its
// handler (mapped, checked off, or ignored), every mapped value goes through set(), which checks it
// against our schema and against what the user set, and the result is our config parsed again with
// the mapped keys written into it (so every cross-key rule of parse_config still applies).
// DeepSpeed's defaults and formulas: deepspeed/runtime/config.py (the batch rule),
// runtime/engine.py (Adam/AdamW), runtime/lr_schedules.py, runtime/zero/config.py.
#include "config/deepspeed.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "tensor/check.h"
#include "tensor/input_file.h"

namespace autosp {

namespace {

using json = nlohmann::json;

// Keys that change nothing here (logging, profiling, I/O, device selection, DeepSpeed's own memory
// and communication tuning), and keys widely used files carry that DeepSpeed itself never reads
// (LLaMA-Factory's comms_config, DeepSpeedExamples' cuda_visible_devices): accepted whatever their
// value, and listed once in the log as not used by autosp.
const std::set<std::string>& ignored_top_level() {
  static const std::set<std::string> s = {
      "wall_clock_breakdown", "flops_profiler", "wandb", "comet", "comms_logger",
      "memory_breakdown", "dump_state", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
      "activation_checkpointing", "aio", "checkpoint", "autotuning", "nebula", "timers", "monitor_config", "pipeline",
      "graph_harvesting", "prescale_gradients", "gradient_predivide_factor", "disable_allgather", "comms_config",
      "cuda_visible_devices"};
  return s;
}
const std::set<std::string>& ignored_zero() {
  static const std::set<std::string> s = {
      "allgather_partitions", "allgather_bucket_size", "reduce_scatter", "contiguous_gradients",
      "round_robin_gradients", "sub_group_size", "load_from_fp32_weights", "elastic_checkpoint",
      "ignore_unused_parameters", "legacy_stage1", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
      "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
      "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance",
      "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
      "stage3_gather_fp16_weights_on_model_save", "module_granularity_threshold",
      "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
      "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
      "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
      "use_multi_rank_bucket_allreduce"};
  return s;
}
// Sections that change the math when enabled: fine while {"enabled": false} (or "auto", which
// is ours: off), with why they are refused otherwise and what to do.
struct OffOnly {
  const char* why;
  const char* fix;
};
const std::map<std::string, OffOnly>& off_only() {
  static const std::map<std::string, OffOnly> s = {
      {"fp16", {"fp16 training with loss scaling; autosp computes in float32 or bfloat16 and never scales the loss",
                "use \"bf16\": {\"enabled\": true} instead, or remove fp16"}},
      {"amp", {"NVIDIA Apex mixed precision", "use \"bf16\": {\"enabled\": true} instead, or remove amp"}},
      {"torch_autocast", {"torch.autocast's per-op precision choices", "use \"bf16\": {\"enabled\": true} instead"}},
      {"curriculum_learning", {"it changes which sequences a step sees", ""}},
      {"data_efficiency", {"it changes which tokens and sequences a step sees", ""}},
      {"quantize_training", {"quantized weights", ""}},
      {"hybrid_engine", {"it is DeepSpeed-Chat's RLHF engine", ""}},
      {"eigenvalue", {"it is for MoQ's quantization schedule", ""}},
      {"progressive_layer_drop", {"it skips layers during training", ""}},
      {"elasticity", {"it changes the batch size with the number of GPUs", "fix the batch sizes instead"}},
  };
  return s;
}
// The other top-level keys DeepSpeed knows that are read below.
const std::set<std::string>& handled() {
  static const std::set<std::string> s = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                          "gradient_accumulation_steps", "gradient_clipping", "steps_per_print",
                                          "sequence_parallel_size", "bf16", "bfloat16", "zero_optimization",
                                          "compile", "optimizer", "scheduler", "sparse_attention",
                                          "compression_training", "sparse_gradients", "communication_data_type",
                                          "seq_parallel_communication_data_type", "data_types", "tensor_parallel",
                                          "tensorboard", "csv_monitor"};
  return s;
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// Equal as values: 1 and 1.0 are.
bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// A refusal while one key is read: caught where that key's reading began (Mapper::guard), so the
// rest of the file is still read and every problem is said at once.
struct Refused {
  std::string what;
};

class Mapper {
 public:
  Mapper(const Config& cfg, const json& ds, int world, std::string origin)
      : cfg_(cfg), ds_(ds), world_(world), origin_(std::move(origin)) {}

  // The keys to write into the user's config, in order, and where each came from; notes for the
  // log (what was mapped, keys not used, keys at autosp's own value); warnings; every problem.
  std::vector<std::pair<std::string, json>> assigned;
  std::map<std::string, std::string> sources;
  std::vector<std::string> mapped, ignored, agreed, warnings, problems;

  void run() {
    if (!ds_.is_object()) throw UsageError(str(origin_, ": expected a JSON object at the top level (a DeepSpeed config)"));
    for (auto& [key, v] : ds_.items()) guard([&] { top_level(key, v); });
    // Order matters: dp needs the SP size, the scheduler's ratios the optimizer's lr, the bucket
    // size the dtype.
    bool sp_ok = true;
    if (ds_.contains("sequence_parallel_size"))
      sp_ok = guard([&] { value("sequence_parallel_size", ds_["sequence_parallel_size"], "sequence_parallel.autosp_size"); });
    if (sp_ok) guard([&] { batch(); });  // with a wrong SP size, its dp would only add a false mismatch
    if (ds_.contains("optimizer")) guard([&] { optimizer(ds_["optimizer"]); });
    guard([&] { scheduler(); });
    guard([&] { clipping(); });
    if (ds_.contains("steps_per_print") && !ds_["steps_per_print"].is_null())
      guard([&] { value("steps_per_print", ds_["steps_per_print"], "train.log_every"); });
    // DeepSpeed reads "bf16" and its old name "bfloat16" only where "bf16" is absent
    // (runtime/precision_config.py get_bfloat16_config): with both, "bfloat16" changes nothing.
    if (ds_.contains("bf16")) {
      guard([&] { bf16("bf16", ds_["bf16"]); });
      if (ds_.contains("bfloat16")) shadowed("bfloat16", ds_["bfloat16"], "bf16", ds_["bf16"]);
    } else if (ds_.contains("bfloat16")) {
      guard([&] { bf16("bfloat16", ds_["bfloat16"]); });
    }
    if (ds_.contains("zero_optimization")) guard([&] { zero(ds_["zero_optimization"]); });
    if (ds_.contains("compile")) guard([&] { compile(ds_["compile"]); });
    if (ds_.contains("tensorboard")) guard([&] { monitor("tensorboard", ds_["tensorboard"], "train.tensorboard_dir"); });
    if (ds_.contains("csv_monitor")) guard([&] { monitor("csv_monitor", ds_["csv_monitor"], "train.csv_dir"); });
  }

 private:
  const Config& cfg_;
  const json& ds_;
  int world_;
  std::string origin_;

  // Runs one key's reading; a refusal becomes one of the problems. Whether it read without one.
  template <class F>
  bool guard(F&& f) {
    try {
      f();
      return true;
    } catch (const Refused& r) {
      problems.push_back(r.what);
      return false;
    }
  }
  [[noreturn]] static void fail(const std::string& what) { throw Refused{what}; }
  // `key` = `v` refused: why, and what to do (left out when empty).
  [[noreturn]] static void refuse(const std::string& key, const json& v, const std::string& why, const std::string& fix) {
    fail(str(key, " = ", v.dump(), ": not supported by autosp-train (", why, ")", fix.empty() ? "" : "; ", fix));
  }

  // A key no DeepSpeed section of ours knows: most likely a misspelling of one of `known` (or a
  // block where DeepSpeed takes a key of that name and more: sequence_parallel →
  // sequence_parallel_size).
  static std::string unknown(const std::string& where, const std::string& key, const std::vector<std::string>& known) {
    std::string hint = closest_name(key, known);
    for (const std::string& k : known)
      if (hint.empty() && k.rfind(key + "_", 0) == 0) hint = k;
    std::string full = where.empty() ? key : str(where, ".", key);
    if (hint.empty())
      return str("unknown DeepSpeed key '", full, "': no DeepSpeed key autosp knows is spelt like it (check the "
                 "spelling: a misspelt setting would silently not apply)");
    return str("unknown DeepSpeed key '", full, "' (did you mean '", where.empty() ? hint : str(where, ".", hint), "'?)");
  }

  void top_level(const std::string& key, const json& v) {
    if (ignored_top_level().count(key)) return ignored.push_back(key);
    if (off_only().count(key)) return off_section(key, v);
    if (key == "sparse_attention" || key == "compression_training")
      fail(str(key, ": not supported by autosp-train (it changes the model)"));
    if (key == "sparse_gradients") return require(key, v, json(false), "gradients are dense", "set it false");
    if (key == "communication_data_type" || key == "seq_parallel_communication_data_type") return fp32_only(key, v);
    if (key == "data_types") return data_types(v);
    if (key == "tensor_parallel") return tensor_parallel(v);
    if (handled().count(key)) return;  // read in run()'s order
    std::vector<std::string> known(handled().begin(), handled().end());
    known.insert(known.end(), ignored_top_level().begin(), ignored_top_level().end());
    for (const auto& [k, _] : off_only()) known.push_back(k);
    std::string what = unknown("", key, known);
    if (key == "sequence_parallel") {  // a block where DeepSpeed takes the top-level integer
      what += "; DeepSpeed reads the sequence parallel degree from the top-level integer sequence_parallel_size";
      if (v.is_object())
        for (auto& [k, x] : v.items())
          if (x.is_number_integer() && (k.find("size") != std::string::npos || k.find("degree") != std::string::npos)) {
            what += str(": write \"sequence_parallel_size\": ", x.dump(), " in place of the block");
            break;
          }
    }
    fail(what);
  }

  // Our key's JSON pointer.
  static json::json_pointer ptr(const std::string& ours) {
    std::string p = "/";
    for (char c : ours) p += c == '.' ? '/' : c;
    return json::json_pointer(p);
  }
  bool given(const std::string& ours) const { return cfg_.given.is_object() && cfg_.given.contains(ptr(ours)); }
  // Our value now: one mapped already, else the config's (default or set).
  json current(const std::string& ours) const {
    for (auto it = assigned.rbegin(); it != assigned.rend(); ++it)
      if (it->first == ours) return it->second;
    return cfg_.resolved.contains(ptr(ours)) ? cfg_.resolved[ptr(ours)] : json();
  }

  // DeepSpeed's `ds_key` = `v` becomes our `ours`: checked against our schema, and against the
  // value the user set there, if any. A later set of the same key replaces an earlier one.
  // `source` says where the value came from in the recipe (default: the file's key). `written` is
  // the file's own value where `v` is its translation (bf16.enabled true → "bfloat16"), for the
  // messages: they show what the user wrote.
  void set(const std::string& ds_key, const std::string& ours, const json& v, const std::string& how = "",
           const std::string& source = "", const json& written = json()) {
    const std::string shown = written.is_null() ? v.dump() : str(written.dump(), " (our ", ours, " ", v.dump(), ")");
    if (auto problem = config_value_problem(ours, v))
      fail(str(ds_key, " = ", written.is_null() ? str(v.dump(), " (our ", ours, ")") : shown, ": ", *problem));
    if (given(ours) && !same(cfg_.given[ptr(ours)], v))
      fail(str(ds_key, " = ", shown, " conflicts with ", ours, " = ", cfg_.given[ptr(ours)].dump(),
               " set in the config or by --set; remove one of them"));
    std::erase_if(assigned, [&](const auto& a) { return a.first == ours; });
    std::erase_if(mapped, [&](const std::string& m) { return m.find(" → " + ours + " ") != std::string::npos; });
    assigned.emplace_back(ours, v);
    mapped.push_back(str(ds_key, " → ", ours, " ", v.dump(), how));
    sources[ours] = source.empty() ? str(origin_, " ", ds_key) : source;
  }

  // A mapped key: "auto" keeps ours.
  void value(const std::string& ds_key, const json& v, const std::string& ours) {
    if (is_auto(v)) {
      mapped.push_back(str(ds_key, " \"auto\" → ", ours, " ", current(ours).dump(), " (ours)"));
      sources[ours] = str(given(ours) ? "run config" : "default", " (", origin_, " ", ds_key, " \"auto\")");
      return;
    }
    set(ds_key, ours, v);
  }

  // What DeepSpeed does where the file is silent, unless the user set our key: `ours` = `v`.
  void ds_default(const std::string& ds_key, const std::string& ours, const json& v, const std::string& why) {
    if (given(ours)) return;
    set(ds_key, ours, v, str(" (DeepSpeed's default", why.empty() ? "" : ": ", why, ")"),
        str("DeepSpeed's default", why.empty() ? "" : ": ", why));
  }

  // A parameter of a section the file gives: its value, "auto" (ours), or DeepSpeed's default
  // where the user did not set ours.
  void param(const std::string& ds_key, const json& params, const char* name, const std::string& ours,
             const json& dflt) {
    if (params.contains(name)) return value(ds_key, params[name], ours);
    if (!dflt.is_null()) ds_default(ds_key, ours, dflt, "");
  }

  // A setting autosp has one value of: at it (or "auto"), accepted; else refused, why and what to do.
  void require(const std::string& key, const json& v, const json& allowed, const std::string& why,
               const std::string& fix) {
    if (!same(v, allowed) && !is_auto(v)) refuse(key, v, why, fix.empty() ? str("expected ", allowed.dump()) : fix);
    agreed.push_back(str(key, " ", v.dump()));
  }

  // A key DeepSpeed does not read because `winner`, its other spelling, is there: ignored, with a
  // warning when the two say different things (the file's author may have meant the other one).
  void shadowed(const std::string& key, const json& v, const std::string& winner, const json& w) {
    ignored.push_back(str(key, " (", winner, " is given)"));
    if (v != w)
      warnings.push_back(str(origin_, ": ", key, " = ", v.dump(), " is ignored: DeepSpeed reads ", winner, " = ", w.dump(),
                             " when both are given"));
  }

  void off_section(const std::string& key, const json& v) {
    if (!v.is_object()) fail(str(key, " = ", v.dump(), ": expected an object"));
    const json enabled = v.value("enabled", json(false));
    if (!same(enabled, json(false)) && !is_auto(enabled)) {
      const OffOnly& o = off_only().at(key);
      refuse(str(key, ".enabled"), enabled, str("it would change the math: ", o.why), o.fix);
    }
    ignored.push_back(key);
  }

  void fp32_only(const std::string& key, const json& v) {
    if (v.is_null() || is_auto(v) || v == "fp32" || v == "float32") return agreed.push_back(str(key, " ", v.dump()));
    refuse(key, v, "it would change the math: autosp communicates gradients in fp32", "set it \"fp32\" or remove it");
  }

  void data_types(const json& v) {
    if (!v.is_object()) fail(str("data_types = ", v.dump(), ": expected an object"));
    for (auto& [k, x] : v.items())
      guard([&] {
        if (k != "grad_accum_dtype") fail(unknown("data_types", k, {"grad_accum_dtype"}));
        fp32_only("data_types.grad_accum_dtype", x);
      });
  }

  void tensor_parallel(const json& v) {
    if (!v.is_object()) fail(str("tensor_parallel = ", v.dump(), ": expected an object"));
    const json size = v.value("autotp_size", json(0));
    if (size.is_number() && size.get<double>() <= 1) return ignored.push_back("tensor_parallel");
    refuse("tensor_parallel.autotp_size", size, "no tensor parallelism",
           "use sequence_parallel_size for the ranks instead, or remove tensor_parallel");
  }

  // An integer the rule below computes with (not "auto").
  int64_t integer(const std::string& key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 1) fail(str(key, " = ", v.dump(), ": expected a positive integer"));
    return v.get<int64_t>();
  }

  // train_batch_size = micro × gas × dp (DeepSpeed's _set_batch_related_parameters and
  // _batch_assertion): any two give the third; train alone means gas 1, micro alone too. "auto"
  // micro or gas is ours; "auto" train is the product.
  void batch() {
    const char* kTrain = "train_batch_size";
    const char* kMicro = "train_micro_batch_size_per_gpu";
    const char* kGas = "gradient_accumulation_steps";
    const bool has_train = ds_.contains(kTrain), has_micro = ds_.contains(kMicro), has_gas = ds_.contains(kGas);
    if (!has_train && !has_micro && !has_gas) return;
    const int64_t sp = current("sequence_parallel.autosp_size").get<int64_t>();
    if (sp < 1 || world_ % sp != 0)
      fail(str("sequence_parallel_size ", sp, " does not divide the world size ", world_));
    const int64_t dp = world_ / sp;
    auto read = [&](const char* key, const char* ours) -> std::optional<int64_t> {
      if (!ds_.contains(key)) return std::nullopt;
      if (is_auto(ds_[key])) return ours ? std::optional(current(ours).get<int64_t>()) : std::nullopt;
      return integer(key, ds_[key]);
    };
    std::optional<int64_t> train, micro, gas;
    bool read_ok = guard([&] { train = read(kTrain, nullptr); });
    read_ok &= guard([&] { micro = read(kMicro, "data.batch_size"); });
    read_ok &= guard([&] { gas = read(kGas, "train.gradient_accumulation_steps"); });
    if (!read_ok) return;
    const std::string where = str(" (dp ", dp, " = world ", world_, " / sequence parallel size ", sp, ")");
    auto mismatch = [&](int64_t t, int64_t m, int64_t g) {
      fail(str(kTrain, " ", t, " != ", kMicro, " ", m, " × ", kGas, " ", g, " × dp ", dp, where));
    };
    // The third value of the rule, when the given two leave no integer for it.
    auto not_multiple = [&](const std::string& product, int64_t p, const char* derived) {
      fail(str(kTrain, " ", *train, " is not a multiple of ", product, " = ", p, where, ": no integer ", derived,
               " makes ", kTrain, " = ", kMicro, " × ", kGas, " × dp hold"));
    };
    if (train && micro && !gas && !has_gas) {
      if (*train % (*micro * dp) != 0) not_multiple(str(kMicro, " ", *micro, " × dp ", dp), *micro * dp, kGas);
      gas = *train / (*micro * dp);
    } else if (train && gas && !micro && !has_micro) {
      if (*train % (*gas * dp) != 0) not_multiple(str(kGas, " ", *gas, " × dp ", dp), *gas * dp, kMicro);
      micro = *train / (*gas * dp);
    } else if (train && !micro && !gas && !has_micro && !has_gas) {
      if (*train % dp != 0) not_multiple(str("dp ", dp), dp, kMicro);
      gas = 1, micro = *train / dp;
    }
    if (!micro) micro = current("data.batch_size").get<int64_t>();  // gas alone: our micro-batch
    if (!gas) gas = has_micro && !has_gas ? 1 : current("train.gradient_accumulation_steps").get<int64_t>();
    if (train && *train != *micro * *gas * dp) mismatch(*train, *micro, *gas);
    auto batch_set = [&](bool has, const char* key, const std::string& derived, const std::string& ours, int64_t v) {
      if (has && is_auto(ds_[key])) return value(key, ds_[key], ours);
      set(has ? key : derived, ours, v);
    };
    guard([&] { batch_set(has_micro, kMicro, str(kMicro, " (from ", kTrain, ")"), "data.batch_size", *micro); });
    guard([&] {
      batch_set(has_gas, kGas, str(kGas, " (from the batch rule)"), "train.gradient_accumulation_steps", *gas);
    });
    mapped.push_back(str(kTrain, " = ", *micro * *gas * dp, " = ", *micro, " × ", *gas, " × dp ", dp));
  }

  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  // Adam / AdamW (DeepSpeed's FusedAdam, or torch's with torch_adam): AdamW unless "Adam" with
  // adam_w_mode false (Adam with L2 regularisation, which we do not have).
  void optimizer(const json& o) {
    if (!o.is_object()) fail(str("optimizer = ", o.dump(), ": expected an object with \"type\" and \"params\""));
    for (auto& [k, v] : o.items())
      if (k != "type" && k != "params") guard([&] { fail(unknown("optimizer", k, {"type", "params"})); });
    const json type = o.value("type", json());
    if (!type.is_string() || (lower(type.get<std::string>()) != "adam" && lower(type.get<std::string>()) != "adamw"))
      fail(str("optimizer.type = ", type.dump(), ": not supported by autosp-train (it has AdamW: \"Adam\" or \"AdamW\")"));
    const json p = o.value("params", json::object());
    if (!p.is_object()) fail(str("optimizer.params = ", p.dump(), ": expected an object"));
    const bool adamw = lower(type.get<std::string>()) == "adamw";
    bool w_mode = true, torch_adam = false;
    for (auto& [k, v] : p.items())
      guard([&] {
        if (k == "lr" || k == "betas" || k == "eps" || k == "weight_decay") return;
        const std::string key = str("optimizer.params.", k);
        if (k == "adam_w_mode" || k == "torch_adam") {
          if (!v.is_boolean()) fail(str(key, " = ", v.dump(), ": expected true or false"));
          (k == "adam_w_mode" ? w_mode : torch_adam) = v.get<bool>();
        } else if (k == "amsgrad") {
          require(key, v, json(false), "its AdamW keeps no running maximum of the second moment", "set it false");
        } else if (k == "bias_correction") {
          require(key, v, json(true), "its AdamW corrects the moments' bias, as PyTorch's does", "set it true");
        } else {
          fail(unknown("optimizer.params", k, {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam",
                                               "amsgrad", "bias_correction"}));
        }
      });
    if (!adamw && !w_mode)
      fail("optimizer \"Adam\" with adam_w_mode false (Adam with L2 regularisation) is not supported by autosp-train; "
           "it has AdamW (adam_w_mode true, DeepSpeed's default)");
    guard([&] { param("optimizer.params.lr", p, "lr", "train.lr", 1e-3); });
    guard([&] {
      if (p.contains("betas") && !is_auto(p["betas"])) {
        const json& b = p["betas"];
        if (!b.is_array() || b.size() != 2) fail(str("optimizer.params.betas = ", b.dump(), ": expected [beta1, beta2]"));
        set("optimizer.params.betas[0]", "train.beta1", b[0]);
        set("optimizer.params.betas[1]", "train.beta2", b[1]);
      } else if (!p.contains("betas")) {
        param("optimizer.params.betas[0]", p, "betas", "train.beta1", 0.9);
        param("optimizer.params.betas[1]", p, "betas", "train.beta2", 0.999);
      } else {
        value("optimizer.params.betas[0]", p["betas"], "train.beta1");
        value("optimizer.params.betas[1]", p["betas"], "train.beta2");
      }
    });
    guard([&] { param("optimizer.params.eps", p, "eps", "train.eps", 1e-8); });
    // FusedAdam's default weight decay is 0; torch.optim.AdamW's (torch_adam) is 0.01.
    guard([&] { param("optimizer.params.weight_decay", p, "weight_decay", "train.weight_decay", torch_adam ? 0.01 : 0.0); });
  }

  // WarmupLR, WarmupDecayLR, WarmupCosineLR with DeepSpeed's defaults (lr_schedules.py); no
  // scheduler section is DeepSpeed's constant learning rate (the optimizer's lr at every step).
  void scheduler() {
    if (!ds_.contains("scheduler"))
      return ds_default("scheduler", "train.lr_schedule", "constant",
                        str("no scheduler section, so a constant learning rate"));
    const json& s = ds_["scheduler"];
    if (!s.is_object()) fail(str("scheduler = ", s.dump(), ": expected an object with \"type\" and \"params\""));
    for (auto& [k, v] : s.items())
      if (k != "type" && k != "params") guard([&] { fail(unknown("scheduler", k, {"type", "params"})); });
    const json type = s.value("type", json());
    const std::map<std::string, std::string> ours = {
        {"WarmupLR", "ds_warmup"}, {"WarmupDecayLR", "ds_warmup_decay"}, {"WarmupCosineLR", "ds_warmup_cosine"}};
    if (!type.is_string() || !ours.count(type.get<std::string>()))
      fail(str("scheduler.type = ", type.dump(),
               ": not supported by autosp-train (it has WarmupLR, WarmupDecayLR and WarmupCosineLR)"));
    const std::string t = type.get<std::string>();
    const json p = s.value("params", json::object());
    if (!p.is_object()) fail(str("scheduler.params = ", p.dump(), ": expected an object"));
    std::set<std::string> known = {"warmup_num_steps", "warmup_type", "last_batch_iteration"};
    if (t == "WarmupCosineLR") known.insert({"total_num_steps", "warmup_min_ratio", "cos_min_ratio"});
    else known.insert({"warmup_min_lr", "warmup_max_lr"});
    if (t == "WarmupDecayLR") known.insert("total_num_steps");
    for (auto& [k, v] : p.items())
      if (!known.count(k))
        guard([&] {
          const std::string hint = closest_name(k, {known.begin(), known.end()});
          fail(str("scheduler.params.", k, ": not a parameter of DeepSpeed's ", t,
                   hint.empty() ? "" : str(" (did you mean 'scheduler.params.", hint, "'?)")));
        });
    auto key = [](const char* k) { return str("scheduler.params.", k); };
    guard([&] { set("scheduler.type", "train.lr_schedule", ours.at(t), "", "", json(t)); });
    if (p.contains("last_batch_iteration") && !same(p["last_batch_iteration"], json(-1)))
      guard([&] {
        refuse(key("last_batch_iteration"), p["last_batch_iteration"], "a schedule starts at step 0",
               "resume with --resume instead");
      });
    guard([&] {
      if (p.contains("warmup_num_steps") && !is_auto(p["warmup_num_steps"]))
        integer(key("warmup_num_steps"), p["warmup_num_steps"]);
      param(key("warmup_num_steps"), p, "warmup_num_steps", "train.warmup_steps", 1000);
    });
    guard([&] {
      if (p.contains("warmup_type") && !is_auto(p["warmup_type"]) && p["warmup_type"] != "log" &&
          p["warmup_type"] != "linear")
        fail(str(key("warmup_type"), " = ", p["warmup_type"].dump(), ": expected \"log\" or \"linear\""));
      param(key("warmup_type"), p, "warmup_type", "train.warmup_type", "log");
    });
    if (t != "WarmupLR")
      guard([&] {
        if (!p.contains("total_num_steps"))
          fail(str("scheduler ", t, " needs params.total_num_steps (DeepSpeed has no default)"));
        if (!is_auto(p["total_num_steps"])) integer(key("total_num_steps"), p["total_num_steps"]);
        value(key("total_num_steps"), p["total_num_steps"], "train.schedule_steps");
      });
    if (t == "WarmupCosineLR") {  // ratios of the optimizer's lr
      const double lr = current("train.lr").get<double>();
      for (auto [name, ours_key, dflt] : {std::tuple{"warmup_min_ratio", "train.warmup_min_lr", 0.0},
                                         std::tuple{"cos_min_ratio", "train.min_lr", 1e-4}})
        guard([&] {
          if (p.contains(name) && is_auto(p[name])) return value(key(name), p[name], ours_key);
          if (!p.contains(name) && given(ours_key)) return;
          const json r = p.value(name, json(dflt));
          if (!r.is_number() || r.get<double>() < 0) fail(str(key(name), " = ", r.dump(), ": expected a number >= 0"));
          if (p.contains(name)) set(key(name), ours_key, r.get<double>() * lr, str(" (× lr ", lr, ")"), "", r);
          else set(key(name), ours_key, r.get<double>() * lr, str(" (DeepSpeed's default × lr ", lr, ")"),
                   str("DeepSpeed's default ", name, " ", r.get<double>(), " × lr"), r);
        });
    } else {
      guard([&] { param(key("warmup_min_lr"), p, "warmup_min_lr", "train.warmup_min_lr", 0.0); });
      // warmup_max_lr is the lr (DeepSpeed's scheduler overrides the optimizer's); WarmupLR's
      // default is the optimizer's lr, WarmupDecayLR's 0.001.
      guard([&] {
        param(key("warmup_max_lr"), p, "warmup_max_lr", "train.lr", t == "WarmupDecayLR" ? json(1e-3) : json());
      });
    }
  }

  // gradient_clipping, or DeepSpeed's default where the file has none: 0, no clipping.
  void clipping() {
    if (ds_.contains("gradient_clipping")) return value("gradient_clipping", ds_["gradient_clipping"], "train.grad_clip");
    ds_default("gradient_clipping", "train.grad_clip", 0.0, "none in the file, so no clipping");
  }

  void bf16(const std::string& key, const json& b) {
    if (!b.is_object()) fail(str(key, " = ", b.dump(), ": expected an object"));
    // The fp16 section's loss-scaling keys, which bf16 (never scaled) does not read.
    static const std::set<std::string> scaling = {"loss_scale", "loss_scale_window", "initial_scale_power", "hysteresis",
                                                  "consecutive_hysteresis", "min_loss_scale"};
    for (auto& [k, v] : b.items())
      guard([&] {
        const std::string sub = str(key, ".", k);
        if (k == "enabled") return;
        if (k == "immediate_grad_update" || k == "check_grad_overflow" || scaling.count(k)) return ignored.push_back(sub);
        if (k == "auto_cast")
          return require(sub, v, json(false), "autosp does not cast the model's floating-point inputs", "set it false");
        if (k == "bf16_master_weights_and_grads" || k == "bf16_optimizer_states")
          return require(sub, v, json(false), "under bf16 autosp keeps float32 master weights, gradients and AdamW "
                         "state", "set it false");
        std::vector<std::string> known = {"enabled", "immediate_grad_update", "check_grad_overflow", "auto_cast",
                                          "bf16_master_weights_and_grads", "bf16_optimizer_states"};
        known.insert(known.end(), scaling.begin(), scaling.end());
        fail(unknown(key, k, known));
      });
    const json enabled = b.value("enabled", json(false));
    if (is_auto(enabled)) return value(str(key, ".enabled"), enabled, "runtime.dtype");
    if (!enabled.is_boolean()) fail(str(key, ".enabled = ", enabled.dump(), ": expected true, false or \"auto\""));
    if (enabled.get<bool>()) return set(str(key, ".enabled"), "runtime.dtype", "bfloat16", "", "", enabled);
    if (given("runtime.dtype") && cfg_.given[ptr("runtime.dtype")] == "bfloat16")
      fail(str(key, ".enabled = false conflicts with runtime.dtype = \"bfloat16\" set in the config or by --set"));
  }

  void zero(const json& z) {
    if (!z.is_object()) fail(str("zero_optimization = ", z.dump(), ": expected an object"));
    for (auto& [k, v] : z.items())
      guard([&] {
        const std::string key = str("zero_optimization.", k);
        if (k == "stage") value(key, v, "zero_optimization.stage");
        else if (k == "overlap_comm") value(key, v, "runtime.overlap_grad_sync");
        else if (k == "reduce_bucket_size") bucket(key, v);
        else if (k == "offload_optimizer" || k == "offload_param") {
          const json device = v.is_object() ? v.value("device", json("none")) : v;
          if (!v.is_null() && device != "none")
            refuse(key, v, "no offload; it keeps everything on the device",
                   "remove it (or set \"device\": \"none\"); to save memory shard more with zero_optimization.stage 3, "
                   "or recompute with runtime.activation_checkpointing in the run config");
          ignored.push_back(key);
        } else if (k == "cpu_offload" || k == "cpu_offload_param") {
          require(key, v, json(false), "no offload; it keeps everything on the device", "set it false");
        } else if (k == "zero_quantized_weights" || k == "zero_quantized_gradients" ||
                   k == "zero_quantized_nontrainable_weights") {
          require(key, v, json(false), "it would change the math: ZeRO++ quantizes what it communicates", "set it false");
        } else if (k == "zero_hpz_partition_size") {
          if (!(v.is_number() && v.get<double>() <= 1))
            refuse(key, v, "no hierarchical partitioning (ZeRO++ hpZ)", "remove it or set it 1");
          ignored.push_back(key);
        } else if (k == "mics_shard_size") {
          if (!(v.is_number() && v.get<double>() <= 0)) refuse(key, v, "no MiCS sharding", "remove it");
          ignored.push_back(key);
        } else if (ignored_zero().count(k)) {
          ignored.push_back(key);
        } else {
          std::vector<std::string> known(ignored_zero().begin(), ignored_zero().end());
          known.insert(known.end(), {"stage", "overlap_comm", "reduce_bucket_size", "offload_optimizer", "offload_param",
                                     "cpu_offload", "cpu_offload_param", "zero_quantized_weights",
                                     "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
                                     "zero_hpz_partition_size", "mics_shard_size"});
          fail(unknown("zero_optimization", k, known));
        }
      });
  }

  // reduce_bucket_size counts elements (DeepSpeed's zero/config.py); ours is MiB of gradients,
  // which are f32 (f64 under runtime.dtype float64).
  void bucket(const std::string& key, const json& v) {
    if (is_auto(v)) return value(key, v, "runtime.grad_bucket_mb");
    if (!v.is_number() || v.get<double>() <= 0) fail(str(key, " = ", v.dump(), ": expected a positive number of elements"));
    const double bytes = current("runtime.dtype") == "float64" ? 8 : 4;
    set(key, "runtime.grad_bucket_mb", v.get<double>() * bytes / (1024.0 * 1024.0),
        str(" (", bytes, "-byte gradients)"), "", v);
  }

  // compile: autosp-train always runs AutoSP (our compiler); DeepSpeed's other passes and
  // settings are its own compiler's and change nothing here.
  // DeepSpeed's monitors (deepspeed/monitor/config.py): {"enabled", "output_path", "job_name"},
  // writing into os.path.join(output_path, job_name), defaults "" and "DeepSpeedJobName". Enabled,
  // the directory becomes our key (train/curves.h: event files; one metrics.csv for csv_monitor,
  // where DeepSpeed writes a CSV per metric).
  void monitor(const std::string& key, const json& m, const std::string& ours) {
    if (!m.is_object()) fail(str(key, " = ", m.dump(), ": expected an object"));
    const std::vector<std::string> known = {"enabled", "output_path", "job_name"};
    for (auto& [k, v] : m.items()) {
      if (std::find(known.begin(), known.end(), k) == known.end()) fail(unknown(key, k, known));
      if (k == "enabled" ? !v.is_boolean() : !v.is_string())
        fail(str(key, ".", k, " = ", v.dump(), k == "enabled" ? ": expected true or false" : ": expected a string"));
    }
    if (!m.value("enabled", false)) return ignored.push_back(str(key, " (not enabled)"));
    const std::string dir =
        (std::filesystem::path(m.value("output_path", std::string())) / m.value("job_name", std::string("DeepSpeedJobName")))
            .string();
    set(key, ours, dir, " (output_path/job_name)");
  }

  void compile(const json& c) {
    if (!c.is_object()) fail(str("compile = ", c.dump(), ": expected an object"));
    for (auto& [k, v] : c.items())
      guard([&] {
        if (k == "passes") {
          if (!v.is_array() || std::none_of(v.begin(), v.end(), [](const json& x) { return x == "autosp"; }))
            fail(str("compile.passes = ", v.dump(), ": must contain \"autosp\" (autosp-train runs AutoSP)"));
        } else if (k == "deepcompile") {
          if (!v.is_boolean()) fail(str("compile.deepcompile = ", v.dump(), ": expected true or false"));
        } else {
          ignored.push_back(str("compile.", k));
        }
      });
    mapped.push_back("compile.passes: AutoSP (always on)");
  }
};

}  // namespace

Config apply_deepspeed(const Config& cfg, const json& ds, int world_size, const std::string& ds_origin,
                       const std::string& cfg_origin) {
  Mapper m(cfg, ds, world_size, ds_origin);
  m.run();
  Problems problems(ds_origin);
  for (std::string& p : m.problems) problems.add(std::move(p));
  problems.raise();
  json j = cfg.given.is_object() ? cfg.given : json::object();
  for (const auto& [key, v] : m.assigned) {
    const auto dot = key.find('.');
    json& section = j[key.substr(0, dot)];
    if (!section.is_object()) section = json::object();
    section[key.substr(dot + 1)] = v;
  }
  Config out;
  try {
    out = parse_config(j, {}, cfg_origin);
  } catch (const UsageError& e) {
    throw UsageError(with_note(e.what(), str(" (with the DeepSpeed config ", ds_origin, ")")));
  }
  // The first parse's notes and warnings (a bare HF config says so only then), then ours.
  std::vector<std::string> warnings = cfg.warnings;
  for (auto& w : out.warnings)
    if (std::find(warnings.begin(), warnings.end(), w) == warnings.end()) warnings.push_back(w);
  for (auto& w : m.warnings) warnings.push_back(std::move(w));
  out.warnings = std::move(warnings);
  out.notes = cfg.notes;
  out.given = cfg.given;
  out.sources = m.sources;
  auto join = [](const std::vector<std::string>& items, const char* sep) {
    std::string list;
    for (const auto& s : items) list += str(list.empty() ? "" : sep, s);
    return list;
  };
  out.notes.push_back(str(ds_origin, ": DeepSpeed keys applied: ", m.mapped.empty() ? "none" : join(m.mapped, "; ")));
  if (!m.agreed.empty()) out.notes.push_back(str(ds_origin, ": at autosp's own value: ", join(m.agreed, ", ")));
  if (!m.ignored.empty())
    out.notes.push_back(str(ds_origin, ": not used by autosp (they change nothing here): ", join(m.ignored, ", ")));
  return out;
}

Config load_deepspeed(const Config& cfg, const std::string& path, int world_size, const std::string& cfg_origin) {
  return apply_deepspeed(cfg, parse_json(read_input_file(path, "a DeepSpeed config"), path), world_size, path, cfg_origin);
}

}  // namespace autosp
