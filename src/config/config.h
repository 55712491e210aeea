// The run configuration (config.json + --set overrides), parsed once and validated against one
// schema table, which also writes the resolved config: an unknown key, a wrong type or a value out
// of range is a UsageError naming the key path. Strings with a fixed set of values become enums
// here (model.arch → Arch, data.source → DataSourceKind, runtime.device → DeviceKind,
// runtime.dtype → DType, runtime.attention → AttentionBackend, train.lr_schedule → LrSchedule), so code that uses the config
// switches over them and never re-validates. The model section is models/model_config.h (what the
// builders read); the rest is here. Knows nothing of graphs; of kernels only the neutral
// attention-backend enum (kernels/attention_backend.h).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/attention_backend.h"
#include "models/model_config.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace autosp {

// data.source (train/data.h describes each).
enum class DataSourceKind { synthetic, tokens, text };
std::string_view data_source_name(DataSourceKind s);  // "synthetic", "tokens", "text"

// One dataset of data.mix: a path (a file or a glob, read like data.path) and its weight (> 0, any
// scale: the weights are normalised).
struct DataMixEntry {
  std::string path;
  double weight = 1;
  std::string loss_mask_path;  // its loss masks, as data.loss_mask_path for data.path ("" = none)
  std::string doc_ids_path;    // its document ids, as data.doc_ids_path for data.path ("" = none)
};

struct DataConfig {
  DataSourceKind source = DataSourceKind::synthetic;
  std::string path;
  // Weighted datasets instead of `path`, mixed deterministically: sequence g of the run goes to a
  // dataset by a fixed schedule of the weights, and each dataset reads its own sequences in order
  // (its own epochs and shuffle; train/data_order.h). Empty = `path` alone.
  std::vector<DataMixEntry> mix;
  // A new seeded permutation of the sequences each epoch (train/data_order.h); validation data is
  // never shuffled. seed -1 = train.seed (Hugging Face's data_seed, which defaults to seed).
  bool shuffle = false;
  int64_t seed = -1;
  // Validation data (train.eval_every): read like `path`, with the same source; synthetic data
  // draws its validation sequences from a held-out stream instead (train/data.h).
  std::string val_path;
  int64_t seq_len = 256, batch_size = 4;
  // Packed documents: the separator already in the token stream (-1 = none), and whether attention
  // stays inside each document (then position_ids restart per document and an EOS's target,
  // the next document's first token, is ignored; train/data.h).
  int64_t eos_token_id = -1;
  bool document_mask = false;
  // Loss masks (supervised fine-tuning): a file or glob of one-dimensional .npy files (uint8 or
  // bool), one per token file of `path` (val_path) in the same sorted order and of the same length;
  // mask[t] = 0 ignores token t as a target (Hugging Face's labels[t] = -100; train/data.h).
  std::string loss_mask_path, val_loss_mask_path;
  // Preference pairs (train.objective "dpo"): a file or glob of one-dimensional int32 .npy files,
  // one per token file of `path` (val_path) in the same sorted order and of the same length, as
  // scripts/prepare_data.py --preference writes them: k + 1 on pair k's chosen sequence, −(k + 1)
  // on its rejected one, 0 elsewhere (train/data.h).
  std::string pairs_path, val_pairs_path;
  // Document ids (supervised fine-tuning under document_mask): int32 .npy files beside the token
  // files as for pairs_path, as scripts/prepare_data.py --chat and --completion write them: k + 1 on
  // example k's tokens, 0 on padding. Under document_mask a document is a run of one id (a 0 is one
  // of its own), not what lies between EOS tokens, so a chat template that ends turns with EOS
  // (Llama 2, Mistral, Zephyr) keeps a conversation one document (train/data.h).
  std::string doc_ids_path, val_doc_ids_path;
};

// train.lr_schedule (train/schedule.h gives each one's formula). The Hugging Face names are
// transformers' schedulers of that name; cosine is ours from the start (HF's cosine_with_min_lr with
// the warm-up counted from 1); the ds_ ones are DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR.
enum class LrSchedule {
  cosine, cosine_with_min_lr, linear, constant, constant_with_warmup, wsd,
  ds_warmup, ds_warmup_decay, ds_warmup_cosine,
};
std::string_view lr_schedule_name(LrSchedule s);  // "cosine", ..., "ds_warmup_cosine"
// train.decay_type: the shape of wsd's decay (HF's decay_type).
enum class DecayType { cosine, linear, one_minus_sqrt };
std::string_view decay_type_name(DecayType d);  // "cosine", "linear", "1-sqrt"
// train.warmup_type: the shape of the ds_ schedules' warm-up (DeepSpeed's warmup_type).
enum class WarmupType { log, linear };
std::string_view warmup_type_name(WarmupType w);  // "log", "linear"

