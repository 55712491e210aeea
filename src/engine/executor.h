// The executor: binds the graph's symbols (B, S, ...) to the sizes of the fed tensors, checks the
// graph's assumptions (a violated one is a UsageError naming it), then runs the nodes in order
// through kernel dispatch (each op's launcher, engine/dispatch.h), freeing each intermediate after
// its last use. It runs on the device the fed tensors are on (all on one): intermediates and the
// memory-plan arena come from that device's allocator, whose peak during the run it reports.
// Joins src/graph and src/kernels; holds no model knowledge.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "graph/ir.h"
#include "engine/memory_plan.h"
#include "kernels/attention_backend.h"
#include "tensor/tensor.h"

namespace autosp {

using TensorMap = std::map<std::string, Tensor>;
struct KernelCall;  // engine/dispatch.h

struct RunResult {
  TensorMap outputs;     // graph outputs by node name
  Bindings bindings;     // the symbol sizes used
  size_t peak_bytes = 0; // allocator high-water mark during the run (includes fed tensors)
  size_t planned_bytes = 0;  // the memory plan's arena (the planned peak of intermediates), 0 unplanned
};

// Called after each computed node (not inputs or parameters) with its value, before anything is
// freed: the trainer starts a gradient's all-reduce as soon as the gradient exists.
using NodeHook = std::function<void(const Node&, const Tensor&)>;

// Where the time goes, per op kind (runtime.profile_ops; torch.profiler's key_averages): the
// wall time of each kernel call and how many ran, summed over every run of the executors that
// share it. On CUDA the executor waits for the device after each kernel, so the time is the
// kernel's own (and the step slower than without the profile).
struct OpProfile {
  struct Entry {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Entry> by_op;  // by op name ("matmul", "sdpa_backward", ...)
};

// The profile as a table, heaviest op first: per op kind the milliseconds and calls per step (over
// `steps` steps) and its share of the kernels' time; then the kernels' share of `total_ms`, the
// steps' wall time (the rest: the executor, the optimizer, the host).
std::string op_profile_table(const OpProfile& p, int64_t steps, double total_ms);

struct ExecOptions {
  // The sdpa implementation on CUDA (runtime.attention); every KernelCall carries it. CPU kernels
  // ignore it.
  AttentionBackend attention = AttentionBackend::automatic;
  // Graph outputs (by node name) freed after their last use like intermediates, once the hook has
  // seen them, and absent from RunResult::outputs: ZeRO-2's gradients, which live on only in their
  // reduce-scattered shard (train/grad_sync.h).
  std::set<std::string> transient_outputs = {};
  // Collectives background_until lets run in the background (ZeRO-3's gathers and
  // reduce-scatters) do; false runs every collective blocking (runtime.overlap_grad_sync false:
  // what the overlap hides).
  bool background_collectives = true;
  // Where to add each kernel call's time (not owned; null: no timing).
  OpProfile* profile = nullptr;
};

class Executor {
 public:
  explicit Executor(const Graph& g, ExecOptions options = {});

  // `feeds` holds a tensor for every input node (by node name) and every parameter (by name);
  // `groups` the communicators the graph's collectives name.
  RunResult run(const TensorMap& feeds, const CommGroups& groups = {}, const NodeHook& on_value = {}) const;

  // Bind symbols from the feeds' shapes and check every dim and assumption.
  Bindings bind(const TensorMap& feeds) const;

 private:
  // Make the memory plan and its arena on `dev` unless the last ones were for these bindings there.
  void plan_for(const Bindings& b, const Device& dev, Allocator& alloc) const;
  // The call of node `n`'s kernel: its inputs `in`, its group's communicator, and the places the
  // plan gave its output, extra outputs and workspace in the arena.
  KernelCall kernel_call(const Node& n, std::span<const Tensor> in, const Shape& shape, const Bindings& b,
                         Allocator& alloc, std::vector<Tensor>& extras, const CommGroups& groups) const;

  const Graph& g_;
  ExecOptions options_;
  std::vector<size_t> last_use_;  // per node: position of its last user (or itself)
  std::vector<bool> kept_;        // per node: a graph output RunResult returns
  std::vector<size_t> until_;     // per node: where a background collective must have finished
  // The plan and arena of the last bindings seen (plans depend on the sizes).
  mutable Bindings planned_for_;
  mutable MemoryPlan plan_;
  mutable Tensor arena_;
};

// Concrete shape of a symbolic one.
Shape eval_shape(const SymShape& s, const Bindings& b);

}  // namespace autosp
