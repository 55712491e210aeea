// Hugging Face config.json ↔ our model keys: one table of the keys each HF config class has (and
// what we call them), one list of the keys that do not change the math, and the settings we
// cannot train (each an error naming its key). Defaults are transformers 4.44's.
#include "models/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "tensor/check.h"

namespace autosp {
namespace {

using json = nlohmann::json;

// One HF key with our name and HF's default (null: no default).
struct Rename {
  const char* hf;
  const char* ours;
  json fallback;
};

const std::vector<Rename>& gpt2_keys() {
  static const std::vector<Rename> k = {
      {"vocab_size", "vocab_size", 50257},      {"n_embd", "hidden_size", 768},
      {"n_layer", "num_hidden_layers", 12},     {"n_head", "num_attention_heads", 12},
      {"n_positions", "max_position_embeddings", 1024}, {"layer_norm_epsilon", "norm_eps", 1e-5},
  };
  return k;
}
// The Llama family's config classes share these keys; each class has its own defaults
// (transformers 4.44's, and Qwen3Config's of 4.51+).
std::vector<Rename> llama_family_keys(json vocab, json intermediate, json heads_kv, json max_pos, json eps,
                                      json head_dim) {
  return {
      {"vocab_size", "vocab_size", std::move(vocab)},
      {"hidden_size", "hidden_size", 4096},
      {"intermediate_size", "intermediate_size", std::move(intermediate)},
      {"num_hidden_layers", "num_hidden_layers", 32},
      {"num_attention_heads", "num_attention_heads", 32},
      {"num_key_value_heads", "num_key_value_heads", std::move(heads_kv)},  // null: num_attention_heads
      {"max_position_embeddings", "max_position_embeddings", std::move(max_pos)},
      {"rms_norm_eps", "norm_eps", std::move(eps)},
      {"rope_theta", "rope_theta", 10000.0},
      {"tie_word_embeddings", "tie_word_embeddings", false},
      {"head_dim", "head_dim", std::move(head_dim)},  // null: hidden_size / num_attention_heads
  };
}
const std::vector<Rename>& llama_keys() {
  static const std::vector<Rename> k = [] {
    auto v = llama_family_keys(32000, 11008, nullptr, 2048, 1e-6, nullptr);
    v.push_back({"attention_bias", "attention_bias", false});
    v.push_back({"mlp_bias", "mlp_bias", false});
    return v;
  }();
  return k;
}
const std::vector<Rename>& mistral_keys() {
  static const std::vector<Rename> k = llama_family_keys(32000, 14336, 8, 4096 * 32, 1e-6, nullptr);
  return k;
}
const std::vector<Rename>& qwen2_keys() {
  static const std::vector<Rename> k = llama_family_keys(151936, 22016, 32, 32768, 1e-6, nullptr);
  return k;
}
const std::vector<Rename>& qwen3_keys() {
  static const std::vector<Rename> k = [] {
    auto v = llama_family_keys(151936, 22016, 32, 32768, 1e-6, 128);
    v.push_back({"attention_bias", "attention_bias", false});
    return v;
  }();
  return k;
}

// Keys of PretrainedConfig, generation defaults and the config classes that do not change the
// forward math of a causal LM trained here: accepted, and listed once in the log.
const std::set<std::string>& math_free_keys() {
  static const std::set<std::string> k = {
      "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "use_cache",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "initializer_range", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
      "use_bfloat16", "tf_legacy_loss", "tie_encoder_decoder", "is_decoder", "chunk_size_feed_forward",
      "cross_attention_hidden_size", "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix",
      "problem_type", "task_specific_params", "max_length", "min_length", "do_sample", "early_stopping",
      "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
      "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
      "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
      "suppress_tokens", "begin_suppress_tokens", "_attn_implementation", "_attn_implementation_autoset",
      "gradient_checkpointing",
      // transformers 5's name for torch_dtype.
      "dtype",
      // GPT-2: the double-heads model's summary head, the legacy context key, the fp32 upcast.
      "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
      "summary_first_dropout", "n_ctx", "reorder_and_upcast_attn",
      // Llama: pretraining_tp splits the projections into slices whose sum is the same product.
      "pretraining_tp"};
  return k;
}

// Settings we do not train whose value must be the one that leaves the model plain; each row is
// (key, accepted values as JSON, what we support).
struct Required {
  const char* key;
  std::vector<json> ok;
  const char* what;
};
const std::vector<Required>& gpt2_required() {
  static const std::vector<Required> r = {
      {"activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "autosp's GPT-2 uses the tanh GELU (gelu_new)"},
      {"scale_attn_weights", {true}, "attention is scaled by 1/sqrt(head dim)"},
      {"scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scaling"},
      {"tie_word_embeddings", {true}, "GPT-2's lm_head is tied to wte"},
      {"add_cross_attention", {false}, "a decoder-only model"},
      {"sliding_window", {nullptr}, "attention is full causal (no sliding window)"},
  };
  return r;
}
const std::vector<Required>& llama_required() {
  static const std::vector<Required> r = {
      {"hidden_act", {"silu"}, "autosp's Llama MLP is SwiGLU (silu)"},
      {"use_sliding_window", {false}, "attention is full causal"},
      {"sliding_window", {nullptr}, "attention is full causal (no sliding window)"},
  };
  return r;
}
// Mistral's sliding_window and Qwen's use_sliding_window are read by translate_hf_config.
const std::vector<Required>& mistral_required() {
  static const std::vector<Required> r = {{"hidden_act", {"silu"}, "autosp's Mistral MLP is SwiGLU (silu)"}};
  return r;
}
const std::vector<Required>& qwen_required() {
  static const std::vector<Required> r = {{"hidden_act", {"silu"}, "autosp's Qwen MLP is SwiGLU (silu)"}};
  return r;
}
const std::vector<Required>& common_required() {
  static const std::vector<Required> r = {
      {"is_encoder_decoder", {false}, "a decoder-only model"},
      {"pruned_heads", {json::object()}, "every head is present"},
      {"quantization_config", {nullptr}, "unquantized weights"},
  };
  return r;
}
const std::vector<const char*> kDropouts = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"};

// The Arch that model_type (our model.arch) `name` spells, if an HF config class is known for it.
std::optional<Arch> arch_named(const std::string& name) {
  for (Arch a : {Arch::gpt2, Arch::llama, Arch::mistral, Arch::qwen2, Arch::qwen3})
    if (arch_name(a) == name) return a;
  return std::nullopt;
}

// The HF config class of an architecture: its name, its keys and the settings we cannot train.
struct HfClass {
  const char* name;
  const std::vector<Rename>& keys;
  const std::vector<Required>& required;
};
HfClass hf_class(Arch arch) {
  switch (arch) {
    case Arch::gpt2: return {"GPT2Config", gpt2_keys(), gpt2_required()};
    case Arch::llama: return {"LlamaConfig", llama_keys(), llama_required()};
    case Arch::mistral: return {"MistralConfig", mistral_keys(), mistral_required()};
    case Arch::qwen2: return {"Qwen2Config", qwen2_keys(), qwen_required()};
    case Arch::qwen3: return {"Qwen3Config", qwen3_keys(), qwen_required()};
  }
  throw std::logic_error("hf_class: unknown arch");
}

// Our key → HF's, for messages about a directory's config.json.
std::string hf_name(Arch arch, const std::string& ours) {
  if (ours == "arch") return "model_type";
  for (const Rename& r : hf_class(arch).keys)
    if (ours == r.ours) return r.hf;
  return ours;
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// What a config.json value must be to compare with ours (a JSON integer where ours is one, as
// the config schema asks), or nullptr when its type fits.
const char* type_mismatch(const json& theirs, const json& ours) {
  if (ours.is_boolean() && !theirs.is_boolean()) return "true or false";
  if (ours.is_number_integer() && !theirs.is_number_integer()) return "an integer";
  if (ours.is_number() && !theirs.is_number()) return "a number";
  if (ours.is_string() && !theirs.is_string()) return "a string";
  return nullptr;
}

}  // namespace

bool is_hf_config(const json& j) {
  if (!j.is_object() || !(j.contains("model_type") || j.contains("architectures"))) return false;
  for (const char* section : {"model", "data", "train", "runtime", "sequence_parallel"})
    if (j.contains(section)) return false;
  return true;
}

RopeScalingConfig parse_rope_scaling(const json& j, const std::string& where) {
  RopeScalingConfig s;
  if (j.is_null()) return s;
  auto bad = [&](const std::string& what) { throw UsageError(str(where, ": ", what)); };
  if (!j.is_object()) bad(str("expected an object or null, got ", j.dump()));
  const json type = j.contains("rope_type") ? j["rope_type"] : j.contains("type") ? j["type"] : json();
  if (!type.is_string()) bad("needs \"rope_type\": \"linear\", \"llama3\" or \"yarn\" (or \"default\")");
  const std::string t = type.get<std::string>();
  if (t != "default" && t != "linear" && t != "llama3" && t != "yarn")
    bad(str("rope_type \"", t, "\" is not supported (supported: linear, llama3, yarn, default)"));
  std::set<std::string> allowed = {"rope_type", "type"};
  if (t != "default") allowed.insert("factor");
  if (t == "llama3") allowed.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (t == "yarn")
    allowed.insert({"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
                    "mscale_all_dim", "truncate"});
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key())) bad(str("'", it.key(), "' does not apply to rope_type \"", t, "\""));
  if (t == "default") return s;
  auto number = [&](const char* k, double lo) {
    if (!j.contains(k) || !j[k].is_number()) bad(str("rope_type \"", t, "\" needs \"", k, "\" (a number)"));
    const double v = j[k].get<double>();
    if (!(v >= lo) || !std::isfinite(v)) bad(str("\"", k, "\" = ", v, ": expected a number >= ", lo));
    return v;
  };
  // An optional positive number (HF's `.get(k) or default`: null and absent alike); 0 = absent.
  auto optional_positive = [&](const char* k) {
    if (!j.contains(k) || j[k].is_null()) return 0.0;
    const double v = j[k].is_number() ? j[k].get<double>() : -1;
    if (!(v > 0) || !std::isfinite(v)) bad(str("\"", k, "\" = ", j[k].dump(), ": expected a positive number"));
    return v;
  };
  auto original = [&](bool required) -> int64_t {
    const char* k = "original_max_position_embeddings";
    if (!required && (!j.contains(k) || j[k].is_null())) return 0;
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() < 1)
      bad(str("rope_type \"", t, "\" needs \"", k, "\" (a positive integer)"));
    return j[k].get<int64_t>();
  };
  s.rope_type = t;
  s.factor = number("factor", 1);
  if (t == "llama3") {
    s.low_freq_factor = number("low_freq_factor", 1e-6);
    s.high_freq_factor = number("high_freq_factor", 1e-6);
    if (!(s.high_freq_factor > s.low_freq_factor))
      bad(str("high_freq_factor ", s.high_freq_factor, " must exceed low_freq_factor ", s.low_freq_factor));
    s.original_max_position_embeddings = original(true);
  }
  if (t == "yarn") {
    s.original_max_position_embeddings = original(false);  // 0: the model's max_position_embeddings
    s.beta_fast = optional_positive("beta_fast");
    s.beta_slow = optional_positive("beta_slow");
    s.attention_factor = optional_positive("attention_factor");
    s.mscale = optional_positive("mscale");
    s.mscale_all_dim = optional_positive("mscale_all_dim");
    if (j.contains("truncate") && !j["truncate"].is_boolean())
      bad(str("\"truncate\" = ", j["truncate"].dump(), ": expected true or false"));
    s.truncate = j.value("truncate", true);
  }
  return s;
}