// train.objective: the language-model loss (the token mean of the cross entropy), or DPO on
// preference pairs (data.pairs_path; the dpo section).
enum class Objective { lm, dpo };
std::string_view objective_name(Objective o);  // "lm", "dpo"

struct TrainConfig {
  Objective objective = Objective::lm;
  // The run's step count, the one place that holds it: autosp-train's --steps sets it (after every
  // --set), library callers with with_steps; every rule that depends on it (the schedule's) reads it.
  int64_t steps = 100;
  // Micro-batches of data.batch_size sequences per optimizer step (per dp rank): the global batch is
  // batch_size × gradient_accumulation_steps × dp, and the loss is the token mean over all of it.
  int64_t gradient_accumulation_steps = 1;
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_steps = 10;
  // The learning-rate schedule and its own keys (train/schedule.h): the steps it spans (0: the
  // run's, train.steps; DeepSpeed's total_num_steps), wsd's decay (the fraction of
  // those steps, rounded to the nearest step, and its shape), and the ds_ schedules' warm-up (its
  // shape and the lr it starts from: DeepSpeed's warmup_min_lr, or warmup_min_ratio × lr).
  LrSchedule lr_schedule = LrSchedule::cosine;
  int64_t schedule_steps = 0;
  double decay_fraction = 0.1;
  DecayType decay_type = DecayType::cosine;
  WarmupType warmup_type = WarmupType::log;
  double warmup_min_lr = 0;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
  int64_t seed = 1234, log_every = 10;
  // Validation: every eval_every steps and after the last (0 = never), the mean loss (and
  // accuracy) over the first eval_batches batches of the validation data (train/trainer.h).
  int64_t eval_every = 0, eval_batches = 8;
  std::string checkpoint_dir;
  // Curves (rank 0, every step, train/curves.h): TensorBoard event files under tensorboard_dir
  // (DeepSpeed's "tensorboard" section), one CSV <csv_dir>/metrics.csv (its "csv_monitor"); "" = none.
  std::string tensorboard_dir, csv_dir;
  int64_t checkpoint_every = 0;
  int64_t keep_checkpoints = 3;  // newest step_* directories kept under checkpoint_dir (0 = all)
  // A checkpoint's model weights above this many MB (10^6 bytes) are sharded, like save_pretrained's
  // max_shard_size (its default, "5GB").
  double max_shard_mb = 5000;
  // Seconds a preempted run (SIGTERM, SIGINT, SIGUSR1) has to finish its step and save (train/preempt.h).
  double save_timeout = 60;
};

struct RuntimeConfig {
  DeviceKind device = DeviceKind::cpu;  // "cpu" | "cuda"
  AttentionBackend attention = AttentionBackend::automatic;  // CUDA attention: "auto" | "flash" | "cudnn"
  // What the graph computes in: "float32", "float64", or "bfloat16" (mixed precision: f32 master
  // weights, bf16 compute; compiler/program.h master_dtype).
  DType dtype = DType::f32;
  int64_t threads = 0;  // 0 = OpenMP's default
  bool activation_checkpointing = false;
  // Llama's MLP as one tiled op (swiglu_mlp, kernels/cpu/mlp.h): no [S, intermediate] tensor is
  // planned, the backward recomputes the gate and up projections chunk by chunk.
  bool tiled_mlp = false;
  // The LM head and the loss as one tiled op (linear_cross_entropy_sum, kernels/cpu/loss.h): no
  // [S, vocab] logits are planned, the backward computes them again chunk by chunk; the graph
  // outputs each position's argmax ("predictions") instead of the logits.
  bool tiled_loss = false;
  // A mixture-of-experts layer keeps each token's gate and up projections for its backward instead
  // of computing them again (graph/passes/keep_moe_projections: CPU, f32 and f64 experts; +[2,
  // rows · top_k, expert width] per MoE layer from forward to backward, as PyTorch's autograd keeps
  // them). false: the backward recomputes them (less memory, two more GEMMs per expert).
  bool moe_keep_projections = true;
  // Fused kernels (residual add + norm, bias + GELU) by passes/fuse_elementwise before autograd.
  bool fuse_kernels = true;
  // Gradient all-reduce: buckets of about grad_bucket_mb MiB (DDP's bucket_cap_mb), each started
  // while the backward still runs when overlap_grad_sync (train/grad_sync.h).
  bool overlap_grad_sync = true;
  double grad_bucket_mb = 25;
  // Time every kernel call and log where the step's time goes, per op kind, at the end of the
  // run (engine/executor.h OpProfile; on CUDA each kernel is waited for, so steps are slower).
  bool profile_ops = false;
  // The device's dense peak in TFLOP/s for the log's MFU (model FLOPs per rank per second / peak);
  // 0: the detected GPU's dense bf16 peak (device/cuda/device.h), none on a CPU.
  double peak_tflops = 0;
};

