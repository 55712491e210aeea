// AdamW, clipping and the learning-rate schedule.
#include "train/optimizer.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/optim.h"
#include "device/cuda/optim.h"

namespace autosp {

double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps) {
  if (step < t.warmup_steps) return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  const double decay = static_cast<double>(std::max<int64_t>(1, total_steps - t.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / decay);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

namespace {
// Parameters and gradients on a CUDA device go through device/cuda/optim.h (all on one device).
bool on_device(const ParamMap& m) { return !m.empty() && m.begin()->second.device().kind == DeviceKind::cuda; }

std::vector<Tensor> values(const ParamMap& m) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : m) out.push_back(t);
  return out;
}
}  // namespace

double global_grad_norm(const ParamMap& grads) {
  if (on_device(grads)) return cudart::global_norm(values(grads));
  double sq = 0;
  for (const auto& [name, g] : grads) {
    if (g.dtype() == DType::f32)
      sq += cpu::sum_squares(g.data<float>(), g.numel());
    else
      sq += cpu::sum_squares(g.data<double>(), g.numel());
  }
  return std::sqrt(sq);
}

void clip_grads(ParamMap& grads, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  if (on_device(grads)) return cudart::scale(values(grads), coef);
  for (auto& [name, g] : grads) {
    if (g.dtype() == DType::f32)
      cpu::unary(cpu::Unary::scale, g.data<float>(), g.data<float>(), g.numel(), coef);
    else
      cpu::unary(cpu::Unary::scale, g.data<double>(), g.data<double>(), g.numel(), coef);
  }
}

void AdamW::init(const ParamMap& params) {
  exp_avg.clear();
  exp_avg_sq.clear();
  const bool device = on_device(params);
  for (const auto& [name, p] : params) {
    exp_avg[name] = device ? cudart::zeros_like(p) : Tensor::zeros(p.shape(), p.dtype());
    exp_avg_sq[name] = device ? cudart::zeros_like(p) : Tensor::zeros(p.shape(), p.dtype());
  }
  step = 0;
}

void AdamW::update(ParamMap& params, const ParamMap& grads, const TrainConfig& t, double lr) {
  ++step;
  for (auto& [name, p] : params) {
    const Tensor& g = grads.at(name);
    Tensor& m = exp_avg.at(name);
    Tensor& v = exp_avg_sq.at(name);
    const double wd = p.rank() >= 2 ? t.weight_decay : 0.0;  // no decay on biases and norm weights
    if (p.device().kind == DeviceKind::cuda)
      cudart::adamw_step(p, g, m, v, lr, t.beta1, t.beta2, t.eps, wd, step);
    else if (p.dtype() == DType::f32)
      cpu::adamw_step(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), lr, t.beta1,
                      t.beta2, t.eps, wd, step);
    else
      cpu::adamw_step(p.data<double>(), g.data<double>(), m.data<double>(), v.data<double>(), p.numel(), lr, t.beta1,
                      t.beta2, t.eps, wd, step);
  }
}

}  // namespace autosp
