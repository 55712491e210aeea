// Config parsing: defaults, overrides, arch-specific keys, a table of malformed configs that must
// each give a UsageError naming the key, and the resolved config (every key, parsed back unchanged).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "common/temp_dir.h"
#include "config/config.h"
#include "config/deepspeed.h"
#include "tensor/check.h"

using namespace autosp;
using nlohmann::json;

TEST_CASE("configs resolve defaults and overrides", "[config]") {
  Config c = parse_config(json::parse(R"({"model": {"arch": "llama", "hidden_size": 64, "num_attention_heads": 8}})"),
                          {"train.lr=0.01", "data.seq_len=64", "model.num_key_value_heads=2", "runtime.dtype=float64"});
  CHECK(c.model.arch == Arch::llama);
  CHECK(c.model.num_key_value_heads == 2);
  CHECK(c.model.head_dim() == 8);
  CHECK(c.model.norm_eps == 1e-6);  // llama default
  CHECK_FALSE(c.model.tie_word_embeddings);
  CHECK(c.train.lr == 0.01);
  CHECK(c.data.seq_len == 64);
  CHECK(c.runtime.dtype == DType::f64);
  CHECK(c.resolved["train"]["lr"] == 0.01);
  CHECK(c.resolved["model"]["num_key_value_heads"] == 2);
  CHECK(c.train.keep_checkpoints == 3);  // default: the newest 3 checkpoints
  CHECK(c.resolved["train"]["keep_checkpoints"] == 3);
  CHECK(parse_config(json::object(), {"train.keep_checkpoints=0"}).resolved["train"]["keep_checkpoints"] == 0);

  Config g = parse_config(json::parse(R"({"model": {"arch": "gpt2", "num_key_value_heads": 2}})"));
  CHECK(g.model.num_key_value_heads == g.model.num_attention_heads);  // does not apply to gpt2
  REQUIRE(g.warnings.size() == 1);
  CHECK_THAT(g.warnings[0], Catch::Contains("model.num_key_value_heads"));
  CHECK(g.model.tie_word_embeddings);
  CHECK(g.model.mlp_width() == 4 * g.model.hidden_size);
}

TEST_CASE("string keys with fixed values become enums and resolve to the same strings", "[config]") {
  struct Row {
    std::string key, value;
    std::function<bool(const Config&)> parsed;
  };
  const std::vector<Row> rows = {
      {"model.arch", "gpt2", [](const Config& c) { return c.model.arch == Arch::gpt2; }},
      {"model.arch", "llama", [](const Config& c) { return c.model.arch == Arch::llama; }},
      {"model.arch", "mistral", [](const Config& c) { return c.model.arch == Arch::mistral; }},
      {"model.arch", "qwen2", [](const Config& c) { return c.model.arch == Arch::qwen2; }},
      {"model.arch", "qwen3", [](const Config& c) { return c.model.arch == Arch::qwen3; }},
      {"data.source", "synthetic", [](const Config& c) { return c.data.source == DataSourceKind::synthetic; }},
      {"data.source", "tokens", [](const Config& c) { return c.data.source == DataSourceKind::tokens; }},
      {"data.source", "text", [](const Config& c) { return c.data.source == DataSourceKind::text; }},
      {"runtime.device", "cpu", [](const Config& c) { return c.runtime.device == DeviceKind::cpu; }},
      {"runtime.device", "cuda", [](const Config& c) { return c.runtime.device == DeviceKind::cuda; }},
      {"runtime.attention", "auto", [](const Config& c) { return c.runtime.attention == AttentionBackend::automatic; }},
      {"runtime.attention", "flash", [](const Config& c) { return c.runtime.attention == AttentionBackend::flash; }},
      {"runtime.attention", "cudnn", [](const Config& c) { return c.runtime.attention == AttentionBackend::cudnn; }},
      {"runtime.dtype", "float32", [](const Config& c) { return c.runtime.dtype == DType::f32; }},
      {"runtime.dtype", "float64", [](const Config& c) { return c.runtime.dtype == DType::f64; }},
      {"runtime.dtype", "bfloat16", [](const Config& c) { return c.runtime.dtype == DType::bf16; }},
  };
  for (const auto& r : rows) {
    INFO(r.key << " = " << r.value);
    // A path, which file sources need, and the device cudnn needs, unless the row sets the device.
    std::vector<std::string> sets = {"data.path=x", r.key + "=" + r.value};
    if (r.key != "runtime.device") sets.insert(sets.begin(), "runtime.device=cuda");
    const Config c = parse_config(json::object(), sets);
    CHECK(r.parsed(c));
    const auto dot = r.key.find('.');
    CHECK(c.resolved[r.key.substr(0, dot)][r.key.substr(dot + 1)] == r.value);
  }
  const Config d = parse_config(json::object());
  CHECK(d.resolved["model"]["arch"] == "gpt2");
  CHECK(d.resolved["data"]["source"] == "synthetic");
  CHECK(d.resolved["runtime"]["device"] == "cpu");
  CHECK(d.resolved["runtime"]["attention"] == "auto");
  CHECK(d.resolved["runtime"]["dtype"] == "float32");
  CHECK(d.zero_optimization.stage == 0);  // DeepSpeed's default: no sharding
  CHECK(d.resolved["zero_optimization"]["stage"] == 0);
  CHECK(parse_config(json::object(), {"zero_optimization.stage=2"}).zero_optimization.stage == 2);
  // The error names every accepted value, in this order.
  CHECK_THROWS_WITH(parse_config(json::object(), {"model.arch=bert"}), Catch::EndsWith("expected one of gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen2_moe|qwen3_moe|gemma2|gemma3_text|gpt_oss"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"data.source=csv"}),
                    Catch::EndsWith("expected one of synthetic|tokens|text"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"runtime.device=tpu"}), Catch::EndsWith("expected one of cpu|cuda"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"runtime.attention=x"}),
                    Catch::EndsWith("expected one of auto|flash|cudnn"));
  CHECK_THROWS_WITH(parse_config(json::object(), {"runtime.dtype=f32"}),
                    Catch::EndsWith("expected one of float32|float64|bfloat16"));
}

