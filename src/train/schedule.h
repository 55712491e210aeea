// The learning-rate schedules (train.lr_schedule): the learning rate of each optimizer step, one
// small function per kind behind one switch. Step numbers are 0-based: step s gets the lr that
// Hugging Face's LambdaLR gives optimizer step s (lr × lambda(s), the scheduler stepped after each
// update), and, for the ds_ kinds, the lr DeepSpeed's scheduler has set when the engine takes
// optimizer step s (its last_batch_iteration = s − 1: DeepSpeed steps the scheduler after each
// update, and its constructor sets the lr of iteration −1). Knows nothing of optimizers or graphs.
//
//   cosine               ours since the start: lr·(s+1)/W while s < W, then cosine from lr to
//                        min_lr. It is HF's cosine_with_min_lr except that the warm-up counts from
//                        1 (HF's lr·s/W gives step 0 a learning rate of 0).
//   cosine_with_min_lr   HF's get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate = min_lr/lr)
//   linear               HF's get_linear_schedule_with_warmup (to 0; min_lr is not read)
//   constant             HF's get_constant_schedule
//   constant_with_warmup HF's get_constant_schedule_with_warmup
//   wsd                  HF's get_wsd_schedule as in transformers ≥ 4.50: linear warm-up from
//                        min_lr to lr, stable, then decay_type (cosine, linear, 1-sqrt) down to
//                        min_lr over round(decay_fraction × N) steps, min_lr after.
//   ds_warmup            DeepSpeed's WarmupLR (warmup_min_lr → warmup_max_lr = lr, log or linear)
//   ds_warmup_decay      DeepSpeed's WarmupDecayLR (then linear to 0 at N)
//   ds_warmup_cosine     DeepSpeed's WarmupCosineLR (ratios warmup_min_lr/lr and min_lr/lr of lr)
// W = train.warmup_steps (the ds_ kinds use max(2, W), as DeepSpeed does); N = train.schedule_steps,
// or the run's steps when that is 0. Which of the schedule keys each kind reads is the config's
// schedule_reads (config/config.h; a key a run gives and its kind does not read is a warning): a
// new kind adds its row there, and tests/train/test_schedule.cpp checks the rows against lr_at.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace autosp {

// The learning rate of step `step` (0-based) of a run of `total_steps` steps.
double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps);

}  // namespace autosp
