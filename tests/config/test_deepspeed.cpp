// DeepSpeed config files onto ours (config/deepspeed.h), against values worked by hand from
// DeepSpeed's rules: the batch triple, Adam/AdamW and their defaults, the schedulers (the lr they
// give checked by train/schedule.h's lr_at), ZeRO, bf16, compile; and a table of files that must
// each be an error naming the key.
#include <catch2/catch.hpp>

#include <cmath>

#include "config/deepspeed.h"
#include "tensor/check.h"
#include "train/schedule.h"

using namespace autosp;
using nlohmann::json;

namespace {

// Our config from `run` (+ sets), parsed as autosp-train does with --deepspeed (the cross-key
// rules wait for the DeepSpeed file), with `ds` applied for `world` ranks.
Config apply(const std::string& ds, int world = 1, const std::string& run = "{}", std::vector<std::string> sets = {}) {
  return apply_deepspeed(parse_config(json::parse(run), sets, "run.json", false), json::parse(ds), world, "ds.json",
                         "run.json");
}

bool has_note(const Config& c, const std::string& text) {
  for (const auto& n : c.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("the DeepSpeedExamples AutoSP config maps onto ours", "[deepspeed]") {
  // benchmarks/autosp/configs/autosp_config.json of deepspeedai/DeepSpeedExamples, as it is.
  const char* ds = R"({
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 0},
    "compile": {"deepcompile": true, "passes": ["autosp"]},
    "gradient_accumulation_steps": 1,
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": 1,
    "train_micro_batch_size_per_gpu": 1,
    "wall_clock_breakdown": false,
    "sequence_parallel_size": 2})";
  const Config c = apply(ds, 2, R"({"data": {"batch_size": 1}})");
  CHECK(c.runtime.dtype == DType::bf16);
  CHECK(c.zero_optimization.stage == 0);
  CHECK(c.sequence_parallel.autosp_size == 2);
  CHECK(c.data.batch_size == 1);
  CHECK(c.train.gradient_accumulation_steps == 1);
  CHECK(c.train.grad_clip == 1.0);  // "auto": ours (the default)
  CHECK(c.train.log_every == 2000);
  CHECK(c.resolved["runtime"]["dtype"] == "bfloat16");
  CHECK(has_note(c, "ds.json: not used by autosp (they change nothing here): wall_clock_breakdown"));
  // No scheduler section: DeepSpeed's constant learning rate; "auto" clipping: ours.
  CHECK(c.train.lr_schedule == LrSchedule::constant);
  CHECK(has_note(c, "gradient_clipping \"auto\" → train.grad_clip 1.0 (ours)"));
  // The same file on 4 ranks: dp 2, so 1 ≠ 1 × 1 × 2.
  CHECK_THROWS_WITH(apply(ds, 4), Catch::Contains("train_batch_size 1 != train_micro_batch_size_per_gpu 1 × "
                                                  "gradient_accumulation_steps 1 × dp 2"));
}

