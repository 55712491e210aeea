// gpt-oss's stacked experts ↔ the per-expert tensors the model takes (models/moe.h). transformers'
// GptOssExperts keeps each layer's experts as four stacked parameters, multiplied as x @ W (not
// nn.Linear's x @ Wᵀ), with the gate and up projections interleaved column by column:
//   <layer>mlp.experts.gate_up_proj       [E, C, 2I]  expert e's gate = [e, :, 0::2], up = [e, :, 1::2]
//   <layer>mlp.experts.gate_up_proj_bias  [E, 2I]     gate = [e, 0::2], up = [e, 1::2]
//   <layer>mlp.experts.down_proj          [E, I, C]
//   <layer>mlp.experts.down_proj_bias     [E, C]
// The model's parameters are per expert, in nn.Linear's layout (so the EP pass, ZeRO and the
// optimizer see ordinary tensors, as for the other mixtures of experts):
//   <layer>mlp.experts.{e}.gate_proj.weight [I, C], .up_proj.weight [I, C], .down_proj.weight [C, I]
//   and .gate_proj.bias [I], .up_proj.bias [I], .down_proj.bias [C].
// One table of views (gpt_oss_experts.cpp) says where each per-expert tensor lies in the stacked
// ones, for both directions. The hub checkpoint (openai/gpt-oss-*) holds gate_up_proj and down_proj
// as MXFP4 blocks and scales (tensor/mxfp4.h), dequantized here as transformers does
// (convert_moe_packed_tensors: the blocks' rows are the output features, so the dequantized
// [E, rows, K] is transposed to [E, K, rows]).
#pragma once

#include <map>
#include <string>

#include "models/model_config.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace autosp {

// Replaces every layer's stacked expert tensors in `tensors` by the per-expert ones. A layer whose
// file holds per-expert tensors already is left as it is. Throws UsageError naming `path` and the
// tensor: a stacked tensor without its three partners, one of the wrong shape, or an expert given twice.
void split_gpt_oss_experts(std::map<std::string, Tensor>& tensors, const ModelConfig& m, const std::string& path);

// The inverse, for saving a checkpoint as transformers lays gpt-oss out: every layer's per-expert
// tensors in `params` replaced by the four stacked ones (in their dtype).
void fuse_gpt_oss_experts(std::map<std::string, Tensor>& params, const ModelConfig& m);

// The MXFP4 expert weights of `file` (<layer>mlp.experts.{gate_up_proj,down_proj}_{blocks,scales},
// its `bytes`) dequantized into f32 gate_up_proj [E, C, 2I] and down_proj [E, I, C] in its
// `tensors`. Throws UsageError naming `path` and the tensor: blocks without scales or the other way,
// shapes that do not match each other or the model, the dequantized tensor given too, or any other
// U8 tensor (nothing else is read as bytes).
void dequantize_gpt_oss_experts(SafetensorsFile& file, const ModelConfig& m, const std::string& path);

}  // namespace autosp