json rope_scaling_json(const RopeScalingConfig& s) {
  if (s.rope_type.empty()) return nullptr;
  json j = {{"rope_type", s.rope_type}, {"factor", s.factor}};
  if (s.rope_type == "llama3") {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
    j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  if (s.rope_type == "yarn") {  // only what was given, so HF applies its own defaults as we do
    if (s.original_max_position_embeddings > 0) j["original_max_position_embeddings"] = s.original_max_position_embeddings;
    for (auto [k, v] : {std::pair{"beta_fast", s.beta_fast}, {"beta_slow", s.beta_slow},
                        {"attention_factor", s.attention_factor}, {"mscale", s.mscale}, {"mscale_all_dim", s.mscale_all_dim}})
      if (v > 0) j[k] = v;
    if (!s.truncate) j["truncate"] = false;
  }
  return j;
}

json model_json(const ModelConfig& m) {
  json r = {{"arch", arch_name(m.arch)},
            {"vocab_size", m.vocab_size},
            {"hidden_size", m.hidden_size},
            {"num_hidden_layers", m.num_hidden_layers},
            {"num_attention_heads", m.num_attention_heads},
            {"num_key_value_heads", m.num_key_value_heads},
            {"intermediate_size", m.intermediate_size},
            {"max_position_embeddings", m.max_position_embeddings},
            {"rope_theta", m.rope_theta},
            {"norm_eps", m.norm_eps},
            {"tie_word_embeddings", m.tie_word_embeddings}};
  if (!m.rope_scaling.rope_type.empty()) r["rope_scaling"] = rope_scaling_json(m.rope_scaling);
  // The Llama family's settings, where they are not the default (as translate_hf_config gives them).
  if (m.head_dim_config > 0 && m.head_dim_config * m.num_attention_heads != m.hidden_size) r["head_dim"] = m.head_dim_config;
  if (m.attention_bias) r["attention_bias"] = true;
  if (m.mlp_bias) r["mlp_bias"] = true;
  if (m.sliding_window > 0) r["sliding_window"] = m.sliding_window;
  return r;
}

namespace {

// The rope settings of a Llama-family config.json into `m` (rope_theta, rope_scaling): 4.x's
// rope_theta and rope_scaling, transformers 5's rope_parameters (rope_theta inside), or both
// spellings, which must then agree (our checkpoints write both).
void translate_rope(const json& hf, json& m, std::vector<std::string>& errors) {
  std::optional<RopeScalingConfig> scaling;
  try {
    if (hf.contains("rope_scaling")) scaling = parse_rope_scaling(hf["rope_scaling"], "rope_scaling");
  } catch (const UsageError& e) {
    errors.push_back(e.what());
    return;
  }
  if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
    const json& rp = hf["rope_parameters"];
    if (!rp.is_object()) {
      errors.push_back(str("rope_parameters = ", rp.dump(), ": expected an object"));
      return;
    }
    json rest = rp;
    if (rest.contains("partial_rotary_factor")) {
      if (!(rest["partial_rotary_factor"].is_number() && rest["partial_rotary_factor"].get<double>() == 1.0)) {
        errors.push_back(str("rope_parameters.partial_rotary_factor = ", rest["partial_rotary_factor"].dump(),
                             " is not supported (RoPE rotates the whole head)"));
        return;
      }
      rest.erase("partial_rotary_factor");
    }
    if (rest.contains("rope_theta")) {
      const json& theta = rest["rope_theta"];
      if (!theta.is_number()) {
        errors.push_back(str("rope_parameters.rope_theta = ", theta.dump(), ": expected a number"));
        return;
      }
      if (hf.contains("rope_theta") && !(hf["rope_theta"].is_number() && hf["rope_theta"].get<double>() == theta.get<double>())) {
        errors.push_back(str("rope_theta = ", hf["rope_theta"].dump(), " differs from rope_parameters.rope_theta = ", theta.dump()));
        return;
      }
      m["rope_theta"] = theta;
      rest.erase("rope_theta");
    }
    if (!rest.contains("rope_type") && !rest.contains("type")) rest["rope_type"] = "default";  // 5.x's default
    try {
      const RopeScalingConfig p = parse_rope_scaling(rest, "rope_parameters");
      if (scaling && !(*scaling == p)) {
        errors.push_back(str("rope_scaling = ", hf["rope_scaling"].dump(), " differs from rope_parameters = ", rp.dump()));
        return;
      }
      scaling = p;
    } catch (const UsageError& e) {
      errors.push_back(e.what());
      return;
    }
  }
  if (scaling && !scaling->rope_type.empty()) m["rope_scaling"] = rope_scaling_json(*scaling);
}

// The Llama family's keys beyond the shared table: the KV-head default, rope, head_dim, biases,
// the sliding window and transformers 5's layer_types. Our keys that keep their default are left
// out (model_json does the same), so a directory compares equal to the run it came from.
void translate_llama_family(const json& hf, Arch arch, json& m, std::set<std::string>& used,
                            std::vector<std::string>& errors) {
  auto integer = [&](const char* k) { return m.contains(k) && m[k].is_number_integer() ? m[k].get<int64_t>() : 0; };
  if (!m.contains("num_key_value_heads") && m["num_attention_heads"].is_number_integer())
    m["num_key_value_heads"] = m["num_attention_heads"];
  used.insert({"rope_scaling", "rope_parameters", "layer_types"});
  translate_rope(hf, m, errors);
  if (m.contains("head_dim")) {
    const int64_t hd = integer("head_dim"), C = integer("hidden_size"), N = integer("num_attention_heads");
    if (hd < 2 || hd % 2 != 0)
      errors.push_back(str("head_dim = ", m["head_dim"].dump(), ": expected an even positive integer (RoPE rotates pairs)"));
    else if (N > 0 && hd * N == C)
      m.erase("head_dim");  // the default: hidden_size / num_attention_heads
  }
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (m.contains(k)) {
      if (!m[k].is_boolean()) errors.push_back(str(k, " = ", m[k].dump(), ": expected true or false"));
      else if (!m[k].get<bool>()) m.erase(k);
    }
  // The sliding window: Mistral's applies when set; Qwen's only with use_sliding_window true.
  // A window is kept as model.sliding_window (config/ refuses one shorter than the sequence).
  switch (arch) {
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: {
      used.insert({"sliding_window", "use_sliding_window", "max_window_layers"});
      const bool applies = arch == Arch::mistral || (hf.contains("use_sliding_window") && hf["use_sliding_window"] == true);
      if (hf.contains("use_sliding_window") && !hf["use_sliding_window"].is_boolean())
        errors.push_back(str("use_sliding_window = ", hf["use_sliding_window"].dump(), ": expected true or false"));
      // MistralConfig's default is 4096; Qwen's window is off by default.
      const json w = hf.contains("sliding_window") ? hf["sliding_window"] : arch == Arch::mistral ? json(4096) : json();
      if (applies && !w.is_null()) {
        if (!w.is_number_integer() || w.get<int64_t>() < 1)
          errors.push_back(str("sliding_window = ", w.dump(), ": expected a positive integer or null"));
        else
          m["sliding_window"] = w;
      }
      break;
    }
    case Arch::llama:
    case Arch::gpt2: break;
  }
  if (hf.contains("layer_types") && !hf["layer_types"].is_null()) {
    const json& lt = hf["layer_types"];
    if (!lt.is_array()) {
      errors.push_back(str("layer_types = ", lt.dump(), ": expected a list of \"full_attention\""));
    } else {
      if (integer("num_hidden_layers") > 0 && static_cast<int64_t>(lt.size()) != integer("num_hidden_layers"))
        errors.push_back(str("layer_types has ", lt.size(), " entries for num_hidden_layers ", integer("num_hidden_layers")));
      for (size_t i = 0; i < lt.size(); ++i)
        if (lt[i] != "full_attention") {
          errors.push_back(str("layer_types[", i, "] = ", lt[i].dump(),
                               " is not supported (layer ", i, ": autosp's attention is full causal, \"full_attention\")"));
          break;
        }
    }
  }
}

}  // namespace