TEST_CASE("the batch triple: any two give the third, dp = world / sequence_parallel_size", "[deepspeed]") {
  struct Row {
    int world;
    std::string ds;
    int64_t micro, gas;
  };
  const std::vector<Row> rows = {
      {8, R"({"sequence_parallel_size": 2, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})", 2, 4},
      {8, R"({"sequence_parallel_size": 2, "train_batch_size": 32, "gradient_accumulation_steps": 2})", 4, 2},
      {8, R"({"sequence_parallel_size": 2, "train_batch_size": 32})", 8, 1},
      {8, R"({"sequence_parallel_size": 2, "train_micro_batch_size_per_gpu": 3})", 3, 1},
      {8, R"({"sequence_parallel_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 2, 3},
      {8, R"({"sequence_parallel_size": 8, "train_batch_size": 6, "train_micro_batch_size_per_gpu": 2,
              "gradient_accumulation_steps": 3})", 2, 3},
      {4, R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto"})", 2, 2},  // ours: batch_size 2
      {4, R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 2})", 5, 2},
      {1, R"({"gradient_accumulation_steps": 4})", 2, 4},  // gas alone: our micro-batch
  };
  for (const auto& r : rows) {
    INFO(r.ds << " on " << r.world << " ranks");
    // Ours gives the micro-batch where the file says "auto" or leaves it to us; elsewhere a
    // data.batch_size in run.json would conflict with the file's.
    const bool ours = r.ds.find(R"("train_micro_batch_size_per_gpu": "auto")") != std::string::npos ||
                      r.ds.find("train_") == std::string::npos;
    const Config c = apply(r.ds, r.world, ours ? R"({"data": {"batch_size": 2}})" : "{}");
    CHECK(c.data.batch_size == r.micro);
    CHECK(c.train.gradient_accumulation_steps == r.gas);
  }
  const std::string all_three = "train_batch_size 32 != train_micro_batch_size_per_gpu 2 × gradient_accumulation_steps 2 × dp 4";
  CHECK_THROWS_WITH(apply(R"({"sequence_parallel_size": 2, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 2})", 8),
                    Catch::Contains(all_three) && Catch::Contains("(dp 4 = world 8 / sequence parallel size 2)"));
  // Two given values that leave no integer third: the message names the product, never a
  // truncated third value (it printed "gradient_accumulation_steps 0" here before).
  CHECK_THROWS_WITH(apply(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 4),
                    Catch::Contains("train_batch_size 30 is not a multiple of train_micro_batch_size_per_gpu 4 × dp 4 "
                                    "= 16 (dp 4 = world 4 / sequence parallel size 1): no integer "
                                    "gradient_accumulation_steps makes") &&
                        !Catch::Contains("steps 0"));
  CHECK_THROWS_WITH(apply(R"({"train_batch_size": 6, "gradient_accumulation_steps": 4})", 1),
                    Catch::Contains("train_batch_size 6 is not a multiple of gradient_accumulation_steps 4 × dp 1 = 4") &&
                        Catch::Contains("no integer train_micro_batch_size_per_gpu"));
  CHECK_THROWS_WITH(apply(R"({"train_batch_size": 3})", 2),
                    Catch::Contains("train_batch_size 3 is not a multiple of dp 2 = 2"));
  CHECK_THROWS_WITH(apply(R"({"sequence_parallel_size": 3, "train_batch_size": 8})", 8),
                    Catch::Contains("sequence_parallel_size 3 does not divide the world size 8"));
  CHECK_THROWS_WITH(apply(R"({"train_batch_size": 0})"), Catch::Contains("train_batch_size = 0: expected a positive integer"));
  // The same value in both files is fine; a different one names both.
  CHECK(apply(R"({"train_micro_batch_size_per_gpu": 2})", 1, R"({"data": {"batch_size": 2}})").data.batch_size == 2);
  CHECK_THROWS_WITH(apply(R"({"train_micro_batch_size_per_gpu": 3})", 1, R"({"data": {"batch_size": 2}})"),
                    Catch::Contains("train_micro_batch_size_per_gpu = 3 conflicts with data.batch_size = 2"));
}

TEST_CASE("optimizer: Adam and AdamW with DeepSpeed's defaults, unless ours are set", "[deepspeed]") {
  const Config c = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.8, 0.98], "eps": 1e-6,
                                                                       "weight_decay": 0.05}}})");
  CHECK(c.train.lr == 2e-4);
  CHECK(c.train.beta1 == 0.8);
  CHECK(c.train.beta2 == 0.98);
  CHECK(c.train.eps == 1e-6);
  CHECK(c.train.weight_decay == 0.05);
  // "Adam" is AdamW (adam_w_mode true); left-out params are FusedAdam's defaults...
  const Config d = apply(R"({"optimizer": {"type": "adam"}})", 1, "{}", {"train.min_lr=0"});
  CHECK(d.train.lr == 1e-3);
  CHECK(d.train.beta1 == 0.9);
  CHECK(d.train.beta2 == 0.999);
  CHECK(d.train.eps == 1e-8);
  CHECK(d.train.weight_decay == 0.0);
  // ... or torch.optim.AdamW's (torch_adam), and ours where the user set them.
  CHECK(apply(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}})").train.weight_decay == 0.01);
  const Config e = apply(R"({"optimizer": {"type": "Adam", "params": {"lr": "auto"}}})", 1,
                         R"({"train": {"weight_decay": 0.2, "lr": 3e-3}})");
  CHECK(e.train.weight_decay == 0.2);
  CHECK(e.train.lr == 3e-3);
  CHECK(e.train.beta2 == 0.999);
  CHECK_THROWS_WITH(apply(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"),
                    Catch::Contains("adam_w_mode false"));
  CHECK_THROWS_WITH(apply(R"({"optimizer": {"type": "Lamb", "params": {}}})"),
                    Catch::Contains("optimizer.type = \"Lamb\": not supported"));
  CHECK_THROWS_WITH(apply(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})"),
                    Catch::Contains("optimizer.params.amsgrad = true"));
  CHECK_THROWS_WITH(apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})", 1,
                          R"({"train": {"lr": 3e-4, "min_lr": 0}})"),
                    Catch::Contains("optimizer.params.lr = 0.0001 conflicts with train.lr = 0.0003"));
}