TEST_CASE("malformed configs are named errors", "[config]") {
  struct Bad {
    const char* json;
    std::vector<std::string> sets;
    const char* expect;
  };
  const std::vector<Bad> table = {
      {R"([1, 2])", {}, "top level"},
      {R"({"modle": {}})", {}, "unknown key 'modle'"},
      {R"({"model": {"hidden": 4}})", {}, "unknown key 'model.hidden'"},
      {R"({"model": 3})", {}, "'model' must be an object"},
      {R"({"model": {"arch": "bert"}})", {}, "model.arch"},
      {R"({"model": {"arch": 7}})", {}, "model.arch"},
      {R"({"model": {"hidden_size": "big"}})", {}, "model.hidden_size"},
      {R"({"model": {"hidden_size": 12.5}})", {}, "model.hidden_size"},
      {R"({"model": {"hidden_size": -4}})", {}, "model.hidden_size"},
      {R"({"model": {"vocab_size": 1e30}})", {}, "model.vocab_size"},
      {R"({"model": {"hidden_size": 100, "num_attention_heads": 8}})", {}, "not divisible"},
      {R"({"model": {"arch": "llama", "num_attention_heads": 4, "num_key_value_heads": 3}})", {}, "num_key_value_heads"},
      {R"({"model": {"norm_eps": true}})", {}, "model.norm_eps"},
      {R"({"model": {"tie_word_embeddings": 1, "arch": "llama"}})", {}, "model.tie_word_embeddings"},
      {R"({"data": {"source": "csv"}})", {}, "data.source"},
      // loss masks (data.loss_mask_path, data.val_loss_mask_path, a data.mix entry's loss_mask_path)
      {R"({"data": {"loss_mask_path": 3}})", {}, "data.loss_mask_path"},
      {R"({"data": {"loss_mask_path": "m.npy"}})", {}, "do not apply to data.source \"synthetic\""},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a"}], "loss_mask_path": "m.npy"}})", {},
       "with data.mix give each entry its own \"loss_mask_path\""},
      {R"({"data": {"source": "tokens", "path": "t.bin", "val_loss_mask_path": "v.npy"}})", {},
       "data.val_loss_mask_path needs data.val_path"},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a", "loss_mask_path": ""}]}})", {}, "data.mix[0].loss_mask_path"},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a", "loss_mask_path": 1}]}})", {}, "data.mix[0].loss_mask_path"},
      {R"({"data": {"source": "tokens"}})", {}, "data.path is required"},
      {R"({"data": {"seq_len": 0}})", {}, "data.seq_len"},
      {R"({"data": {"val_path": 3}})", {}, "data.val_path"},
      {R"({"data": {"val_path": "v.bin"}})", {}, "data.val_path does not apply to data.source \"synthetic\""},
      {R"({"data": {"shuffle": 1}})", {}, "data.shuffle"},
      {R"({"data": {"seed": -2}})", {}, "data.seed"},
      {R"({"data": {"seed": "x"}})", {}, "data.seed"},
      {R"({"data": {"mix": {"path": "a.bin"}}})", {}, "data.mix = {\"path\":\"a.bin\"}: expected a list or null"},
      {R"({"data": {"source": "tokens", "mix": ["a.bin"]}})", {}, "data.mix[0] = \"a.bin\": expected {\"path\""},
      {R"({"data": {"source": "tokens", "mix": [{"path": ""}]}})", {}, "data.mix[0].path"},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a", "weight": 0}]}})", {}, "data.mix[0].weight = 0"},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a", "weight": "half"}]}})", {}, "data.mix[0].weight"},
      {R"({"data": {"source": "tokens", "mix": [{"path": "a"}, {"path": "b", "w": 2}]}})", {}, "data.mix[1]: unknown key 'w'"},
      {R"({"data": {"source": "tokens", "path": "t.bin", "mix": [{"path": "a"}]}})", {}, "data.path and data.mix exclude each other"},
      {R"({"data": {"mix": [{"path": "a"}]}})", {}, "data.mix does not apply to data.source \"synthetic\""},
      {R"({"data": {"source": "tokens", "path": "t.bin"}, "train": {"eval_every": 5}})", {},
       "train.eval_every 5 needs data.val_path for data.source \"tokens\""},
      {R"({"train": {"eval_every": -1}})", {}, "train.eval_every"},
      {R"({"train": {"eval_every": 1.5}})", {}, "train.eval_every"},
      {R"({"train": {"eval_batches": 0}})", {}, "train.eval_batches"},
      {R"({"train": {"eval_batches": "all"}})", {}, "train.eval_batches"},
      {R"({"data": {"seq_len": 4096}})", {}, "max_position_embeddings"},
      {R"({"train": {"lr": -1}})", {}, "train.lr"},
      {R"({"train": {"lr": 0.001, "min_lr": 0.01}})", {}, "train.min_lr"},
      {R"({"train": {"beta2": 1.5}})", {}, "train.beta2"},
      {R"({"runtime": {"device": "tpu"}})", {}, "runtime.device"},
      {R"({"runtime": {"dtype": "int8"}})", {}, "runtime.dtype"},
      {R"({"runtime": {"attention": "xformers"}})", {}, "runtime.attention"},
      {R"({"runtime": {"attention": "cudnn"}})", {}, "runtime.attention \"cudnn\" needs runtime.device \"cuda\""},
      {R"({"runtime": {"overlap_grad_sync": "yes"}})", {}, "runtime.overlap_grad_sync"},
      {R"({"runtime": {"grad_bucket_mb": 0}})", {}, "runtime.grad_bucket_mb"},
      {R"({"runtime": {"grad_bucket_mb": -5}})", {}, "runtime.grad_bucket_mb"},
      {R"({"runtime": {"grad_bucket_mb": "25MB"}})", {}, "runtime.grad_bucket_mb"},
      {R"({"runtime": {"fuse_kernels": 1}})", {}, "runtime.fuse_kernels"},
      {R"({"runtime": {"moe_keep_projections": "yes"}})", {}, "runtime.moe_keep_projections"},
      {R"({"runtime": {"tiled_mlp": "yes"}})", {}, "runtime.tiled_mlp = \"yes\": expected true, false or \"auto\""},
      {R"({"runtime": {"tiled_mlp": 3}})", {}, "runtime.tiled_mlp = 3: expected true, false or \"auto\""},
      {R"({})", {"runtime.tiled_mlp=yes"}, "runtime.tiled_mlp"},
      {R"({"runtime": {"tiled_loss": "yes"}})", {}, "runtime.tiled_loss = \"yes\": expected true, false or \"auto\""},
      {R"({"runtime": {"tiled_loss": 0}})", {}, "runtime.tiled_loss = 0: expected true, false or \"auto\""},
      {R"({})", {"runtime.tiled_loss=1.5"}, "runtime.tiled_loss"},
      {R"({"runtime": {"profile_ops": "yes"}})", {}, "runtime.profile_ops = \"yes\": expected true or false"},
      {R"({})", {"runtime.profile_ops=2"}, "runtime.profile_ops"},
      {R"({"model": {"arch": "gpt2"}, "runtime": {"tiled_mlp": true}})", {},
       "runtime.tiled_mlp is for Llama's SwiGLU MLP; model.arch \"gpt2\" has none"},
      {R"({"sequence_parallel": {"autosp_size": 0}})", {}, "sequence_parallel.autosp_size"},
      {R"({"sequence_parallel": {"ulysses": 2}})", {}, "unknown key 'sequence_parallel.ulysses'"},
      {R"({"sequence_parallel": {"ring_size": 0}})", {}, "sequence_parallel.ring_size = 0: expected an integer in [1, 65536]"},
      {R"({"sequence_parallel": {"ring_size": -2}})", {}, "sequence_parallel.ring_size = -2: expected an integer in [1, 65536]"},
      {R"({"sequence_parallel": {"ring_size": 1.5}})", {}, "sequence_parallel.ring_size = 1.5: expected an integer or \"auto\""},
      {R"({"sequence_parallel": {"ring_size": "big"}})", {}, "sequence_parallel.ring_size = \"big\": expected an integer or \"auto\""},
      {R"({"sequence_parallel": {"ring_size": [2]}})", {}, "sequence_parallel.ring_size"},
      {R"({"sequence_parallel": {"ring_size": null}})", {}, "sequence_parallel.ring_size"},
      {R"({})", {"sequence_parallel.ring_size=AUTO"}, "sequence_parallel.ring_size = \"AUTO\": expected an integer or \"auto\""},
      {R"({"sequence_parallel": {"autosp_size": 4, "ring_size": 3}})", {},
       "sequence_parallel.ring_size 3 does not divide sequence_parallel.autosp_size 4"},
      {R"({"model": {"arch": "llama", "num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 48},
          "sequence_parallel": {"autosp_size": 8, "ring_size": 2}})", {},
       "sequence_parallel.ring_size 2 with autosp_size 8 leaves Ulysses 4 ranks for 6 query heads and 3 key/value "
       "heads (the Ulysses degree must divide the query heads, and the key/value heads must be a multiple of it or "
       "divide it); \"auto\" would pick ring_size 8"},
      {R"({"zero_optimization": {"stage": 4}})", {}, "zero_optimization.stage"},
      {R"({"zero_optimization": {"stage": -1}})", {}, "zero_optimization.stage"},
      {R"({"zero_optimization": {"stage": 1.5}})", {}, "zero_optimization.stage"},
      {R"({"zero_optimization": {"stage": "2"}})", {}, "zero_optimization.stage"},
      {R"({"moe": {"expert_parallel_size": 0}})", {}, "moe.expert_parallel_size"},
      {R"({"moe": {"expert_parallel_size": 1.5}})", {}, "moe.expert_parallel_size"},
      {R"({"moe": {"expert_parallel_size": "2"}})", {}, "moe.expert_parallel_size"},
      {R"({"moe": {"expert_parallel_size": 2}})", {},
       "moe.expert_parallel_size 2 needs a mixture of experts; model.arch \"gpt2\" has none"},
      {R"({"model": {"arch": "qwen3_moe", "num_experts": 6, "num_experts_per_tok": 2},
          "moe": {"expert_parallel_size": 4}})", {}, "moe.expert_parallel_size 4 does not divide model.num_experts 6"},
      {R"({"moe": {"expert_parallel_size": 2, "capacity_factor": 1}})", {}, "unknown key 'moe.capacity_factor'"},
      {R"({"zero_optimization": {"offload_optimizer": true}})", {}, "unknown key 'zero_optimization.offload_optimizer'"},
      {R"({})", {"train.lr"}, "expected key.path=value"},
      {R"({})", {"lr=3"}, "expected section.key"},
      {R"({})", {"train.nope=3"}, "unknown key 'train.nope'"},
      {R"({})", {"train.steps=many"}, "train.steps"},
      {R"({"model": 5})", {"model.arch=gpt2"}, "--set model.arch"},
      {R"({"train": {"keep_checkpoints": -1}})", {}, "train.keep_checkpoints"},
      {R"({"train": {"keep_checkpoints": 2.5}})", {}, "train.keep_checkpoints"},
      {R"({"train": {"keep_checkpoints": "all"}})", {}, "train.keep_checkpoints"},
      {R"({})", {"train.keep_checkpoints=[3]"}, "train.keep_checkpoints"},
      {R"({})", {"train.keep_checkpoints=1e300"}, "train.keep_checkpoints"},
      {R"({})", {"model.arch=\xff"}, "not valid UTF-8"},
      {R"({})", {"train.lr.x=1"}, "expected section.key"},
      {R"({})", {"train.=3"}, "--set train.: expected section.key"},
      {R"({})", {".lr=3"}, "--set .lr: expected section.key"},
      {R"({})", {"train/lr=1"}, "expected section.key"},
      {R"({})", {"x.9999999999999=1"}, "unknown key 'x'"},  // not an array index (fuzzer find)
      {R"({"train": 3})", {"train.lr=1"}, "'train' must be an object"},
      {R"({"model": {"from": 3}})", {}, "model.from = 3: expected a Hugging Face model directory"},
      {R"({"model": {"from": ""}})", {}, "model.from = \"\""},
      {R"({"model": {"from": "/nonexistent/autosp-hf"}})", {}, "not a directory (model.from"},
      {R"({"model": {"arch": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2}}})", {}, "rope_type \"dynamic\""},
      {R"({"model": {"arch": "qwen2", "rope_scaling": {"rope_type": "yarn", "factor": 0}}})", {}, "\"factor\" = 0"},
      // The window's layers: layer_types has one known kind per layer; max_window_layers is a count.
      {R"({"model": {"arch": "mistral", "sliding_window": 8, "layer_types": ["full_attention"]}})", {},
       "model.layer_types has 1 entries for model.num_hidden_layers 2"},
      {R"({"model": {"arch": "qwen2", "sliding_window": 8, "layer_types": ["full_attention", "local"]}})", {},
       "model.layer_types[1] = \"local\": expected \"full_attention\" or \"sliding_attention\""},
      {R"({"model": {"arch": "qwen2", "layer_types": "sliding_attention"}})", {}, "model.layer_types"},
      {R"({"model": {"arch": "qwen3", "layer_types": [1, 2]}})", {}, "model.layer_types[0] = 1"},
      {R"({"model": {"arch": "qwen2", "max_window_layers": -1}})", {}, "model.max_window_layers"},
      {R"({"model": {"arch": "mistral", "max_window_layers": 3}})", {}, "model.max_window_layers is a qwen2"},
      {R"({"model": {"arch": "llama", "layer_types": ["full_attention", "full_attention"]}})", {},
       "model.layer_types is a mistral"},
      {R"({"model": {"arch": "qwen3", "head_dim": 5}})", {}, "model.head_dim 5 must be even"},
      {R"({"model": {"arch": "llama", "sliding_window": 4096}})", {}, "model.sliding_window is a mistral"},
      {R"({"model": {"arch": "llama", "rope_scaling": [1]}})", {}, "model.rope_scaling"},
      {R"({"model": {"arch": "llama", "rope_scaling": {"rope_type": "linear"}}})", {}, "needs \"factor\""},
      {R"({"train": {"max_shard_mb": 0}})", {}, "train.max_shard_mb"},
      {R"({"train": {"max_shard_mb": "5GB"}})", {}, "train.max_shard_mb"},
      {R"({"model": {"n_embd": 4}})", {}, "did you mean 'model.hidden_size'"},
      {R"({"model_type": "gpt2", "n_embd": 32, "attention_bias": true})", {}, "unknown key 'attention_bias'"},
      {R"({"data": {"eos_token_id": -2}})", {}, "data.eos_token_id"},
      {R"({"data": {"eos_token_id": 1.5}})", {}, "data.eos_token_id"},
      {R"({"data": {"eos_token_id": "eos"}})", {}, "data.eos_token_id"},
      {R"({"data": {"eos_token_id": 50257}})", {}, "data.eos_token_id 50257 is outside the vocabulary"},
      {R"({"data": {"document_mask": "true"}})", {}, "data.document_mask"},
      {R"({"data": {"document_mask": true}})", {"data.source=tokens", "data.path=x"}, "needs data.eos_token_id"},
      {R"({"data": {"document_mask": true, "eos_token_id": 2}})", {}, "the synthetic task has none"},
      {R"({"data": {"document_mask": true, "eos_token_id": 2, "source": "text", "path": "x"},
           "model": {"vocab_size": 256}, "runtime": {"device": "cuda", "attention": "cudnn"}})", {},
       "cannot apply the document mask"},
      {R"({})", {"train.lr=" + std::string(40, '[') + std::string(40, ']')}, "train.lr"},
      // null lifts a window; any other value that is not a length is refused.
      {R"({"model": {"arch": "mistral"}})", {"model.sliding_window=[]"}, "model.sliding_window = []: expected an integer"},
      {R"({"model": {"arch": "mistral"}})", {"model.sliding_window=none"}, "model.sliding_window = \"none\""},
      {R"({"model": {"arch": "mistral"}})", {"model.sliding_window=0"}, "model.sliding_window = 0: expected an integer in"},
      {R"({"model": {"arch": "llama"}})", {"model.sliding_window=4096"}, "model.sliding_window is a mistral"},
      // Gemma: softcaps and the attention scalar are positive (null: no softcap); its layer_types
      // and window pattern are checked like the others; the tiled MLP and loss refuse it by name.
      {R"({"model": {"arch": "gemma2", "attn_logit_softcapping": 0}})", {}, "model.attn_logit_softcapping = 0"},
      {R"({"model": {"arch": "gemma3_text"}})", {"model.final_logit_softcapping=-30"}, "model.final_logit_softcapping = -30"},
      {R"({"model": {"arch": "gemma2", "final_logit_softcapping": "30"}})", {}, "model.final_logit_softcapping"},
      {R"({"model": {"arch": "gemma2", "query_pre_attn_scalar": 0}})", {}, "model.query_pre_attn_scalar = 0"},
      {R"({"model": {"arch": "gemma3_text", "query_pre_attn_scalar": -256}})", {}, "model.query_pre_attn_scalar = -256"},
      {R"({"model": {"arch": "gemma2", "sliding_window_pattern": 0}})", {}, "model.sliding_window_pattern = 0"},
      {R"({"model": {"arch": "gemma3_text", "sliding_window": 8, "layer_types": ["sliding_attention"]}})", {},
       "model.layer_types has 1 entries for model.num_hidden_layers 2"},
      {R"({"model": {"arch": "gemma2", "sliding_window": 8, "layer_types": ["full_attention", "chunked_attention"]}})",
       {}, "model.layer_types[1] = \"chunked_attention\""},
      {R"({"model": {"arch": "llama", "attn_logit_softcapping": 50}})", {}, "model.attn_logit_softcapping is a gemma2"},
      {R"({"model": {"arch": "qwen3", "rope_local_base_freq": 10000}})", {}, "model.rope_local_base_freq is a gemma3_text"},
      {R"({"model": {"arch": "llama", "vocab_size": 100, "pad_token_id": 100}})", {},
       "model.pad_token_id 100 is outside [-100, 100)"},
      {R"({"model": {"arch": "llama", "vocab_size": 100, "pad_token_id": -101}})", {},
       "model.pad_token_id -101 is outside [-100, 100)"},
      {R"({"model": {"arch": "gemma2", "pad_token_id": "zero"}})", {}, "model.pad_token_id"},
      {R"({"model": {"arch": "gemma3_text"}, "runtime": {"tiled_mlp": true}})", {},
       "runtime.tiled_mlp is for Llama's SwiGLU MLP; model.arch \"gemma3_text\""},
      // gpt-oss: the clamped SwiGLU's limit and gain are positive; k of E experts.
      {R"({"model": {"arch": "gpt_oss", "swiglu_limit": 0}})", {}, "model.swiglu_limit = 0"},
      {R"({"model": {"arch": "gpt_oss"}})", {"model.swiglu_limit=-7"}, "model.swiglu_limit = -7"},
      {R"({"model": {"arch": "gpt_oss", "swiglu_alpha": 0}})", {}, "model.swiglu_alpha = 0"},
      {R"({"model": {"arch": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 5}})", {},
       "model.num_experts_per_tok 5 exceeds model.num_local_experts 4"},
      {R"({"model": {"arch": "llama", "swiglu_limit": 7}})", {}, "model.swiglu_limit is a gpt_oss"},
  };
  for (const auto& t : table) {
    INFO(t.json);
    CHECK_THROWS_WITH(parse_config(json::parse(t.json), t.sets, "cfg.json"),
                      Catch::Contains(t.expect) && Catch::StartsWith("cfg.json"));
  }
}

