// The three kinds of training state behind TrainState: whole (replicated), sharded moments (ZeRO-1
// and 2) and sharded parameters (ZeRO-3), each over the parameter groups of expert parallelism
// (ParamGroups), and the factory that picks one from the ZeRO mode.
#include "train/train_state.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <numeric>
#include <unordered_map>

#include "device/optim.h"  // grads_sum_of_squares
#include "tensor/check.h"
#include "train/expert_split.h"
#include "train/run_device.h"

namespace autosp {
namespace {

// The joint program's gradients in the order the backward produces them (graph position), and,
// on several ranks, their bucketed all-reduce or reduce-scatter (train/grad_sync.h).
class BucketedGradients {
 public:
  // `take`: which parameters' gradients it synchronises (all when null).
  BucketedGradients(const RankProgram& prog, const ParamMap& params, const Config& cfg, ZeroMode mode,
                    Communicator& world, const std::function<bool(const std::string&)>& take = nullptr)
      : prog_(prog) {
    for (size_t i = 0; i < prog.grad_names.size(); ++i)
      if (!take || take(prog.param_names[i])) order_.push_back(i);
    auto position = [&](size_t i) { return prog.graph->position(prog.graph->find(prog.grad_names[i])); };
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return position(a) < position(b); });
    if (world.size() == 1 && mode == ZeroMode::replicated) return;  // ZeRO's groups may be one rank (world = E)
    std::vector<GradSync::Slot> slots;
    for (size_t k = 0; k < order_.size(); ++k) {
      const Node* n = prog.graph->find(prog.grad_names[order_[k]]);
      slots.push_back({params.at(prog.param_names[order_[k]]).shape(), n->dtype()});
      slot_of_[n] = k;
    }
    sync_ = std::make_unique<GradSync>(world, std::move(slots), cfg.runtime.overlap_grad_sync,
                                       static_cast<size_t>(cfg.runtime.grad_bucket_mb * 1024 * 1024), mode);
  }

  void offer(const Node& n, const Tensor& v) {
    if (!sync_) return;
    if (auto it = slot_of_.find(&n); it != slot_of_.end()) sync_->ready(it->second, v);
    sync_->poll();
  }
  // By parameter name, after the run: summed over the world, or the graph's own on one rank.
  ParamMap collect(const RunResult& r) {
    ParamMap grads;
    if (sync_) {
      std::vector<Tensor> summed = sync_->finish();
      for (size_t k = 0; k < order_.size(); ++k) grads[prog_.param_names[order_[k]]] = summed[k];
    } else {
      for (size_t i : order_) grads[prog_.param_names[i]] = r.outputs.at(prog_.grad_names[i]);
    }
    return grads;
  }
  // ZeRO-1/2: this rank's shard of every summed bucket.
  std::vector<Tensor> collect_shards() { return sync_->finish_shards(); }

  GradSync& sync() { return *sync_; }
  GradSyncStats stats() const { return sync_ ? sync_->stats() : GradSyncStats{}; }
  size_t bucket_bytes() const { return sync_ ? sync_->bucket_bytes_held() : 0; }
  std::vector<std::string> names_in_slot_order() const {
    std::vector<std::string> names;
    for (size_t i : order_) names.push_back(prog_.param_names[i]);
    return names;
  }

 private:
  const RankProgram& prog_;
  std::vector<size_t> order_;  // order_[k]: the index into prog.param_names of the k-th gradient produced
  std::unique_ptr<GradSync> sync_;                    // null on one rank
  std::unordered_map<const Node*, size_t> slot_of_;  // a gradient node's slot in sync_
};

// The groups a state keeps its parameters in (train/expert_split.h): every parameter in one group
// over the world, or under expert parallelism the dense parameters over the world and this rank's
// experts over the expert-replica group (decisions 162 and 185), each group with its own buckets
// and ZeRO state. It also makes whole tensors of a rank's: every other expert broadcast by its
// owner over the expert group, in name order on every rank (checkpoints, --dump-grads).
class ParamGroups {
 public:
  struct Group {
    Communicator& comm;
    std::function<bool(const std::string&)> take;  // which parameters are in it
  };
  ParamGroups(const RankProgram& prog, const Config& cfg, JobComms& comms)
      : split_(cfg, comms.mesh), ep_(comms.ep.get()) {
    AUTOSP_ASSERT(!split_.on() || (comms.ep && comms.ep_replica), "expert parallelism without its groups");
    auto dense = [this](const std::string& n) { return !split_.is_expert(n); };
    auto experts = [this](const std::string& n) { return split_.is_expert(n); };
    // A group of no trained parameter (LoRA's frozen experts) gets no buckets.
    auto trains = [&](const std::function<bool(const std::string&)>& take) {
      return std::any_of(prog.param_names.begin(), prog.param_names.end(), take);
    };
    if (!split_.on()) groups_.push_back({*comms.world, nullptr});
    if (split_.on() && trains(dense)) groups_.push_back({*comms.world, dense});
    if (split_.on() && trains(experts)) groups_.push_back({*comms.ep_replica, experts});
  }
  const std::vector<Group>& groups() const { return groups_; }