TEST_CASE("scheduler: WarmupLR, WarmupDecayLR, WarmupCosineLR with DeepSpeed's defaults", "[deepspeed]") {
  const Config w = apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                                         "warmup_num_steps": 10}}})");
  CHECK(w.train.lr_schedule == LrSchedule::ds_warmup);
  CHECK(w.train.warmup_type == WarmupType::log);  // DeepSpeed's default
  CHECK(w.train.warmup_steps == 10);
  CHECK(lr_at(w.train, 2, 100) == Approx(1e-3 * std::log(2.0) / std::log(10.0)).epsilon(1e-13));

  // Left-out params: warmup_num_steps 1000, warmup_min_lr 0, and WarmupDecayLR's warmup_max_lr 0.001.
  const Config d = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 5e-4}},
                             "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000,
                                                                              "warmup_type": "linear"}}})");
  CHECK(d.train.lr_schedule == LrSchedule::ds_warmup_decay);
  CHECK(d.train.lr == 1e-3);
  CHECK(d.train.warmup_steps == 1000);
  CHECK(d.train.warmup_min_lr == 0);
  CHECK(d.train.schedule_steps == 5000);
  CHECK(lr_at(d.train, 3001, 10) == Approx(1e-3 * 0.5).epsilon(1e-13));  // (5000 − 3000) / (5000 − 1000)

  // WarmupCosineLR: ratios of the optimizer's lr.
  const Config c = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 2e-4}},
                             "scheduler": {"type": "WarmupCosineLR",
                                           "params": {"total_num_steps": 1000, "warmup_min_ratio": 0.1,
                                                      "cos_min_ratio": 0.01, "warmup_num_steps": 50}}})");
  CHECK(c.train.lr_schedule == LrSchedule::ds_warmup_cosine);
  CHECK(c.train.warmup_min_lr == Approx(2e-5).epsilon(1e-15));
  CHECK(c.train.min_lr == Approx(2e-6).epsilon(1e-15));
  CHECK(lr_at(c.train, 1, 1000) == Approx(2e-5).epsilon(1e-13));
  CHECK(lr_at(c.train, 525, 1000) == Approx(2e-4 * (0.01 + 0.99 * 0.5)).epsilon(1e-13));  // progress 475/950
  // cos_min_ratio left out: DeepSpeed's 0.0001.
  CHECK(apply(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10}}})").train.min_lr ==
        Approx(1e-3 * 1e-4).epsilon(1e-15));

  CHECK_THROWS_WITH(apply(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})"),
                    Catch::Contains("needs params.total_num_steps"));
  CHECK_THROWS_WITH(apply(R"({"scheduler": {"type": "OneCycle", "params": {}}})"),
                    Catch::Contains("scheduler.type = \"OneCycle\": not supported"));
  CHECK_THROWS_WITH(apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})"),
                    Catch::Contains("scheduler.params.warmup_num_steps = 0: expected a positive integer"));
  CHECK_THROWS_WITH(apply(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})"),
                    Catch::Contains("scheduler.params.cos_min_ratio: not a parameter of DeepSpeed's WarmupLR"));
  CHECK_THROWS_WITH(apply(R"({"scheduler": {"type": "WarmupLR"}})", 1, "{}", {"train.lr_schedule=wsd"}),
                    Catch::Contains("scheduler.type = \"WarmupLR\" (our train.lr_schedule \"ds_warmup\") conflicts with "
                                    "train.lr_schedule = \"wsd\""));
}