TEST_CASE("every problem of a config is said at once, in one block", "[config]") {
  // Unknown keys and bad values together; one problem each, with its hint.
  const std::string values = [] {
    try {
      parse_config(json::parse(R"({"model": {"hidden_size": "big", "n_layer": 2}, "train": {"lr": -1, "stesp": 3},
                                   "data": {"seq_len": 0}})"),
                   {}, "cfg.json");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  CHECK_THAT(values, Catch::StartsWith("cfg.json: 5 problems:\n  - ") &&
                         Catch::Contains("\n  - unknown key 'model.n_layer' (did you mean 'model.num_hidden_layers'?)") &&
                         Catch::Contains("\n  - unknown key 'train.stesp' (did you mean 'train.steps'?)") &&
                         Catch::Contains("\n  - model.hidden_size = \"big\": expected an integer") &&
                         Catch::Contains("\n  - train.lr = -1: expected a value in [0, 10]") &&
                         Catch::Contains("\n  - data.seq_len = 0: expected an integer in [1, 67108864]"));
  // Every rule across keys, once the values are good.
  CHECK_THROWS_WITH(parse_config(json::parse(R"({"model": {"arch": "gpt2", "hidden_size": 30, "num_attention_heads": 4},
                                                 "data": {"seq_len": 2048, "source": "tokens"},
                                                 "train": {"lr": 1e-5}})"),
                                 {}, "cfg.json"),
                    Catch::StartsWith("cfg.json: 4 problems:") &&
                        Catch::Contains("\n  - model.hidden_size 30 is not divisible by model.num_attention_heads 4") &&
                        Catch::Contains("\n  - data.seq_len 2048 exceeds model.max_position_embeddings 1024") &&
                        Catch::Contains("\n  - data.path is required for data.source \"tokens\"") &&
                        Catch::Contains("\n  - train.min_lr 0.0001 exceeds train.lr 1e-05"));
  // An unknown arch is one more problem, not the only one (and no key is called foreign to it).
  CHECK_THROWS_WITH(parse_config(json::parse(R"({"train": {"lr": -1}, "model": {"arch": "bert", "mlp_bias": true,
                                                 "hidden_size": "big"}})"),
                                 {}, "cfg.json"),
                    Catch::StartsWith("cfg.json: 3 problems:") && Catch::Contains("\n  - model.arch = \"bert\"") &&
                        Catch::Contains("\n  - train.lr = -1: expected a value in [0, 10]") &&
                        Catch::Contains("\n  - model.hidden_size = \"big\": expected an integer"));
  // One problem stays one line.
  CHECK_THROWS_WITH(parse_config(json::parse(R"({"train": {"lr": -1}})"), {}, "cfg.json"),
                    Catch::Equals("cfg.json: train.lr = -1: expected a value in [0, 10]"));
}

