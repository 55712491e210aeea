// AdamW (whole and ZeRO-sharded) and clipping.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "device/buffers.h"
#include "device/cuda/device.h"
#include "device/optim.h"

namespace autosp {

namespace {
std::vector<Tensor> values(const ParamMap& m) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : m) out.push_back(t);
  return out;
}
}  // namespace

double global_grad_norm(const ParamMap& grads) { return grads_norm(values(grads)); }

void clip_grads(const std::vector<Tensor>& grads, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  scale_grads(grads, coef);
}

void clip_grads(ParamMap& grads, double norm, double max_norm) { clip_grads(values(grads), norm, max_norm); }

void AdamW::init(const ParamMap& params) {
  exp_avg.clear();
  exp_avg_sq.clear();
  for (const auto& [name, p] : params) {
    exp_avg[name] = zeros_like(p);
    exp_avg_sq[name] = zeros_like(p);
  }
  step = 0;
}

namespace {
// One AdamW step of p with gradient g and moments m, v (same shape; any device).
void adamw_tensor(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const TrainConfig& t, double lr,
                  double wd, int64_t step) {
  adamw_step(p, g, m, v, lr, t.beta1, t.beta2, t.eps, wd, step);
}

// No decay on biases and norm weights (tensors of rank < 2).
double decay_of(const Shape& shape, const TrainConfig& t) { return shape.size() >= 2 ? t.weight_decay : 0.0; }
}  // namespace

void AdamW::update(ParamMap& params, const ParamMap& grads, const TrainConfig& t, double lr) {
  ++step;
  for (auto& [name, p] : params)
    adamw_tensor(p, grads.at(name), exp_avg.at(name), exp_avg_sq.at(name), t, lr, decay_of(p.shape(), t), step);
}

// ---- ZeRO ----------------------------------------------------------------------------------------

namespace {
// Elements [offset, offset + n) of contiguous `t` (itself a view or not) as a 1-D view.
Tensor flat_range(const Tensor& t, int64_t offset, int64_t n) {
  AUTOSP_ASSERT(t.is_contiguous() && offset >= 0 && n >= 0 && offset + n <= t.numel(), "ZeRO: elements [", offset,
                ", ", offset + n, ") of ", t.str());
  return t.as_strided({n}, {1}, offset);
}

// dst = src (same numel and dtype, contiguous, one device).
void copy_range(const Tensor& src, const Tensor& dst) {
  AUTOSP_ASSERT(src.nbytes() == dst.nbytes() && src.dtype() == dst.dtype(), "ZeRO copy ", src.str(), " -> ", dst.str());
  if (src.device().kind == DeviceKind::cuda) return copy_on_device(src, dst);
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}
}  // namespace

ZeroAdamW::ZeroAdamW(FlatLayout layout, std::vector<std::string> names, int rank)
    : layout_(std::move(layout)), names_(std::move(names)), rank_(rank) {
  AUTOSP_ASSERT(names_.size() == layout_.slots.size(), "ZeroAdamW: ", names_.size(), " names for ",
                layout_.slots.size(), " slots");
  AUTOSP_ASSERT(rank_ >= 0 && rank_ < layout_.ranks, "ZeroAdamW: rank ", rank_, " of ", layout_.ranks);
  segments_.resize(layout_.buckets.size());
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const int64_t c = layout_.shard_numel(b), lo = rank_ * c, hi = lo + c;
    for (size_t k = layout_.buckets[b].first; k < layout_.buckets[b].last; ++k) {
      const int64_t first = layout_.offset_of[k], last = first + shape_numel(layout_.slots[k].shape);
      const int64_t a = std::max(first, lo), e = std::min(last, hi);
      if (a < e) segments_[b].push_back({k, a - first, a - lo, e - a});
    }
  }
}

