// The keys of the model section ("model" in config.json), one row each (models/model_keys.cpp):
// the value's kind and range, the families it is a setting of, how it is set on and read from
// ModelConfig, when the model section leaves it out, and its names in Hugging Face's config.json
// (the Llama family's classes and GPT2Config). Everything that names a model key reads this table:
//   - the config schema's model.* rows (config/config.cpp), and so the resolved config;
//   - model_json(), the model section of the resolved config and of a checkpoint's meta.json;
//   - HF import and export (models/hf_config.cpp), in both transformers spellings;
//   - the "did you mean" hints for names other tools use (aliases).
// A new key is one row here (and its HF default in the families' HF rows, models/hf_config.cpp).
// Knows nothing of the rest of the run config.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_config.h"

namespace autosp {

struct HfImport;  // models/hf_config.h: a config.json being translated

// The kinds of value a config key takes (the config schema uses them for every section).
enum class ValueKind {
  integer, number, boolean, string, object, list, integer_or_auto, boolean_or_auto, list_or_string, boolean_or_string
};
const char* value_kind_name(ValueKind k);  // "an integer", "true or false", ...

struct ModelKey {
  std::string name;  // "hidden_size" (the config key model.hidden_size)
  ValueKind kind;
  double lo = 0, hi = 0;  // inclusive range of a number
  std::string choices;    // "a|b|c" for a string with fixed values, "" = any
  // Whether null is a value: none (model.sliding_window = null lifts a window). The setter takes it.
  bool nullable = false;
  // Whether the key is a setting of a family (of its HF config class); null: of every family.
  // Given for a family it is not a setting of, config/ warns and ignores it when no family of the
  // same layout has it, and refuses it otherwise (a false boolean aside: the family's own value).
  bool (*applies)(const Family&) = nullptr;
  std::function<void(ModelConfig&, const nlohmann::json&)> set;  // from a value check_value has accepted
  std::function<nlohmann::json(const ModelConfig&)> get;  // its value; null = none (written to HF as null)
  // Whether the model section leaves it out although it has a value (at its default, as the
  // resolved config has always recorded it), judged on the section; null: never.
  bool (*at_default)(const nlohmann::json& section) = nullptr;
  std::string_view hf;       // its config.json name in the Llama family's classes ("" = none)
  std::string_view hf_gpt2;  // its GPT2Config name ("" = none)
  std::string_view aliases;  // other names people write for it, space-separated ("d_model")
  // Read from config.json beyond its kind: null = any value of the kind (head_dim: even).
  bool (*hf_valid)(const nlohmann::json& v) = nullptr;
  std::string_view hf_expects;  // what hf_valid wants, for the error
  // Where a rename is not enough (rope's two spellings, Qwen's switched window): its own
  // translation from and to config.json (models/hf_config.h); null: the value under its name.
  void (*from_hf)(const nlohmann::json& hf, const Family& f, HfImport& out) = nullptr;
  void (*to_hf)(const ModelConfig& m, const Family& f, nlohmann::json& hf) = nullptr;
};

// Every model key, model.arch first (the other keys' rules depend on it).
const std::vector<ModelKey>& model_keys();
const ModelKey* find_model_key(std::string_view name);  // nullptr when none

// The key's name in config.json for a family (by its layout), "" when its HF class has none.
std::string_view hf_key_name(const ModelKey& k, const Family& f);
// Whether `k` is a key of family `f` (applies, and where the family is given as a model section).
bool key_applies(const ModelKey& k, const Family& f);

// Our model keys of `m`, every one with a value except those at their default (at_default), as the
// resolved config's model section holds them.
nlohmann::json model_json(const ModelConfig& m);

// The keys of a model section that at_default says are at their default, erased (a directory's
// config.json translated, so that it compares equal to the run it came from).
void erase_defaults(nlohmann::json& section);

}  // namespace autosp