  // This rank's part of whole tensors: the other ranks' experts dropped, their shapes kept.
  ParamMap held(ParamMap whole) {
    ParamMap out;
    for (auto& [name, t] : whole) {
      if (split_.is_expert(name)) owner_[name] = split_.owner(name), shapes_[name] = t.shape();
      if (split_.held(name)) out[name] = std::move(t);
    }
    return out;
  }
  AdamW held(AdamW whole) {
    whole.exp_avg = held(std::move(whole.exp_avg));
    whole.exp_avg_sq = held(std::move(whole.exp_avg_sq));
    return whole;
  }
  // `held` (this rank's tensors) with every expert of the model.
  ParamMap whole(ParamMap held) {
    if (!ep_) return held;
    for (const auto& [name, owner] : owner_) {
      Tensor t = owner == ep_->rank() ? held.at(name) : Tensor::empty(shapes_.at(name), held.begin()->second.dtype());
      ep_->broadcast(t, owner);
      held[name] = t;
    }
    return held;
  }
  AdamW whole(AdamW held) {
    held.exp_avg = whole(std::move(held.exp_avg));
    held.exp_avg_sq = whole(std::move(held.exp_avg_sq));
    return held;
  }
  // The norm of whole summed gradients held as `held`: the dense ones are the same on every rank,
  // the expert group's experts distinct, so their squares add up over it.
  double norm(const ParamMap& held) {
    ParamMap dense, experts;
    for (const auto& [name, g] : held) (split_.is_expert(name) ? experts : dense)[name] = g;
    if (!ep_) return global_grad_norm(dense);
    const double d = global_grad_norm(dense);
    Tensor e = Tensor::from_vector<double>({1}, {std::pow(global_grad_norm(experts), 2)});
    ep_->all_reduce_sum(e);
    return std::sqrt(d * d + e.data<double>()[0]);
  }

 private:
  ExpertSplit split_;
  Communicator* ep_;  // the expert group (null without expert parallelism)
  std::vector<Group> groups_;
  std::map<std::string, int> owner_;     // every expert parameter of the model: its rank in the expert group
  std::map<std::string, Shape> shapes_;  // and its whole shape
};

// The tensors of `m` a group takes.
ParamMap taken(const ParamMap& m, const ParamGroups::Group& g) {
  if (!g.take) return m;
  ParamMap out;
  for (const auto& [name, t] : m)
    if (g.take(name)) out[name] = t;
  return out;
}
void merge(ParamMap& into, ParamMap from) { into.merge(from); }

// The AdamW state of every part (a parameter group's consolidated moments, `consolidate(part)`)
// merged into one, by name.
template <class Parts, class Consolidate>
AdamW merged_state(Parts& parts, const Consolidate& consolidate) {
  AdamW out;
  for (auto& p : parts) {
    AdamW part = consolidate(p);
    merge(out.exp_avg, std::move(part.exp_avg));
    merge(out.exp_avg_sq, std::move(part.exp_avg_sq));
    out.step = part.step;
  }
  return out;
}

// The norm of gradient shards summed over `host` (each element of every shard is on one rank).
double sharded_norm(const std::vector<Tensor>& shards, Communicator& host) {
  Tensor sq = Tensor::from_vector<double>({1}, {grads_sum_of_squares(shards)});  // the padding is zero
  host.all_reduce_sum(sq);
  return std::sqrt(sq.data<double>()[0]);
}

GradSyncStats sum(GradSyncStats s, const GradSyncStats& e) {
  s.calls += e.calls, s.bytes += e.bytes, s.exposed_seconds += e.exposed_seconds, s.wait_seconds += e.wait_seconds;
  return s;
}

