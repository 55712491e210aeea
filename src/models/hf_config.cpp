// Hugging Face config.json ↔ our model keys: the model-key table (models/model_keys.h) renames,
// each family's HF row here gives its class's defaults, the settings we cannot train (each an
// error naming its key) and what a checkpoint writes besides the keys; one list holds the keys
// that do not change the math. Defaults are transformers 4.44's.
#include "models/hf_config.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "tensor/check.h"
#include "tensor/input_file.h"

namespace autosp {
namespace {

using json = nlohmann::json;

// Keys of PretrainedConfig, generation defaults and the config classes that do not change the
// forward math of a causal LM trained here: accepted, and listed once in the log.
const std::set<std::string>& math_free_keys() {
  static const std::set<std::string> k = {
      "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "use_cache",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "initializer_range", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
      "use_bfloat16", "tf_legacy_loss", "tie_encoder_decoder", "is_decoder", "chunk_size_feed_forward",
      "cross_attention_hidden_size", "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix",
      "problem_type", "task_specific_params", "max_length", "min_length", "do_sample", "early_stopping",
      "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
      "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
      "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
      "suppress_tokens", "begin_suppress_tokens", "_attn_implementation", "_attn_implementation_autoset",
      "gradient_checkpointing",
      // transformers 5's name for torch_dtype.
      "dtype",
      // GPT-2: the double-heads model's summary head, the legacy context key, the fp32 upcast.
      "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
      "summary_first_dropout", "n_ctx", "reorder_and_upcast_attn",
      // Llama: pretraining_tp splits the projections into slices whose sum is the same product.
      "pretraining_tp",
      // Hub metadata other tools write and transformers ignores: SmolLM's marker from its nanotron
      // conversion and its transformers.js (ONNX) export settings; GPT-2's legacy keys from the
      // original OpenAI GPT double-heads model (special tokens GPT-2 never had).
      "is_llama_config", "transformers.js_config", "n_special", "predict_special_tokens",
      // Gemma: the kind of KV cache generate() makes ("hybrid": local layers keep their window).
      "cache_implementation",
      // gpt-oss's hub config.json: keys of OpenAI's own format that GptOssConfig does not read
      // (num_experts_per_tok and rope_scaling's original_max_position_embeddings say them).
      "experts_per_token", "initial_context_length"};
  return k;
}

// The math-free keys that describe the file, not the model: not carried into a checkpoint's
// config.json (it writes its own).
const std::set<std::string>& file_keys() {
  static const std::set<std::string> k = {"_name_or_path", "architectures", "model_type", "transformers_version",
                                          "torch_dtype", "dtype", "use_cache", "_attn_implementation",
                                          "_attn_implementation_autoset"};
  return k;
}

// Keys transformers spells two ways (4.x's name and 5.x's) that the translation does not read
// otherwise: a file may give both, and then they must say the same, as rope_theta and
// rope_parameters.rope_theta must (rope_from_hf), and rope_type and type inside a rope section
// (parse_rope_scaling). A null is as absent.
const std::vector<std::pair<const char*, const char*>> kTwoSpellings = {{"torch_dtype", "dtype"}};

// Settings we do not train whose value must be the one that leaves the model plain, which is the
// value autosp computes: at it, the key is accepted; at another, refused saying why and what to do.
// Each row is (key, accepted values as JSON, what we support, what to do; "" when nothing will).
struct Required {
  const char* key;
  std::vector<json> ok;
  const char* what;
  const char* fix = "";
};
const std::vector<Required> kCommonRequired = {
    {"is_encoder_decoder", {false}, "a decoder-only model"},
    {"pruned_heads", {json::object()}, "every head is present"},
    {"quantization_config", {nullptr}, "unquantized weights",
     "dequantize the model first (load it and save_pretrained it in bfloat16 or float32)"},
};
// The Llama layout's RoPE and attention, as files of its families carry them: SmolLM's
// rope_interleaved (from nanotron), Qwen2.5's use_mrope (Qwen2-VL's 3-D positions; its text
// models write false) and Qwen2.5-1M's dual_chunk_attention_config (vLLM's long-context attention;
// transformers ignores it, but the model's context length relies on it).
const std::vector<Required> kLlamaLayoutRequired = {
    {"rope_interleaved", {false}, "autosp's RoPE rotates the two halves of each head (rotate_half), not interleaved pairs",
     "permute the q_proj and k_proj rows into the half layout, as transformers' conversion scripts do, and set it false"},
    {"use_mrope", {false}, "multimodal RoPE (Qwen2-VL's 3-D positions) is not implemented; autosp's RoPE is 1-D",
     "train the text model: set use_mrope false"},
    {"dual_chunk_attention_config", {nullptr}, "dual chunk attention (Qwen2.5-1M's long-context attention in vLLM) "
     "is not implemented; autosp's attention is full causal",
     "remove it (or set it null) to train with full causal attention, as transformers computes it"},
};
const std::vector<const char*> kDropouts = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"};

// A family's HF config class beyond its name (Family::hf_config_class): transformers 4.44's default
// of each of its model keys (by our name; Qwen3Config's of 4.51+), the settings it has that we
// cannot train (each value must be one that leaves the model plain), and what a checkpoint's
// config.json writes besides the model keys.
struct HfFamily {
  json defaults;
  std::vector<Required> required;
  json written;
  // The quantization_config.quant_method the loader dequantizes (gpt-oss's "mxfp4":
  // models/mxfp4.h), accepted on load and not written back (a checkpoint is dequantized); none:
  // every quantization_config is refused.
  const char* quantization = nullptr;
};

const json kLlamaFamilyDefaults = {{"hidden_size", 4096},       {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                                   {"rope_theta", 10000.0},     {"tie_word_embeddings", false}};
json with_defaults(json d) {
  d.update(kLlamaFamilyDefaults);
  return d;
}
// A mixture-of-experts class's defaults: its own (they differ from Llama's), and the aux loss's.
json moe_defaults(json d) {
  d.update({{"tie_word_embeddings", false}, {"output_router_logits", false}, {"router_aux_loss_coef", 0.001}});
  return d;
}
const json kSiluWritten = {{"hidden_act", "silu"}, {"attention_dropout", 0.0}};
// A Llama-layout family's refused settings: its activation (silu), the layout's, and `more`.
std::vector<Required> llama_required(const char* act, std::vector<Required> more = {}) {
  std::vector<Required> r = {{"hidden_act", {"silu"}, act}};
  r.insert(r.end(), kLlamaLayoutRequired.begin(), kLlamaLayoutRequired.end());
  r.insert(r.end(), more.begin(), more.end());
  return r;
}

// Gemma's MLP: hidden_activation is what its MLP reads (Gemma2Config's hidden_act is unused);
// Gemma 3's bidirectional attention (EmbeddingGemma's) is not causal.
std::vector<Required> gemma_required() {
  std::vector<Required> r = {
      {"hidden_activation", {"gelu_pytorch_tanh"}, "autosp's Gemma MLP is GeGLU with the tanh GELU (gelu_pytorch_tanh)"},
      {"hidden_act", {"gelu_pytorch_tanh", "gelu", nullptr}, "Gemma's MLP reads hidden_activation"},
      {"use_bidirectional_attention", {false, nullptr}, "autosp's attention is causal"}};
  r.insert(r.end(), kLlamaLayoutRequired.begin(), kLlamaLayoutRequired.end());
  return r;
}
const json kGemmaWritten = {{"hidden_activation", "gelu_pytorch_tanh"}, {"hidden_act", "gelu_pytorch_tanh"},
                            {"attention_dropout", 0.0}};

// In Arch order (checked by hf_family).
const std::vector<HfFamily>& hf_families() {
  static const std::vector<HfFamily> rows = {
      {.defaults = {{"vocab_size", 50257}, {"hidden_size", 768}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
                    {"max_position_embeddings", 1024}, {"norm_eps", 1e-5}},
       .required = {{"activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "autosp's GPT-2 uses the tanh GELU (gelu_new)"},
                    {"scale_attn_weights", {true}, "attention is scaled by 1/sqrt(head dim)"},
                    {"scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scaling"},
                    {"tie_word_embeddings", {true}, "GPT-2's lm_head is tied to wte"},
                    {"add_cross_attention", {false}, "a decoder-only model"},
                    {"sliding_window", {nullptr}, "attention is full causal (no sliding window)",
                     "remove it: GPT2Config has no window"}},
       .written = {{"n_inner", nullptr}, {"activation_function", "gelu_new"}, {"resid_pdrop", 0.0},
                   {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"scale_attn_weights", true},
                   {"tie_word_embeddings", true}}},
      {.defaults = with_defaults({{"vocab_size", 32000}, {"intermediate_size", 11008}, {"max_position_embeddings", 2048},
                                  {"norm_eps", 1e-6}, {"attention_bias", false}, {"mlp_bias", false}}),
       .required = llama_required("autosp's Llama MLP is SwiGLU (silu)",
                                  {{"use_sliding_window", {false}, "attention is full causal",
                                    "remove it: LlamaConfig has no window"},
                                   {"sliding_window", {nullptr}, "attention is full causal (no sliding window)",
                                    "remove it: LlamaConfig has no window"}}),
       .written = kSiluWritten},
      {.defaults = with_defaults({{"vocab_size", 32000}, {"intermediate_size", 14336}, {"num_key_value_heads", 8},
                                  {"max_position_embeddings", 4096 * 32}, {"norm_eps", 1e-6}, {"sliding_window", 4096}}),
       .required = llama_required("autosp's Mistral MLP is SwiGLU (silu)"),
       .written = kSiluWritten},
      {.defaults = with_defaults({{"vocab_size", 151936}, {"intermediate_size", 22016}, {"num_key_value_heads", 32},
                                  {"max_position_embeddings", 32768}, {"norm_eps", 1e-6}, {"sliding_window", 4096}}),
       .required = llama_required("autosp's Qwen MLP is SwiGLU (silu)"),
       .written = kSiluWritten},
      {.defaults = with_defaults({{"vocab_size", 151936}, {"intermediate_size", 22016}, {"num_key_value_heads", 32},
                                  {"max_position_embeddings", 32768}, {"norm_eps", 1e-6}, {"head_dim", 128},
                                  {"attention_bias", false}, {"sliding_window", 4096}}),
       .required = llama_required("autosp's Qwen MLP is SwiGLU (silu)"),
       .written = kSiluWritten},
      // The mixtures of experts (MixtralConfig, Qwen2MoeConfig; Qwen3MoeConfig of 4.51+).
      {.defaults = moe_defaults({{"vocab_size", 32000}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                                 {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                                 {"max_position_embeddings", 4096 * 32}, {"rope_theta", 1e6}, {"norm_eps", 1e-5},
                                 {"sliding_window", nullptr}, {"num_local_experts", 8}, {"num_experts_per_tok", 2}}),
       .required = llama_required("autosp's Mixtral experts are SwiGLU (silu)",
                                  {{"router_jitter_noise", {0, 0.0}, "the router has no jitter noise (transformers "
                                    "multiplies the hidden states by noise in training)", "set it to 0"}}),
       .written = {{"hidden_act", "silu"}, {"attention_dropout", 0.0}, {"router_jitter_noise", 0.0}}},
      {.defaults = moe_defaults({{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5632},
                                 {"num_hidden_layers", 24}, {"num_attention_heads", 16}, {"num_key_value_heads", 16},
                                 {"max_position_embeddings", 32768}, {"rope_theta", 10000.0}, {"norm_eps", 1e-6},
                                 {"sliding_window", 4096}, {"num_experts", 60}, {"num_experts_per_tok", 4},
                                 {"moe_intermediate_size", 1408}, {"shared_expert_intermediate_size", 5632},
                                 {"decoder_sparse_step", 1}, {"norm_topk_prob", false}, {"mlp_only_layers", nullptr}}),
       .required = llama_required("autosp's Qwen2-MoE experts are SwiGLU (silu)"),
       .written = kSiluWritten},
      {.defaults = moe_defaults({{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144},
                                 {"num_hidden_layers", 24}, {"num_attention_heads", 32}, {"num_key_value_heads", 4},
                                 {"max_position_embeddings", 32768}, {"rope_theta", 10000.0}, {"norm_eps", 1e-6},
                                 {"head_dim", 128}, {"attention_bias", false}, {"sliding_window", 4096},
                                 {"num_experts", 128}, {"num_experts_per_tok", 8}, {"moe_intermediate_size", 768},
                                 {"decoder_sparse_step", 1}, {"norm_topk_prob", false}, {"mlp_only_layers", nullptr}}),
       .required = llama_required("autosp's Qwen3-MoE experts are SwiGLU (silu)"),
       .written = kSiluWritten},
      // Gemma2Config (4.44) and Gemma3TextConfig (4.50+): Gemma 3 has no softcaps by default.
      {.defaults = {{"vocab_size", 256000}, {"hidden_size", 3072}, {"intermediate_size", 24576},
                    {"num_hidden_layers", 28}, {"num_attention_heads", 16}, {"num_key_value_heads", 16},
                    {"head_dim", 256}, {"max_position_embeddings", 8192}, {"rope_theta", 10000.0}, {"norm_eps", 1e-6},
                    {"attention_bias", false}, {"sliding_window", 4096}, {"sliding_window_pattern", 2},
                    {"query_pre_attn_scalar", 224}, {"attn_logit_softcapping", 50.0},
                    {"final_logit_softcapping", 30.0}, {"tie_word_embeddings", true}, {"pad_token_id", 0}},
       .required = gemma_required(),
       .written = kGemmaWritten},
      {.defaults = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                    {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                    {"head_dim", 256}, {"max_position_embeddings", 131072}, {"rope_theta", 1e6}, {"norm_eps", 1e-6},
                    {"attention_bias", false}, {"sliding_window", 4096}, {"sliding_window_pattern", 6},
                    {"query_pre_attn_scalar", 256}, {"rope_local_base_freq", 10000.0}, {"tie_word_embeddings", true},
                    {"pad_token_id", 0}},
       .required = gemma_required(),
       .written = kGemmaWritten},
      // GptOssConfig (transformers 5's defaults; its rope_parameters default is this yarn).
      {.defaults = moe_defaults({{"vocab_size", 201088}, {"hidden_size", 2880}, {"intermediate_size", 2880},
                                 {"num_hidden_layers", 36}, {"num_attention_heads", 64}, {"num_key_value_heads", 8},
                                 {"head_dim", 64}, {"max_position_embeddings", 131072}, {"rope_theta", 150000.0},
                                 {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0},
                                                   {"beta_slow", 1.0}, {"truncate", false},
                                                   {"original_max_position_embeddings", 4096}}},
                                 {"norm_eps", 1e-5}, {"sliding_window", 128},
                                 {"num_local_experts", 128}, {"num_experts_per_tok", 4}, {"swiglu_limit", 7.0},
                                 {"swiglu_alpha", 1.702}}),
       .required = llama_required("gpt-oss's config says silu (its experts' clamped SwiGLU does not read it)",
                                  {{"attention_bias", {true}, "gpt-oss's attention has q/k/v/o biases"}}),
       .written = {{"hidden_act", "silu"}, {"attention_dropout", 0.0}, {"attention_bias", true}},
       .quantization = "mxfp4"},
  };
  return rows;
}
const HfFamily& hf_family(Arch a) {
  AUTOSP_ASSERT(hf_families().size() == kNumArchs, "every family needs its HF row (models/hf_config.cpp)");
  return hf_families()[static_cast<size_t>(a)];
}

// The family that model_type (our model.arch) `name` spells.
const Family* family_named(const std::string& name) {
  for (const Family& f : families())
    if (f.name == name) return &f;
  return nullptr;
}

// The model_type an architectures entry names: its family's model class, or a class named by a
// family's prefix ("GPT2DoubleHeadsModel"); else the entry itself.
std::string model_type_of_class(const std::string& cls) {
  for (const Family& f : families())
    if (cls == f.hf_model_class || (!f.hf_class_prefix.empty() && cls.rfind(f.hf_class_prefix, 0) == 0))
      return std::string(f.name);
  return cls;
}

// Our key → HF's, for messages about a directory's config.json.
std::string hf_name(Arch arch, const std::string& ours) {
  const ModelKey* k = find_model_key(ours);
  const std::string_view n = k ? hf_key_name(*k, family(arch)) : std::string_view();
  return n.empty() ? ours : std::string(n);
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

}  // namespace

bool is_hf_config(const json& j) {
  if (!j.is_object() || !(j.contains("model_type") || j.contains("architectures"))) return false;
  for (const char* section : {"model", "data", "train", "runtime", "sequence_parallel"})
    if (j.contains(section)) return false;
  return true;
}

RopeScalingConfig parse_rope_scaling(const json& j, const std::string& where) {
  RopeScalingConfig s;
  if (j.is_null()) return s;
  auto bad = [&](const std::string& what) { throw UsageError(str(where, ": ", what)); };
  if (!j.is_object()) bad(str("expected an object or null, got ", j.dump()));
  const json type = j.contains("rope_type") ? j["rope_type"] : j.contains("type") ? j["type"] : json();
  if (j.contains("rope_type") && j.contains("type") && j["rope_type"] != j["type"])  // 4.x's old name and its new one
    bad(str("rope_type = ", j["rope_type"].dump(), " differs from type = ", j["type"].dump(),
            " (two spellings of one setting: they must agree)"));
  if (!type.is_string()) bad("needs \"rope_type\": \"linear\", \"llama3\" or \"yarn\" (or \"default\")");
  const std::string t = type.get<std::string>();
  if (t != "default" && t != "linear" && t != "llama3" && t != "yarn")
    bad(str("rope_type \"", t, "\" is not supported (supported: linear, llama3, yarn, default)"));
  std::set<std::string> allowed = {"rope_type", "type"};
  if (t != "default") allowed.insert("factor");
  if (t == "llama3") allowed.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (t == "yarn")
    allowed.insert({"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
                    "mscale_all_dim", "truncate"});
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key())) bad(str("'", it.key(), "' does not apply to rope_type \"", t, "\""));
  if (t == "default") return s;
  auto number = [&](const char* k, double lo) {
    if (!j.contains(k) || !j[k].is_number()) bad(str("rope_type \"", t, "\" needs \"", k, "\" (a number)"));
    const double v = j[k].get<double>();
    if (!(v >= lo) || !std::isfinite(v)) bad(str("\"", k, "\" = ", v, ": expected a number >= ", lo));
    return v;
  };
  // An optional positive number (HF's `.get(k) or default`: null and absent alike); 0 = absent.
  auto optional_positive = [&](const char* k) {
    if (!j.contains(k) || j[k].is_null()) return 0.0;
    const double v = j[k].is_number() ? j[k].get<double>() : -1;
    if (!(v > 0) || !std::isfinite(v)) bad(str("\"", k, "\" = ", j[k].dump(), ": expected a positive number"));
    return v;
  };
  auto original = [&](bool required) -> int64_t {
    const char* k = "original_max_position_embeddings";
    if (!required && (!j.contains(k) || j[k].is_null())) return 0;
    if (!j.contains(k) || !j[k].is_number_integer() || j[k].get<int64_t>() < 1)
      bad(str("rope_type \"", t, "\" needs \"", k, "\" (a positive integer)"));
    return j[k].get<int64_t>();
  };
  s.rope_type = t;
  s.factor = number("factor", 1);
  if (t == "llama3") {
    s.low_freq_factor = number("low_freq_factor", 1e-6);
    s.high_freq_factor = number("high_freq_factor", 1e-6);
    if (!(s.high_freq_factor > s.low_freq_factor))
      bad(str("high_freq_factor ", s.high_freq_factor, " must exceed low_freq_factor ", s.low_freq_factor));
    s.original_max_position_embeddings = original(true);
  }
  if (t == "yarn") {
    s.original_max_position_embeddings = original(false);  // 0: the model's max_position_embeddings
    s.beta_fast = optional_positive("beta_fast");
    s.beta_slow = optional_positive("beta_slow");
    s.attention_factor = optional_positive("attention_factor");
    s.mscale = optional_positive("mscale");
    s.mscale_all_dim = optional_positive("mscale_all_dim");
    if (j.contains("truncate") && !j["truncate"].is_boolean())
      bad(str("\"truncate\" = ", j["truncate"].dump(), ": expected true or false"));
    s.truncate = j.value("truncate", true);
  }
  return s;
}

json rope_scaling_json(const RopeScalingConfig& s) {
  if (s.rope_type.empty()) return nullptr;
  json j = {{"rope_type", s.rope_type}, {"factor", s.factor}};
  if (s.rope_type == "llama3") {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
    j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  if (s.rope_type == "yarn") {  // only what was given, so HF applies its own defaults as we do
    if (s.original_max_position_embeddings > 0) j["original_max_position_embeddings"] = s.original_max_position_embeddings;
    for (auto [k, v] : {std::pair{"beta_fast", s.beta_fast}, {"beta_slow", s.beta_slow},
                        {"attention_factor", s.attention_factor}, {"mscale", s.mscale}, {"mscale_all_dim", s.mscale_all_dim}})
      if (v > 0) j[k] = v;
    if (!s.truncate) j["truncate"] = false;
  }
  return j;
}

// The rope settings of a config.json into the model section (rope_theta, rope_scaling): 4.x's
// rope_theta and rope_scaling, transformers 5's rope_parameters (rope_theta inside), or both
// spellings, which must then agree (our checkpoints write both).
void rope_from_hf(const json& hf, const Family&, HfImport& out) {
  json& m = out.model;
  std::vector<std::string>& errors = out.errors;
  out.used.insert({"rope_scaling", "rope_parameters"});
  std::optional<RopeScalingConfig> scaling;
  try {
    if (hf.contains("rope_scaling")) scaling = parse_rope_scaling(hf["rope_scaling"], "rope_scaling");
  } catch (const UsageError& e) {
    errors.push_back(e.what());
    return;
  }
  if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
    const json& rp = hf["rope_parameters"];
    if (!rp.is_object()) {
      errors.push_back(str("rope_parameters = ", rp.dump(), ": expected an object"));
      return;
    }
    json rest = rp;
    if (rest.contains("partial_rotary_factor")) {
      if (!(rest["partial_rotary_factor"].is_number() && rest["partial_rotary_factor"].get<double>() == 1.0)) {
        errors.push_back(str("rope_parameters.partial_rotary_factor = ", rest["partial_rotary_factor"].dump(),
                             " is not supported (RoPE rotates the whole head)"));
        return;
      }
      rest.erase("partial_rotary_factor");
    }
    if (rest.contains("rope_theta")) {
      const json& theta = rest["rope_theta"];
      if (!theta.is_number()) {
        errors.push_back(str("rope_parameters.rope_theta = ", theta.dump(), ": expected a number"));
        return;
      }
      if (hf.contains("rope_theta") && !(hf["rope_theta"].is_number() && hf["rope_theta"].get<double>() == theta.get<double>())) {
        errors.push_back(str("rope_theta = ", hf["rope_theta"].dump(), " differs from rope_parameters.rope_theta = ", theta.dump()));
        return;
      }
      m["rope_theta"] = theta;
      rest.erase("rope_theta");
    }
    if (!rest.contains("rope_type") && !rest.contains("type")) rest["rope_type"] = "default";  // 5.x's default
    try {
      const RopeScalingConfig p = parse_rope_scaling(rest, "rope_parameters");
      if (scaling && !(*scaling == p)) {
        errors.push_back(str("rope_scaling = ", hf["rope_scaling"].dump(), " differs from rope_parameters = ", rp.dump()));
        return;
      }
      scaling = p;
    } catch (const UsageError& e) {
      errors.push_back(e.what());
      return;
    }
  }
  // Neither spelling: the class's default (GptOssConfig's yarn), else none.
  if (!scaling && out.defaults.contains("rope_scaling")) scaling = parse_rope_scaling(out.defaults["rope_scaling"], "rope_scaling");
  if (scaling && !scaling->rope_type.empty()) m["rope_scaling"] = rope_scaling_json(*scaling);
}

void rope_to_hf(const ModelConfig& m, const Family&, json& hf) {
  // Both spellings: 4.x's rope_theta + rope_scaling and transformers 5's rope_parameters (rope_theta
  // inside); each version reads its own and 5.x accepts both.
  const json scaling = rope_scaling_json(m.rope_scaling);
  json parameters = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
  parameters["rope_theta"] = m.rope_theta;
  hf["rope_scaling"] = scaling;
  hf["rope_parameters"] = parameters;
}

// The sliding window: Mistral's applies when set; Qwen's only with use_sliding_window true. Left
// out, it is the class's default (4096 for both, as transformers reads it). A window is kept as
// model.sliding_window (config/ refuses one shorter than the sequence).
void window_from_hf(const json& hf, const Family& f, HfImport& out) {
  out.used.insert({"sliding_window", "use_sliding_window"});
  const bool applies = f.window == Window::key || f.window == Window::pattern || f.window == Window::alternating ||
                       (hf.contains("use_sliding_window") && hf["use_sliding_window"] == true);
  if (hf.contains("use_sliding_window") && !hf["use_sliding_window"].is_boolean())
    out.errors.push_back(str("use_sliding_window = ", hf["use_sliding_window"].dump(), ": expected true or false"));
  const json w = hf.contains("sliding_window") ? hf["sliding_window"] : out.defaults.value("sliding_window", json());
  if (applies && !w.is_null()) {
    if (!w.is_number_integer() || w.get<int64_t>() < 1)
      out.errors.push_back(str("sliding_window = ", w.dump(), ": expected a positive integer or null"));
    else
      out.model["sliding_window"] = w;
  }
}

void window_to_hf(const ModelConfig& m, const Family& f, json& hf) {
  hf["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json();
  if (f.window == Window::switched) hf["use_sliding_window"] = m.sliding_window > 0;
  // Every layer's kind, as transformers 5 reads it (4.x keeps it as an unused attribute).
  std::vector<std::string> kinds;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l)
    kinds.push_back(m.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
  if (f.window != Window::none && f.window != Window::key) hf["layer_types"] = kinds;
  else if (!m.layer_types.empty()) hf["layer_types"] = kinds;
}

namespace {

// The layer_types that Gemma's sliding_window_pattern (the model section's, else the family's) gives
// `layers` layers; gpt-oss's alternation is the pattern 2.
json pattern_kinds(const json& m, const Family& f, size_t layers) {
  const json p = m.value("sliding_window_pattern", json());
  const int64_t pattern = f.window == Window::alternating ? 2
                          : p.is_number_integer() && p.get<int64_t>() > 0 ? p.get<int64_t>() : f.window_pattern;
  json kinds = json::array();
  for (size_t l = 0; l < layers; ++l)
    kinds.push_back((static_cast<int64_t>(l) + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  return kinds;
}

// transformers 5's layer_types: every layer's attention. A windowed family (Family::window) with a
// window keeps it as model.layer_types ("sliding_attention" layers get the window), unless it is
// what Gemma's pattern says anyway (so that a checkpoint's config.json reads back as it was
// written); otherwise every layer must be full causal.
void check_layer_types(const json& hf, const Family& f, json& m, HfImport& out) {
  out.used.insert("layer_types");
  if (!hf.contains("layer_types") || hf["layer_types"].is_null()) return;
  const json& lt = hf["layer_types"];
  if (f.window != Window::none && m.contains("sliding_window") && lt.is_array()) {
    // what the pattern says for every layer (a list of another length is refused with the model section)
    const bool patterned = f.window == Window::pattern || f.window == Window::alternating;
    const json layers = m.value("num_hidden_layers", json());
    if (patterned && layers == json(lt.size()) && lt == pattern_kinds(m, f, lt.size())) return;
    m["layer_types"] = lt;  // its kinds and length are checked with the model section
    return;
  }
  const int64_t layers = m.value("num_hidden_layers", json()).is_number_integer() ? m["num_hidden_layers"].get<int64_t>() : 0;
  if (!lt.is_array()) {
    out.errors.push_back(str("layer_types = ", lt.dump(), ": expected a list of \"full_attention\""));
    return;
  }
  if (layers > 0 && static_cast<int64_t>(lt.size()) != layers)
    out.errors.push_back(str("layer_types has ", lt.size(), " entries for num_hidden_layers ", layers));
  for (size_t i = 0; i < lt.size(); ++i)
    if (lt[i] != "full_attention") {
      out.errors.push_back(str("layer_types[", i, "] = ", lt[i].dump(), " is not supported (layer ", i,
                               ": autosp's attention is full causal, \"full_attention\")"));
      break;
    }
}

// What a model key's value read from config.json must be, or "" when it is that.
std::string hf_value_problem(const ModelKey& k, const json& v) {
  bool kind_ok = true;
  switch (k.kind) {
    case ValueKind::integer: kind_ok = v.is_number_integer(); break;
    case ValueKind::number: kind_ok = v.is_number(); break;
    case ValueKind::boolean: kind_ok = v.is_boolean(); break;
    case ValueKind::string: kind_ok = v.is_string(); break;
    default: break;
  }
  if (!kind_ok) return value_kind_name(k.kind);
  if (k.hf_valid && !k.hf_valid(v)) return std::string(k.hf_expects);
  return "";
}

// A key of config.json that no row knows: most likely a misspelling of one the family's class
// has (`known`: every key the translation read, and the math-free ones), or another class's name
// of one of our keys (hidden_size in a GPT2Config is n_embd); else a setting autosp cannot train.
std::string unknown_key(const std::string& key, const Family& f, const std::set<std::string>& known) {
  std::string hint;
  for (const ModelKey& k : model_keys()) {
    const std::string_view ours = hf_key_name(k, f);
    if (ours.empty() || ours == key || !key_applies(k, f)) continue;
    std::stringstream names(str(k.hf, " ", k.hf_gpt2, " ", k.aliases));
    for (std::string n; names >> n;)
      if (n == key) hint = ours;
  }
  if (hint.empty()) {
    std::vector<std::string> options(known.begin(), known.end());
    options.insert(options.end(), math_free_keys().begin(), math_free_keys().end());
    hint = closest_name(key, options);
  }
  if (!hint.empty()) return str("unknown key '", key, "' (did you mean '", hint, "'?)");
  return str("unknown key '", key, "' (not a ", f.hf_config_class, " setting autosp knows: a setting it cannot train, "
             "or a misspelt one; remove it only if the model does not use it)");
}

// A quantization_config the family's loader dequantizes: accepted when its quant_method is
// `method`, left to the common rows (refused) when absent or null, else refused naming it.
void check_quantization(const json& hf, const char* method, std::set<std::string>& used, std::vector<std::string>& errors) {
  if (!hf.contains("quantization_config") || hf["quantization_config"].is_null()) return;
  used.insert("quantization_config");
  const json& q = hf["quantization_config"];
  const json kind = q.is_object() ? q.value("quant_method", json()) : json();
  if (kind != method)
    errors.push_back(str("quantization_config.quant_method = ", kind.dump(), " is not supported (autosp dequantizes \"",
                         method, "\" expert weights on load; any other quantization: dequantize the model first)"));
}

std::string supported_types() {
  std::string s;
  for (const Family& f : families()) s += str(s.empty() ? "" : ", ", "\"", f.name, "\" (", f.hf_config_class, ")");
  return s;
}

}  // namespace

HfModelConfig translate_hf_config(const json& hf, const std::string& origin) {
  if (!hf.is_object()) throw UsageError(str(origin, ": expected a JSON object (a Hugging Face config.json)"));
  // The architecture: model_type, else the first of architectures.
  std::string type;
  if (hf.contains("model_type") && hf["model_type"].is_string()) type = hf["model_type"].get<std::string>();
  else if (hf.contains("architectures") && hf["architectures"].is_array() && !hf["architectures"].empty() &&
           hf["architectures"][0].is_string())
    type = model_type_of_class(hf["architectures"][0].get<std::string>());
  const Family* named = family_named(type);
  if (!named)
    throw UsageError(str(origin, ": model_type ", type.empty() ? "(none)" : "\"" + type + "\"",
                         " is not supported (supported: ", supported_types(), ")"));
  const Family& f = *named;
  const HfFamily& row = hf_family(f.arch);

  HfModelConfig out;
  std::set<std::string> used;
  std::vector<std::string> errors;
  HfImport in{.model = out.model, .used = used, .errors = errors, .defaults = row.defaults};
  json& m = out.model;
  // Each model key of the family under its HF name, or the class's default (none: left out).
  for (const ModelKey& k : model_keys()) {
    const std::string_view name = hf_key_name(k, f);
    if (k.name == "arch") {
      m["arch"] = type;
      continue;
    }
    if (name.empty() || !key_applies(k, f)) continue;
    if (k.from_hf) {
      k.from_hf(hf, f, in);
      continue;
    }
    const std::string n(name);
    used.insert(n);
    const json v = hf.contains(n) ? hf[n] : row.defaults.value(k.name, json());
    if (v.is_null()) continue;
    if (const std::string want = hf_value_problem(k, v); !want.empty())
      errors.push_back(str(n, " = ", v.dump(), ": expected ", want));
    else
      m[k.name] = v;
  }
  // What the family fixes, and HF's derived defaults.
  if (f.tied_head == Presence::always) m["tie_word_embeddings"] = true;
  if (f.gqa && !m.contains("num_key_value_heads") && m.value("num_attention_heads", json()).is_number_integer())
    m["num_key_value_heads"] = m["num_attention_heads"];  // HF's null: every head its own K, V
  if (f.mlp == Mlp::gelu) {  // GPT-2's n_inner: null, its 4·n_embd
    used.insert("n_inner");
    const json& inner = hf.contains("n_inner") ? hf["n_inner"] : json();
    if (!inner.is_null() && !(m["hidden_size"].is_number_integer() && inner == 4 * m["hidden_size"].get<int64_t>()))
      errors.push_back(str("n_inner = ", inner.dump(), ": autosp's GPT-2 MLP is 4·n_embd (n_inner null)"));
  }
  if (f.layout == Layout::llama) check_layer_types(hf, f, m, in);
  for (const auto& [a, b] : kTwoSpellings)
    if (hf.contains(a) && hf.contains(b) && !hf[a].is_null() && !hf[b].is_null() && !same_value(hf[a], hf[b]))
      errors.push_back(str(a, " = ", hf[a].dump(), " differs from ", b, " = ", hf[b].dump(),
                           " (two spellings of one setting: they must agree)"));
  erase_defaults(m);  // our keys at their default are left out, as model_json leaves them
  auto check_required = [&](const std::vector<Required>& rows) {
    for (const Required& r : rows) {
      if (row.quantization && std::string_view(r.key) == "quantization_config") continue;  // check_quantization's
      used.insert(r.key);
      if (!hf.contains(r.key)) continue;
      bool ok = false;
      for (const json& v : r.ok) ok |= hf[r.key] == v;
      if (!ok)
        errors.push_back(str(r.key, " = ", hf[r.key].dump(), " is not supported (", r.what, ")",
                             *r.fix ? str("; ", r.fix) : ""));
    }
  };
  check_required(row.required);
  if (row.quantization) check_quantization(hf, row.quantization, used, errors);
  check_required(kCommonRequired);
  for (const char* d : kDropouts) {
    used.insert(d);
    if (hf.contains(d) && hf[d].is_number() && hf[d].get<double>() != 0)
      out.warnings.push_back(str(origin, ": ", d, " = ", hf[d].dump(), " is not applied (autosp trains without dropout)"));
  }
  for (auto it = hf.begin(); it != hf.end(); ++it) {
    if (used.count(it.key())) continue;
    if (math_free_keys().count(it.key())) {
      out.math_free.push_back(it.key());
      if (!file_keys().count(it.key())) out.carried[it.key()] = *it;
    }
    else errors.push_back(unknown_key(it.key(), f, used));
  }
  Problems problems(origin);
  for (std::string& e : errors) problems.add(std::move(e));
  problems.raise();
  return out;
}

json read_json_file(const std::string& path, uint64_t max_bytes) {
  const std::string text = read_input_file(path, "a JSON file", max_bytes);
  json j;
  try {
    j = json::parse(text, [](int depth, json::parse_event_t, json&) { return depth <= 32; });
  } catch (const json::exception& e) {
    throw UsageError(str(path, ": not valid JSON: ", e.what()));
  }
  if (j.is_discarded()) throw UsageError(str(path, ": JSON nested deeper than 32 levels"));
  return j;
}

namespace {

// A DeepSpeed checkpoint's model states file under `dir` (its global_step* tags), or empty.
std::string deepspeed_states(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    for (const char* f : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"})
      if (fs::exists(it->path() / f, ec)) return (it->path().filename() / f).string();
  }
  return "";
}

}  // namespace

std::string other_tool_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec)) return "";
  if (fs::exists(d / "adapter_config.json", ec))
    return "a PEFT adapter directory (adapter_config.json), not a model: give it as lora.from, with its base model "
           "(adapter_config.json's base_model_name_or_path) as model.from";
  if (const std::string states = deepspeed_states(d); !states.empty() || fs::exists(d / "zero_to_fp32.py", ec))
    return str("a DeepSpeed checkpoint directory", states.empty() ? "" : str(" (", states, ")"),
               ", not an autosp checkpoint or a model: consolidate its weights with the zero_to_fp32.py DeepSpeed "
               "saves beside them (--safe_serialization), then start from them with --init-from");
  return "";
}

HfModelConfig read_hf_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UsageError(str(dir, ": not a directory (model.from takes a Hugging Face model directory)"));
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path, ec)) {
    if (const std::string other = other_tool_directory(dir); !other.empty()) throw UsageError(str(dir, ": ", other));
    throw UsageError(str(path, ": cannot open (a Hugging Face model directory holds config.json)"));
  }
  return translate_hf_config(read_json_file(path, uint64_t{16} << 20), path);
}

