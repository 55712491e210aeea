// PEFT adapter directories: what a LoRA run's checkpoints are and what lora.from reads.
// adapter_config.json (PEFT's LoraConfig keys: peft_type "LORA", r, lora_alpha, target_modules,
// use_rslora, modules_to_save, base_model_name_or_path, ...) and adapter_model.safetensors, whose
// keys are PEFT's ("base_model.model.<module>.lora_A.weight", "base_model.model.<name>" for a
// modules_to_save tensor), so PeftModel.from_pretrained(base, dir) loads it. Knows nothing of
// graphs or devices.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
// (base_model_name_or_path, where that directory exists) with the run's model; a PEFT setting that
// changes the math and that autosp does not do (DoRA, lora_bias, per-module ranks, layer subsets,
// exclude_modules that exclude a target, a base-changing init_lora_weights such as PiSSA,
// trainable_token_indices, target_parameters, ...) is refused naming the key and the value; every
// tensor must be one the run trains, with its shape, and none may be missing: otherwise a
// UsageError naming the file and the key. Keys PEFT's LoraConfig does not have get a warning
// naming them (as PEFT warns), logged where `warn` is true (the trainer's rank 0).
ParamMap load_adapter(const std::string& dir, const Config& cfg, DType dtype, bool warn = true);

// The identity of a LoRA run's frozen base, which a LoRA checkpoint's meta.json records as
// "lora_base" so that a resume continues on the same weights (decision 289): where the base came
// from ("source": "model.from" with its "path", "--init-from" with its "path", or "random" with
// train.seed), its tensor and element counts, and a fingerprint of its values: the CRC-32C of every
// tensor's name, shape and 4096 evenly spaced elements (the first and the last among them) as f32,
// in name order. `base` is the whole base as loaded (any float dtype: the samples are f32 values).
nlohmann::json lora_base_record(const Config& cfg, const std::string& init_from, const ParamMap& base);

// A resume's base (`now`, lora_base_record's) against the one the checkpoint's adapters were
// trained on (`recorded`, from `meta_path`): another fingerprint is a UsageError naming model.from
// and the base the checkpoint needs. Returns a line for the log where the same weights come from
// another path (a moved base directory), else "".
std::string check_lora_base(const nlohmann::json& recorded, const nlohmann::json& now, const std::string& meta_path);

// --dump-grads' names for a LoRA run's gradients: PEFT's keys, as the adapter checkpoint writes them.
ParamMap peft_keyed(const ParamMap& params);

// --merge-lora: `cfg`'s base with its adapters folded in (models/lora.h merge_lora: W + scale·B·A)
// written to `dir` as a Hugging Face model directory (config.json, model.safetensors or shards), which
// from_pretrained loads without PEFT. `params` holds the base and the adapters (trainer.h
// starting_params). `dir` must not exist or be empty (a UsageError otherwise: nothing is replaced).
void write_merged_model(const std::string& dir, const Config& cfg, const ParamMap& params);

}  // namespace autosp
