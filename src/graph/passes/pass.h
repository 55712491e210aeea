// Graph passes: one file and one function each, `PassResult run(Graph&, const PassContext&)`,
// registered by name in a pipeline (the AutoSP pipeline, graph/passes/autosp/pipeline.cpp; a rank's
// whole program, compiler/program.cpp). A pipeline runs passes in order and verifies the graph after each
// (a rank's program in Release builds: once, after the last, and after each only when that fails;
// run_pipeline_verified_once); a failure names the pass and the passes before it. Passes edit only
// through the Graph API.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/ir.h"

namespace autosp {

// LoRA (graph/passes/lora.h): which projections get an adapter and which parameters train. The
// compiler makes it from the config's lora section; r = 0 is no LoRA (every parameter trains).
struct LoraPlan {
  struct Target {
    std::string weight, a, b;  // the projection's weight parameter and its adapter's A [r, in], B [out, r]
  };
  int64_t r = 0;
  double scale = 0;  // lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA
  std::vector<Target> targets;
  std::vector<std::string> trainable;  // base parameters that train whole (PEFT's modules_to_save)
  // lora_dropout on the adapters' input, training programs only (0: none); the mask's seed.
  double dropout = 0;
  uint64_t seed = 0;
};

struct PassContext {
  int64_t sp_size = 1;   // P: ranks sharing one sequence
  int64_t sp_rank = 0;   // r: this rank's index in its SP group
  // R: ring attention across R groups of U = P / R consecutive Ulysses ranks (1: Ulysses alone;
  // graph/passes/autosp/insert_ring_attention)
  int64_t ring_size = 1;
  int64_t world_size = 1;
  // Expert parallelism (moe.expert_parallel_size): G ranks of an expert group, this rank's index in
  // it (graph/passes/expert_parallel.h); 1: every rank holds every expert.
  int64_t ep_size = 1;
  int64_t ep_rank = 0;
  std::string seq = "S";  // the sequence symbol
  // fuse_elementwise: whether residual add + norm pairs are fused (off under activation
  // checkpointing, where they would cost activation memory: docs/decisions.md).
  bool fuse_residual_norms = true;
  // fuse_elementwise: whether GPT-2's qkv bias add, split and head transposes become one qkv_heads
  // node (CPU programs: the op's CUDA kernel is not yet measured on a GPU; not under activation
  // checkpointing, where the recomputed q, k, v placed 2% more arena at gpt2-tiny.json's sizes).
  bool fuse_qkv_heads = false;
  // fuse_elementwise: whether a fused residual add + norm also takes in the bias add of its
  // residual branch (GPT-2's and gpt-oss's output projections: add(matmul, b [C])) as its optional
  // input rb (CPU programs: the CUDA kernel's rb is checked under the emulation only).
  bool fuse_residual_bias = false;
  // checkpoint_activations: the name prefixes of the scopes (transformer layers) to recompute;
  // also the units ZeRO-3 gathers parameters by (graph/passes/shard_parameters.h).
  std::vector<std::string> layer_scopes;
  // ZeRO-3 (config/config.h ZeroMode::sharded_parameters: stage 3 on a world of several ranks,
  // decided by the program builder): shard_parameters splits every parameter over the world
  // (world_size shards) and regather_parameters gathers it per use.
  bool shard_parameters = false;
  LoraPlan lora;
  // train.gradient_accumulation_steps (feed_target_count: a load-balancing loss's share per micro-batch).
  int64_t accumulation_steps = 1;
  // keep_moe_projections: the moe_experts nodes (f32, f64) keep their gate and up projections for
  // the backward (runtime.moe_keep_projections on a CPU run).
  bool keep_moe_projections = false;
};

struct PassResult {
  bool changed = false;
};

using PassFn = PassResult (*)(Graph&, const PassContext&);

struct Pass {
  std::string_view name;
  PassFn run;
  bool types_valid_after;  // false while types wait for propagate_shapes (structure-only verify)
};

// The layer scopes as an index: the scopes a node's name starts with, found with one lookup per
// distinct scope length instead of one comparison per scope (per node and scope, a pass is
// quadratic in the model's depth).
class ScopeIndex {
 public:
  explicit ScopeIndex(const std::vector<std::string>& scopes);
  // The indices (into `scopes`) of the scopes `name` starts with, ascending.
  std::vector<int> matches(std::string_view name) const;
  // The first of them; -1 when none.
  int first(std::string_view name) const;

 private:
  std::vector<size_t> lengths_;  // distinct scope lengths
  std::unordered_map<std::string_view, std::vector<int>> by_prefix_;  // views into the caller's scopes
};

// What one pass of a pipeline cost: its run and the verifier after it, in seconds of wall time.
// A pipeline verified once ends with an entry named "verify" (run_s 0) for that verify.
struct PassTime {
  std::string_view name;
  double run_s = 0, verify_s = 0;
};

// When a pipeline runs the verifier: after every pass, or once, after the last one.
enum class VerifyWhen { each_pass, once };

// Runs `passes` in order with the verifier after each, or with `once` after the last only. Any
// error becomes a UsageError "<pass>: ... (in pass <pass> after [a, b])", a failure of the one
// verify "verify: ... (after the passes [a, b])". With `times`, appends each pass's PassTime.
void run_pipeline(Graph& g, const std::vector<Pass>& passes, const PassContext& ctx,
                  std::vector<PassTime>* times = nullptr, VerifyWhen when = VerifyWhen::each_pass);

// The graph `make` builds, with `passes` run on it and verified once (the verifier walks the whole
// graph: after each of a 48-layer MoE's ~20 passes it was a third of the build, decision 188). If
// anything fails, builds the graph again and runs the passes with the verifier after each, which
// then throws the error naming the pass that broke the graph, as run_pipeline does; `times` holds
// the first run's. Same result and errors as run_pipeline with `each_pass`, except for a pass that
// breaks the graph and a later one that mends it.
std::unique_ptr<Graph> run_pipeline_verified_once(const std::function<std::unique_ptr<Graph>()>& make,
                                                  const std::vector<Pass>& passes, const PassContext& ctx,
                                                  std::vector<PassTime>* times = nullptr);

}  // namespace autosp