struct SequenceParallelConfig {
  int64_t autosp_size = 1;
  // Ring attention (decision 99): P = autosp_size ranks are U × R, Ulysses over U = P / R
  // consecutive ranks and ring attention across the R groups. ring_size is R after parsing: the
  // written value, or with ring_auto ("auto") the smallest R whose U the query and key/value heads
  // allow (sequence_parallel_degrees).
  int64_t ring_size = 1;
  bool ring_auto = false;
};

// The Ulysses degree U for `sp` = P ranks and `ring` = R: P / R. Whether the heads allow it: U
// divides the query heads, and the key/value heads are a multiple of U (all-to-all'd) or divide
// it (replicated).
bool ulysses_fits(int64_t u, int64_t heads, int64_t kv_heads);
// "auto": the R of the largest U dividing P that the heads allow (U = 1, a pure ring, always does).
int64_t auto_ring_size(int64_t sp, int64_t heads, int64_t kv_heads);

// zero_optimization (DeepSpeed's section): stage 0 keeps the whole optimizer state on every rank;
// 1 shards the AdamW moments over the world (dp × sp), the gradients reduce-scattered to their
// owner; 2 also frees each gradient bucket once it is reduce-scattered; 3 shards the parameters
// too (train/train_state.h).
struct ZeroConfig {
  int64_t stage = 0;
};

// moe (a mixture of experts' parallelism): expert_parallel_size E > 1 splits every MoE layer's
// experts over E consecutive ranks, tokens travelling to their experts by all-to-all
// (graph/passes/expert_parallel.h; decision 162). It must divide the experts and the world size.
struct MoeParallelConfig {
  int64_t expert_parallel_size = 1;
};

// lora (PEFT's LoraConfig, its names and meanings; graph/passes/lora.h): a section given is a LoRA
// run, the base frozen and low-rank adapters trained on the target projections. Absent: every
// parameter trains, as before.
struct LoraConfig {
  bool enabled = false;  // the section is given
  int64_t r = 8;
  double lora_alpha = 8, lora_dropout = 0;
  // Module names the family row lists (models/family.h linear_modules); "all-linear" is all of
  // them, left out is PEFT's default for the family (lora_default_targets). Resolved while parsing.
  std::vector<std::string> target_modules;
  bool all_linear = false;  // written as "all-linear" (the resolved config keeps the spelling)
  bool use_rslora = false;  // scale lora_alpha / sqrt(r) instead of lora_alpha / r
  std::vector<std::string> modules_to_save;  // trained whole ("embed_tokens", "norm", "lm_head")
  // PEFT's init_lora_weights: "true" (A Kaiming-uniform, B zero), "false" (both as nn.Linear's
  // default: B nonzero, the adapter changes the model from the start), "gaussian" (A normal(0, 1/r)).
  std::string init_lora_weights = "true";
  std::string from;  // a PEFT adapter directory to continue ("" = fresh adapters)
  double scale() const;  // lora_alpha / r, or / sqrt(r) with use_rslora
};

// The ZeRO mode a run has, decided once from zero_optimization.stage and the world size: one rank
// has nothing to shard over, so every stage is `replicated` there. Whatever differs by stage (the
// program's passes, the training state, the memory plan's figures) asks this, never the stage and
// the world again.
enum class ZeroMode {
  replicated,          // whole parameters, gradients (all-reduced) and AdamW state on every rank
  sharded_moments,     // stage 1: gradients reduce-scattered into buckets, AdamW moments of the shard
  sharded_gradients,   // stage 2: stage 1, and each bucket freed once reduce-scattered
  sharded_parameters,  // stage 3: the parameters too, sharded and gathered in the graph
};
ZeroMode zero_mode(const ZeroConfig& z, int world_size);
std::string_view zero_mode_name(ZeroMode m);  // "replicated", "sharded_moments", ...

