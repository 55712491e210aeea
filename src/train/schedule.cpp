// The learning-rate schedules: one function per kind, each written as its source writes it (HF's
// lambda times lr; DeepSpeed's gamma or ratio), so that the tests' references agree to rounding.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace autosp {

namespace {

constexpr double kPi = std::numbers::pi;
using D = double;

// Ours since the start (decision 93 says why it stays): warm-up from lr/W at step 0.
double cosine(const TrainConfig& t, int64_t s, int64_t n) {
  if (s < t.warmup_steps) return t.lr * D(s + 1) / D(t.warmup_steps);
  const double decay = D(std::max<int64_t>(1, n - t.warmup_steps));
  const double progress = std::min(1.0, D(s - t.warmup_steps) / decay);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(kPi * progress));
}

// HF's warm-up: lambda(s) = s / max(1, W).
double hf_warmup(int64_t s, int64_t w) { return D(s) / D(std::max<int64_t>(1, w)); }

// min_lr as HF's ratio of the initial lr.
double min_ratio(const TrainConfig& t) { return t.lr > 0 ? t.min_lr / t.lr : 0.0; }

double cosine_with_min_lr(const TrainConfig& t, int64_t s, int64_t n) {
  if (s < t.warmup_steps) return t.lr * hf_warmup(s, t.warmup_steps);
  const double progress = D(s - t.warmup_steps) / D(std::max<int64_t>(1, n - t.warmup_steps));
  const double r = min_ratio(t);
  const double f = 0.5 * (1.0 + std::cos(kPi * 0.5 * 2.0 * progress)) * (1 - r) + r;
  return t.lr * std::max(0.0, f);
}

double linear(const TrainConfig& t, int64_t s, int64_t n) {
  if (s < t.warmup_steps) return t.lr * hf_warmup(s, t.warmup_steps);
  return t.lr * std::max(0.0, D(n - s) / D(std::max<int64_t>(1, n - t.warmup_steps)));
}

double constant_with_warmup(const TrainConfig& t, int64_t s) {
  return s < t.warmup_steps ? t.lr * hf_warmup(s, t.warmup_steps) : t.lr;
}

// HF's get_wsd_schedule (transformers ≥ 4.50, warmup_type "linear", num_cycles 0.5) with
// num_decay_steps = round(decay_fraction × N) and the stable phase the rest.
double wsd(const TrainConfig& t, int64_t s, int64_t n) {
  const int64_t w = t.warmup_steps;
  const int64_t decay = std::llround(t.decay_fraction * D(n));
  const int64_t stable = n - w - decay;
  const double r = min_ratio(t);
  if (s < w) return t.lr * std::max(0.0, hf_warmup(s, w) * (1.0 - r) + r);
  if (s < w + stable) return t.lr;
  if (s < w + stable + decay) {
    const double p = D(s - w - stable) / D(std::max<int64_t>(1, decay));
    double f = 0;
    switch (t.decay_type) {
      case DecayType::linear: f = 1.0 - p; break;
      case DecayType::cosine: f = 0.5 * (1.0 + std::cos(kPi * 0.5 * 2.0 * p)); break;
      case DecayType::one_minus_sqrt: f = 1.0 - std::sqrt(p); break;
    }
    return t.lr * std::max(0.0, f * (1.0 - r) + r);
  }
  return t.lr * r;
}

// DeepSpeed's warm-up fraction at iteration `it` (< w): log(it + 1) / log(w), or it / w.
double ds_warmup_gamma(const TrainConfig& t, int64_t it, int64_t w) {
  switch (t.warmup_type) {
    case WarmupType::log: return 1.0 / std::log(D(w)) * std::log(D(it + 1));
    case WarmupType::linear: return D(it) / D(w);
  }
  return 1.0;
}

// WarmupLR (decay = false) and WarmupDecayLR: warmup_min_lr + (lr − warmup_min_lr)·gamma.
double ds_warmup(const TrainConfig& t, int64_t it, int64_t n, bool decay) {
  const int64_t w = std::max<int64_t>(2, t.warmup_steps);
  if (it < 0) return t.warmup_min_lr;  // the constructor's lr: the first update
  double gamma = 1.0;
  if (it < w) gamma = ds_warmup_gamma(t, it, w);
  else if (decay) gamma = std::max(0.0, D(n - it) / std::max(1.0, D(n - w)));
  return t.warmup_min_lr + (t.lr - t.warmup_min_lr) * gamma;
}

// WarmupCosineLR: lr × ratio, the ratio from warmup_min_ratio up to 1, then a cosine to cos_min_ratio.
double ds_warmup_cosine(const TrainConfig& t, int64_t it, int64_t n) {
  const int64_t w = std::max<int64_t>(2, t.warmup_steps);
  if (it < 0) return 0.0;  // DeepSpeed's constructor sets 0 before the first update
  const double warmup_min_ratio = t.lr > 0 ? t.warmup_min_lr / t.lr : 0.0, cos_min_ratio = min_ratio(t);
  double ratio = 0;
  if (it < w) {
    ratio = warmup_min_ratio + ds_warmup_gamma(t, it, w) * (1.0 - warmup_min_ratio);
  } else {
    const double progress = std::min(1.0, D(it - w + 1) / D(std::max<int64_t>(1, n - w)));
    ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * ((1 + std::cos(kPi * progress)) / 2));
  }
  return t.lr * ratio;
}

}  // namespace

double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps) {
  const int64_t n = t.schedule_steps > 0 ? t.schedule_steps : total_steps;
  switch (t.lr_schedule) {
    case LrSchedule::cosine: return cosine(t, step, n);
    case LrSchedule::cosine_with_min_lr: return cosine_with_min_lr(t, step, n);
    case LrSchedule::linear: return linear(t, step, n);
    case LrSchedule::constant: return t.lr;
    case LrSchedule::constant_with_warmup: return constant_with_warmup(t, step);
    case LrSchedule::wsd: return wsd(t, step, n);
    case LrSchedule::ds_warmup: return ds_warmup(t, step - 1, n, false);
    case LrSchedule::ds_warmup_decay: return ds_warmup(t, step - 1, n, true);
    case LrSchedule::ds_warmup_cosine: return ds_warmup_cosine(t, step - 1, n);
  }
  return t.lr;
}

}  // namespace autosp