TEST_CASE("a key autosp wrote itself is no warning; a value that would not apply is", "[config]") {
  // GPT-2 is always tied: the resolved config and a translated config.json write the key as true.
  CHECK(parse_config(json::parse(R"({"model": {"arch": "gpt2", "tie_word_embeddings": true}})")).warnings.empty());
  const Config g = parse_config(json::parse(R"({"model": {"arch": "gpt2", "tie_word_embeddings": false}})"));
  REQUIRE(g.warnings.size() == 1);
  CHECK_THAT(g.warnings[0], Catch::Contains("model.tie_word_embeddings does not apply to arch gpt2; ignored"));
  CHECK(g.model.tie_word_embeddings);
  // Every GPT-2 resolved config (which holds rope_theta, num_key_value_heads, intermediate_size and
  // tie_word_embeddings at the values autosp uses) parses back without a warning about them.
  for (const char* name : {"gpt2-tiny.json", "gpt2-sp2.json", "gpt2-zero-memory.json"}) {
    INFO(name);
    const Config c = load_config(std::string(AUTOSP_SOURCE_DIR) + "/configs/" + name);
    for (const std::string& w : parse_config(c.resolved).warnings) CHECK_THAT(w, !Catch::Contains("model."));
  }
  CHECK(parse_config(json::parse(R"({"model": {"arch": "gpt2", "rope_theta": 500000}})")).warnings.size() == 1);
}