TEST_CASE("gradient clipping, bf16, ZeRO, compile, steps_per_print", "[deepspeed]") {
  const Config c = apply(R"({"gradient_clipping": 0.5, "bf16": {"enabled": "auto"},
                             "zero_optimization": {"stage": 2, "overlap_comm": false, "reduce_bucket_size": 5e8,
                                                   "contiguous_gradients": true,
                                                   "offload_optimizer": {"device": "none"}},
                             "compile": {"deepcompile": true, "passes": ["autosp", "z1"]}, "steps_per_print": 7,
                             "fp16": {"enabled": false}, "flops_profiler": {"enabled": true}})",
                         2);
  CHECK(c.train.grad_clip == 0.5);
  CHECK(c.runtime.dtype == DType::f32);  // "auto": ours
  CHECK(c.zero_optimization.stage == 2);
  CHECK_FALSE(c.runtime.overlap_grad_sync);
  CHECK(c.runtime.grad_bucket_mb == 5e8 * 4 / (1024.0 * 1024.0));  // elements of f32 gradients
  CHECK(c.train.log_every == 7);
  CHECK(has_note(c, "not used by autosp (they change nothing here): flops_profiler, fp16, zero_optimization.contiguous_gradients, "
                    "zero_optimization.offload_optimizer"));
  CHECK(apply(R"({"zero_optimization": {"reduce_bucket_size": 2097152}})", 1, R"({"runtime": {"dtype": "float64"}})")
            .runtime.grad_bucket_mb == 16);
  CHECK(apply(R"({"gradient_clipping": 1})", 1, R"({"train": {"grad_clip": 1.0}})").train.grad_clip == 1.0);

  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"gradient_clipping": 0.5})", "gradient_clipping = 0.5 conflicts with train.grad_clip = 2.0"},
      {R"({"gradient_clipping": "x"})", "gradient_clipping = \"x\" (our train.grad_clip): expected a number"},
      {R"({"fp16": {"enabled": true}})", "fp16.enabled = true: not supported"},
      {R"({"amp": {"enabled": true}})", "amp.enabled = true"},
      {R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})", "zero_optimization.offload_optimizer"},
      {R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})", "zero_optimization.offload_param"},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage = 4 (our zero_optimization.stage): expected an integer in [0, 3]"},
      {R"({"zero_optimization": {"zero_quantized_gradients": true}})", "zero_optimization.zero_quantized_gradients"},
      {R"({"zero_optimization": {"reduce_bucket_size": -1}})", "zero_optimization.reduce_bucket_size = -1"},
      {R"({"zero_optimization": {"made_up": 1}})", "unknown DeepSpeed key 'zero_optimization.made_up'"},
      {R"({"compile": {"deepcompile": true, "passes": ["z3"]}})", "compile.passes = [\"z3\"]: must contain \"autosp\""},
      {R"({"compile": {"passes": "auto"}})", "compile.passes = \"auto\""},
      {R"({"optimizer": {"type": "auto"}})", "optimizer.type = \"auto\""},
      {R"({"bf16": {"enabled": false}})", "bf16.enabled = false conflicts with runtime.dtype = \"bfloat16\""},
      {R"({"bf16": {"bf16_master_weights_and_grads": true}})", "bf16.bf16_master_weights_and_grads = true"},
      {R"({"communication_data_type": "fp16"})", "communication_data_type = \"fp16\""},
      {R"({"sparse_attention": {"mode": "fixed"}})", "sparse_attention: not supported"},
      {R"({"tensor_parallel": {"autotp_size": 2}})", "tensor_parallel.autotp_size = 2"},
      {R"({"train_micro_batch": 2, "wandb": {}})", "unknown DeepSpeed key 'train_micro_batch'"},
      {R"({"sequence_parallel_size": 0})", "sequence_parallel_size = 0 (our sequence_parallel.autosp_size)"},
      {R"([1])", "expected a JSON object at the top level"},
  };
  for (const auto& [ds, expect] : bad) {
    INFO(ds);
    CHECK_THROWS_WITH(apply(ds, 1, R"({"train": {"grad_clip": 2.0}, "runtime": {"dtype": "bfloat16"}})"),
                      Catch::StartsWith("ds.json: ") && Catch::Contains(expect));
  }
  // A conflict shows the value as the file wrote it, beside its translation.
  CHECK_THROWS_WITH(apply(R"({"bf16": {"enabled": true}})", 1, R"({"runtime": {"dtype": "float32"}})"),
                    Catch::EndsWith("ds.json: bf16.enabled = true (our runtime.dtype \"bfloat16\") conflicts with "
                                    "runtime.dtype = \"float32\" set in the config or by --set; remove one of them"));
  CHECK_THROWS_WITH(apply(R"({"zero_optimization": {"reduce_bucket_size": 262144}})", 1,
                          R"({"runtime": {"grad_bucket_mb": 2}})"),
                    Catch::Contains("zero_optimization.reduce_bucket_size = 262144 (our runtime.grad_bucket_mb 1.0) "
                                    "conflicts with runtime.grad_bucket_mb = 2"));
  // "bfloat16" is DeepSpeed's old name of "bf16", read only where "bf16" is absent (issue 48).
  const Config old_name = apply(R"({"bfloat16": {"enabled": true}})");
  CHECK(old_name.runtime.dtype == DType::bf16);
  CHECK(old_name.warnings.empty());
  const Config both = apply(R"({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}})");
  CHECK(both.runtime.dtype == DType::f32);
  REQUIRE(both.warnings.size() == 1);
  CHECK(both.warnings[0] == "ds.json: bfloat16 = {\"enabled\":true} is ignored: DeepSpeed reads bf16 = "
                            "{\"enabled\":false} when both are given");
  CHECK(has_note(both, "bfloat16 (bf16 is given)"));
  const Config agree = apply(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})");
  CHECK(agree.runtime.dtype == DType::bf16);
  CHECK(agree.warnings.empty());
  CHECK(apply(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": false}})").runtime.dtype == DType::bf16);
  // A rule of ours that the mapped values break names the DeepSpeed file too.
  CHECK_THROWS_WITH(apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}})", 1, "{}", {"train.lr_schedule=cosine"}),
                    Catch::Contains("train.min_lr 0.0001 exceeds train.lr 1e-05") &&
                        Catch::Contains("(with the DeepSpeed config ds.json)"));
}

