// The sdpa implementation on CUDA devices, runtime.attention's values: "auto" (the default: cuDNN's
// fused SDPA where it takes the node's sizes and no document mask, else ours, silently; decision
// 129), our flash attention (kernels/cuda/attention.cuh) or cuDNN's fused SDPA
// (kernels/cuda/cudnn_attention.cuh; ours, with a warning, where cuDNN cannot). A neutral
// kernel header (like kinds.h): the config parses it, the executor's options and the CUDA
// launchers (which read it from the KernelCall) take it, and the device runtime checks that the
// build has it. A plain enum in namespace autosp: no CUDA header, no include of ours, no state.
#pragma once

#include <string_view>

namespace autosp {

enum class AttentionBackend { automatic, flash, cudnn };

// "auto", "flash", "cudnn": the spelling of runtime.attention.
inline std::string_view attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::automatic: return "auto";
    case AttentionBackend::flash: return "flash";
    case AttentionBackend::cudnn: return "cudnn";
  }
  return "unknown attention backend";
}

}  // namespace autosp