TEST_CASE("null lifts a sliding window where the family has one", "[config]") {
  const Config m = parse_config(json::parse(R"({"model": {"arch": "mistral", "sliding_window": 64}})"),
                                {"model.sliding_window=null", "data.seq_len=128"});
  CHECK(m.model.sliding_window == 0);
  CHECK_FALSE(m.resolved["model"].contains("sliding_window"));
  CHECK(m.warnings.empty());
  CHECK(parse_config(json::parse(R"({"model": {"arch": "qwen2", "sliding_window": 64}})"),
                     {"model.sliding_window=null", "data.seq_len=128"})
            .model.sliding_window == 0);
  // Where there is no window, null is what autosp computes anyway: silent.
  for (const char* arch : {"gpt2", "llama"}) {
    INFO(arch);
    const Config c = parse_config(json{{"model", {{"arch", arch}}}}, {"model.sliding_window=null"});
    CHECK(c.model.sliding_window == 0);
    CHECK(c.warnings.empty());
  }
}

TEST_CASE("a sequence past the model's positions: refused for a learned table, a warning for RoPE", "[config]") {
  CHECK_THROWS_WITH(parse_config(json::parse(R"({"model": {"arch": "gpt2"}, "data": {"seq_len": 2048}})"), {}, "c.json"),
                    Catch::Equals("c.json: data.seq_len 2048 exceeds model.max_position_embeddings 1024 (gpt2's "
                                  "positions are a learned table of 1024 rows; train at most 1024 tokens)"));
  const Config l = parse_config(json::parse(R"({"model": {"arch": "llama", "max_position_embeddings": 512},
                                               "data": {"seq_len": 1024}})"),
                                {}, "c.json");
  REQUIRE(l.warnings.size() == 1);
  CHECK_THAT(l.warnings[0], Catch::StartsWith("c.json: data.seq_len 1024 exceeds model.max_position_embeddings 512 and "
                                              "the model has no rope_scaling"));
  // With rope scaling the positions are the scaling's to cover; within the table, nothing to say.
  CHECK(parse_config(json::parse(R"({"model": {"arch": "llama", "max_position_embeddings": 512,
                                             "rope_scaling": {"rope_type": "linear", "factor": 4}},
                                   "data": {"seq_len": 1024}})"))
            .warnings.empty());
  CHECK(parse_config(json::parse(R"({"model": {"arch": "qwen2", "max_position_embeddings": 1024},
                                   "data": {"seq_len": 1024}})"))
            .warnings.empty());
  // Said once with a DeepSpeed file too (the first parse waits for the cross-key rules).
  const Config first = parse_config(json::parse(R"({"model": {"arch": "llama", "max_position_embeddings": 512},
                                                    "data": {"seq_len": 1024}})"),
                                    {}, "c.json", false);
  CHECK(first.warnings.empty());
  CHECK(apply_deepspeed(first, json::object(), 1, "ds.json", "c.json").warnings.size() == 1);
}