TEST_CASE("the shipped DeepSpeed configs apply onto configs/llama-tiny-ds.json", "[deepspeed]") {
  const std::string dir = std::string(AUTOSP_SOURCE_DIR) + "/configs/";
  const Config run = load_config(dir + "llama-tiny-ds.json", {}, false);
  const Config a = load_deepspeed(run, dir + "deepspeed/autosp.json", 2, "llama-tiny-ds.json");
  CHECK(a.sequence_parallel.autosp_size == 2);
  CHECK(a.runtime.dtype == DType::bf16);
  CHECK(a.data.batch_size == 1);
  // AdamW, WarmupCosineLR with total_num_steps "auto" (ours: the run's steps), 2 × 2 × dp 2 = 8.
  const Config z = load_deepspeed(run, dir + "deepspeed/zero1-warmup-cosine.json", 4, "llama-tiny-ds.json");
  CHECK(z.data.batch_size == 2);
  CHECK(z.train.gradient_accumulation_steps == 2);
  CHECK(z.zero_optimization.stage == 1);
  CHECK(z.train.lr_schedule == LrSchedule::ds_warmup_cosine);
  CHECK(z.train.schedule_steps == 0);
  CHECK(z.train.min_lr == Approx(3e-4).epsilon(1e-15));
  CHECK(z.runtime.grad_bucket_mb == 5e7 * 4 / (1024.0 * 1024.0));
  CHECK_THROWS_WITH(load_deepspeed(run, dir + "deepspeed/autosp.json", 4, "llama-tiny-ds.json"),
                    Catch::Contains("train_batch_size 1 != train_micro_batch_size_per_gpu 1"));
}

