// A model family is a row of data: everything that differs between the architectures autosp
// builds (which builder records the graph, its norm, positions, MLP, biases, q/k norms, tied head,
// sliding window, parameter names and Hugging Face class names). Every consumer reads the row: the
// builders (models/model.cpp), the weights loader, HF import and export (models/hf_config.cpp), the
// FLOP counts, the model keys and the config's cross-key rules, generation and the benchmark. The
// table (models/family.cpp) is the one place an architecture is spelled out; nothing else switches
// over Arch. Adding a family: its Arch value, its row there, its HF row (defaults and the settings
// it refuses) in models/hf_config.cpp, and its tests (a reference in tests/ref/torch_models.py).
// Knows nothing of graphs, configs or JSON.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace autosp {

// The architectures, named as Hugging Face's model_type (Family::name), in the table's order.
enum class Arch { gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma2, gemma3_text, gpt_oss };
inline constexpr size_t kNumArchs = static_cast<size_t>(Arch::gpt_oss) + 1;  // name the last value here

// Which builder records the graph: GPT-2's (wpe, LayerNorm, one fused c_attn Conv1D, GELU MLP,
// names under "transformer.") or the Llama family's (RoPE, RMSNorm, q/k/v/o Linear, SwiGLU MLP,
// GQA, names under "model.").
enum class Layout { gpt2, llama };
enum class Norm { layernorm, rmsnorm };  // layernorm: a weight and a bias [C]; rmsnorm: a weight [C]
enum class Positions { learned, rope };  // learned: a table [max_position_embeddings, C] indexed by position_ids
// gelu: [C, 4C] then [4C, C]; swiglu: gate, up [I, C], down [C, I]; geglu: the same with the tanh GELU
// in place of silu (Gemma's gelu_pytorch_tanh)
enum class Mlp { gelu, swiglu, geglu };
// Whether a family has a setting: never, always, or as a config key says (model.attention_bias,
// model.mlp_bias, model.tie_word_embeddings).
enum class Presence { never, always, by_key };
// The sliding window: none (the HF config has no window), a key that applies whenever it is set
// (Mistral's sliding_window, every layer), or one switched on by use_sliding_window (Qwen2, Qwen3:
// the layers from max_window_layers on), or a pattern of local and global layers (Gemma: layer l
// slides unless (l + 1) is a multiple of sliding_window_pattern; Gemma 2 alternates, 2), or
// alternating layers with no key for the pattern (gpt-oss: GptOssConfig's layer_types default,
// sliding on even layers, full on odd ones). ModelConfig::layer_window says which layers have it.
enum class Window { none, key, switched, pattern, alternating };
// A mixture-of-experts MLP (models/moe.h): none (dense), Mixtral's (every layer sparse, names under
// block_sparse_moe, experts w1/w3/w2, top-k weights always renormalised) or Qwen's (names under
// mlp, experts gate_proj/up_proj/down_proj, norm_topk_prob, decoder_sparse_step, mlp_only_layers)
// or gpt-oss's (every layer sparse, names under mlp: the router mlp.router with a bias, experts
// gate_proj/up_proj/down_proj with biases, the clamped SwiGLU of swiglu_limit and swiglu_alpha;
// softmax over the top-k logits, which is top-k renormalised; models/moe.h).
enum class Moe { none, mixtral, qwen, gpt_oss };