TEST_CASE("config files that are not JSON are named errors", "[config]") {
  const test::TempDir tmp("config");
  const std::filesystem::path& dir = tmp.dir;
  auto path = (dir / "bad.json").string();
  std::ofstream(path) << "{\"model\": {";
  CHECK_THROWS_WITH(load_config(path), Catch::Contains("bad.json") && Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(load_config((dir / "missing.json").string()), Catch::Contains("cannot open"));
  std::ofstream(path, std::ios::trunc) << std::string("\x00\xff\xfe", 3);
  CHECK_THROWS_AS(load_config(path), UsageError);
}

TEST_CASE("the shipped configs are valid", "[config]") {
  for (const auto& e : std::filesystem::directory_iterator(std::string(AUTOSP_SOURCE_DIR) + "/configs")) {
    if (!e.is_regular_file()) continue;  // configs/deepspeed: DeepSpeed's files (tests/config/test_deepspeed.cpp)
    INFO(e.path());
    CHECK_NOTHROW(load_config(e.path().string()));
  }
}

namespace {

// Every key with a value other than its default (llama, so every key applies), written here and
// not taken from the schema: a schema key the resolved config leaves out, or one missing from this
// list, fails the test below.
const json kEveryKey = {
    {"model",
     {{"arch", "llama"}, {"vocab_size", 300}, {"hidden_size", 64}, {"num_hidden_layers", 3},
      {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
      {"max_position_embeddings", 512}, {"rope_theta", 500000.0}, {"norm_eps", 1e-5}, {"tie_word_embeddings", true},
      {"rope_scaling",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 64}}},
      {"head_dim", 16}, {"attention_bias", true}, {"attention_sinks", true}}},
    {"data",
     {{"source", "tokens"}, {"path", ""}, {"val_path", "val.bin"}, {"seq_len", 32}, {"batch_size", 3},
      {"eos_token_id", 0}, {"document_mask", true},
      {"mix", json::array({{{"path", "a/*.bin"}, {"weight", 0.75}, {"loss_mask_path", "a/*.npy"}},
                           {{"path", "b.bin"}, {"weight", 0.25}}})},
      {"shuffle", true}, {"seed", 5}, {"val_loss_mask_path", "val.npy"}}},
    {"train",
     {{"objective", "lm"}, {"steps", 7}, {"gradient_accumulation_steps", 3}, {"lr", 0.5}, {"min_lr", 0.25}, {"warmup_steps", 2}, {"weight_decay", 0.5}, {"beta1", 0.8},
      {"beta2", 0.9}, {"eps", 1e-6}, {"grad_clip", 2.0}, {"seed", 7}, {"log_every", 2}, {"eval_every", 3},
      {"eval_batches", 2}, {"checkpoint_dir", "ckpt"}, {"tensorboard_dir", "tb"}, {"csv_dir", "csv"}, {"checkpoint_every", 4}, {"keep_checkpoints", 1},
      {"max_shard_mb", 0.5}, {"save_timeout", 5.0}, {"gradient_accumulation_steps", 2},
      {"lr_schedule", "wsd"}, {"schedule_steps", 5}, {"decay_fraction", 0.2}, {"decay_type", "1-sqrt"},
      {"warmup_type", "linear"}, {"warmup_min_lr", 0.125}}},
    {"runtime",
     {{"device", "cuda"}, {"attention", "flash"}, {"dtype", "bfloat16"}, {"threads", 3},
      {"activation_checkpointing", true}, {"tiled_mlp", true}, {"tiled_loss", true}, {"fuse_kernels", false},
      {"moe_keep_projections", false},
      {"overlap_grad_sync", false}, {"grad_bucket_mb", 8.0}, {"peak_tflops", 989.0}, {"profile_ops", true}}},
    {"sequence_parallel", {{"autosp_size", 2}, {"ring_size", 2}}},
    {"zero_optimization", {{"stage", 3}}},
    {"moe", {{"expert_parallel_size", 1}}},  // > 1 needs experts and the CPU (tests/apps/expert_parallel_cli.sh)
    // lora.from (an adapter directory that must exist) is tested with the adapters (tests/train/test_lora.cpp).
    {"lora",
     {{"r", 4}, {"lora_alpha", 8.0}, {"lora_dropout", 0.0}, {"target_modules", {"q_proj", "v_proj", "o_proj"}},
      {"use_rslora", true}, {"modules_to_save", {"norm"}}, {"init_lora_weights", "gaussian"}}},
};

std::set<std::string> key_paths(const json& config) {
  std::set<std::string> paths;
  for (const auto& [section, body] : config.items())
    for (const auto& [key, v] : body.items()) paths.insert(section + "." + key);
  return paths;
}

}  // namespace

