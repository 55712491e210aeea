// The three kinds of training state behind TrainState: whole (replicated), sharded moments (ZeRO-1
// and 2) and sharded parameters (ZeRO-3), and the factory that picks one from the ZeRO mode.
#include "train/train_state.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <unordered_map>

#include "tensor/check.h"
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
    if (world.size() == 1) return;
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

// ZeRO off (or one rank): whole parameters, AdamW and gradients on every rank.
class ReplicatedState final : public TrainState {
 public:
  ReplicatedState(const RankProgram& prog, ParamMap params, AdamW opt, const Config& cfg, JobComms& comms, Device dev)
      : params_(std::move(params)), opt_(std::move(opt)) {
    to_run_device(params_, dev);
    to_run_device(opt_.exp_avg, dev);
    to_run_device(opt_.exp_avg_sq, dev);
    grads_.emplace(prog, params_, cfg, ZeroMode::replicated, *comms.world);
  }
  const ParamMap& graph_params() const override { return params_; }
  void offer(const Node& n, const Tensor& v) override { grads_->offer(n, v); }
  void finish_backward(const RunResult& r) override { step_grads_ = grads_->collect(r); }
  double grad_norm(Communicator&) override { return global_grad_norm(step_grads_); }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(step_grads_, norm, t.grad_clip);
    opt_.update(params_, step_grads_, t, lr);
  }
  ParamMap whole_params() override { return params_; }
  ParamMap whole_grads() override { return step_grads_; }
  AdamW checkpoint_state() override { return opt_; }
  size_t state_bytes() const override { return opt_.state_bytes(); }
  size_t grad_bucket_bytes() const override { return grads_->bucket_bytes(); }
  GradSyncStats sync_stats() const override { return grads_->stats(); }

 private:
  ParamMap params_;
  AdamW opt_;
  std::optional<BucketedGradients> grads_;
  ParamMap step_grads_;
};

