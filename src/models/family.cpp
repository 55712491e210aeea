// The family table (models/family.h): one row per architecture, as Hugging Face's modeling_<name>.py
// defines it. Mistral is Llama without biases and with a sliding window; Qwen2 is Llama with q/k/v
// biases and a switched window; Qwen3 adds an RMSNorm over each head of q and k.
#include "models/family.h"

#include <array>

namespace autosp {
namespace {

constexpr std::string_view kGpt2Buffers[] = {".attn.bias", ".attn.masked_bias"};  // GPT-2's causal-mask buffers
// The rotary inverse frequencies transformers before 4.31 saved in Llama-family checkpoints (its
// loader ignores them: _keys_to_ignore_on_load_unexpected); they are recomputed from the config.
constexpr std::string_view kRopeBuffers[] = {".rotary_emb.inv_freq"};
// The projections (GPT-2's Conv1D c_proj is both the attention's and the MLP's output) and PEFT's
// default targets (peft.utils.constants TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
constexpr std::string_view kGpt2Linear[] = {"c_attn", "c_proj", "c_fc"};
constexpr std::string_view kGpt2LoraDefault[] = {"c_attn"};
constexpr std::string_view kLlamaLinear[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
constexpr std::string_view kLlamaLoraDefault[] = {"q_proj", "v_proj"};

constexpr Family kGpt2{
    .arch = Arch::gpt2, .name = "gpt2", .layout = Layout::gpt2, .norm = Norm::layernorm,
    .positions = Positions::learned, .mlp = Mlp::gelu, .qkv_bias = Presence::always, .o_bias = Presence::always,
    .mlp_bias = Presence::always, .qk_norm = false, .gqa = false, .tied_head = Presence::always,
    .window = Window::none, .norm_eps = 1e-5, .embedding = "transformer.wte.weight",
    .optional_prefix = "transformer.", .buffers = kGpt2Buffers, .layer_scope = "h", .hf_config_class = "GPT2Config",
    .hf_model_class = "GPT2LMHeadModel", .hf_class_prefix = "GPT2", .linear_modules = kGpt2Linear,
    .lora_default_targets = kGpt2LoraDefault};

// The Llama family's common row; each member changes what differs.
constexpr Family kLlama{
    .arch = Arch::llama, .name = "llama", .layout = Layout::llama, .norm = Norm::rmsnorm,
    .positions = Positions::rope, .mlp = Mlp::swiglu, .qkv_bias = Presence::by_key, .o_bias = Presence::by_key,
    .mlp_bias = Presence::by_key, .sinks = Presence::by_key, .qk_norm = false, .gqa = true,
    .tied_head = Presence::by_key, .window = Window::none, .padding_idx = true, .norm_eps = 1e-6, .embedding = "model.embed_tokens.weight",
    .optional_prefix = "",
    .buffers = kRopeBuffers, .layer_scope = "l", .hf_config_class = "LlamaConfig", .hf_model_class = "LlamaForCausalLM",
    .hf_class_prefix = "Llama", .linear_modules = kLlamaLinear, .lora_default_targets = kLlamaLoraDefault};

constexpr Family member(Family f, Arch arch, std::string_view name, std::string_view config_class,
                        std::string_view model_class) {
  f.arch = arch;
  f.name = name;
  f.hf_config_class = config_class;
  f.hf_model_class = model_class;
  f.hf_class_prefix = "";
  return f;
}

constexpr Family mistral() {
  Family f = member(kLlama, Arch::mistral, "mistral", "MistralConfig", "MistralForCausalLM");
  f.qkv_bias = f.o_bias = f.mlp_bias = Presence::never;
  f.window = Window::key;
  return f;
}
constexpr Family qwen2() {
  Family f = member(kLlama, Arch::qwen2, "qwen2", "Qwen2Config", "Qwen2ForCausalLM");
  f.qkv_bias = Presence::always;
  f.o_bias = f.mlp_bias = Presence::never;
  f.window = Window::switched;
  return f;
}
constexpr Family qwen3() {
  Family f = member(kLlama, Arch::qwen3, "qwen3", "Qwen3Config", "Qwen3ForCausalLM");
  f.mlp_bias = Presence::never;
  f.qk_norm = true;
  f.window = Window::switched;
  return f;
}

// The mixtures of experts: Mixtral is Mistral with sparse MLPs; Qwen2-MoE and Qwen3-MoE are Qwen2 and
// Qwen3 with Qwen's sparse MLPs (Qwen2-MoE's with a shared expert).
constexpr Family mixtral() {
  Family f = member(mistral(), Arch::mixtral, "mixtral", "MixtralConfig", "MixtralForCausalLM");
  f.moe = Moe::mixtral;
  return f;
}
constexpr Family qwen2_moe() {
  Family f = member(qwen2(), Arch::qwen2_moe, "qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM");
  f.moe = Moe::qwen;
  f.shared_expert = true;
  return f;
}
constexpr Family qwen3_moe() {
  Family f = member(qwen3(), Arch::qwen3_moe, "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM");
  f.moe = Moe::qwen;
  return f;
}

// Gemma 2: Llama with GeGLU, (1 + w) RMSNorms, norms before and after attention and MLP, a scaled
// embedding, softcaps, query_pre_attn_scalar, a tied head and alternating windows; Gemma 3's text
// model drops nothing of it (its attention softcap is null by default) and adds q/k norms and a
// local RoPE base.
constexpr Family gemma2() {
  Family f = member(kLlama, Arch::gemma2, "gemma2", "Gemma2Config", "Gemma2ForCausalLM");
  f.mlp = Mlp::geglu;
  f.mlp_bias = Presence::never;
  f.tie_default = true;
  f.window = Window::pattern;
  f.unit_offset_norm = f.sandwich_norms = f.scaled_embedding = f.softcaps = f.query_pre_attn_scalar = true;
  return f;
}
constexpr Family gemma3_text() {
  Family f = member(gemma2(), Arch::gemma3_text, "gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM");
  f.qk_norm = true;
  f.local_rope = true;
  f.window_pattern = 6;
  return f;
}

// gpt-oss: Llama with q/k/v/o biases (GptOssConfig's attention_bias, which every gpt-oss sets),
// sinks, alternating 128-token windows and its own mixture of experts (models/moe.h).
constexpr Family gpt_oss() {
  Family f = member(kLlama, Arch::gpt_oss, "gpt_oss", "GptOssConfig", "GptOssForCausalLM");
  f.qkv_bias = f.o_bias = Presence::always;
  f.mlp_bias = Presence::never;
  f.sinks = Presence::always;
  f.window = Window::alternating;
  f.moe = Moe::gpt_oss;
  f.norm_eps = 1e-5;
  return f;
}

constexpr std::array<Family, kNumArchs> kFamilies{kGpt2,     kLlama,      mistral(),   qwen2(),  qwen3(),
                                                  mixtral(), qwen2_moe(), qwen3_moe(), gemma2(), gemma3_text(),
                                                  gpt_oss()};

constexpr bool rows_in_order() {
  for (size_t i = 0; i < kFamilies.size(); ++i)
    if (static_cast<size_t>(kFamilies[i].arch) != i) return false;
  return true;
}
static_assert(rows_in_order(), "the family table has one row per Arch, in enum order");

}  // namespace

const Family& family(Arch a) { return kFamilies.at(static_cast<size_t>(a)); }

std::span<const Family> families() { return kFamilies; }

}  // namespace autosp
