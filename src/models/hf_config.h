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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model_config.h"
#include "tensor/dtype.h"

namespace autosp {

struct HfModelConfig {
  nlohmann::json model;                // our model keys: arch, vocab_size, …, rope_scaling (when set)
  std::vector<std::string> math_free;  // HF keys accepted that do not change the math (ids, torch_dtype, …)
  std::vector<std::string> warnings;   // settings accepted but not applied (a nonzero dropout)
};

// Translates an HF config.json. Every key it cannot take (an unknown key, an unsupported setting
// such as a layer_types entry other than full_attention, another rope type or activation) is named
// in one UsageError "<origin>: ...", all of them at once.
HfModelConfig translate_hf_config(const nlohmann::json& hf, const std::string& origin);

// A JSON file (config.json, an index) of at most `max_bytes`, nested at most 32 levels; a missing
// file, a FIFO (it would block) or invalid JSON is a UsageError naming it.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes);

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

// Our model keys of `m`, every one (rope_scaling only when set), as the resolved config's model
// section holds them (config/ writes that from its schema rows; tests/models/test_hf.cpp checks the
// two agree).
nlohmann::json model_json(const ModelConfig& m);

// The HF config.json of a model (architectures, model_type, torch_dtype and dtype = `dtype`;
// rope_theta + rope_scaling and rope_parameters).
nlohmann::json hf_config_json(const ModelConfig& m, DType dtype);

// Refuses (UsageError naming the file and the first key that differs, in HF's and our name) an HF
// directory whose config.json describes another model than `m` (max_position_embeddings aside: it
// is not the math of a Llama, and GPT-2's is the shape of wpe); a directory without one passes.
void check_hf_dir_matches(const std::string& dir, const ModelConfig& m);

}  // namespace autosp