json hf_config_json(const ModelConfig& m, DType dtype, const json& carried) {
  const Family& f = family(m.arch);
  json hf = carried;  // ours below write over them
  hf["architectures"] = {f.hf_model_class};
  for (const ModelKey& k : model_keys()) {  // model_type among them
    const std::string_view name = hf_key_name(k, f);
    if (name.empty() || !key_applies(k, f)) continue;
    if (k.to_hf) k.to_hf(m, f, hf);
    else hf[std::string(name)] = k.get(m);
  }
  hf.update(hf_family(f.arch).written);
  hf["dtype"] = std::string(dtype_torch_name(dtype));  // transformers 5's name; 4.x reads torch_dtype
  hf["torch_dtype"] = std::string(dtype_torch_name(dtype));
  hf["use_cache"] = true;
  return hf;
}

void check_hf_dir_matches(const std::string& dir, const ModelConfig& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "config.json", ec)) return;
  const HfModelConfig hf = read_hf_model_dir(dir);  // a value of the wrong type is refused there, named
  const json ours = model_json(m);
  const std::string path = (fs::path(dir) / "config.json").string();
  auto refuse = [&](const std::string& key, const json& theirs, const json& run) {
    throw UsageError(str(path, ": ", hf_name(m.arch, key), " is ", theirs.dump(), " but this run's model.", key, " is ",
                         run.dump(), ": the weights are for another model (take the model from the directory with "
                         "\"model\": {\"from\": \"", dir, "\"})"));
  };
  auto run = [&](const std::string& k) { return ours.contains(k) ? ours[k] : json(); };  // null when absent
  if (hf.model["arch"] != ours["arch"]) refuse("arch", hf.model["arch"], ours["arch"]);
  // max_position_embeddings changes neither the math of a Llama (RoPE takes any position) nor
  // weights without a check of their own (GPT-2's wpe has it as its shape).
  for (auto it = hf.model.begin(); it != hf.model.end(); ++it)
    if (it.key() != "max_position_embeddings" && !same_value(*it, run(it.key()))) refuse(it.key(), *it, run(it.key()));
  // The family's keys that the directory leaves out (at their default) but this run sets.
  for (const ModelKey& k : model_keys())
    if (key_applies(k, family(m.arch)) && ours.contains(k.name) && !hf.model.contains(k.name))
      refuse(k.name, nullptr, ours[k.name]);
}

}  // namespace autosp
