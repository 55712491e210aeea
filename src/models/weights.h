// Model weights on disk: safetensors with Hugging Face names and layouts. The loader checks every
// name and shape against the model, accepts GPT-2 names with or without the "transformer." prefix,
// ignores GPT-2's attention-mask buffers (attn.bias, attn.masked_bias) and converts float dtypes.
#pragma once

#include <string>

#include "models/model.h"

namespace autosp {

// Throws UsageError naming the file and the offending tensor.
ParamMap load_weights(const std::string& path, const ModelConfig& m, DType dtype);
void save_weights(const std::string& path, const ParamMap& params);

}  // namespace autosp
