// Executor: symbol binding, assumption checks, in-order dispatch with last-use freeing, and the
// bookkeeping of the collectives it leaves running in the background (InFlightCollectives).
#include "engine/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "device/buffers.h"
#include "device/cuda/device.h"
#include "engine/dispatch.h"

namespace autosp {
namespace {

// The device a run uses: the one every fed leaf is on (CPU for a graph without leaves).
Device feed_device(const Graph& g, const TensorMap& feeds) {
  Device dev;
  const Node* first = nullptr;
  for (const auto& n : g.nodes()) {
    if (n->op() != Op::input && n->op() != Op::parameter) continue;
    const Device d = feeds.at(n->name()).device();
    if (first == nullptr) {
      dev = d;
      first = n.get();
    } else if (d != dev) {
      throw UsageError(str("'", n->name(), "' is on ", d.str(), " but '", first->name(), "' is on ", dev.str(),
                           ": feed every input and parameter on one device"));
    }
  }
  return dev;
}

// What an `output` node reads: extra output `index` of its input (`of_input`, kept by the executor).
const Tensor& extra_output(const Node& n, const std::vector<Tensor>& of_input) {
  const int64_t index = n.attrs().i("index");
  AUTOSP_ASSERT(index >= 1 && static_cast<size_t>(index) <= of_input.size(), "no extra output ", index, " of ",
                n.input(0)->name());
  return of_input[index - 1];
}

// The collectives a run leaves in the background (ZeRO-3's parameter prefetch and gradient
// reduce-scatters), by node position: each is waited for at the position background_until gives
// (at the latest its first reader), polled between nodes (MPI makes progress only inside its
// calls), and all have finished before the run returns. The hook sees such a value once it has
// arrived, every other value as soon as its node has run.
class InFlightCollectives {
 public:
  InFlightCollectives(const Graph& g, const std::vector<size_t>& until, const std::vector<Tensor>& values,
                      const NodeHook& on_value)
      : g_(g), until_(until), values_(values), on_value_(on_value), pending_(g.size()) {}

  // Where the launcher of the node at `at` leaves the handle of a collective it started.
  std::unique_ptr<PendingCollective>* slot(size_t at) { return &pending_[at]; }

  // Before the node at `at` runs: wait for each collective that must have finished by then.
  void wait_due(size_t at) {
    for (size_t k = 0; k < in_flight_.size();) {
      const size_t p = in_flight_[k];
      if (until_[p] <= at) {
        pending_[p]->wait();
        arrived(p);
      } else {
        ++k;
      }
    }
  }

  // After the node at `at` ran: the hook sees its value now, or, if the node left a collective
  // running, once that has arrived; at once when `unread` (nothing reads the value, which is freed
  // right after).
  void record(size_t at, bool unread) {
    if (pending_[at]) {
      in_flight_.push_back(at);
      if (unread) {
        pending_[at]->wait();
        arrived(at);
      }
    } else if (on_value_) {
      on_value_(*g_.nodes()[at], values_[at]);
    }
  }

  // Between nodes: take each collective that has finished, except the one started at `except`.
  void poll(size_t except) {
    for (size_t k = 0; k < in_flight_.size();) {
      const size_t p = in_flight_[k];
      if (p != except && pending_[p]->test()) arrived(p);
      else ++k;
    }
  }

  // At the end of the run: wait for the rest, in the order they started.
  void drain() {
    while (!in_flight_.empty()) {
      const size_t p = in_flight_.front();
      pending_[p]->wait();
      arrived(p);
    }
  }

 private:
  void arrived(size_t p) {
    pending_[p].reset();
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), p));
    if (on_value_) on_value_(*g_.nodes()[p], values_[p]);
  }

  const Graph& g_;
  const std::vector<size_t>& until_;
  const std::vector<Tensor>& values_;
  const NodeHook& on_value_;
  std::vector<std::unique_ptr<PendingCollective>> pending_;  // by node position
  std::vector<size_t> in_flight_;                            // positions, in the order they started
};

}  // namespace

Shape eval_shape(const SymShape& s, const Bindings& b) {
  Shape out;
  for (const auto& d : s) out.push_back(d.eval(b));
  return out;
}

