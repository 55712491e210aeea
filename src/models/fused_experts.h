// transformers 5's fused expert layout, read. transformers 5 keeps a mixture of experts' experts as
// two 3-D parameters per sparse layer, and its checkpoint conversion mapping (conversion_mapping.py,
// for mixtral, qwen2_moe and qwen3_moe) says how they relate to the per-expert tensors of 4.x:
//   <layer>mlp.experts.gate_up_proj  [E, 2I, C]  expert e's gate rows [0, I) then its up rows [I, 2I)
//   <layer>mlp.experts.down_proj     [E, C, I]   expert e's down projection
// and Mixtral's router moves from <layer>block_sparse_moe.gate to <layer>mlp.gate. A directory
// saved in that layout (save_pretrained(save_original_format=False), or a checkpoint released in it)
// is read by splitting those tensors into the per-expert ones the model takes (models/moe.h). We
// write the per-expert layout, which transformers 4.x reads as it is and 5.x converts on load.
#pragma once

#include <map>
#include <string>

#include "models/model_config.h"
#include "tensor/tensor.h"

namespace autosp {

// Replaces, in `tensors` (a weights file's, by name), every sparse layer's fused expert tensors by
// the per-expert tensors under their 4.x names, and Mixtral's router under mlp.gate by its
// block_sparse_moe name. A layer in the per-expert layout is left as it is. Throws UsageError naming
// `path` and the tensor: a fused tensor without its partner, one of the wrong shape, or a layer
// holding an expert in both layouts. gpt-oss's stacked experts are split by split_gpt_oss_experts
// (models/gpt_oss_experts.h), called from here.
void split_fused_experts(std::map<std::string, Tensor>& tensors, const ModelConfig& m, const std::string& path);

}  // namespace autosp
