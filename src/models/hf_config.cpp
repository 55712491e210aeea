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
const std::vector<Rename>& llama_keys() {
  static const std::vector<Rename> k = {
      {"vocab_size", "vocab_size", 32000},
      {"hidden_size", "hidden_size", 4096},
      {"intermediate_size", "intermediate_size", 11008},
      {"num_hidden_layers", "num_hidden_layers", 32},
      {"num_attention_heads", "num_attention_heads", 32},
      {"num_key_value_heads", "num_key_value_heads", nullptr},  // default: num_attention_heads
      {"max_position_embeddings", "max_position_embeddings", 2048},
      {"rms_norm_eps", "norm_eps", 1e-6},
      {"rope_theta", "rope_theta", 10000.0},
      {"tie_word_embeddings", "tie_word_embeddings", false},
  };
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
  };
  return r;
}
const std::vector<Required>& llama_required() {
  static const std::vector<Required> r = {
      {"hidden_act", {"silu"}, "autosp's Llama MLP is SwiGLU (silu)"},
      {"attention_bias", {false}, "the attention projections have no bias"},
      {"mlp_bias", {false}, "the MLP projections have no bias"},
      {"use_sliding_window", {false}, "attention is full causal"},
  };
  return r;
}
const std::vector<Required>& common_required() {
  static const std::vector<Required> r = {
      {"is_encoder_decoder", {false}, "a decoder-only model"},
      {"sliding_window", {nullptr}, "attention is full causal (no sliding window)"},
      {"pruned_heads", {json::object()}, "every head is present"},
      {"quantization_config", {nullptr}, "unquantized weights"},
  };
  return r;
}
const std::vector<const char*> kDropouts = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"};

// The Arch that model_type (our model.arch) `name` spells, if an HF config class is known for it.
std::optional<Arch> arch_named(const std::string& name) {
  for (Arch a : {Arch::gpt2, Arch::llama})
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
  if (!type.is_string()) bad("needs \"rope_type\": \"linear\" or \"llama3\" (or \"default\")");
  const std::string t = type.get<std::string>();
  if (t == "default") return s;
  if (t != "linear" && t != "llama3")
    bad(str("rope_type \"", t, "\" is not supported (supported: linear, llama3, default)"));
  std::set<std::string> allowed = {"rope_type", "type", "factor"};
  if (t == "llama3") allowed.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key())) bad(str("'", it.key(), "' does not apply to rope_type \"", t, "\""));
  auto number = [&](const char* k, double lo) {
    if (!j.contains(k) || !j[k].is_number()) bad(str("rope_type \"", t, "\" needs \"", k, "\" (a number)"));
    const double v = j[k].get<double>();
    if (!(v >= lo) || !std::isfinite(v)) bad(str("\"", k, "\" = ", v, ": expected a number >= ", lo));
    return v;
  };
  s.rope_type = t;
  s.factor = number("factor", 1);
  if (t == "llama3") {
    s.low_freq_factor = number("low_freq_factor", 1e-6);
    s.high_freq_factor = number("high_freq_factor", 1e-6);
    if (!(s.high_freq_factor > s.low_freq_factor))
      bad(str("high_freq_factor ", s.high_freq_factor, " must exceed low_freq_factor ", s.low_freq_factor));
    if (!j.contains("original_max_position_embeddings") || !j["original_max_position_embeddings"].is_number_integer() ||
        j["original_max_position_embeddings"].get<int64_t>() < 1)
      bad("rope_type \"llama3\" needs \"original_max_position_embeddings\" (a positive integer)");
    s.original_max_position_embeddings = j["original_max_position_embeddings"].get<int64_t>();
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
  return r;
}

HfModelConfig translate_hf_config(const json& hf, const std::string& origin) {
  if (!hf.is_object()) throw UsageError(str(origin, ": expected a JSON object (a Hugging Face config.json)"));
  std::vector<std::string> errors;
  // The architecture: model_type, else the first of architectures.
  std::string type;
  if (hf.contains("model_type") && hf["model_type"].is_string()) type = hf["model_type"].get<std::string>();
  else if (hf.contains("architectures") && hf["architectures"].is_array() && !hf["architectures"].empty() &&
           hf["architectures"][0].is_string()) {
    const std::string a = hf["architectures"][0].get<std::string>();
    type = a.rfind("GPT2", 0) == 0 ? "gpt2" : a.rfind("Llama", 0) == 0 ? "llama" : a;
  }
  const std::optional<Arch> named = arch_named(type);
  if (!named)
    throw UsageError(str(origin, ": model_type ", type.empty() ? "(none)" : "\"" + type + "\"",
                         " is not supported (supported: \"gpt2\" (GPT2Config), \"llama\" (LlamaConfig))"));
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
  switch (arch) {
    case Arch::gpt2: {
      m["tie_word_embeddings"] = true;
      used.insert("n_inner");
      const json& inner = hf.contains("n_inner") ? hf["n_inner"] : json();
      if (!inner.is_null() && !(m["hidden_size"].is_number_integer() && inner == 4 * m["hidden_size"].get<int64_t>()))
        errors.push_back(str("n_inner = ", inner.dump(), ": autosp's GPT-2 MLP is 4·n_embd (n_inner null)"));
      break;
    }
    case Arch::llama: {
      if (!m.contains("num_key_value_heads") && m["num_attention_heads"].is_number_integer())
        m["num_key_value_heads"] = m["num_attention_heads"];
      used.insert({"rope_scaling", "head_dim"});
      if (hf.contains("rope_scaling")) {
        try {
          RopeScalingConfig s = parse_rope_scaling(hf["rope_scaling"], "rope_scaling");
          if (!s.rope_type.empty()) m["rope_scaling"] = rope_scaling_json(s);
        } catch (const UsageError& e) {
          errors.push_back(e.what());
        }
      }
      const json& hd = hf.contains("head_dim") ? hf["head_dim"] : json();
      if (!hd.is_null() && m["hidden_size"].is_number_integer() && m["num_attention_heads"].is_number_integer() &&
          m["num_attention_heads"].get<int64_t>() > 0 &&
          hd != m["hidden_size"].get<int64_t>() / m["num_attention_heads"].get<int64_t>())
        errors.push_back(str("head_dim = ", hd.dump(), ": autosp's head dim is hidden_size / num_attention_heads (",
                             m["hidden_size"].get<int64_t>() / m["num_attention_heads"].get<int64_t>(), ")"));
      break;
    }
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
      hf = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", get("vocab_size")},
            {"hidden_size", get("hidden_size")},
            {"intermediate_size", get("intermediate_size")},
            {"num_hidden_layers", get("num_hidden_layers")},
            {"num_attention_heads", get("num_attention_heads")},
            {"num_key_value_heads", get("num_key_value_heads")},
            {"hidden_act", "silu"},
            {"max_position_embeddings", get("max_position_embeddings")},
            {"rms_norm_eps", get("norm_eps")},
            {"rope_theta", get("rope_theta")},
            {"rope_scaling", get("rope_scaling")},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"mlp_bias", false},
            {"tie_word_embeddings", get("tie_word_embeddings")}};
      break;
  }
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
  if (ours.contains("rope_scaling") && !hf.model.contains("rope_scaling"))
    refuse("rope_scaling", nullptr, ours["rope_scaling"]);
}

}  // namespace autosp
