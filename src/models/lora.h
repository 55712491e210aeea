// LoRA over a model's parameters, with PEFT's conventions: which weights a target_modules list
// selects, what modules_to_save keeps trainable, the adapters' names, shapes and initialisation
// (init_lora_weights), and the key names of PEFT's adapter_model.safetensors. The graph rewrite
// is graph/passes/lora.h; the config section config/config.h LoraConfig. Knows nothing of configs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "models/model.h"

namespace autosp {

// The module path of a parameter name ("model.norm.weight" → "model.norm").
std::string_view module_of(std::string_view param);
// PEFT's match of a module to a key of target_modules: the path equals the key or ends with "." +
// key; and to a key of modules_to_save (its _set_trainable): the path ends with the key, so "norm"
// is every norm ("input_layernorm", "model.norm", Qwen3's "q_norm"), as LongLoRA trains them.
bool module_matches(std::string_view module, std::string_view key);
bool saved_module_matches(std::string_view module, std::string_view key);

// The weight parameters ("<module>.weight") of the modules `targets` matches, in the model's order.
std::vector<std::string> lora_target_weights(const ModelConfig& m, const std::vector<std::string>& targets);
// The parameters of the modules `modules_to_save` matches, in the model's order.
std::vector<std::string> lora_saved_params(const ModelConfig& m, const std::vector<std::string>& modules_to_save);
// The module paths of the model's parameters, each once, in order (what modules_to_save may name).
std::vector<std::string> model_modules(const ModelConfig& m);

// The adapter of the weight "<module>.weight": "<module>.lora_A.weight" [r, in] and
// "<module>.lora_B.weight" [out, r].
std::string lora_a_name(std::string_view weight);
std::string lora_b_name(std::string_view weight);
bool is_lora_param(std::string_view name);

// The shapes of the adapters of `weights` at rank r: "<module>.lora_A.weight" [r, in] and
// "<module>.lora_B.weight" [out, r] (GPT-2's Conv1D weights are [in, out], nn.Linear's [out, in]).
std::map<std::string, Shape> lora_shapes(const ModelConfig& m, const std::vector<std::string>& weights, int64_t r);

// What LoRA changes in the step's FLOP count (models/flops.h step_flops): the parameters the FLOP
// formula counts that are frozen (every one but those modules_to_save trains; the input
// embedding's lookup is not counted), and the adapters' parameters at rank r.
struct LoraFlopParams {
  int64_t frozen = 0, adapters = 0;
};
LoraFlopParams lora_flop_params(const ModelConfig& m, const std::vector<std::string>& targets,
                                const std::vector<std::string>& modules_to_save, int64_t r);
// W + scale · B·A for each adapted weight (Conv1D: W + scale · (B·A)ᵀ): the adapters folded into
// `params` (which holds the base, the adapters and the modules_to_save), as PEFT's merge_and_unload.
// The result holds the model's own parameters only.
ParamMap merge_lora(const ModelConfig& m, const ParamMap& params, double scale);

// Fresh adapters for `weights` as PEFT's init_lora_weights says: "true" A Kaiming-uniform
// (U(±1/√in)), B zero; "gaussian" A normal(0, 1/r), B zero; "false" both nn.Linear's default
// (U(±1/√fan_in)), so the adapter changes the model from the first step. Seeded, deterministic.
ParamMap init_lora_params(const ModelConfig& m, const std::vector<std::string>& weights, int64_t r,
                          const std::string& init, uint64_t seed, DType dtype);

// PEFT's key of a trainable tensor in adapter_model.safetensors ("base_model.model." + name) and
// back ("" when `key` is not one).
std::string peft_key(std::string_view name);
std::string from_peft_key(std::string_view key);

}  // namespace autosp