TEST_CASE("a Hugging Face Trainer style config of \"auto\" values takes ours", "[deepspeed]") {
  const Config c = apply(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                     "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
                          "allgather_bucket_size": 2e8, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})",
                         2, R"({"train": {"lr": 2e-5, "warmup_steps": 30, "beta2": 0.98, "grad_clip": 0.5},
                               "data": {"batch_size": 3}})");
  CHECK(c.train.lr_schedule == LrSchedule::ds_warmup_decay);
  CHECK(c.train.lr == 2e-5);
  CHECK(c.train.beta1 == 0.9);  // ours (default)
  CHECK(c.train.beta2 == 0.98);
  CHECK(c.train.warmup_steps == 30);
  CHECK(c.train.warmup_min_lr == 0);
  CHECK(c.train.schedule_steps == 0);  // the run's steps
  CHECK(c.train.grad_clip == 0.5);
  CHECK(c.data.batch_size == 3);
  CHECK(c.train.gradient_accumulation_steps == 1);
  CHECK(c.runtime.dtype == DType::f32);
  CHECK(c.runtime.grad_bucket_mb == 25);
  CHECK(c.zero_optimization.stage == 2);
  CHECK(has_note(c, "not used by autosp (they change nothing here): fp16, wall_clock_breakdown, zero_optimization.allgather_bucket_size"));
  // run.json alone breaks a rule (min_lr 1e-4 above lr 2e-5 under our cosine); the DeepSpeed
  // scheduler, which does not read min_lr, completes it. So does no scheduler (DeepSpeed's constant
  // lr); with our cosine asked for in run.json the rule holds.
  CHECK_THROWS_WITH(parse_config(json::parse(R"({"train": {"lr": 2e-5}})")), Catch::Contains("exceeds train.lr"));
  CHECK(apply(R"({"gradient_clipping": 1.0})", 1, R"({"train": {"lr": 2e-5}})").train.lr_schedule == LrSchedule::constant);
  CHECK_THROWS_WITH(apply(R"({"gradient_clipping": 1.0})", 1, R"({"train": {"lr": 2e-5, "lr_schedule": "cosine"}})"),
                    Catch::Contains("train.min_lr 0.0001 exceeds train.lr 2e-05 (with the DeepSpeed config ds.json)"));
}

TEST_CASE("what a DeepSpeed file leaves out is what DeepSpeed does, and the recipe says whose each value is",
          "[deepspeed]") {
  // No scheduler: the optimizer's lr at every step. No gradient_clipping: none. (Ours would warm up,
  // decay by a cosine and clip at 1.0: the same file would train another model.)
  const Config c = apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})", 2, R"({"data": {"seq_len": 64}})");
  CHECK(c.train.lr_schedule == LrSchedule::constant);
  CHECK(c.train.grad_clip == 0);
  CHECK(lr_at(c.train, 0, 100) == 3e-4);
  CHECK(lr_at(c.train, 99, 100) == 3e-4);
  CHECK(has_note(c, "scheduler → train.lr_schedule \"constant\" (DeepSpeed's default: no scheduler section, so a "
                    "constant learning rate)"));
  CHECK(has_note(c, "gradient_clipping → train.grad_clip 0.0 (DeepSpeed's default: none in the file, so no clipping)"));
  const std::string recipe = recipe_text(c, 2);
  CHECK_THAT(recipe, Catch::StartsWith("recipe (each value ← where it came from):\n  optimizer: AdamW"));
  CHECK_THAT(recipe, Catch::Contains("lr 0.0003 ← ds.json optimizer.params.lr"));
  CHECK_THAT(recipe, Catch::Contains("beta2 0.999 ← DeepSpeed's default"));  // FusedAdam's, in a present section
  CHECK_THAT(recipe, Catch::Contains("lr schedule: constant ← DeepSpeed's default: no scheduler section"));
  CHECK_THAT(recipe, Catch::Contains("clipping: none (0) ← DeepSpeed's default: none in the file, so no clipping"));
  CHECK_THAT(recipe, Catch::Contains("batch: micro-batch 4 ← default; accumulation 1 ← default; dp 2 (2 ranks / "
                                     "sequence parallel 1 ← default) = 8 sequences of 64 tokens a step"));
  CHECK_THAT(recipe, Catch::Contains("ZeRO: stage 0 ← default (replicated on 2 ranks)"));
  CHECK_THAT(recipe, Catch::Contains("precision: float32 ← default"));
  // The user's own keys stand where the file is silent.
  const Config mine = apply("{}", 1, R"({"train": {"grad_clip": 0.5, "lr_schedule": "linear"}})");
  CHECK(mine.train.grad_clip == 0.5);
  CHECK(mine.train.lr_schedule == LrSchedule::linear);
  CHECK_THAT(recipe_text(mine, 1), Catch::Contains("clipping: global norm 0.5 ← run config") &&
                                       Catch::Contains("lr schedule: linear ← run config"));
  // A file without an optimizer section leaves ours (DeepSpeed would use the client's optimizer).
  CHECK(apply("{}", 1, R"({"train": {"lr": 0.01}})").train.lr == 0.01);
}

