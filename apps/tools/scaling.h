// The arithmetic behind autosp-bench's FLOP/s column and its --project scaling model
// (docs/scaling.md has the derivations): the model's FLOPs per training step, the bytes autosp's
// Ulysses sequence parallelism and gradient all-reduce move per rank and step, and an alpha-beta
// projection of step time, efficiency and the longest trainable sequence on P GPUs.
// Pure functions of the model shape; knows nothing of graphs, kernels or communicators (the
// volumes are checked against the bytes CountingCommunicator counts in tests/mpi/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/flops.h"  // param_count, step_flops
#include "models/model_config.h"

namespace autosp {


// Bytes one rank moves in one training step (CountingCommunicator's definitions, comm/counting.h),
// for `batch` sequences of `seq` tokens (padded up to a multiple of sp) on a world of `world` ranks
// with SP degree `sp` (world = dp × sp), activations of `act_bytes` and gradients of `grad_bytes`.
struct CommVolume {
  int64_t all_to_all_calls = 0;  // 8 per layer: q, k, v, o forward and their gradients backward
  int64_t all_to_all_bytes = 0;  // sent to other ranks: Σ (sp-1)/sp · local tensor bytes
  int64_t all_reduce_bytes = 0;  // buffer bytes: gradients + the loss normalisation's two scalars
  int64_t grad_bytes = 0;        // of which gradients: param_count · grad_bytes (0 on one rank)
  int64_t kv_heads = 0;          // K/V heads each all-to-all carries (N_kv, or sp when replicated)
};
CommVolume step_comm_volume(const ModelConfig& m, int64_t batch, int64_t seq, int64_t sp, int64_t world,
                            int64_t act_bytes, int64_t grad_bytes);

// ---- the scaling model (autosp-bench --project) ----------------------------------------------

struct LinkModel {
  double alpha_s = 0;         // latency per collective
  double bytes_per_s = 1e9;   // achieved bandwidth per GPU, one direction
};

struct ProjectionConfig {
  ModelConfig model;                          // default: Llama-3-8B-like
  std::vector<int64_t> gpus{8, 16, 32, 64};
  std::vector<int64_t> seq_lens{131072, 262144, 524288, 1048576};
  int64_t batch = 1;                          // sequences per SP group and step
  int64_t activation_bytes = 2;               // bf16 activations (all-to-all payload)
  int64_t grad_bytes = 4;                     // fp32 gradient all-reduce
  int64_t gpus_per_node = 8;
  double gpu_memory_bytes = 141e9;
  double memory_reserve_fraction = 0.1;       // kept free for workspaces and fragmentation
  double replicated_bytes_per_param = 6;      // bf16 weights + fp32 gradients on every GPU
  double sharded_bytes_per_param = 12;        // fp32 master weights + Adam m, v over all GPUs
  // zero_optimization.stage of the run, when given (-1: not given): the two figures above become
  // what this runtime holds per parameter at that stage (zero_state_bytes), and stage 3 adds two
  // layers' gathered parameters.
  int64_t zero_stage = -1;
  bool activation_checkpointing = true;
  bool overlap_grad_allreduce = true;         // the all-reduce hides behind backward compute
  double achieved_tflops = 400;               // compute rate per GPU with no communication
  double peak_tflops = 989;                   // dense bf16 peak per GPU (for MFU)
  LinkModel nvlink{5e-6, 360e9}, infiniband{10e-6, 45e9};
  std::string source = "built-in defaults";
};

// Bytes per parameter autosp holds at ZeRO `stage` (0-3; 3 as planned): replicated on every rank,
// and sharded over the world. Parameters are the f32 master (4), gradients a graph output and a
// bucket copy (4 + 4; stage 2 keeps a 1/W shard, 4), AdamW's two f32 moments (8).
struct ZeroStateBytes {
  double replicated = 0, sharded = 0;
};
ZeroStateBytes zero_state_bytes(int64_t stage);

// Reads a --project-config JSON file: every key optional, unknown keys and bad values are
// UsageErrors naming the key (schema in docs/scaling.md).
ProjectionConfig load_projection_config(const std::string& path);
ProjectionConfig parse_projection_config(const nlohmann::json& j, const std::string& origin);

struct ProjectionRow {
  int64_t gpus = 0, sp = 0, dp = 0, seq = 0;
  int64_t ulysses = 0, ring = 1;  // sp = ulysses × ring (ring 1: Ulysses alone)
  double ring_s = 0;              // the ring's block exchange, exposed past the ring steps' attention
  double compute_s = 0, all_to_all_s = 0, all_reduce_s = 0, exposed_all_reduce_s = 0, step_s = 0;
  double efficiency = 0;       // compute_s / step_s
  double mfu = 0;              // model FLOPs per GPU per second / peak
  double tokens_per_s_per_gpu = 0;
  double memory_bytes = 0;     // per GPU: model states + activations
  bool fits = false;
};

// The SP degree used on `gpus` GPUs: the largest divisor of gpus that divides the head count and
// for which K/V heads divide or are replicated (DESIGN.md); the rest is data parallelism.
int64_t projection_sp(const ModelConfig& m, int64_t gpus);
// Activation bytes per local token (docs/scaling.md, "Memory").
double activation_bytes_per_token(const ProjectionConfig& c);
// Model-state bytes per GPU on `gpus` GPUs.
double state_bytes_per_gpu(const ProjectionConfig& c, int64_t gpus);
ProjectionRow project_point(const ProjectionConfig& c, int64_t gpus, int64_t seq);
// The longest sequence (a multiple of 1024) whose per-GPU memory fits on `gpus` GPUs; 0 if none.
int64_t longest_sequence(const ProjectionConfig& c, int64_t gpus);

// Ulysses × ring (sequence_parallel.ring_size, decision 99) on `gpus` GPUs, as a planner would lay
// it out: U the largest degree that divides gpus, fits in a node (its all-to-alls stay on NVLink)
// and that the heads allow; R = gpus / U ring ranks (across nodes once U fills one); sp = gpus.
struct UlyssesRing {
  int64_t ulysses = 1, ring = 1;
};
UlyssesRing projection_ulysses_ring(const ProjectionConfig& c, int64_t gpus);
// One step at `seq` on that layout (docs/scaling.md, "Ulysses × ring"): compute as project_point
// over all GPUs, the Ulysses all-to-alls at S/gpus tokens per rank, and per layer (3R − 2) ring
// blocks of K and V (2·B·Nkv_local·(S/R)·D activation bytes each: forward R − 1, backward R − 1
// and R dK/dV) on the link between ring neighbours, exposed where they outlast the attention
// compute of the steps they overlap.
ProjectionRow project_ring_point(const ProjectionConfig& c, int64_t gpus, int64_t seq);
// The longest sequence (a multiple of lcm(1024, 2·gpus)) that fits on that layout; 0 if none.
int64_t longest_ring_sequence(const ProjectionConfig& c, int64_t gpus);

// The report autosp-bench --project prints (markdown tables).
std::string projection_report(const ProjectionConfig& c);

}  // namespace autosp
