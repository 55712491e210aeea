// The learning-rate schedules (train/schedule.h) against values worked by hand from each source's
// formula (Hugging Face's lambdas, DeepSpeed's lr_schedules.py), and the schedule keys' rules.
// tests/ref/hf_schedules.py compares the HF ones with transformers itself, through autosp-train.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "config/config.h"
#include "tensor/check.h"
#include "train/schedule.h"

using namespace autosp;
using nlohmann::json;

namespace {

constexpr double kPi = std::numbers::pi;

TrainConfig schedule(LrSchedule kind, int64_t warmup, double lr = 1e-3, double min_lr = 1e-4) {
  TrainConfig t;
  t.lr_schedule = kind;
  t.warmup_steps = warmup;
  t.lr = lr;
  t.min_lr = min_lr;
  return t;
}

// {step, expected lr} at a run of `total` steps.
void check(const TrainConfig& t, int64_t total, const std::vector<std::pair<int64_t, double>>& rows) {
  for (const auto& [step, want] : rows) {
    INFO(lr_schedule_name(t.lr_schedule) << " step " << step << " of " << total);
    CHECK(lr_at(t, step, total) == Approx(want).epsilon(1e-13).margin(1e-18));
  }
}

}  // namespace

TEST_CASE("cosine (the default) warms up from lr/W at step 0, then a cosine to min_lr", "[schedule]") {
  const TrainConfig t = schedule(LrSchedule::cosine, 4);
  CHECK(TrainConfig{}.lr_schedule == LrSchedule::cosine);
  // progress at step 8 of 12: (8 − 4) / 8 = ½, cos(π/2) = 0.
  check(t, 12, {{0, 1e-3 / 4}, {1, 2e-3 / 4}, {3, 1e-3}, {4, 1e-3}, {8, 1e-4 + 0.5 * 9e-4}, {12, 1e-4}, {20, 1e-4}});
}

TEST_CASE("HF's schedules: warm-up lr·s/W from 0, then their decay", "[schedule]") {
  // cosine_with_min_lr: f = ½(1 + cos(π·progress))·(1 − r) + r, r = min_lr/lr = 0.1.
  check(schedule(LrSchedule::cosine_with_min_lr, 4), 12,
        {{0, 0.0}, {2, 5e-4}, {4, 1e-3}, {6, 1e-3 * (0.5 * (1 + std::sqrt(0.5)) * 0.9 + 0.1)}, {8, 1e-3 * 0.55},
         {12, 1e-4}});
  // linear: (N − s) / (N − W), to 0 (min_lr is not read).
  check(schedule(LrSchedule::linear, 4), 12,
        {{0, 0.0}, {1, 2.5e-4}, {4, 1e-3}, {8, 5e-4}, {11, 1.25e-4}, {12, 0.0}, {13, 0.0}});
  check(schedule(LrSchedule::linear, 0), 10, {{0, 1e-3}, {5, 5e-4}});
  check(schedule(LrSchedule::constant, 4), 12, {{0, 1e-3}, {3, 1e-3}, {100, 1e-3}});
  check(schedule(LrSchedule::constant_with_warmup, 4), 12, {{0, 0.0}, {3, 7.5e-4}, {4, 1e-3}, {100, 1e-3}});
}

TEST_CASE("wsd: warm-up from min_lr, stable, then the decay type down to min_lr", "[schedule]") {
  // N = 20, W = 2, decay round(0.25 · 20) = 5 steps, stable 13: decay over steps 15..19.
  TrainConfig t = schedule(LrSchedule::wsd, 2);
  t.decay_fraction = 0.25;
  const double cos72 = (std::sqrt(5.0) - 1) / 4;  // cos(0.4π)
  check(t, 20, {{0, 1e-4}, {1, 1e-3 * (0.5 * 0.9 + 0.1)}, {2, 1e-3}, {14, 1e-3}, {15, 1e-3},
                {17, 1e-3 * (0.5 * (1 + cos72) * 0.9 + 0.1)}, {20, 1e-4}, {25, 1e-4}});
  t.decay_type = DecayType::linear;
  check(t, 20, {{16, 1e-3 * (0.8 * 0.9 + 0.1)}, {17, 1e-3 * (0.6 * 0.9 + 0.1)}, {19, 1e-3 * (0.2 * 0.9 + 0.1)}});
  t.decay_type = DecayType::one_minus_sqrt;
  check(t, 20, {{16, 1e-3 * ((1 - std::sqrt(0.2)) * 0.9 + 0.1)}, {19, 1e-3 * ((1 - std::sqrt(0.8)) * 0.9 + 0.1)}});
  // round(0.1 · 25) = 3 decay steps (halves round up): stable 25 − 2 − 3 = 20, decay from step 22.
  t.decay_fraction = 0.1;
  t.decay_type = DecayType::linear;
  check(t, 25, {{21, 1e-3}, {22, 1e-3}, {23, 1e-3 * ((2.0 / 3) * 0.9 + 0.1)}, {24, 1e-3 * ((1.0 / 3) * 0.9 + 0.1)}});
  // train.schedule_steps spans the schedule whatever the run's length.
  t.schedule_steps = 20;
  t.decay_fraction = 0.25;
  check(t, 1000, {{14, 1e-3}, {17, 1e-3 * (0.6 * 0.9 + 0.1)}, {500, 1e-4}});
}

