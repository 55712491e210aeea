// The device a rank runs on and the copies between it and the host: the run device chosen from
// runtime.device, tensors moved there, host copies for the host code that reads results (the loss,
// scores, checkpoints, --dump-grads, the returned parameters), and a step's feeds. A tensor
// already where it is wanted is not copied.
#pragma once

#include "config/config.h"
#include "tensor/tensor.h"
#include "train/data.h"
#include "train/optimizer.h"

namespace autosp {

// runtime.device: the host, or the GPU of this node-local rank, which becomes the process's
// current device (a build without CUDA, or a machine without a GPU, is a UsageError saying so, and
// so is runtime.attention "cudnn" in a build without CUDA).
Device pick_device(const Config& cfg);

// Every tensor of `m` on `dev`.
void to_run_device(ParamMap& m, Device dev);

Tensor host_copy(const Tensor& t);
ParamMap host_copy(const ParamMap& m);
AdamW host_copy(const AdamW& opt);

// What the graph is fed for `batch` on `dev`: its inputs and `params` (already on `dev`). On a
// device, whose kernels do not check them, token ids and labels are checked against `vocab` first
// (there a bad id would be a NaN loss, not an error naming it).
ParamMap run_feeds(const Batch& batch, const ParamMap& params, int64_t vocab, Device dev);

}  // namespace autosp
