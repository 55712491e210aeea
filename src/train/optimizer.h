// Optimisation: AdamW with PyTorch semantics (decoupled weight decay on tensors of rank >= 2 only),
// global-norm gradient clipping like torch.nn.utils.clip_grad_norm_ (the learning-rate schedule is
// train/schedule.h). Works on ParamMaps on the host or all on one CUDA
// device (the arithmetic through device/optim.h); knows nothing of graphs or kernels.
//
// ZeroAdamW is the same AdamW at ZeRO stages 1 and 2 (zero_optimization.stage, DeepSpeed's key):
// the moments exist only for this rank's shard of every flat gradient bucket (train/grad_sync.h
// FlatLayout), the gradients arrive reduce-scattered, each rank updates the parameters of its shard
// and all-gathers them back into every rank's whole parameters. The parameters (the f32 master
// weights: under bf16 the graph casts them on use) stay whole on every rank, the working copy.
//
// Zero3State is ZeRO stage 3: the parameters too exist only as this rank's shard, parameter by
// parameter (DeepSpeed's partitioning: shard r of a parameter of n elements is its flattened
// elements [r·c, (r+1)·c), c = ceil(n / W), zero past n), with AdamW moments of the same shards.
// The graph gathers whole parameters where it uses them and returns each gradient's shard summed
// over the world (graph/passes/shard_parameters.h), so the update needs no communication.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "tensor/tensor.h"
#include "train/grad_sync.h"

namespace autosp {

// The bytes of every tensor of `m`.
size_t bytes_of(const ParamMap& m);

// Global L2 norm of all gradients (accumulated in double).
double global_grad_norm(const ParamMap& grads);
// Scales every gradient by max_norm / (norm + 1e-6) when that is < 1 (no-op for max_norm = 0).
void clip_grads(ParamMap& grads, double norm, double max_norm);
// The same over a list of tensors (ZeRO's gradient shards).
void clip_grads(const std::vector<Tensor>& grads, double norm, double max_norm);

struct AdamW {
  ParamMap exp_avg, exp_avg_sq;  // first and second moments, by parameter name
  int64_t step = 0;              // number of updates done

  void init(const ParamMap& params);  // zero moments
  // One update of every parameter with learning rate `lr`.
  void update(ParamMap& params, const ParamMap& grads, const TrainConfig& t, double lr);
  size_t state_bytes() const;  // the two moments
};

class ZeroAdamW {
 public:
  // `names`: the parameter of each slot of `layout` (layout.ranks shards; this is shard `rank`).
  ZeroAdamW(FlatLayout layout, std::vector<std::string> names, int rank);

  // This rank's shard of `full` (a whole AdamW state, from any world size or stage: a
  // checkpoint's, or AdamW::init's zeros), on `device`.
  void load(const AdamW& full, Device device);
  // The whole state on every rank (a collective over `comm`, the layout's group): for checkpoints.
  AdamW consolidate(Communicator& comm) const;
  // Whole tensors by parameter name from every rank's shard of each bucket (a collective):
  // gradients for --dump-grads, moments for consolidate.
  ParamMap unshard(const std::vector<Tensor>& shards, Communicator& comm) const;

  // The global gradient norm from every rank's shard (one f64 all-reduce over `host`, a host
  // communicator of the same ranks).
  double grad_norm(const std::vector<Tensor>& shards, Communicator& host) const;
  // One AdamW update of this rank's shard of every parameter, then the updated shards all-gathered
  // over `comm` into `params` (whole, on every rank).
  void update(ParamMap& params, const std::vector<Tensor>& grad_shards, const TrainConfig& t, double lr,
              Communicator& comm);

  int64_t step() const { return step_; }
  // Bytes of optimizer state this rank holds (the two moment shards).
  size_t state_bytes() const;

 private:
  // A piece of one parameter inside this rank's shard of a bucket (elements).
  struct Segment {
    size_t slot;
    int64_t in_param, in_shard, numel;
  };
  FlatLayout layout_;
  std::vector<std::string> names_;
  int rank_;
  std::vector<std::vector<Segment>> segments_;  // per bucket
  std::vector<Tensor> exp_avg_, exp_avg_sq_;    // per bucket: this rank's shard
  int64_t step_ = 0;
};

// Shard `rank` of `ranks` of `whole` (flattened, zero-padded), on whole's device.
Tensor parameter_shard(const Tensor& whole, int ranks, int rank);

class Zero3State {
 public:
  // This rank's shards of whole parameters and their whole AdamW state (a checkpoint's, of any
  // world size or stage, or AdamW::init's zeros), placed on `device`.
  Zero3State(const ParamMap& whole, const AdamW& opt, int ranks, int rank, Device device);

  // The shards by parameter name, what the graph's parameter nodes are fed.
  const ParamMap& shards() const { return params_; }
  // Whole tensors by parameter name from every rank's shards (a collective over `comm`, the world):
  // the parameters for checkpoints and the end of a run, gradients for --dump-grads.
  ParamMap unshard(const ParamMap& shards, Communicator& comm) const;
  ParamMap whole_params(Communicator& comm) const { return unshard(params_, comm); }
  AdamW consolidate(Communicator& comm) const;

  // The global gradient norm from every rank's gradient shards (one f64 all-reduce over `host`).
  double grad_norm(const ParamMap& grad_shards, Communicator& host) const;
  // One AdamW update of this rank's shards (weight decay by the whole parameter's rank).
  void update(const ParamMap& grad_shards, const TrainConfig& t, double lr);

  int64_t step() const { return opt_.step; }
  size_t state_bytes() const;  // the two moments' shards

 private:
  std::map<std::string, Shape> shapes_;  // the whole parameters'
  int ranks_, rank_;
  ParamMap params_;
  AdamW opt_;
};

}  // namespace autosp