// ZeRO off (or one rank): whole parameters, AdamW and gradients on every rank (under expert
// parallelism its own experts only, their gradients summed over the expert-replica group).
class ReplicatedState final : public TrainState {
 public:
  ReplicatedState(const RankProgram& prog, ParamMap params, AdamW opt, const Config& cfg, JobComms& comms, Device dev)
      : groups_(prog, cfg, comms), params_(groups_.held(std::move(params))), opt_(groups_.held(std::move(opt))) {
    to_run_device(params_, dev);
    to_run_device(opt_.exp_avg, dev);
    to_run_device(opt_.exp_avg_sq, dev);
    for (const ParamGroups::Group& g : groups_.groups())
      grads_.emplace_back(prog, params_, cfg, ZeroMode::replicated, g.comm, g.take);
  }
  const ParamMap& graph_params() const override { return params_; }
  void offer(const Node& n, const Tensor& v) override {
    for (BucketedGradients& g : grads_) g.offer(n, v);
  }
  void finish_backward(const RunResult& r) override {
    step_grads_.clear();
    for (BucketedGradients& g : grads_) merge(step_grads_, g.collect(r));
  }
  double grad_norm(Communicator&) override { return groups_.norm(step_grads_); }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(step_grads_, norm, t.grad_clip);
    opt_.update(params_, step_grads_, t, lr);
  }
  ParamMap whole_params() override { return groups_.whole(params_); }
  ParamMap whole_grads() override { return groups_.whole(step_grads_); }
  AdamW checkpoint_state() override { return groups_.whole(opt_); }
  size_t state_bytes() const override { return opt_.state_bytes(); }
  size_t grad_bucket_bytes() const override {
    size_t n = 0;
    for (const BucketedGradients& g : grads_) n += g.bucket_bytes();
    return n;
  }
  GradSyncStats sync_stats() const override {
    GradSyncStats s;
    for (const BucketedGradients& g : grads_) s = sum(s, g.stats());
    return s;
  }

 private:
  ParamGroups groups_;
  ParamMap params_;
  AdamW opt_;
  std::deque<BucketedGradients> grads_;  // per group
  ParamMap step_grads_;
};

// ZeRO-1 and 2: whole parameters on every rank, the gradients reduce-scattered, ZeroAdamW over this
// rank's shard of every bucket (whole state from a checkpoint of any world size or stage,
// resharded); per group (ParamGroups: under expert parallelism the experts' buckets and moments
// are sharded over the expert-replica group).
class ShardedMomentsState final : public TrainState {
 public:
  ShardedMomentsState(ZeroMode mode, const RankProgram& prog, ParamMap params, const AdamW& opt, const Config& cfg,
                      JobComms& comms, Device dev)
      : groups_(prog, cfg, comms), params_(groups_.held(std::move(params))) {
    to_run_device(params_, dev);
    for (const ParamGroups::Group& g : groups_.groups()) parts_.emplace_back(mode, prog, params_, opt, cfg, g, dev);
    if (mode == ZeroMode::sharded_gradients) transient_ = {prog.grad_names.begin(), prog.grad_names.end()};
  }
  const ParamMap& graph_params() const override { return params_; }
  std::set<std::string> transient_outputs() const override { return transient_; }
  void offer(const Node& n, const Tensor& v) override {
    for (Part& p : parts_) p.grads.offer(n, v);
  }
  void finish_backward(const RunResult&) override {
    for (Part& p : parts_) p.shards = p.grads.collect_shards();
  }
  double grad_norm(Communicator& host) override { return sharded_norm(all_shards(), host); }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(all_shards(), norm, t.grad_clip);
    for (Part& p : parts_) p.zopt.update(params_, p.shards, t, lr, p.comm);
  }
  ParamMap whole_params() override { return groups_.whole(params_); }
  ParamMap whole_grads() override {
    ParamMap out;
    for (Part& p : parts_) merge(out, p.zopt.unshard(p.shards, p.comm));
    return groups_.whole(std::move(out));
  }
  AdamW checkpoint_state() override {
    return groups_.whole(merged_state(parts_, [](Part& p) { return p.zopt.consolidate(p.comm); }));
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const Part& p : parts_) n += p.zopt.state_bytes();
    return n;
  }
  size_t grad_bucket_bytes() const override {
    size_t n = 0;
    for (const Part& p : parts_) n += p.grads.bucket_bytes();
    return n;
  }
  GradSyncStats sync_stats() const override {
    GradSyncStats s;
    for (const Part& p : parts_) s = sum(s, p.grads.stats());
    return s;
  }

 private:
  // One group's buckets, ZeroAdamW over its shards, and this step's summed gradient shards.
  struct Part {
    Part(ZeroMode mode, const RankProgram& prog, const ParamMap& params, const AdamW& opt, const Config& cfg,
         const ParamGroups::Group& g, Device dev)
        : comm(g.comm), grads(prog, params, cfg, mode, g.comm, g.take),
          zopt(grads.sync().layout(), grads.names_in_slot_order(), g.comm.rank()) {
      zopt.load(opt, dev);
    }
    Communicator& comm;
    BucketedGradients grads;
    ZeroAdamW zopt;
    std::vector<Tensor> shards;  // one per bucket
  };
  std::vector<Tensor> all_shards() const {
    std::vector<Tensor> all;
    for (const Part& p : parts_) all.insert(all.end(), p.shards.begin(), p.shards.end());
    return all;
  }

  ParamGroups groups_;
  ParamMap params_;
  std::deque<Part> parts_;  // per group
  std::set<std::string> transient_;
};

