// Model weights on disk: safetensors with Hugging Face names and layouts, as one file, a sharded
// set with its model.safetensors.index.json, or a Hugging Face model directory holding either. The
// loader checks every name and shape against the model, accepts GPT-2 names with or without the
// "transformer." prefix, ignores GPT-2's attention-mask buffers (attn.bias, attn.masked_bias),
// checks a tied lm_head.weight against the embedding, and converts float dtypes (f32, f64, bf16,
// f16). PyTorch pickles (pytorch_model.bin), llm.c checkpoints and token shards, PEFT adapter and
// DeepSpeed checkpoint directories are recognised and refused by name.
#pragma once

#include <string>
#include <vector>

#include "models/model.h"

namespace autosp {

// `path`: a .safetensors file, a .safetensors.index.json, or a directory holding
// model.safetensors.index.json or model.safetensors (and, when it has a config.json, that config
// must describe `m`: models/hf_config.h check_hf_dir_matches; `check_dir_config` false skips that,
// for model.from, whose config the run's model came from, overrides included). Throws UsageError
// naming the file and the offending tensor or key.
ParamMap load_weights(const std::string& path, const ModelConfig& m, DType dtype, bool check_dir_config = true);

// One safetensors file, {"format": "pt"} in its metadata (what transformers' loader requires).
void save_weights(const std::string& path, const ParamMap& params);

// `params` into `dir` as save_pretrained lays them out: model.safetensors when the whole fits in
// `max_shard_bytes`, else model-0000i-of-0000n.safetensors shards of at most that size (a tensor
// larger than it gets a shard of its own) and model.safetensors.index.json. Returns the file names
// written, in order.
std::vector<std::string> save_hf_weights(const std::string& dir, const ParamMap& params, uint64_t max_shard_bytes);

// A model's parameters as transformers lays out its checkpoint (save_hf_weights after putting
// gpt-oss's experts back into its stacked tensors: models/gpt_oss_experts.h).
std::vector<std::string> save_hf_model(const std::string& dir, ParamMap params, const ModelConfig& m,
                                       uint64_t max_shard_bytes);

}  // namespace autosp