HfModelConfig translate_hf_config(const json& hf, const std::string& origin) {
  if (!hf.is_object()) throw UsageError(str(origin, ": expected a JSON object (a Hugging Face config.json)"));
  std::vector<std::string> errors;
  // The architecture: model_type, else the first of architectures.
  std::string type;
  if (hf.contains("model_type") && hf["model_type"].is_string()) type = hf["model_type"].get<std::string>();
  else if (hf.contains("architectures") && hf["architectures"].is_array() && !hf["architectures"].empty() &&
           hf["architectures"][0].is_string()) {
    const std::string a = hf["architectures"][0].get<std::string>();
    type = a.rfind("GPT2", 0) == 0                ? "gpt2"
           : a.rfind("Llama", 0) == 0             ? "llama"
           : a == "MistralForCausalLM"            ? "mistral"
           : a == "Qwen2ForCausalLM"              ? "qwen2"
           : a == "Qwen3ForCausalLM"              ? "qwen3"
                                                  : a;
  }
  const std::optional<Arch> named = arch_named(type);
  if (!named)
    throw UsageError(str(origin, ": model_type ", type.empty() ? "(none)" : "\"" + type + "\"",
                         " is not supported (supported: \"gpt2\" (GPT2Config), \"llama\" (LlamaConfig), \"mistral\" "
                         "(MistralConfig), \"qwen2\" (Qwen2Config), \"qwen3\" (Qwen3Config))"));
  const Arch arch = *named;
  const HfClass cls = hf_class(arch);

  HfModelConfig out;
  json& m = out.model;
  m["arch"] = type;
  std::set<std::string> used;
  for (const Rename& r : cls.keys) {
    used.insert(r.hf);
    const json& v = hf.contains(r.hf) ? hf[r.hf] : r.fallback;
    if (!v.is_null()) m[r.ours] = v;
  }
  switch (family(arch)) {
    case Arch::gpt2: {
      m["tie_word_embeddings"] = true;
      used.insert("n_inner");
      const json& inner = hf.contains("n_inner") ? hf["n_inner"] : json();
      if (!inner.is_null() && !(m["hidden_size"].is_number_integer() && inner == 4 * m["hidden_size"].get<int64_t>()))
        errors.push_back(str("n_inner = ", inner.dump(), ": autosp's GPT-2 MLP is 4·n_embd (n_inner null)"));
      break;
    }
    default:
      translate_llama_family(hf, arch, m, used, errors);
      break;
  }
  auto check_required = [&](const std::vector<Required>& rows) {
    for (const Required& r : rows) {
      used.insert(r.key);
      if (!hf.contains(r.key)) continue;
      bool ok = false;
      for (const json& v : r.ok) ok |= hf[r.key] == v;
      if (!ok) errors.push_back(str(r.key, " = ", hf[r.key].dump(), " is not supported (", r.what, ")"));
    }
  };
  check_required(cls.required);
  check_required(common_required());
  for (const char* d : kDropouts) {
    used.insert(d);
    if (hf.contains(d) && hf[d].is_number() && hf[d].get<double>() != 0)
      out.warnings.push_back(str(origin, ": ", d, " = ", hf[d].dump(), " is not applied (autosp trains without dropout)"));
  }
  for (auto it = hf.begin(); it != hf.end(); ++it) {
    if (used.count(it.key())) continue;
    if (math_free_keys().count(it.key())) out.math_free.push_back(it.key());
    else errors.push_back(str("unknown key '", it.key(), "' (not a ", cls.name, " setting autosp knows)"));
  }
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += str(all.empty() ? "" : "; ", e);
    throw UsageError(str(origin, ": ", all));
  }
  return out;
}