Executor::Executor(const Graph& g, ExecOptions options)
    : g_(g), options_(std::move(options)), last_use_(g.size()), kept_(g.size(), false) {
  for (const auto& n : g.nodes()) {
    size_t at = g.position(n.get());
    last_use_[at] = at;
    for (const Node* i : n->inputs()) last_use_[g.position(i)] = at;
  }
  for (const Node* o : g.outputs()) kept_[g.position(o)] = !options_.transient_outputs.count(o->name());
  until_ = background_until(g);
}

Bindings Executor::bind(const TensorMap& feeds) const {
  Bindings b;
  std::vector<const Node*> leaves;
  for (const auto& n : g_.nodes()) {
    if (n->op() != Op::input && n->op() != Op::parameter) continue;
    auto it = feeds.find(n->name());
    if (it == feeds.end()) throw UsageError(str("no tensor fed for ", n->op_name(), " '", n->name(), "'"));
    const Tensor& t = it->second;
    if (t.dtype() != n->dtype())
      throw UsageError(str("'", n->name(), "' is ", t.str(), ", the graph expects ", n->type().str()));
    if (t.rank() != n->type().rank())
      throw UsageError(str("'", n->name(), "' is ", t.str(), ", the graph expects ", n->type().str()));
    for (int i = 0; i < t.rank(); ++i) {
      const Dim& d = n->shape()[i];
      if (d.is_symbol() && !b.count(d.symbol_name())) b[d.symbol_name()] = t.dim(i);
    }
    leaves.push_back(n.get());
  }
  for (const Node* n : leaves) {
    const Tensor& t = feeds.at(n->name());
    for (int i = 0; i < t.rank(); ++i) {
      int64_t want = n->shape()[i].eval(b);
      if (want != t.dim(i))
        throw UsageError(str("'", n->name(), "' is ", t.str(), " but the graph expects ", n->type().str(), " = ",
                             shape_str(eval_shape(n->shape(), b))));
    }
  }
  for (const auto& a : g_.assumptions()) {
    int64_t v = a.expr.eval(b);
    if (v % a.modulus != 0) {
      std::string sizes;
      for (const auto& [k, x] : b) sizes += (sizes.empty() ? "" : ", ") + k + " = " + std::to_string(x);
      throw UsageError(str("assumption ", a.str(), " does not hold (", sizes, ")"));
    }
  }
  return b;
}

void Executor::plan_for(const Bindings& b, const Device& dev, Allocator& alloc) const {
  if (!plan_.offset.empty() && planned_for_ == b && arena_.device() == dev) return;
  arena_ = Tensor();
  plan_ = plan_memory(g_, b, dev.kind);
  planned_for_ = b;
  arena_ = Tensor::empty({static_cast<int64_t>((plan_.arena_bytes + 7) / 8)}, DType::i64, alloc);
}

KernelCall Executor::kernel_call(const Node& n, std::span<const Tensor> in, const Shape& shape, const Bindings& b,
                                 Allocator& alloc, std::vector<Tensor>& extras, const CommGroups& groups) const {
  const size_t at = g_.position(&n);
  Communicator* comm = nullptr;
  if (n.attrs().has("group")) {
    auto it = groups.find(n.attrs().s("group"));
    if (it == groups.end())
      throw RuntimeFailure(
          str("[", n.op_name(), "] ", n.name(), ": no communicator for group '", n.attrs().s("group"), "'"));
    comm = it->second;
  }
  KernelCall call{n, in, shape, b, alloc, extras, comm, {}, {}, options_.attention};
  // The planned places of the output and extra outputs (kHeap: allocated by the launcher).
  if (plan_.offset[at] != MemoryPlan::kHeap)
    call.out = Tensor::view_bytes(arena_, static_cast<size_t>(plan_.offset[at]), shape, n.dtype());
  const auto types = extra_types(n);
  for (size_t e = 0; e < plan_.extra_offset[at].size(); ++e)
    call.extra_out.push_back(plan_.extra_offset[at][e] == MemoryPlan::kHeap
                                 ? Tensor()
                                 : Tensor::view_bytes(arena_, static_cast<size_t>(plan_.extra_offset[at][e]),
                                                      eval_shape(types[e].shape, b), types[e].dtype));
  if (plan_.workspace_offset[at] != MemoryPlan::kHeap)
    call.workspace = Tensor::view_bytes(arena_, static_cast<size_t>(plan_.workspace_offset[at]),
                                        {static_cast<int64_t>(plan_.workspace_bytes[at] / 8)}, DType::i64);
  return call;
}