TEST_CASE("docs/config.md has a row for every key of the schema", "[config]") {
  std::ifstream in(std::string(AUTOSP_SOURCE_DIR) + "/docs/config.md");
  REQUIRE(in);
  std::stringstream page;
  page << in.rdbuf();
  const std::vector<std::string> keys = config_key_paths();
  CHECK(keys.size() >= 60);
  for (const std::string& k : keys) {
    INFO(k << ": add a row `| `" << k << "` | default | meaning |` to docs/config.md");
    CHECK(page.str().find(str("| `", k, "` |")) != std::string::npos);
  }
}

TEST_CASE("the resolved config holds every key, and parsing it again gives it back", "[config]") {
  const Config c = parse_config(kEveryKey, {}, "every.json");
  // No schedule reads every schedule key: wsd leaves the ds_ kinds' two (issue 48).
  CHECK(c.warnings == std::vector<std::string>{
                          "every.json: train.warmup_type does not apply to train.lr_schedule \"wsd\" (it reads train.lr, "
                          "train.warmup_steps, train.min_lr, train.schedule_steps, train.decay_fraction and "
                          "train.decay_type); ignored",
                          "every.json: train.warmup_min_lr does not apply to train.lr_schedule \"wsd\" (it reads "
                          "train.lr, train.warmup_steps, train.min_lr, train.schedule_steps, train.decay_fraction and "
                          "train.decay_type); ignored"});
  // Compared key by key first, so a failure names the key.
  CHECK(key_paths(c.resolved) == key_paths(kEveryKey));
  for (const auto& path : key_paths(kEveryKey)) {
    INFO(path);
    const json::json_pointer p("/" + path.substr(0, path.find('.')) + "/" + path.substr(path.find('.') + 1));
    CHECK(c.resolved.contains(p));
    if (c.resolved.contains(p)) CHECK(c.resolved[p] == kEveryKey[p]);
  }
  CHECK(c.resolved == kEveryKey);

  // GPT-2 and the defaults: the llama-only keys are still recorded (their defaults); rope_scaling,
  // head_dim, attention_bias, attention_sinks, mlp_bias and sliding_window (a mistral / qwen key,
  // so not in kEveryKey) are left out at their defaults.
  std::set<std::string> without_rope = key_paths(kEveryKey);
  for (const char* k : {"model.rope_scaling", "model.head_dim", "model.attention_bias", "model.attention_sinks", "data.mix",
                        "data.val_loss_mask_path"})
    without_rope.erase(k);
  for (const std::string& k : key_paths(kEveryKey))  // no lora section: no lora keys
    if (k.starts_with("lora.")) without_rope.erase(k);
  CHECK(key_paths(parse_config(json::object()).resolved) == without_rope);

  // data.loss_mask_path goes with data.path (kEveryKey has a mix): recorded, and read back.
  const Config masked = parse_config(json::object(), {"data.source=tokens", "data.path=t/*.bin", "data.loss_mask_path=t/*.npy"});
  CHECK(masked.resolved["data"]["loss_mask_path"] == "t/*.npy");
  CHECK(parse_config(masked.resolved).data.loss_mask_path == "t/*.npy");
  // train.objective "dpo": its section and data.pairs_path recorded, and read back (issue 44);
  // without it the dpo keys are left out (as lora's are).
  CHECK(!parse_config(json::object()).resolved.contains("dpo"));
  const Config dpo = parse_config(json::object(), {"data.source=tokens", "data.path=t/*.bin", "data.pairs_path=p/*.npy",
                                                   "data.loss_mask_path=t/*.npy",
                                                   "train.objective=dpo", "dpo.beta=0.25", "dpo.loss_type=ipo",
                                                   "dpo.rpo_alpha=0.5"});
  CHECK(key_paths({{"dpo", dpo.resolved["dpo"]}}) ==
        std::set<std::string>{"dpo.beta", "dpo.label_smoothing", "dpo.loss_type", "dpo.precompute_ref", "dpo.rpo_alpha"});
  const Config dpo_back = parse_config(dpo.resolved);
  CHECK(dpo_back.train.objective == Objective::dpo);
  CHECK(dpo_back.data.pairs_path == "p/*.npy");
  CHECK(dpo_back.dpo.beta == 0.25);
  CHECK(dpo_back.dpo.loss_type == "ipo");
  CHECK(dpo_back.dpo.rpo_alpha == 0.5);
  std::vector<Config> configs = {c, masked, parse_config(json::object()),
                                 parse_config(json::object(), {"model.arch=llama", "runtime.dtype=bfloat16"})};
  for (const auto& e : std::filesystem::directory_iterator(std::string(AUTOSP_SOURCE_DIR) + "/configs"))
    if (e.is_regular_file()) configs.push_back(load_config(e.path().string(), {"train.lr=0.01"}));
  for (const Config& a : configs) {
    INFO(a.resolved.dump());
    const Config b = parse_config(a.resolved, {}, "resolved");
    CHECK(b.resolved == a.resolved);
    CHECK(b.resolved.dump() == a.resolved.dump());  // byte for byte, as checkpoints record it
  }
}