// ZeRO-3: this rank's shards of the parameters and AdamW state, per group (ParamGroups: an
// expert's over the expert-replica group, as shard_parameters gathers it); the graph's gradient
// outputs are already the summed shards, so nothing is left to synchronise.
class ShardedParamsState final : public TrainState {
 public:
  ShardedParamsState(const RankProgram& prog, ParamMap params, const AdamW& opt, const Config& cfg, JobComms& comms,
                     Device dev)
      : prog_(prog), groups_(prog, cfg, comms) {
    const ParamMap held = groups_.held(std::move(params));
    for (const ParamGroups::Group& g : groups_.groups()) {
      parts_.emplace_back(g, Zero3State(taken(held, g), opt, g.comm.size(), g.comm.rank(), dev));
      for (const auto& [name, t] : parts_.back().z3.shards()) shards_[name] = t;  // the same storage
    }
  }
  const ParamMap& graph_params() const override { return shards_; }
  void finish_backward(const RunResult& r) override {
    step_grads_.clear();
    for (size_t i = 0; i < prog_.param_names.size(); ++i)
      step_grads_[prog_.param_names[i]] = r.outputs.at(prog_.grad_names[i]);
  }
  double grad_norm(Communicator& host) override {
    std::vector<Tensor> all;
    for (const auto& [name, g] : step_grads_) all.push_back(g);
    return sharded_norm(all, host);
  }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(step_grads_, norm, t.grad_clip);
    for (Part& p : parts_) p.z3.update(step_grads_, t, lr);
  }
  ParamMap whole_params() override {
    ParamMap out;
    for (Part& p : parts_) merge(out, p.z3.whole_params(p.group.comm));
    return groups_.whole(std::move(out));
  }
  ParamMap whole_grads() override {
    ParamMap out;
    for (Part& p : parts_) merge(out, p.z3.unshard(taken(step_grads_, p.group), p.group.comm));
    return groups_.whole(std::move(out));
  }
  AdamW checkpoint_state() override {
    return groups_.whole(merged_state(parts_, [](Part& p) { return p.z3.consolidate(p.group.comm); }));
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const Part& p : parts_) n += p.z3.state_bytes();
    return n;
  }

 private:
  struct Part {
    Part(const ParamGroups::Group& g, Zero3State z) : group(g), z3(std::move(z)) {}
    ParamGroups::Group group;
    Zero3State z3;
  };
  const RankProgram& prog_;
  ParamGroups groups_;
  std::deque<Part> parts_;  // per group
  ParamMap shards_;         // every part's parameter shards (what the graph is fed)
  ParamMap step_grads_;
};

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

std::unique_ptr<TrainState> make_train_state(ZeroMode mode, const RankProgram& prog, ParamMap params, AdamW opt,
                                             const Config& cfg, JobComms& comms, Device device) {
  switch (mode) {
    case ZeroMode::replicated:
      return std::make_unique<ReplicatedState>(prog, std::move(params), std::move(opt), cfg, comms, device);
    case ZeroMode::sharded_moments:
    case ZeroMode::sharded_gradients:
      return std::make_unique<ShardedMomentsState>(mode, prog, std::move(params), opt, cfg, comms, device);
    case ZeroMode::sharded_parameters:
      return std::make_unique<ShardedParamsState>(prog, std::move(params), opt, cfg, comms, device);
  }
  AUTOSP_ASSERT(false, "unknown ZeRO mode");
  return nullptr;
}

PlannedStateBytes planned_state_bytes(ZeroMode mode, size_t param_bytes, size_t grad_bytes, int world) {
  PlannedStateBytes b;
  if (grad_bytes == 0) return b;  // forward only: no optimizer, no gradients
  const auto W = static_cast<size_t>(world);
  switch (mode) {
    case ZeroMode::replicated:  // whole moments; on several ranks a whole copy of the gradients in buckets
      b.optimizer = 2 * param_bytes;
      b.grad_buckets = world > 1 ? grad_bytes : 0;
      break;
    case ZeroMode::sharded_moments:  // 1/W of the moments; whole buckets and their reduce-scattered shard
      b.optimizer = ceil_div(2 * param_bytes, W);
      b.grad_buckets = grad_bytes + ceil_div(grad_bytes, W);
      break;
    case ZeroMode::sharded_gradients:
      // Between steps only the shard (while the backward runs, buckets whose reduce-scatter has not
      // finished live too, and each gradient until it is copied); the gradient outputs are freed.
      b.optimizer = ceil_div(2 * param_bytes, W);
      b.grad_buckets = ceil_div(grad_bytes, W);
      b.freed_outputs = grad_bytes;
      break;
    case ZeroMode::sharded_parameters:
      // The graph's parameter nodes and gradient outputs are already shards, there are no buckets;
      // the whole parameters and gradients it gathers and reduce-scatters live in the arena.
      b.optimizer = 2 * param_bytes;
      break;
  }
  return b;
}

}  // namespace autosp