TEST_CASE("DeepSpeed's WarmupLR and WarmupDecayLR: step s gets iteration s − 1", "[schedule]") {
  TrainConfig t = schedule(LrSchedule::ds_warmup, 10);
  t.warmup_min_lr = 1e-5;
  const double delta = 1e-3 - 1e-5;
  // log warm-up: min + delta · ln(it + 1) / ln(W); step 0 is the constructor's lr (iteration −1).
  check(t, 100, {{0, 1e-5}, {1, 1e-5}, {2, 1e-5 + delta * std::log(2.0) / std::log(10.0)},
                 {5, 1e-5 + delta * std::log(5.0) / std::log(10.0)}, {10, 1e-3}, {11, 1e-3}, {1000, 1e-3}});
  t.warmup_type = WarmupType::linear;  // it / W
  check(t, 100, {{1, 1e-5}, {6, 1e-5 + delta * 0.5}, {10, 1e-5 + delta * 0.9}, {11, 1e-3}});
  t.warmup_steps = 1;  // DeepSpeed warms up over max(2, W) steps
  check(t, 100, {{1, 1e-5}, {2, 1e-5 + delta * 0.5}, {3, 1e-3}});

  // WarmupDecayLR: after W, gamma = (N − it) / (N − W), so it ends at warmup_min_lr.
  t = schedule(LrSchedule::ds_warmup_decay, 10);
  t.warmup_min_lr = 1e-5;
  t.warmup_type = WarmupType::linear;
  check(t, 30, {{0, 1e-5}, {6, 1e-5 + delta * 0.5}, {11, 1e-3}, {21, 1e-5 + delta * 0.5}, {31, 1e-5}, {40, 1e-5}});
}

TEST_CASE("DeepSpeed's WarmupCosineLR: ratios of lr, 0 at the first step", "[schedule]") {
  // warmup_min_ratio 0.1 (warmup_min_lr 1e-4), cos_min_ratio 0.01 (min_lr 1e-5), W = 10, N = 30.
  TrainConfig t = schedule(LrSchedule::ds_warmup_cosine, 10, 1e-3, 1e-5);
  t.warmup_min_lr = 1e-4;
  t.warmup_type = WarmupType::linear;
  // After the warm-up, progress = (it − W + 1) / (N − W).
  check(t, 30, {{0, 0.0}, {1, 1e-4}, {6, 1e-3 * (0.1 + 0.5 * 0.9)}, {10, 1e-3 * (0.1 + 0.9 * 0.9)},
                {11, 1e-3 * (0.01 + 0.99 * (1 + std::cos(0.05 * kPi)) / 2)}, {20, 1e-3 * (0.01 + 0.99 * 0.5)},
                {30, 1e-5}, {50, 1e-5}});
  t.warmup_type = WarmupType::log;
  check(t, 30, {{3, 1e-3 * (0.1 + std::log(3.0) / std::log(10.0) * 0.9)}});
}

