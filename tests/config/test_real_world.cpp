// Configuration files as users bring them (tests/config/fixtures/real_world): Hugging Face
// config.json files with the keys and values the hub's Qwen2.5, DeepSeek-R1-Distill, SmolLM2 and
// gpt2-medium files carry, and DeepSpeed files as DeepSpeedExamples, LLaMA-Factory, accelerate,
// transformers and FastChat ship them. Each row is a file (or one with a patch) and the outcome the
// foreign-key rule of docs/design.md gives it: accepted (the model it builds, with the parameter
// count its model card publishes, or the recipe it maps to, and the keys listed as not used by
// autosp), or refused with every reason in one block.
#include <catch2/catch.hpp>

#include <fstream>
#include <functional>

#include "config/config.h"
#include "config/deepspeed.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "tensor/check.h"

using namespace autosp;
using nlohmann::json;

namespace {

const std::string kDir = std::string(AUTOSP_SOURCE_DIR) + "/tests/config/fixtures/real_world/";

json fixture(const std::string& path) {
  std::ifstream f(kDir + path);
  REQUIRE(f);
  return json::parse(f);
}

int64_t parameter_count(const ModelConfig& m) {
  int64_t n = 0;
  for (const ParamSpec& p : param_specs(m)) {
    int64_t e = 1;
    for (const auto& d : p.shape) e *= d;
    n += e;
  }
  return n;
}

bool has(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

// The problems of a refusal: the lines "  - ..." of a block, or the one problem of a line.
size_t problem_count(const std::string& message) {
  if (message.find('\n') == std::string::npos) return 1;
  size_t n = 0;
  for (size_t at = message.find("\n  - "); at != std::string::npos; at = message.find("\n  - ", at + 1)) ++n;
  return n;
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Hugging Face config.json files as the hub has them", "[config][hf][real_world]") {
  struct Row {
    std::string file;
    json patch;  // merged into the file (null: as it is)
    // Accepted: the architecture, the parameter count published for the model (0: not checked)
    // and keys the log lists as not used by autosp.
    std::string arch;
    int64_t params = 0;
    std::vector<std::string> unused;
    // Refused: the problems, each by a phrase its line contains.
    std::vector<std::string> refused = {};
  };
  const std::vector<Row> rows = {
      // Qwen2.5 base and its distillations: use_mrope false is the 1-D RoPE autosp computes (and
      // max_window_layers is read: model.max_window_layers, with use_sliding_window false inert).
      {"qwen2.5-0.5b.json", nullptr, "qwen2", 494032768, {"torch_dtype"}},
      {"qwen2.5-3b.json", nullptr, "qwen2", 0, {}},
      {"deepseek-r1-distill-qwen-7b.json", nullptr, "qwen2", 0, {"_name_or_path"}},
      // SmolLM2: nanotron's marker and transformers.js's settings are hub metadata; rope_interleaved
      // false is rotate_half.
      {"smollm2-135m.json", nullptr, "llama", 134515008, {"is_llama_config", "transformers.js_config", "pretraining_tp"}},
      {"smollm2-360m.json", nullptr, "llama", 361821120, {"is_llama_config", "transformers.js_config"}},
      // gpt2-medium: the legacy special-token keys of the original GPT are not GPT-2's math.
      {"gpt2-medium.json", nullptr, "gpt2", 354823168, {"n_special", "predict_special_tokens", "n_ctx", "summary_type"}},
      // Qwen2.5-1M: its context relies on dual chunk attention, which autosp does not compute.
      {"qwen2.5-14b-instruct-1m.json", nullptr, "", 0, {},
       {"dual_chunk_attention_config = {\"chunk_size\":262144,\"local_size\":8192,\"original_max_position_embeddings\":"
        "262144} is not supported (dual chunk attention"}},
      {"qwen2.5-14b-instruct-1m.json", {{"dual_chunk_attention_config", nullptr}}, "qwen2", 0, {}},
      // The same keys at values that change the math: refused, with why and what to do.
      {"qwen2.5-0.5b.json", {{"use_mrope", true}}, "", 0, {},
       {"use_mrope = true is not supported (multimodal RoPE (Qwen2-VL's 3-D positions) is not implemented; autosp's "
        "RoPE is 1-D); train the text model: set use_mrope false"}},
      {"smollm2-135m.json", {{"rope_interleaved", true}}, "", 0, {},
       {"rope_interleaved = true is not supported (autosp's RoPE rotates the two halves of each head (rotate_half), "
        "not interleaved pairs); permute the q_proj and k_proj rows"}},
      // Every problem at once: a value that changes the math, a misspelt key, another activation.
      {"qwen2.5-0.5b.json", {{"use_mrope", true}, {"rms_norm_epsilon", 1e-6}, {"hidden_act", "gelu"}}, "", 0, {},
       {"use_mrope = true is not supported", "unknown key 'rms_norm_epsilon' (did you mean 'rms_norm_eps'?)",
        "hidden_act = \"gelu\" is not supported"}},
      // Another class's name of one of our keys, and a key no class has.
      {"gpt2-medium.json", {{"hidden_size", 1024}, {"n_experts", 8}}, "", 0, {},
       {"unknown key 'hidden_size' (did you mean 'n_embd'?)", "unknown key 'n_experts' (not a GPT2Config setting"}},
      // Garbage where the new keys are read: refused, never taken for their plain value.
      {"qwen2.5-0.5b.json", {{"use_mrope", "no"}}, "", 0, {}, {"use_mrope = \"no\" is not supported"}},
      {"smollm2-135m.json", {{"rope_interleaved", 0}}, "", 0, {}, {"rope_interleaved = 0 is not supported"}},
      {"qwen2.5-0.5b.json", {{"dual_chunk_attention_config", 7}}, "", 0, {}, {"dual_chunk_attention_config = 7"}},
      {"gpt2-medium.json", {{"n_inner", "4096"}, {"predict_special_tokens", "x"}}, "", 0, {}, {"n_inner = \"4096\""}},
      // Hub metadata of any shape is not read.
      {"smollm2-135m.json", {{"transformers.js_config", {{"use_external_data_format", {1, 2}}}}}, "llama", 134515008,
       {"transformers.js_config"}},
  };
  for (const Row& r : rows) {
    json file = fixture("hf/" + r.file);
    if (!r.patch.is_null()) file.merge_patch(r.patch);
    INFO(r.file << " " << r.patch.dump());
    if (!r.refused.empty()) {
      const std::string why = refusal([&] { translate_hf_config(file, "x.json"); });
      CHECK_THAT(why, Catch::StartsWith("x.json: "));
      for (const std::string& needle : r.refused) CHECK_THAT(why, Catch::Contains(needle));
      CHECK(problem_count(why) == r.refused.size());
      // The same through the run config (model.from reads it this way): one error, exit 2.
      CHECK_THROWS_AS(parse_config(file, {"data.seq_len=64"}, "x.json"), UsageError);
      continue;
    }
    const HfModelConfig hf = translate_hf_config(file, "x.json");
    CHECK(hf.model["arch"] == r.arch);
    for (const std::string& k : r.unused)
      CHECK(std::find(hf.math_free.begin(), hf.math_free.end(), k) != hf.math_free.end());
    // As a bare config.json: it trains, and its log says once which keys autosp does not use,
    // with no warning about a key autosp itself derives (GPT-2's tie_word_embeddings).
    const Config c = parse_config(file, {"data.seq_len=64"}, "x.json");
    if (!r.unused.empty()) CHECK(has(c.notes, "x.json: not used by autosp (Hugging Face keys that do not change the math): "));
    CHECK_FALSE(has(c.warnings, "does not apply"));
    if (r.params > 0) CHECK(parameter_count(c.model) == r.params);
  }
}

TEST_CASE("DeepSpeed files as their projects ship them", "[config][deepspeed][real_world]") {
  // A small model; the batch, optimizer, schedule and precision come from each file (or ours).
  const json run = json::parse(R"({"model": {"arch": "llama", "vocab_size": 64, "hidden_size": 32,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
      "data": {"seq_len": 32}})");
  struct Row {
    std::string file;  // under deepspeed/, or a path from the source root
    json patch;
    int world;
    std::vector<std::string> sets;
    std::function<void(const Config&)> check;  // accepted: what it maps to
    std::vector<std::string> refused = {};
  };
  auto note = [](const Config& c, const std::string& text) {
    INFO(text);
    CHECK(has(c.notes, text));
  };
  const std::vector<Row> rows = {
      // LLaMA-Factory: comms_config is read by no DeepSpeed; "auto" everywhere takes ours; no scheduler
      // is DeepSpeed's constant learning rate.
      {"llamafactory-ds_z0_config.json", nullptr, 2, {},
       [&](const Config& c) {
         CHECK(c.zero_optimization.stage == 0);
         CHECK(c.train.lr_schedule == LrSchedule::constant);
         CHECK(c.train.grad_clip == 1.0);  // "auto": ours
         CHECK(c.runtime.dtype == DType::f32);
         note(c, "not used by autosp (they change nothing here): comms_config, fp16, zero_allow_untested_optimizer, "
                 "zero_optimization.allgather_bucket_size");
         CHECK(c.sources.at("train.lr_schedule") == "DeepSpeed's default: no scheduler section, so a constant learning rate");
       }},
      {"llamafactory-ds_z2_config.json", nullptr, 2, {},
       [&](const Config& c) {
         CHECK(c.zero_optimization.stage == 2);
         CHECK_FALSE(c.runtime.overlap_grad_sync);
         note(c, "comms_config");
       }},
      {"llamafactory-ds_z3_config.json", nullptr, 2, {"runtime.dtype=bfloat16"},
       [&](const Config& c) {
         CHECK(c.zero_optimization.stage == 3);
         CHECK(c.runtime.dtype == DType::bf16);  // bf16 "auto": ours, from --set
         note(c, "zero_optimization.stage3_max_live_parameters");
       }},
      {"llamafactory-ds_z3_offload_config.json", nullptr, 2, {}, nullptr,
       {"zero_optimization.offload_optimizer = {\"device\":\"cpu\",\"pin_memory\":true}: not supported by autosp-train "
        "(no offload; it keeps everything on the device); remove it (or set \"device\": \"none\")",
        "zero_optimization.offload_param = "}},
      // LLaMA-Factory's ALST file: every problem in one block (it took three rounds of edits), the
      // sequence_parallel block pointed at the key DeepSpeed reads; comms_config and the bf16
      // section's keys at their defaults are no problem.
      {"llamafactory-ds_z3_alst_config.json", nullptr, 2, {}, nullptr,
       {"unknown DeepSpeed key 'sequence_parallel' (did you mean 'sequence_parallel_size'?); DeepSpeed reads the "
        "sequence parallel degree from the top-level integer sequence_parallel_size: write \"sequence_parallel_size\": 2 "
        "in place of the block",
        "zero_optimization.offload_optimizer", "zero_optimization.offload_param"}},
      // ... and as the block's hints leave it: it runs, SP 2 on 2 ranks.
      {"llamafactory-ds_z3_alst_config.json",
       {{"sequence_parallel", nullptr}, {"sequence_parallel_size", 2},
        {"zero_optimization", {{"offload_optimizer", nullptr}, {"offload_param", nullptr}}}},
       2, {},
       [&](const Config& c) {
         CHECK(c.sequence_parallel.autosp_size == 2);
         CHECK(c.zero_optimization.stage == 3);
         CHECK(c.train.log_every == 10);
         note(c, "at autosp's own value: bf16.auto_cast false");
         note(c, "bf16.consecutive_hysteresis, bf16.hysteresis, bf16.initial_scale_power, bf16.loss_scale, "
                 "bf16.loss_scale_window, bf16.min_loss_scale");
       }},
      // DeepSpeedExamples' ImageNet file: cuda_visible_devices is device selection.
      {"deepspeedexamples-imagenet.json", nullptr, 4, {},
       [&](const Config& c) {
         CHECK(c.data.batch_size == 64);
         CHECK(c.train.gradient_accumulation_steps == 1);
         CHECK(c.train.lr == 0.001);
         CHECK(c.train.beta1 == 0.8);
         CHECK(c.train.weight_decay == 3e-7);
         CHECK(c.train.lr_schedule == LrSchedule::ds_warmup);
         CHECK(c.train.grad_clip == 1.0);
         note(c, "cuda_visible_devices");
         note(c, "at autosp's own value: zero_optimization.cpu_offload false");
       }},
      {"configs/deepspeed/autosp.json", nullptr, 2, {},
       [&](const Config& c) {
         CHECK(c.sequence_parallel.autosp_size == 2);
         CHECK(c.train.lr_schedule == LrSchedule::constant);
       }},
      {"configs/deepspeed/zero1-warmup-cosine.json", nullptr, 4, {},
       [&](const Config& c) { CHECK(c.train.lr_schedule == LrSchedule::ds_warmup_cosine); }},
      // accelerate's ZeRO-2 template trains in fp16 with loss scaling.
      {"accelerate-zero_stage2_config.json", nullptr, 1, {}, nullptr,
       {"fp16.enabled = true: not supported by autosp-train (it would change the math: fp16 training with loss "
        "scaling; autosp computes in float32 or bfloat16 and never scales the loss); use \"bf16\": {\"enabled\": true}"}},
      {"accelerate-zero_stage2_config.json", {{"fp16", {{"enabled", false}}}, {"bf16", {{"enabled", true}}}}, 1, {},
       [&](const Config& c) {
         CHECK(c.runtime.dtype == DType::bf16);
         CHECK(c.train.lr_schedule == LrSchedule::ds_warmup_decay);
         CHECK(c.train.weight_decay == 0.1);  // "auto": ours
       }},
      {"transformers-ds_config_zero2.json", nullptr, 2, {},
       [&](const Config& c) {
         CHECK(c.train.lr_schedule == LrSchedule::ds_warmup);
         CHECK(c.zero_optimization.stage == 2);
         note(c, "zero_optimization.offload_optimizer");  // device "none"
       }},
      // FastChat: no clipping key and no scheduler: DeepSpeed's no clipping, constant lr.
      {"fastchat-deepspeed_config_s2.json", nullptr, 2, {},
       [&](const Config& c) {
         CHECK(c.train.grad_clip == 0);
         CHECK(c.train.lr_schedule == LrSchedule::constant);
         CHECK_THAT(recipe_text(c, 2), Catch::Contains("clipping: none (0) ← DeepSpeed's default: none in the file, so "
                                                       "no clipping"));
       }},
      // ... unless the run config says otherwise: the user's keys stand (and the recipe says whose).
      {"fastchat-deepspeed_config_s2.json", nullptr, 2, {"train.grad_clip=0.5", "train.lr_schedule=cosine"},
       [&](const Config& c) {
         CHECK(c.train.grad_clip == 0.5);
         CHECK(c.train.lr_schedule == LrSchedule::cosine);
         CHECK_THAT(recipe_text(c, 2), Catch::Contains("clipping: global norm 0.5 ← run config") &&
                                           Catch::Contains("lr schedule: cosine ← run config"));
       }},
      {"fastchat-deepspeed_config_s3.json", nullptr, 2, {}, nullptr,
       {"zero_optimization.offload_optimizer", "zero_optimization.offload_param"}},
      // Garbage where the new keys are read.
      {"llamafactory-ds_z0_config.json", {{"bf16", {{"auto_cast", "yes"}}}}, 2, {}, nullptr,
       {"bf16.auto_cast = \"yes\": not supported by autosp-train (autosp does not cast the model's floating-point "
        "inputs); set it false"}},
      {"llamafactory-ds_z0_config.json", {{"comms_config", {1, 2, 3}}, {"cuda_visible_devices", 7}}, 2, {},
       [&](const Config& c) { note(c, "comms_config"); }},
      {"llamafactory-ds_z0_config.json", {{"sequence_parallel", "four"}, {"gradient_clip", 1.0}}, 2, {}, nullptr,
       {"unknown DeepSpeed key 'sequence_parallel' (did you mean 'sequence_parallel_size'?)",
        "unknown DeepSpeed key 'gradient_clip' (did you mean 'gradient_clipping'?)"}},
      {"llamafactory-ds_z0_config.json", {{"bf16", {{"enabled", true}, {"loss_scal", 0}}}}, 2, {}, nullptr,
       {"unknown DeepSpeed key 'bf16.loss_scal' (did you mean 'bf16.loss_scale'?)"}},
  };
  for (const Row& r : rows) {
    const bool ours = r.file.rfind("configs/", 0) == 0;
    json ds = ours ? json::parse(std::ifstream(std::string(AUTOSP_SOURCE_DIR) + "/" + r.file)) : fixture("deepspeed/" + r.file);
    if (!r.patch.is_null()) ds.merge_patch(r.patch);
    INFO(r.file << " " << r.patch.dump() << " on " << r.world << " ranks");
    const Config cfg = parse_config(run, r.sets, "run.json", false);
    if (!r.refused.empty()) {
      const std::string why = refusal([&] { apply_deepspeed(cfg, ds, r.world, "ds.json", "run.json"); });
      CHECK_THAT(why, Catch::StartsWith("ds.json: "));
      for (const std::string& needle : r.refused) CHECK_THAT(why, Catch::Contains(needle));
      CHECK(problem_count(why) == r.refused.size());
      for (const char* fine : {"comms_config", "auto_cast = false", "loss_scale ="}) CHECK_THAT(why, !Catch::Contains(fine));
      continue;
    }
    const Config c = apply_deepspeed(cfg, ds, r.world, "ds.json", "run.json");
    r.check(c);
    // The recipe names a source for each of its values.
    const std::string recipe = recipe_text(c, r.world);
    CHECK_THAT(recipe, Catch::Contains("optimizer: AdamW") && Catch::Contains("lr schedule: ") &&
                           Catch::Contains("clipping: ") && Catch::Contains("batch: micro-batch ") &&
                           Catch::Contains("ZeRO: stage ") && Catch::Contains("precision: "));
  }
}