json read_json_file(const std::string& path, uint64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str(path, ": cannot open: no such file"));
  if (!fs::is_regular_file(path, ec)) throw UsageError(str(path, ": not a regular file"));  // a FIFO would block
  if (fs::file_size(path, ec) > max_bytes) throw UsageError(str(path, ": larger than ", max_bytes, " bytes"));
  std::ifstream f(path);
  if (!f) throw UsageError(str(path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str(), [](int depth, json::parse_event_t, json&) { return depth <= 32; });
  } catch (const json::exception& e) {
    throw UsageError(str(path, ": not valid JSON: ", e.what()));
  }
  if (j.is_discarded()) throw UsageError(str(path, ": JSON nested deeper than 32 levels"));
  return j;
}

HfModelConfig read_hf_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UsageError(str(dir, ": not a directory (model.from takes a Hugging Face model directory)"));
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path, ec)) throw UsageError(str(path, ": cannot open (a Hugging Face model directory holds config.json)"));
  return translate_hf_config(read_json_file(path, uint64_t{16} << 20), path);
}

json hf_config_json(const ModelConfig& m, DType dtype) {
  const json model = model_json(m);
  auto get = [&](const char* k) { return model.contains(k) ? model[k] : json(); };  // null when absent
  const json arch = get("arch");
  const std::optional<Arch> named = arch.is_string() ? arch_named(arch.get<std::string>()) : std::nullopt;
  AUTOSP_ASSERT(named, "hf_config_json: model.arch ", arch.dump(), " names no architecture");
  json hf;
  switch (*named) {
    case Arch::gpt2:
      hf = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", get("vocab_size")},
            {"n_positions", get("max_position_embeddings")},
            {"n_embd", get("hidden_size")},
            {"n_layer", get("num_hidden_layers")},
            {"n_head", get("num_attention_heads")},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", get("norm_eps")},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true}};
      break;
    case Arch::llama:
    case Arch::mistral:
    case Arch::qwen2:
    case Arch::qwen3: {
      const Arch a = *named;
      const char* cls = a == Arch::llama     ? "LlamaForCausalLM"
                        : a == Arch::mistral ? "MistralForCausalLM"
                        : a == Arch::qwen2   ? "Qwen2ForCausalLM"
                                             : "Qwen3ForCausalLM";
      // Both spellings of rope: 4.x's rope_theta + rope_scaling and transformers 5's
      // rope_parameters (rope_theta inside); each version reads its own and 5.x accepts both.
      json rope_parameters = get("rope_scaling").is_null() ? json{{"rope_type", "default"}} : get("rope_scaling");
      rope_parameters["rope_theta"] = get("rope_theta");
      hf = {{"architectures", {cls}},
            {"model_type", arch_name(a)},
            {"vocab_size", get("vocab_size")},
            {"hidden_size", get("hidden_size")},
            {"intermediate_size", get("intermediate_size")},
            {"num_hidden_layers", get("num_hidden_layers")},
            {"num_attention_heads", get("num_attention_heads")},
            {"num_key_value_heads", get("num_key_value_heads")},
            {"head_dim", m.head_dim()},
            {"hidden_act", "silu"},
            {"max_position_embeddings", get("max_position_embeddings")},
            {"rms_norm_eps", get("norm_eps")},
            {"rope_theta", get("rope_theta")},
            {"rope_scaling", get("rope_scaling")},
            {"rope_parameters", rope_parameters},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", get("tie_word_embeddings")}};
      switch (a) {
        case Arch::llama:
          hf["attention_bias"] = m.attention_bias;
          hf["mlp_bias"] = m.mlp_bias;
          break;
        case Arch::mistral: hf["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(); break;
        case Arch::qwen3: hf["attention_bias"] = m.attention_bias; [[fallthrough]];
        case Arch::qwen2:
          hf["use_sliding_window"] = m.sliding_window > 0;
          hf["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json();
          // 5.x derives layer_types from the window when it is absent; without one, every layer is full.
          if (m.sliding_window == 0) hf["layer_types"] = std::vector<std::string>(size_t(m.num_hidden_layers), "full_attention");
          break;
        case Arch::gpt2: break;
      }
      break;
    }
  }
  hf["dtype"] = std::string(dtype_torch_name(dtype));  // transformers 5's name; 4.x reads torch_dtype
  hf["torch_dtype"] = std::string(dtype_torch_name(dtype));
  hf["use_cache"] = true;
  return hf;
}

void check_hf_dir_matches(const std::string& dir, const ModelConfig& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "config.json", ec)) return;
  const HfModelConfig hf = read_hf_model_dir(dir);
  const json ours = model_json(m);
  const std::string path = (fs::path(dir) / "config.json").string();
  auto refuse = [&](const std::string& key, const json& theirs, const json& run) {
    throw UsageError(str(path, ": ", hf_name(m.arch, key), " is ", theirs.dump(), " but this run's model.", key, " is ",
                         run.dump(), ": the weights are for another model (take the model from the directory with "
                         "\"model\": {\"from\": \"", dir, "\"})"));
  };
  auto run = [&](const std::string& k) { return ours.contains(k) ? ours[k] : json(); };  // null when absent
  if (hf.model["arch"] != ours["arch"]) refuse("arch", hf.model["arch"], ours["arch"]);
  // A value of the wrong type ("32" for an integer) is a malformed file, as model.from says, not
  // another model.
  for (auto it = hf.model.begin(); it != hf.model.end(); ++it)
    if (const char* want = type_mismatch(*it, run(it.key())))
      throw UsageError(str(path, ": ", hf_name(m.arch, it.key()), " = ", it->dump(), ": expected ", want));
  // max_position_embeddings changes neither the math of a Llama (RoPE takes any position) nor
  // weights without a check of their own (GPT-2's wpe has it as its shape).
  for (auto it = hf.model.begin(); it != hf.model.end(); ++it)
    if (it.key() != "max_position_embeddings" && !same_value(*it, run(it.key()))) refuse(it.key(), *it, run(it.key()));
  // Our keys that are left out when they keep their default (model_json).
  for (const char* k : {"rope_scaling", "head_dim", "attention_bias", "mlp_bias", "sliding_window"})
    if (ours.contains(k) && !hf.model.contains(k)) refuse(k, nullptr, ours[k]);
}

}  // namespace autosp