// Expert parallelism (moe.expert_parallel_size G > 1, ZeRO off; decision 162): this rank holds the
// dense parameters whole and its expert group's 1/G of the experts (the program's parameters), with
// their AdamW state. Dense gradients are all-reduced over the world, this rank's experts' over the
// ranks holding the same experts ("ep_replica"); the norm adds the expert group's sum of squares.
// Whole tensors (checkpoints, --dump-grads) take every other expert from its owner in the expert
// group (a broadcast per tensor, in name order on every rank).
class ExpertParallelState final : public TrainState {
 public:
  ExpertParallelState(const RankProgram& prog, ParamMap params, AdamW opt, const Config& cfg, JobComms& comms,
                      Device dev)
      : ep_(ep_group(comms)) {
    const std::set<std::string> mine(prog.param_names.begin(), prog.param_names.end());
    const int64_t L = cfg.model.num_experts / ep_.size();
    for (auto& [name, t] : params) {
      const int64_t e = expert_of(name);
      if (e >= 0) owner_[name] = static_cast<int>(e / L);
      AUTOSP_ASSERT((e < 0 || owner_[name] == ep_.rank()) == (mine.count(name) > 0), name,
                    ": the program and the expert split disagree");
      if (!mine.count(name)) {
        shapes_[name] = t.shape();
        continue;
      }
      params_[name] = std::move(t);
      opt_.exp_avg[name] = std::move(opt.exp_avg.at(name));
      opt_.exp_avg_sq[name] = std::move(opt.exp_avg_sq.at(name));
    }
    opt_.step = opt.step;
    to_run_device(params_, dev);
    to_run_device(opt_.exp_avg, dev);
    to_run_device(opt_.exp_avg_sq, dev);
    auto is_expert = [this](const std::string& n) { return owner_.count(n) > 0; };
    dense_.emplace(prog, params_, cfg, ZeroMode::replicated, *comms.world, [&](const std::string& n) { return !is_expert(n); });
    experts_.emplace(prog, params_, cfg, ZeroMode::replicated, *comms.ep_replica, is_expert);
  }
  static Communicator& ep_group(const JobComms& comms) {
    AUTOSP_ASSERT(comms.ep && comms.ep_replica, "expert parallelism without its groups");
    return *comms.ep;
  }
  // The expert index in a parameter's name ("...experts.<e>...."), or -1 for a dense parameter.
  static int64_t expert_of(const std::string& name) {
    const size_t at = name.find(".experts.");
    if (at == std::string::npos) return -1;
    return std::stoll(name.substr(at + 9, name.find('.', at + 9) - at - 9));
  }
  const ParamMap& graph_params() const override { return params_; }
  void offer(const Node& n, const Tensor& v) override {
    dense_->offer(n, v);
    experts_->offer(n, v);
  }
  void finish_backward(const RunResult& r) override {
    step_grads_ = dense_->collect(r);
    for (auto& [name, g] : experts_->collect(r)) step_grads_[name] = g;
  }
  double grad_norm(Communicator&) override {
    ParamMap dense, experts;
    for (const auto& [name, g] : step_grads_) (owner_.count(name) ? experts : dense)[name] = g;
    const double d = global_grad_norm(dense);
    Tensor e = Tensor::from_vector<double>({1}, {std::pow(global_grad_norm(experts), 2)});
    ep_.all_reduce_sum(e);  // the expert group's experts are distinct: their squares add up
    return std::sqrt(d * d + e.data<double>()[0]);
  }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(step_grads_, norm, t.grad_clip);
    opt_.update(params_, step_grads_, t, lr);
  }
  ParamMap whole_params() override { return whole(params_); }
  ParamMap whole_grads() override { return whole(step_grads_); }
  AdamW checkpoint_state() override {
    AdamW w;
    w.exp_avg = whole(opt_.exp_avg);
    w.exp_avg_sq = whole(opt_.exp_avg_sq);
    w.step = opt_.step;
    return w;
  }
  size_t state_bytes() const override { return opt_.state_bytes(); }
  size_t grad_bucket_bytes() const override { return dense_->bucket_bytes() + experts_->bucket_bytes(); }
  GradSyncStats sync_stats() const override {
    GradSyncStats s = dense_->stats();
    const GradSyncStats e = experts_->stats();
    s.calls += e.calls, s.bytes += e.bytes, s.exposed_seconds += e.exposed_seconds, s.wait_seconds += e.wait_seconds;
    return s;
  }

 private:
  // `held` (this rank's tensors by name) with every expert of the model, each broadcast by its owner.
  ParamMap whole(const ParamMap& held) {
    ParamMap out = held;
    for (const auto& [name, owner] : owner_) {
      Tensor t = owner == ep_.rank() ? held.at(name) : Tensor::empty(shapes_.at(name), held.begin()->second.dtype());
      ep_.broadcast(t, owner);
      out[name] = t;
    }
    return out;
  }

  Communicator& ep_;
  ParamMap params_;
  AdamW opt_;
  std::map<std::string, int> owner_;     // every expert parameter of the model: its rank in the expert group
  std::map<std::string, Shape> shapes_;  // the shapes of those this rank does not hold
  std::optional<BucketedGradients> dense_, experts_;
  ParamMap step_grads_;
};

