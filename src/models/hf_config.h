// Hugging Face config.json ↔ the model section of our config. A model directory saved by
// transformers (GPT2Config, LlamaConfig, MistralConfig, Qwen2Config or Qwen3Config keys, as
// transformers 4.x or 5.x writes them) becomes our keys (n_embd → hidden_size, rms_norm_eps →
// norm_eps, rope_scaling or rope_parameters as HF's rope_scaling object), with HF's defaults for
// keys the file leaves out, exactly as transformers would read it; a checkpoint's
// step_N/config.json is written back in HF keys (both versions' spellings), so
// AutoModelForCausalLM.from_pretrained(step_N) loads it. docs/huggingface.md has the table.
// Knows nothing of the rest of the run config (config/ calls it) or of graphs.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_config.h"
#include "models/model_keys.h"
#include "tensor/dtype.h"

namespace autosp {

struct HfModelConfig {
  nlohmann::json model;                // our model keys: arch, vocab_size, …, rope_scaling (when set)
  std::vector<std::string> math_free;  // HF keys accepted that do not change the math (ids, torch_dtype, …)
  std::vector<std::string> warnings;   // settings accepted but not applied (a nonzero dropout)
  // The math-free keys with their values, less those that describe the file rather than the model
  // (architectures, model_type, dtype, transformers_version, ...): token ids, generation settings,
  // initializer_range, ... which a checkpoint's config.json writes back (hf_config_json).
  nlohmann::json carried = nlohmann::json::object();
};

// Translates an HF config.json. Every key it cannot take (an unknown key, an unsupported setting
// such as a layer_types entry other than full_attention, another rope type or activation) is named
// in one UsageError "<origin>: ...", all of them at once.
HfModelConfig translate_hf_config(const nlohmann::json& hf, const std::string& origin);

// A JSON file (config.json, an index) of at most `max_bytes`, nested at most 32 levels; a missing
// file, a FIFO (it would block) or invalid JSON is a UsageError naming it.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes);

// What a directory that holds no model is, when it is one of the things people bring from other
// tools in its place (a PEFT adapter, a DeepSpeed checkpoint), with what to do instead; empty for
// anything else. For the refusals of model.from, --init-from and --resume.
std::string other_tool_directory(const std::string& dir);

// Reads and translates <dir>/config.json (UsageError naming it when missing or malformed).
HfModelConfig read_hf_model_dir(const std::string& dir);

// Whether a JSON object looks like an HF config.json (it has model_type or architectures, and none
// of our config's sections).
bool is_hf_config(const nlohmann::json& j);

// rope_scaling as HF writes it ({"rope_type": "llama3", "factor": 8, …}; linear, llama3, yarn;
// "default" and null = none), validated;
// `where` names the key in errors.
RopeScalingConfig parse_rope_scaling(const nlohmann::json& j, const std::string& where);
nlohmann::json rope_scaling_json(const RopeScalingConfig& s);  // null when none

// The HF config.json of a model: architectures, every model key of its family under its HF name
// (rope_theta + rope_scaling and rope_parameters), what its HF row writes besides, and
// torch_dtype and dtype = `dtype`; under them the keys `carried` from the directory the model came
// from (HfModelConfig::carried), so a round trip keeps every key.
nlohmann::json hf_config_json(const ModelConfig& m, DType dtype, const nlohmann::json& carried = nlohmann::json::object());

// A config.json being translated into a model section (translate_hf_config), for the model keys
// whose translation is more than a rename (ModelKey::from_hf): the keys read so far, the HF keys
// used, the errors, and the class's defaults by our key name.
struct HfImport {
  nlohmann::json& model;
  std::set<std::string>& used;
  std::vector<std::string>& errors;
  const nlohmann::json& defaults;
};
// rope_theta and rope_scaling from 4.x's spelling, transformers 5's rope_parameters, or both (which
// must agree); and back, in both.
void rope_from_hf(const nlohmann::json& hf, const Family& f, HfImport& out);
void rope_to_hf(const ModelConfig& m, const Family& f, nlohmann::json& hf);
// The sliding window: a key that applies when set (Mistral), or switched on by use_sliding_window
// (Qwen); and back (Qwen also writes use_sliding_window, and layer_types without a window).
void window_from_hf(const nlohmann::json& hf, const Family& f, HfImport& out);
void window_to_hf(const ModelConfig& m, const Family& f, nlohmann::json& hf);

// Refuses (UsageError naming the file and the first key that differs, in HF's and our name) an HF
// directory whose config.json describes another model than `m` (max_position_embeddings aside: it
// is not the math of a Llama, and GPT-2's is the shape of wpe); a directory without one passes.
void check_hf_dir_matches(const std::string& dir, const ModelConfig& m);

}  // namespace autosp
