// PEFT adapter directories: what a LoRA run's checkpoints are and what lora.from reads.
// adapter_config.json (PEFT's LoraConfig keys: peft_type "LORA", r, lora_alpha, target_modules,
// use_rslora, modules_to_save, base_model_name_or_path, ...) and adapter_model.safetensors, whose
// keys are PEFT's ("base_model.model.<module>.lora_A.weight", "base_model.model.<name>" for a
// modules_to_save tensor), so PeftModel.from_pretrained(base, dir) loads it. Knows nothing of
// graphs or devices.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "tensor/tensor.h"

namespace autosp {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

// The tensors a LoRA run of `cfg` trains, with their shapes: every target's A and B, and the
// parameters modules_to_save names.
std::map<std::string, Shape> adapter_shapes(const Config& cfg);

// Writes adapter_config.json and adapter_model.safetensors ({"format": "pt"}) of `params` (the
// adapter_shapes tensors, host) into `dir`; returns the file names written.
std::vector<std::string> save_adapter(const std::string& dir, const ParamMap& params, const Config& cfg);

// The adapter in `dir` as parameters named like the graph's, in `dtype`. Its adapter_config.json
// must agree with cfg.lora (r, lora_alpha, use_rslora, the targets, modules_to_save) and its base
// (base_model_name_or_path, where that directory exists) with the run's model; every tensor must
// be one the run trains, with its shape, and none may be missing: otherwise a UsageError naming
// the file and the key.
ParamMap load_adapter(const std::string& dir, const Config& cfg, DType dtype);

// --merge-lora: `cfg`'s base with its adapters folded in (models/lora.h merge_lora: W + scale·B·A)
// written to `dir` as a Hugging Face model directory (config.json, model.safetensors or shards), which
// from_pretrained loads without PEFT. `params` holds the base and the adapters (trainer.h
// starting_params). `dir` must not exist or be empty (a UsageError otherwise: nothing is replaced).
void write_merged_model(const std::string& dir, const Config& cfg, const ParamMap& params);

}  // namespace autosp