// ZeRO-1 and 2: whole parameters on every rank, the gradients reduce-scattered, ZeroAdamW over this
// rank's shard of every bucket (whole state from a checkpoint of any world size or stage, resharded).
class ShardedMomentsState final : public TrainState {
 public:
  ShardedMomentsState(ZeroMode mode, const RankProgram& prog, ParamMap params, const AdamW& opt, const Config& cfg,
                      JobComms& comms, Device dev)
      : params_(std::move(params)), comm_(*comms.world) {
    to_run_device(params_, dev);
    grads_.emplace(prog, params_, cfg, mode, comm_);
    zopt_.emplace(grads_->sync().layout(), grads_->names_in_slot_order(), comm_.rank());
    zopt_->load(opt, dev);
    if (mode == ZeroMode::sharded_gradients) transient_ = {prog.grad_names.begin(), prog.grad_names.end()};
  }
  const ParamMap& graph_params() const override { return params_; }
  std::set<std::string> transient_outputs() const override { return transient_; }
  void offer(const Node& n, const Tensor& v) override { grads_->offer(n, v); }
  void finish_backward(const RunResult&) override { shards_ = grads_->collect_shards(); }
  double grad_norm(Communicator& host) override { return zopt_->grad_norm(shards_, host); }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(shards_, norm, t.grad_clip);
    zopt_->update(params_, shards_, t, lr, comm_);
  }
  ParamMap whole_params() override { return params_; }
  ParamMap whole_grads() override { return zopt_->unshard(shards_, comm_); }
  AdamW checkpoint_state() override { return zopt_->consolidate(comm_); }
  size_t state_bytes() const override { return zopt_->state_bytes(); }
  size_t grad_bucket_bytes() const override { return grads_->bucket_bytes(); }
  GradSyncStats sync_stats() const override { return grads_->stats(); }

 private:
  ParamMap params_;
  Communicator& comm_;
  std::optional<BucketedGradients> grads_;
  std::optional<ZeroAdamW> zopt_;
  std::set<std::string> transient_;
  std::vector<Tensor> shards_;  // this step's summed gradient shards, one per bucket
};

// ZeRO-3: this rank's shards of the parameters and AdamW state; the graph's gradient outputs are
// already the summed shards, so nothing is left to synchronise.
class ShardedParamsState final : public TrainState {
 public:
  ShardedParamsState(const RankProgram& prog, const ParamMap& params, const AdamW& opt, JobComms& comms, Device dev)
      : prog_(prog), comm_(*comms.world), z3_(params, opt, comm_.size(), comm_.rank(), dev) {}
  const ParamMap& graph_params() const override { return z3_.shards(); }
  void finish_backward(const RunResult& r) override {
    step_grads_.clear();
    for (size_t i = 0; i < prog_.param_names.size(); ++i)
      step_grads_[prog_.param_names[i]] = r.outputs.at(prog_.grad_names[i]);
  }
  double grad_norm(Communicator& host) override { return z3_.grad_norm(step_grads_, host); }
  void update(const TrainConfig& t, double norm, double lr) override {
    clip_grads(step_grads_, norm, t.grad_clip);
    z3_.update(step_grads_, t, lr);
  }
  ParamMap whole_params() override { return z3_.whole_params(comm_); }
  ParamMap whole_grads() override { return z3_.unshard(step_grads_, comm_); }
  AdamW checkpoint_state() override { return z3_.consolidate(comm_); }
  size_t state_bytes() const override { return z3_.state_bytes(); }

 private:
  const RankProgram& prog_;
  Communicator& comm_;
  Zero3State z3_;
  ParamMap step_grads_;
};

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

std::unique_ptr<TrainState> make_train_state(ZeroMode mode, const RankProgram& prog, ParamMap params, AdamW opt,
                                             const Config& cfg, JobComms& comms, Device device) {
  switch (mode) {
    case ZeroMode::replicated:
      if (cfg.moe.expert_parallel_size > 1)
        return std::make_unique<ExpertParallelState>(prog, std::move(params), std::move(opt), cfg, comms, device);
      return std::make_unique<ReplicatedState>(prog, std::move(params), std::move(opt), cfg, comms, device);
    case ZeroMode::sharded_moments:
    case ZeroMode::sharded_gradients:
      return std::make_unique<ShardedMomentsState>(mode, prog, std::move(params), opt, cfg, comms, device);
    case ZeroMode::sharded_parameters: return std::make_unique<ShardedParamsState>(prog, params, opt, comms, device);
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