struct Family {
  Arch arch;
  std::string_view name;  // model.arch and HF's model_type: "qwen2"
  Layout layout;
  Norm norm;
  Positions positions;
  Mlp mlp;
  Presence qkv_bias;   // the q, k, v projections (GPT-2: c_attn); by_key: model.attention_bias
  Presence o_bias;     // the attention's output projection; by_key: model.attention_bias
  Presence mlp_bias;   // by_key: model.mlp_bias
  // gpt-oss's attention sinks, a learned logit per query head (model.layers.{i}.self_attn.sinks [N]);
  // by_key: model.attention_sinks, autosp's own key (docs/decisions.md 174).
  Presence sinks = Presence::never;
  bool qk_norm;        // an RMSNorm over each head's D of q and k, before RoPE (weights q_norm, k_norm [D])
  bool gqa;            // num_key_value_heads is a setting (else every head has its own K and V)
  Presence tied_head;  // the LM head is the embedding: always, or as model.tie_word_embeddings says (default tie_default)
  Window window;
  Moe moe = Moe::none;
  bool shared_expert = false;  // Qwen2-MoE: a dense SwiGLU expert every token takes, scaled by a sigmoid gate
  // Gemma. unit_offset_norm: every RMSNorm (q/k norms too) multiplies by (1 + w), its weights
  // stored as w, computed in f32 at least (HF's Gemma2RMSNorm). sandwich_norms: post-norms on the
  // attention's and the MLP's outputs (post_attention_layernorm, post_feedforward_layernorm) and
  // the MLP's pre-norm named pre_feedforward_layernorm. scaled_embedding: the embedding times
  // √hidden_size rounded to the model's dtype. softcaps: model.attn_logit_softcapping (sdpa's
  // softcap) and model.final_logit_softcapping (cap · tanh(logits / cap)) are settings.
  // query_pre_attn_scalar: the attention scale is model.query_pre_attn_scalar^-0.5. local_rope:
  // sliding layers rotate with model.rope_local_base_freq and no rope_scaling.
  bool unit_offset_norm = false;
  bool sandwich_norms = false;
  bool scaled_embedding = false;
  bool softcaps = false;
  bool query_pre_attn_scalar = false;
  bool local_rope = false;
  int64_t window_pattern = 2;
  // The token embedding is nn.Embedding(V, C, padding_idx=pad_token_id) (every Llama-layout family;
  // GPT-2's wte has none): model.pad_token_id's row gets no gradient from the lookup.
  bool padding_idx = false;
  bool tie_default = false;    // model.tie_word_embeddings when the config leaves it out (Gemma: true)  // model.sliding_window_pattern when the config leaves it out (Window::pattern)
  double norm_eps;     // model.norm_eps when the config leaves it out (HF's default)
  // Names.
  std::string_view embedding;       // the token embedding's parameter, which a tied head reuses
  std::string_view optional_prefix;  // a prefix that weight files may leave out of every name ("transformer.")
  std::span<const std::string_view> buffers;  // name suffixes of non-parameters in weight files, ignored
  std::string_view layer_scope;     // layer l's nodes are named "<layer_scope><l>." (the checkpointing scopes)
  std::string_view hf_config_class;  // "Qwen2Config"
  std::string_view hf_model_class;   // "Qwen2ForCausalLM": what a checkpoint's config.json lists in architectures
  std::string_view hf_class_prefix;  // other architectures entries that name it, by prefix ("GPT2"; "" = none)
  // LoRA (graph/passes/lora.h): the module names of the layers' projections, as PEFT's
  // target_modules names them (the last part of the HF module path; "all-linear" is all of them:
  // the LM head is never one), and PEFT's default targets when lora.target_modules is left out.
  std::span<const std::string_view> linear_modules;
  std::span<const std::string_view> lora_default_targets;
};

const Family& family(Arch a);
std::span<const Family> families();  // in Arch order

inline std::string_view arch_name(Arch a) { return family(a).name; }

// The model key that counts a mixture of experts' experts: Qwen's num_experts, Mixtral's and
// gpt-oss's num_local_experts.
inline std::string_view experts_key(Moe moe) { return moe == Moe::qwen ? "num_experts" : "num_local_experts"; }

// A setting of presence `p` whose config key (when p is by_key) holds `key`: is it there?
inline bool present(Presence p, bool key) { return p == Presence::always || (p == Presence::by_key && key); }

}  // namespace autosp