TEST_CASE("schedule keys: parsed, resolved, and their rules", "[schedule]") {
  const Config d = parse_config(json::object());
  CHECK(d.resolved["train"]["lr_schedule"] == "cosine");
  CHECK(d.resolved["train"]["decay_type"] == "cosine");
  CHECK(d.resolved["train"]["warmup_type"] == "log");
  CHECK(d.resolved["train"]["schedule_steps"] == 0);
  for (const char* s : {"cosine", "cosine_with_min_lr", "linear", "constant", "constant_with_warmup", "wsd",
                        "ds_warmup", "ds_warmup_decay", "ds_warmup_cosine"}) {
    const Config c = parse_config(json::object(), {str("train.lr_schedule=", s)});
    CHECK(lr_schedule_name(c.train.lr_schedule) == s);
    CHECK(c.resolved["train"]["lr_schedule"] == s);
    CHECK(parse_config(c.resolved).resolved == c.resolved);
  }
  CHECK(parse_config(json::object(), {"train.decay_type=1-sqrt"}).train.decay_type == DecayType::one_minus_sqrt);
  CHECK(parse_config(json::object(), {"train.warmup_type=linear"}).train.warmup_type == WarmupType::linear);
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.lr_schedule=exp"}),
                    Catch::EndsWith("expected one of cosine|cosine_with_min_lr|linear|constant|constant_with_warmup|"
                                    "wsd|ds_warmup|ds_warmup_decay|ds_warmup_cosine"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.decay_type=sqrt"}),
                    Catch::EndsWith("expected one of cosine|linear|1-sqrt"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.decay_fraction=1.5"}), Catch::Contains("train.decay_fraction"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.lr_schedule=ds_warmup", "train.warmup_steps=0"}),
                    Catch::Contains("needs train.warmup_steps >= 1"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.lr_schedule=wsd", "train.steps=10", "train.warmup_steps=5",
                                                  "train.decay_fraction=0.6"}),
                    Catch::Contains("train.warmup_steps 5 + the decay's 6 steps"));
  // min_lr above lr is an error only where the schedule reads min_lr.
  CHECK_THROWS_WITH(parse_config(json::object(), {"train.lr=1e-5"}), Catch::Contains("train.min_lr"));
  CHECK_NOTHROW(parse_config(json::object(), {"train.lr=1e-5", "train.lr_schedule=linear"}));
}

TEST_CASE("the schedule's rules read the run's steps: train.steps, which --steps and with_steps set", "[schedule]") {
  const std::vector<std::string> wsd = {"train.lr_schedule=wsd", "train.warmup_steps=4", "train.decay_fraction=0.5"};
  auto plus = [&](const std::string& extra) {
    std::vector<std::string> v = wsd;
    v.push_back(extra);
    return v;
  };
  const Config c = parse_config(json::object(), plus("train.steps=100"));
  // 4 warm-up steps and round(0.5 × 5) = 3 decay steps do not fit 5 steps; they fit 100 and 8.
  CHECK_THROWS_WITH(with_steps(c, 5), Catch::Contains("exceed the schedule's 5 steps (the run's: train.steps or --steps)"));
  const Config eight = with_steps(c, 8);
  CHECK(eight.train.steps == 8);
  CHECK(eight.resolved["train"]["steps"] == 8);
  CHECK_THROWS_WITH(with_steps(c, -1), Catch::StartsWith("steps -1: "));
  // Its own span (train.schedule_steps) is what the rule reads when it is set.
  const Config own = parse_config(json::object(), plus("train.schedule_steps=100"));
  CHECK_NOTHROW(with_steps(own, 5));
  CHECK_THROWS_WITH(parse_config(json::object(), plus("train.schedule_steps=5")),
                    Catch::Contains("exceed the schedule's 5 steps (train.schedule_steps)"));
}

TEST_CASE("schedule_reads is what each schedule's formula reads, no more, no less", "[schedule]") {
  // Each schedule key changed on its own: the learning rates of a 60-step run change exactly where
  // the schedule reads it (so the config's warning for an unread key never hides a read one).
  const std::vector<std::pair<std::string_view, std::string>> changes = {
      {"train.warmup_steps", "train.warmup_steps=3"},     {"train.min_lr", "train.min_lr=3e-4"},
      {"train.schedule_steps", "train.schedule_steps=40"}, {"train.decay_fraction", "train.decay_fraction=0.5"},
      {"train.decay_type", "train.decay_type=linear"},    {"train.warmup_type", "train.warmup_type=linear"},
      {"train.warmup_min_lr", "train.warmup_min_lr=2e-4"}};
  REQUIRE(changes.size() == schedule_keys().size());
  for (const char* s : {"cosine", "cosine_with_min_lr", "linear", "constant", "constant_with_warmup", "wsd",
                        "ds_warmup", "ds_warmup_decay", "ds_warmup_cosine"}) {
    const std::vector<std::string> base = {str("train.lr_schedule=", s), "train.steps=60"};
    const Config b = parse_config(json::object(), base);
    const std::vector<std::string_view> reads = schedule_reads(b.train.lr_schedule);
    for (const auto& [key, set] : changes) {
      std::vector<std::string> sets = base;
      sets.push_back(set);
      const Config c = parse_config(json::object(), sets);
      bool differs = false;
      for (int64_t k = 0; k < 60; ++k) differs = differs || lr_at(b.train, k, 60) != lr_at(c.train, k, 60);
      INFO(s << ": " << key);
      CHECK(differs == (std::find(reads.begin(), reads.end(), key) != reads.end()));
    }
  }
}