TEST_CASE("a setting the run does not read is a warning naming it and what leaves it unread, once", "[config]") {
  auto warnings = [](const std::vector<std::string>& sets) { return parse_config(json::object(), sets, "run.json").warnings; };
  struct Row {
    std::vector<std::string> sets;
    std::vector<std::string> expected;  // whole warnings
  };
  const std::vector<Row> rows = {
      {{"train.lr_schedule=linear", "train.min_lr=1e-5"},
       {"run.json: train.min_lr does not apply to train.lr_schedule \"linear\" (it reads train.lr, train.warmup_steps "
        "and train.schedule_steps); ignored"}},
      {{"train.decay_fraction=0.2"},
       {"run.json: train.decay_fraction does not apply to train.lr_schedule \"cosine\" (it reads train.lr, "
        "train.warmup_steps, train.min_lr and train.schedule_steps); ignored"}},
      {{"train.lr_schedule=constant", "train.warmup_steps=5"},
       {"run.json: train.warmup_steps does not apply to train.lr_schedule \"constant\" (it reads only train.lr); "
        "ignored"}},
      {{"train.lr_schedule=constant_with_warmup", "train.warmup_type=linear", "train.schedule_steps=9"},
       {"run.json: train.schedule_steps does not apply to train.lr_schedule \"constant_with_warmup\" (it reads "
        "train.lr and train.warmup_steps); ignored",
        "run.json: train.warmup_type does not apply to train.lr_schedule \"constant_with_warmup\" (it reads train.lr "
        "and train.warmup_steps); ignored"}},
      {{"train.lr_schedule=ds_warmup", "train.min_lr=1e-5", "train.decay_type=linear"},
       {"run.json: train.min_lr does not apply to train.lr_schedule \"ds_warmup\" (it reads train.lr, "
        "train.warmup_steps, train.warmup_type and train.warmup_min_lr); ignored",
        "run.json: train.decay_type does not apply to train.lr_schedule \"ds_warmup\" (it reads train.lr, "
        "train.warmup_steps, train.warmup_type and train.warmup_min_lr); ignored"}},
      // every key its schedule reads: nothing to say
      {{"train.lr_schedule=wsd", "train.min_lr=1e-5", "train.decay_fraction=0.2", "train.decay_type=linear",
        "train.warmup_steps=3", "train.schedule_steps=50"},
       {}},
      {{"train.lr_schedule=ds_warmup_cosine", "train.min_lr=1e-5", "train.warmup_type=linear",
        "train.warmup_min_lr=1e-6", "train.schedule_steps=50"},
       {}},
      {{"data.source=tokens", "data.path=t.bin", "data.seed=3"},
       {"run.json: data.seed keys data.shuffle's order, and data.shuffle is false; ignored"}},
      {{"data.source=tokens", "data.path=t.bin", "data.seed=3", "data.shuffle=true"}, {}},
      {{"data.seed=3"},
       {"run.json: data.seed does nothing for data.source \"synthetic\" (it keys data.shuffle's order of a file); "
        "ignored"}},
      {{"train.keep_checkpoints=2", "train.checkpoint_every=5", "train.max_shard_mb=10"},
       {"run.json: train.checkpoint_every does nothing without train.checkpoint_dir; ignored",
        "run.json: train.keep_checkpoints does nothing without train.checkpoint_dir; ignored",
        "run.json: train.max_shard_mb does nothing without train.checkpoint_dir; ignored"}},
      {{"train.keep_checkpoints=2", "train.checkpoint_dir=ck"}, {}},
      {{"train.eval_batches=2"},
       {"run.json: train.eval_batches does nothing while train.eval_every is 0 (no validation runs); ignored"}},
      {{"train.eval_batches=2", "train.eval_every=5"}, {}},
      {{}, {}},  // defaults are never reported
  };
  for (const Row& r : rows) {
    INFO(r.sets.size() << " settings, the first " << (r.sets.empty() ? "" : r.sets[0]));
    CHECK(warnings(r.sets) == r.expected);
  }
  // A config another file completes (--deepspeed) says it once, after that file: its scheduler is
  // the one that counts.
  const Config first = parse_config(json::object(), {"train.warmup_min_lr=1e-6"}, "run.json", false);
  CHECK(first.warnings.empty());
  const Config ds = apply_deepspeed(first, json::parse(R"({"scheduler": {"type": "WarmupLR"}})"), 1, "ds.json", "run.json");
  CHECK(ds.warnings.empty());  // WarmupLR reads warmup_min_lr
  const Config cosine =
      apply_deepspeed(parse_config(json::object(), {"train.decay_fraction=0.2"}, "run.json", false),
                      json::parse(R"({"gradient_clipping": 1.0})"), 1, "ds.json", "run.json");
  CHECK(cosine.warnings.size() == 1);
}