// The dpo section (train.objective "dpo"; TRL's DPOConfig names): the loss's beta, its loss_type
// ("sigmoid": DPO, "ipo"), label_smoothing (conservative DPO), rpo_alpha (the NLL of the chosen
// completions added with this weight; 0: none), and precompute_ref (the reference's log-probabilities
// computed in one pass over the data before training, then the reference dropped: train/preference.h).
struct DpoConfig {
  double beta = 0.1;
  std::string loss_type = "sigmoid";
  double label_smoothing = 0, rpo_alpha = 0;
  bool precompute_ref = false;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  RuntimeConfig runtime;
  SequenceParallelConfig sequence_parallel;
  ZeroConfig zero_optimization;
  MoeParallelConfig moe;
  // The layout keys written "auto" (sequence_parallel.autosp_size, zero_optimization.stage,
  // runtime.activation_checkpointing, runtime.tiled_mlp, runtime.tiled_loss,
  // moe.expert_parallel_size; decisions 124, 217): their
  // typed values above are placeholders until the layout search (apps/tools/layout_search.h
  // resolve_auto) sets them for the job's world at start-up and empties this. build_program refuses
  // a config that still has any.
  std::set<std::string> auto_keys;
  LoraConfig lora;
  DpoConfig dpo;
  // Every schema key with its value after defaults and overrides (model.rope_scaling only when
  // set), as the log echoes it and a checkpoint's meta.json records it; parsing it again gives it
  // back. Code reads the typed sections above, not this.
  nlohmann::json resolved;
  // Keys that do not apply to the chosen arch, HF settings accepted but not applied (a dropout),
  // data.val_path without validation.
  std::vector<std::string> warnings;
  std::vector<std::string> notes;     // for the log: model.from's accepted keys and overrides
  // The keys the user wrote (the config file after --set, before defaults and model.from): what
  // another source of keys (a DeepSpeed config, config/deepspeed.h) must agree with.
  nlohmann::json given;
  // Where a key's value came from, for the keys another file decided ("ds.json
  // optimizer.params.lr", "DeepSpeed's default: no clipping"); every other key is the run
  // config's (in `given`) or our default. recipe_text reads it.
  std::map<std::string, std::string> sources;
  // model.from: the Hugging Face model directory the architecture came from, whose weights start
  // the run unless --init-from or --resume say otherwise ("" = none).
  std::string model_from;
  // The keys of model.from's config.json (or of a bare HF config.json given as the config) that do
  // not change the math, with their values (HfModelConfig::carried): a checkpoint's config.json
  // writes them back.
  nlohmann::json hf_carried = nlohmann::json::object();
};

// Parse and validate. `j` may also be a bare Hugging Face config.json (models/hf_config.h): its
// architecture with freshly initialised weights, as transformers' from_config. `overrides` are
// "key.path=value" strings (--set); a value is read as JSON when it parses (numbers, true/false),
// otherwise as a string. `origin` names the source in errors. Without `cross_key_rules` only each
// key's own type, range and choices are checked: for a config another file completes (a DeepSpeed
// config, config/deepspeed.h), which parses the result again with them.
Config parse_config(const nlohmann::json& j, const std::vector<std::string>& overrides = {},
                    const std::string& origin = "config", bool cross_key_rules = true);
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   bool cross_key_rules = true);

// The keys of the learning-rate schedules besides train.lr (which every kind reads), and those of
// them that kind `s` reads (train/schedule.h gives each kind's formula; tests/train/test_schedule.cpp
// checks this against lr_at). The config's rules read it: min_lr ≤ lr only where min_lr is read,
// and a schedule key the config gives that its schedule does not read is a warning.
const std::vector<std::string_view>& schedule_keys();
std::vector<std::string_view> schedule_reads(LrSchedule s);

// `c` for a run of `steps` steps (train.steps, as --steps sets it): the value checked like the key,
// and the schedule's rules checked against it; a UsageError naming `origin` otherwise.
Config with_steps(Config c, int64_t steps, const std::string& origin = "steps");

// Whether a sequence of `seq` tokens fits the model's positions; `what` names the length in the
// messages ("data.seq_len 4096", "S = 4096"). Learned positions (GPT-2's table of
// max_position_embeddings rows) end at the table: `refused` says so. RoPE takes any position, but
// past max_position_embeddings without rope_scaling the model meets positions it was not trained
// on: `warning` says so. Both empty: it fits.
struct PositionsCheck {
  std::string refused, warning;
};
PositionsCheck check_positions(const ModelConfig& m, int64_t seq, const std::string& what);

// The effective training recipe as one block for the log: the optimizer, the learning-rate
// schedule (and the keys it reads), clipping, the batch triple (micro × accumulation × dp, for a
// job of `world_size` ranks), the ZeRO stage and the precision, each value with where it came
// from: a DeepSpeed file (Config::sources), the run config (Config::given), or the default.
std::string recipe_text(const Config& c, int world_size);

// What is wrong with `v` as the value of the schema key `path` (its type, range or choices), or
// nothing: for keys that come from elsewhere (a DeepSpeed config) and are named there.
std::optional<std::string> config_value_problem(const std::string& path, const nlohmann::json& v);

// Every key of the schema ("model.arch", ...), in the schema's order: what docs/config.md lists.
std::vector<std::string> config_key_paths();

// JSON text from `origin` (a config file, a checkpoint's meta.json): invalid JSON, or nesting
// deeper than 32 levels (which would only recurse deeply later), is a UsageError naming `origin`.
nlohmann::json parse_json(const std::string& text, const std::string& origin);

}  // namespace autosp