TEST_CASE("every problem of a DeepSpeed file is said at once", "[deepspeed]") {
  std::string why;
  try {
    apply(R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 7, "offload_param": {"device": "cpu"},
               "overlap_com": true}, "optimizer": {"type": "AdamW", "params": {"lr": "x", "amsgrad": true}},
               "scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}, "gradient_clipping": "big",
               "train_batch_size": 3, "train_micro_batch_size_per_gpu": 2, "wandb": {"enabled": true}})",
          2);
  } catch (const UsageError& e) {
    why = e.what();
  }
  CHECK_THAT(why, Catch::StartsWith("ds.json: 9 problems:\n  - "));
  for (const char* p : {"fp16.enabled = true: not supported by autosp-train (it would change the math: fp16 training",
                        "train_batch_size 3 is not a multiple of train_micro_batch_size_per_gpu 2 × dp 2 = 4",
                        "optimizer.params.amsgrad = true: not supported by autosp-train (its AdamW keeps no running "
                        "maximum of the second moment); set it false",
                        "optimizer.params.lr = \"x\" (our train.lr): expected a number",
                        "scheduler.params.warmup_num_step: not a parameter of DeepSpeed's WarmupLR (did you mean "
                        "'scheduler.params.warmup_num_steps'?)",
                        "gradient_clipping = \"big\" (our train.grad_clip): expected a number",
                        "zero_optimization.offload_param = {\"device\":\"cpu\"}: not supported",
                        "unknown DeepSpeed key 'zero_optimization.overlap_com' (did you mean "
                        "'zero_optimization.overlap_comm'?)",
                        "zero_optimization.stage = 7 (our zero_optimization.stage): expected an integer in [0, 3]"}) {
    INFO(p);
    CHECK_THAT(why, Catch::Contains(str("\n  - ", p)));
  }
  CHECK_THAT(why, !Catch::Contains("wandb"));
}

TEST_CASE("monitors: tensorboard and csv_monitor write into output_path/job_name", "[deepspeed]") {
  const Config c = apply(R"({"tensorboard": {"enabled": true, "output_path": "logs/", "job_name": "run1"},
                             "csv_monitor": {"enabled": true}, "wandb": {"enabled": true}})");
  CHECK(c.train.tensorboard_dir == "logs/run1");
  CHECK(c.train.csv_dir == "DeepSpeedJobName");  // DeepSpeed's defaults: output_path "", job_name "DeepSpeedJobName"
  CHECK(has_note(c, "tensorboard → train.tensorboard_dir \"logs/run1\" (output_path/job_name)"));
  const Config off = apply(R"({"tensorboard": {"enabled": false, "output_path": "x"}, "csv_monitor": {}})");
  CHECK(off.train.tensorboard_dir.empty());
  CHECK(off.train.csv_dir.empty());
  CHECK(has_note(off, "csv_monitor (not enabled)"));
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"tensorboard": true})", "tensorboard = true: expected an object"},
      {R"({"tensorboard": {"enabled": "yes"}})", "tensorboard.enabled = \"yes\": expected true or false"},
      {R"({"csv_monitor": {"enabled": true, "output_path": 3}})", "csv_monitor.output_path = 3: expected a string"},
      {R"({"tensorboard": {"enabled": true, "outpt_path": "x"}})",
       "unknown DeepSpeed key 'tensorboard.outpt_path' (did you mean 'tensorboard.output_path'?)"},
      {R"({"tensorboard": {"enabled": true, "job_name": "b"}})", "conflicts with train.tensorboard_dir = \"a\""},
  };
  for (const auto& [ds, expect] : bad) {
    INFO(ds);
    CHECK_THROWS_WITH(apply(ds, 1, R"({"train": {"tensorboard_dir": "a"}})"),
                      Catch::StartsWith("ds.json: ") && Catch::Contains(expect));
  }
}