void ZeroAdamW::load(const AdamW& full, Device device) {
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const DType dt = full.exp_avg.empty() ? layout_.buckets[b].dtype : full.exp_avg.begin()->second.dtype();
    Tensor m = Tensor::zeros({layout_.shard_numel(b)}, dt), v = Tensor::zeros({layout_.shard_numel(b)}, dt);
    for (const Segment& s : segments_[b]) {
      const std::string& name = names_[s.slot];
      copy_range(flat_range(full.exp_avg.at(name), s.in_param, s.numel), flat_range(m, s.in_shard, s.numel));
      copy_range(flat_range(full.exp_avg_sq.at(name), s.in_param, s.numel), flat_range(v, s.in_shard, s.numel));
    }
    exp_avg_.push_back(device.kind == DeviceKind::cpu ? m : to_device(m, device));
    exp_avg_sq_.push_back(device.kind == DeviceKind::cpu ? v : to_device(v, device));
  }
  step_ = full.step;
}

ParamMap ZeroAdamW::unshard(const std::vector<Tensor>& shards, Communicator& comm) const {
  AUTOSP_ASSERT(shards.size() == layout_.buckets.size() && comm.size() == layout_.ranks, "ZeroAdamW::unshard: ",
                shards.size(), " shards over ", comm.size(), " ranks");
  ParamMap out;
  for (size_t b = 0; b < shards.size(); ++b) {
    const FlatLayout::Bucket& l = layout_.buckets[b];
    const Tensor& shard = shards[b];
    Tensor whole = Tensor::empty({l.padded}, shard.dtype(), allocator_of(shard.device()));
    comm.all_gather(shard, whole);
    for (size_t k = l.first; k < l.last; ++k) {
      Tensor t = Tensor::empty(layout_.slots[k].shape, shard.dtype(), allocator_of(shard.device()));
      copy_range(flat_range(whole, layout_.offset_of[k], t.numel()), flat_range(t, 0, t.numel()));
      out[names_[k]] = t;
    }
  }
  return out;
}

AdamW ZeroAdamW::consolidate(Communicator& comm) const {
  AdamW full;
  full.exp_avg = unshard(exp_avg_, comm);
  full.exp_avg_sq = unshard(exp_avg_sq_, comm);
  full.step = step_;
  return full;
}

double ZeroAdamW::grad_norm(const std::vector<Tensor>& shards, Communicator& host) const {
  Tensor sq = Tensor::from_vector<double>({1}, {grads_sum_of_squares(shards)});  // the padding is zero
  host.all_reduce_sum(sq);
  return std::sqrt(sq.data<double>()[0]);
}

void ZeroAdamW::update(ParamMap& params, const std::vector<Tensor>& grad_shards, const TrainConfig& t, double lr,
                       Communicator& comm) {
  AUTOSP_ASSERT(grad_shards.size() == layout_.buckets.size(), "ZeroAdamW::update: ", grad_shards.size(),
                " gradient shards for ", layout_.buckets.size(), " buckets");
  ++step_;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const FlatLayout::Bucket& l = layout_.buckets[b];
    const Tensor& m = exp_avg_[b];
    Allocator& alloc = allocator_of(m.device());
    // This rank's shard of the parameters, in its slot of the bucket, updated; then every rank's
    // shard gathered in place and copied back into the whole parameters.
    const int64_t c = layout_.shard_numel(b), lo = rank_ * c, pad_from = std::max(lo, l.numel);
    Tensor whole = Tensor::empty({l.padded}, m.dtype(), alloc);
    const Tensor shard = flat_range(whole, lo, c);
    if (pad_from < lo + c) {  // the part of the padding in this rank's slot: zero, as in the gradients
      const Tensor zeros = Tensor::zeros({lo + c - pad_from}, m.dtype());
      copy_range(m.device().kind == DeviceKind::cpu ? zeros : to_device(zeros, m.device()),
                 flat_range(whole, pad_from, lo + c - pad_from));
    }
    for (const Segment& s : segments_[b]) {
      const Tensor p = flat_range(params.at(names_[s.slot]), s.in_param, s.numel);
      const Tensor ps = flat_range(shard, s.in_shard, s.numel);
      copy_range(p, ps);
      adamw_tensor(ps, flat_range(grad_shards[b], s.in_shard, s.numel), flat_range(m, s.in_shard, s.numel),
                   flat_range(exp_avg_sq_[b], s.in_shard, s.numel), t, lr, decay_of(layout_.slots[s.slot].shape, t),
                   step_);
    }
    comm.all_gather(shard, whole);
    for (size_t k = l.first; k < l.last; ++k) {
      Tensor& p = params.at(names_[k]);
      copy_range(flat_range(whole, layout_.offset_of[k], p.numel()), flat_range(p, 0, p.numel()));
    }
  }
}