RunResult Executor::run(const TensorMap& feeds, const CommGroups& groups, const NodeHook& on_value) const {
  RunResult r;
  r.bindings = bind(feeds);
  // Intermediates, the arena and the peak come from the allocator of the feeds' device.
  const Device dev = feed_device(g_, feeds);
  if (dev.kind == DeviceKind::cuda) use_device(dev.index);
  Allocator& alloc = allocator_of(dev);
  plan_for(r.bindings, dev, alloc);
  r.planned_bytes = plan_.arena_bytes;
  alloc.reset_peak();
  std::vector<Tensor> values(g_.size());
  std::vector<std::vector<Tensor>> extras(g_.size());  // extra outputs of multi-output nodes
  std::vector<Tensor> args;
  InFlightCollectives collectives(g_, until_, values, on_value);
  // Free the value at `p` if the node at `at` was its last use and RunResult does not return it
  // (fed tensors stay alive with the caller).
  auto free_if_last_use = [&](size_t p, size_t at) {
    if (last_use_[p] != at || kept_[p]) return;
    values[p] = Tensor();
    extras[p].clear();
  };
  for (const auto& up : g_.nodes()) {
    const Node& n = *up;
    const size_t at = g_.position(&n);
    if (n.op() == Op::input || n.op() == Op::parameter) {
      values[at] = feeds.at(n.name());
      continue;
    }
    collectives.wait_due(at);
    const Shape shape = eval_shape(n.shape(), r.bindings);
    if (n.op() == Op::output) {
      values[at] = extra_output(n, extras[g_.position(n.input(0))]);
    } else {
      args.clear();
      for (const Node* i : n.inputs()) args.push_back(values[g_.position(i)]);
      KernelCall call = kernel_call(n, args, shape, r.bindings, alloc, extras[at], groups);
      if (until_[at] != at && options_.background_collectives) call.pending = collectives.slot(at);
      if (options_.profile == nullptr) {
        values[at] = dispatch(call, dev.kind);
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        values[at] = dispatch(call, dev.kind);
        if (dev.kind == DeviceKind::cuda) synchronize();
        OpProfile::Entry& e = options_.profile->by_op[std::string(n.op_name())];
        e.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ++e.calls;
      }
    }
    AUTOSP_ASSERT(values[at].shape() == shape, "kernel for ", n.name(), " returned ", values[at].str(), ", expected ",
                  shape_str(shape));
    collectives.record(at, last_use_[at] == at);
    collectives.poll(at);
    for (const Node* i : n.inputs()) free_if_last_use(g_.position(i), at);
    free_if_last_use(at, at);
  }
  collectives.drain();
  args.clear();
  for (const Node* o : g_.outputs())
    if (kept_[g_.position(o)]) r.outputs[o->name()] = values[g_.position(o)];
  r.peak_bytes = alloc.peak_bytes();
  return r;
}

std::string op_profile_table(const OpProfile& p, int64_t steps, double total_ms) {
  std::vector<std::pair<std::string, OpProfile::Entry>> rows(p.by_op.begin(), p.by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double kernels = 0;
  for (const auto& [op, e] : rows) kernels += e.ms;
  const double n = double(std::max<int64_t>(steps, 1));
  std::string out = "op profile (per step, over " + std::to_string(steps) + " steps):";
  char line[160];
  for (const auto& [op, e] : rows) {
    std::snprintf(line, sizeof line, "\n  %-28s %10.2f ms %8.1f calls %6.1f%%", op.c_str(), e.ms / n, double(e.calls) / n,
                  kernels > 0 ? 100.0 * e.ms / kernels : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "\n  kernels %.2f ms of the step's %.2f ms (%.1f%%); the rest is the executor, the optimizer and the host",
                kernels / n, total_ms / n, total_ms > 0 ? 100.0 * kernels / total_ms : 0.0);
  return out + line;
}

}  // namespace autosp