// ---- ZeRO-3 --------------------------------------------------------------------------------------

Tensor parameter_shard(const Tensor& whole, int ranks, int rank) {
  const int64_t n = whole.numel(), c = shard_numel(n, ranks), lo = std::min(n, rank * c), hi = std::min(n, lo + c);
  Tensor shard = Tensor::zeros({c}, whole.dtype());
  if (whole.device().kind != DeviceKind::cpu) shard = to_device(shard, whole.device());
  if (hi > lo) copy_range(flat_range(whole.contiguous(), lo, hi - lo), flat_range(shard, 0, hi - lo));
  return shard;
}

Zero3State::Zero3State(const ParamMap& whole, const AdamW& opt, int ranks, int rank, Device device)
    : ranks_(ranks), rank_(rank) {
  auto placed = [&](const Tensor& t) {
    Tensor s = parameter_shard(t, ranks_, rank_);
    return s.device() == device ? s : to_device(s, device);
  };
  for (const auto& [name, p] : whole) {
    shapes_[name] = p.shape();
    params_[name] = placed(p);
    opt_.exp_avg[name] = placed(opt.exp_avg.at(name));
    opt_.exp_avg_sq[name] = placed(opt.exp_avg_sq.at(name));
  }
  opt_.step = opt.step;
}

ParamMap Zero3State::unshard(const ParamMap& shards, Communicator& comm) const {
  AUTOSP_ASSERT(comm.size() == ranks_, "Zero3State::unshard over ", comm.size(), " ranks, sharded over ", ranks_);
  ParamMap out;
  for (const auto& [name, shard] : shards) {
    Allocator& alloc = allocator_of(shard.device());
    Tensor all = Tensor::empty({shard.numel() * ranks_}, shard.dtype(), alloc);
    comm.all_gather(shard, all);
    Tensor t = Tensor::empty(shapes_.at(name), shard.dtype(), alloc);
    copy_range(flat_range(all, 0, t.numel()), flat_range(t, 0, t.numel()));
    out[name] = t;
  }
  return out;
}

AdamW Zero3State::consolidate(Communicator& comm) const {
  AdamW full;
  full.exp_avg = unshard(opt_.exp_avg, comm);
  full.exp_avg_sq = unshard(opt_.exp_avg_sq, comm);
  full.step = opt_.step;
  return full;
}

double Zero3State::grad_norm(const ParamMap& grad_shards, Communicator& host) const {
  Tensor sq = Tensor::from_vector<double>({1}, {grads_sum_of_squares(values(grad_shards))});  // the padding is zero
  host.all_reduce_sum(sq);
  return std::sqrt(sq.data<double>()[0]);
}

void Zero3State::update(const ParamMap& grad_shards, const TrainConfig& t, double lr) {
  ++opt_.step;
  for (auto& [name, p] : params_)
    adamw_tensor(p, grad_shards.at(name), opt_.exp_avg.at(name), opt_.exp_avg_sq.at(name), t, lr,
                 decay_of(shapes_.at(name), t), opt_.step);
}

size_t bytes_of(const ParamMap& m) {
  size_t n = 0;
  for (const auto& [name, t] : m) n += t.nbytes();
  return n;
}

size_t AdamW::state_bytes() const { return bytes_of(exp_avg) + bytes_of(exp_avg_sq); }

size_t Zero3State::state_bytes() const { return opt_.state_bytes(); }

size_t ZeroAdamW::state_bytes() const {
  size_t n = 0;
  for (size_t b = 0; b < exp_avg_.size(); ++b) n += exp_avg_[b].nbytes() + exp_avg_sq_[b].nbytes();
  return n;
}

}  // namespace autosp
