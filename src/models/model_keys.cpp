// The model keys (models/model_keys.h): one row per key of the model section. HF's names are
// transformers 4.44's (GPT2Config, LlamaConfig and the classes built like it).
#include "models/model_keys.h"


#include "models/hf_config.h"
#include "tensor/check.h"

namespace autosp {
namespace {

using json = nlohmann::json;

// Which families a key is a setting of (Family's columns).
bool gqa(const Family& f) { return f.gqa; }
bool gated_mlp(const Family& f) { return f.mlp != Mlp::gelu; }
bool rope(const Family& f) { return f.positions == Positions::rope; }
bool llama_layout(const Family& f) { return f.layout == Layout::llama; }
bool tie_by_key(const Family& f) { return f.tied_head == Presence::by_key; }
bool attention_bias_by_key(const Family& f) { return f.qkv_bias == Presence::by_key || f.o_bias == Presence::by_key; }
bool mlp_bias_by_key(const Family& f) { return f.mlp_bias == Presence::by_key; }
bool windowed(const Family& f) { return f.window != Window::none; }
bool switched_window(const Family& f) { return f.window == Window::switched; }
bool pattern_window(const Family& f) { return f.window == Window::pattern; }
bool softcaps(const Family& f) { return f.softcaps; }
bool query_scalar(const Family& f) { return f.query_pre_attn_scalar; }
bool local_rope(const Family& f) { return f.local_rope; }
bool padding_idx(const Family& f) { return f.padding_idx; }

// A softcap (Gemma's attn_logit_softcapping, final_logit_softcapping): a positive number, or null
// (0 in ModelConfig) for none.
ModelKey softcap_key(std::string_view name, double ModelConfig::*member) {
  return {.name = std::string(name), .kind = ValueKind::number, .lo = 1e-6, .hi = 1e6, .nullable = true,
          .applies = softcaps,
          .set = [member](ModelConfig& m, const json& v) { m.*member = v.is_null() ? 0.0 : v.get<double>(); },
          .get = [member](const ModelConfig& m) { return m.*member > 0 ? json(m.*member) : json(); },
          .hf = name};
}

// A positive number of the families `applies` names, by the same name in config.json.
ModelKey positive_key(std::string_view name, double ModelConfig::*member, bool (*applies)(const Family&)) {
  return {.name = std::string(name), .kind = ValueKind::number, .lo = 1e-6, .hi = 1e6, .applies = applies,
          .set = [member](ModelConfig& m, const json& v) { m.*member = v.get<double>(); },
          .get = [member, applies](const ModelConfig& m) { return applies(family(m.arch)) ? json(m.*member) : json(); },
          .hf = name, .hf_valid = [](const json& v) { return v.is_number() && v.get<double>() > 0; },
          .hf_expects = "a positive number"};
}

// model.layer_types: a list of transformers 5's kinds (its length is checked against the layers
// with the other cross-key rules).
void set_layer_types(ModelConfig& m, const json& v) {
  m.layer_types.clear();
  if (v.is_null()) return;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || (v[i] != "full_attention" && v[i] != "sliding_attention"))
      throw UsageError(str("model.layer_types[", i, "] = ", v[i].dump(),
                           ": expected \"full_attention\" or \"sliding_attention\""));
    m.layer_types.push_back(v[i].get<std::string>());
  }
}
bool moe(const Family& f) { return f.moe != Moe::none; }
bool local_experts(const Family& f) { return f.moe != Moe::none && experts_key(f.moe) == "num_local_experts"; }
bool qwen_moe(const Family& f) { return f.moe == Moe::qwen; }
bool gpt_oss_moe(const Family& f) { return f.moe == Moe::gpt_oss; }
bool sinks_by_key(const Family& f) { return f.sinks == Presence::by_key; }
bool shared_expert(const Family& f) { return f.shared_expert; }

// A ModelConfig member as a key's setter and getter.
template <class T>
auto set_field(T ModelConfig::*member) {
  return [member](ModelConfig& m, const json& v) { m.*member = v.get<T>(); };
}
template <class T>
auto get_field(T ModelConfig::*member) {
  return [member](const ModelConfig& m) { return json(m.*member); };
}

// The getter of a setting only some families have (the mixtures of experts'): null (left out) for
// the others, whose resolved config never had it.
template <class T>
auto field_if(bool (*applies)(const Family&), T ModelConfig::*member) {
  return [applies, member](const ModelConfig& m) { return applies(family(m.arch)) ? json(m.*member) : json(); };
}

bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }

std::string arch_choices() {
  std::string s;
  for (const Family& f : families()) s += str(s.empty() ? "" : "|", f.name);
  return s;
}

std::vector<ModelKey> make_keys() {
  using K = ValueKind;
  return {
      {.name = "arch", .kind = K::string, .choices = arch_choices(),
       .set = [](ModelConfig& m, const json& v) {
         for (const Family& f : families())
           if (f.name == v.get<std::string>()) m.arch = f.arch;
       },
       .get = [](const ModelConfig& m) { return json(arch_name(m.arch)); },
       .hf = "model_type", .hf_gpt2 = "model_type"},
      {.name = "vocab_size", .kind = K::integer, .lo = 2, .hi = 1 << 24, .set = set_field(&ModelConfig::vocab_size),
       .get = get_field(&ModelConfig::vocab_size), .hf = "vocab_size", .hf_gpt2 = "vocab_size", .aliases = "n_vocab"},
      {.name = "hidden_size", .kind = K::integer, .lo = 2, .hi = 1 << 16, .set = set_field(&ModelConfig::hidden_size),
       .get = get_field(&ModelConfig::hidden_size), .hf = "hidden_size", .hf_gpt2 = "n_embd", .aliases = "d_model"},
      {.name = "num_hidden_layers", .kind = K::integer, .lo = 1, .hi = 1024,
       .set = set_field(&ModelConfig::num_hidden_layers), .get = get_field(&ModelConfig::num_hidden_layers),
       .hf = "num_hidden_layers", .hf_gpt2 = "n_layer", .aliases = "num_layers"},
      {.name = "num_attention_heads", .kind = K::integer, .lo = 1, .hi = 1024,
       .set = set_field(&ModelConfig::num_attention_heads), .get = get_field(&ModelConfig::num_attention_heads),
       .hf = "num_attention_heads", .hf_gpt2 = "n_head", .aliases = "num_heads"},
      {.name = "num_key_value_heads", .kind = K::integer, .lo = 1, .hi = 1024, .applies = gqa,
       .set = set_field(&ModelConfig::num_key_value_heads), .get = get_field(&ModelConfig::num_key_value_heads),
       .hf = "num_key_value_heads", .aliases = "num_kv_heads n_kv_heads"},
      {.name = "intermediate_size", .kind = K::integer, .lo = 1, .hi = 1 << 20, .applies = gated_mlp,
       .set = set_field(&ModelConfig::intermediate_size), .get = get_field(&ModelConfig::intermediate_size),
       .hf = "intermediate_size", .aliases = "n_inner ffn_dim"},
      {.name = "max_position_embeddings", .kind = K::integer, .lo = 1, .hi = 1 << 24,
       .set = set_field(&ModelConfig::max_position_embeddings), .get = get_field(&ModelConfig::max_position_embeddings),
       .hf = "max_position_embeddings", .hf_gpt2 = "n_positions", .aliases = "n_ctx max_seq_len"},
      {.name = "rope_theta", .kind = K::number, .lo = 1, .hi = 1e12, .applies = rope,
       .set = set_field(&ModelConfig::rope_theta), .get = get_field(&ModelConfig::rope_theta), .hf = "rope_theta"},
      {.name = "norm_eps", .kind = K::number, .lo = 0, .hi = 1, .set = set_field(&ModelConfig::norm_eps),
       .get = get_field(&ModelConfig::norm_eps), .hf = "rms_norm_eps", .hf_gpt2 = "layer_norm_epsilon",
       .aliases = "layer_norm_eps"},
      {.name = "pad_token_id", .kind = K::integer, .lo = -(1 << 30), .hi = 1 << 30, .nullable = true,
       .applies = padding_idx,
       .set = [](ModelConfig& m, const json& v) {
         m.pad_token_id = v.is_null() ? std::nullopt : std::optional<int64_t>(v.get<int64_t>());
       },
       .get = [](const ModelConfig& m) { return m.pad_token_id ? json(*m.pad_token_id) : json(); },
       .hf = "pad_token_id"},
      {.name = "tie_word_embeddings", .kind = K::boolean, .applies = tie_by_key,
       .set = set_field(&ModelConfig::tie_word_embeddings), .get = get_field(&ModelConfig::tie_word_embeddings),
       .hf = "tie_word_embeddings", .aliases = "tie_embeddings"},
      // HF's form (rope_scaling_json); none is null, left out.
      {.name = "rope_scaling", .kind = K::object, .applies = rope,
       .set = [](ModelConfig& m, const json& v) { m.rope_scaling = parse_rope_scaling(v, "model.rope_scaling"); },
       .get = [](const ModelConfig& m) { return rope_scaling_json(m.rope_scaling); }, .hf = "rope_scaling",
       .from_hf = rope_from_hf, .to_hf = rope_to_hf},
      // Left out where it is hidden_size / num_attention_heads; written to config.json always.
      {.name = "head_dim", .kind = K::integer, .lo = 2, .hi = 1 << 16, .applies = llama_layout,
       .set = [](ModelConfig& m, const json& v) { m.head_dim_config = v.get<int64_t>(); },
       .get = [](const ModelConfig& m) { return json(m.head_dim()); },
       .at_default = [](const json& s) {
         return s.value("head_dim", json()).is_number_integer() && s.value("num_attention_heads", json()).is_number_integer() &&
                s.value("hidden_size", json()).is_number_integer() &&
                s["head_dim"].get<int64_t>() * s["num_attention_heads"].get<int64_t>() == s["hidden_size"].get<int64_t>();
       },
       .hf = "head_dim",
       .hf_valid = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 2 && v.get<int64_t>() % 2 == 0; },
       .hf_expects = "an even positive integer (RoPE rotates pairs)"},
      {.name = "attention_bias", .kind = K::boolean, .applies = attention_bias_by_key,
       .set = set_field(&ModelConfig::attention_bias), .get = get_field(&ModelConfig::attention_bias),
       .at_default = [](const json& s) { return is_false(s.value("attention_bias", json())); }, .hf = "attention_bias"},
      {.name = "mlp_bias", .kind = K::boolean, .applies = mlp_bias_by_key, .set = set_field(&ModelConfig::mlp_bias),
       .get = get_field(&ModelConfig::mlp_bias),
       .at_default = [](const json& s) { return is_false(s.value("mlp_bias", json())); }, .hf = "mlp_bias"},
      // autosp's own key (config.json has none: gpt-oss's model type implies it).
      {.name = "attention_sinks", .kind = K::boolean, .applies = sinks_by_key,
       .set = set_field(&ModelConfig::attention_sinks), .get = get_field(&ModelConfig::attention_sinks),
       .at_default = [](const json& s) { return is_false(s.value("attention_sinks", json())); }},
      // 0 (none) is null, left out; null lifts a window (a Mistral or Qwen model.from's).
      {.name = "sliding_window", .kind = K::integer, .lo = 1, .hi = 1 << 30, .nullable = true, .applies = windowed,
       .set = [](ModelConfig& m, const json& v) { m.sliding_window = v.is_null() ? 0 : v.get<int64_t>(); },
       .get = [](const ModelConfig& m) { return m.sliding_window > 0 ? json(m.sliding_window) : json(); },
       .hf = "sliding_window", .from_hf = window_from_hf, .to_hf = window_to_hf},
      // Qwen's windowed layers (ModelConfig::layer_window); config.json's layer_types is read with
      // the window (models/hf_config.cpp check_layer_types) and written from layer_window.
      {.name = "max_window_layers", .kind = K::integer, .lo = 0, .hi = 1 << 30, .applies = switched_window,
       .set = set_field(&ModelConfig::max_window_layers), .get = get_field(&ModelConfig::max_window_layers),
       .at_default = [](const json& s) { return s.value("max_window_layers", json()) == json(28); },
       .hf = "max_window_layers"},
      {.name = "layer_types", .kind = K::list, .applies = windowed, .set = set_layer_types,
       .get = [](const ModelConfig& m) { return m.layer_types.empty() ? json() : json(m.layer_types); }},
      // Gemma's local and global layers (ModelConfig::layer_sliding); written with the family's
      // default (Family::window_pattern) too, so that a checkpoint never depends on it.
      {.name = "sliding_window_pattern", .kind = K::integer, .lo = 1, .hi = 1 << 20, .applies = pattern_window,
       .set = set_field(&ModelConfig::sliding_window_pattern),
       .get = field_if(pattern_window, &ModelConfig::sliding_window_pattern), .hf = "sliding_window_pattern"},
      softcap_key("attn_logit_softcapping", &ModelConfig::attn_logit_softcapping),
      softcap_key("final_logit_softcapping", &ModelConfig::final_logit_softcapping),
      // Gemma's attention scale query_pre_attn_scalar^-0.5; written as the head dim when not set.
      {.name = "query_pre_attn_scalar", .kind = K::number, .lo = 1e-6, .hi = 1e12, .applies = query_scalar,
       .set = set_field(&ModelConfig::query_pre_attn_scalar),
       .get = [](const ModelConfig& m) {
         if (!query_scalar(family(m.arch))) return json();
         return m.query_pre_attn_scalar > 0 ? json(m.query_pre_attn_scalar) : json(m.head_dim());
       },
       .hf = "query_pre_attn_scalar"},
      {.name = "rope_local_base_freq", .kind = K::number, .lo = 1, .hi = 1e12, .applies = local_rope,
       .set = set_field(&ModelConfig::rope_local_base_freq), .get = field_if(local_rope, &ModelConfig::rope_local_base_freq),
       .hf = "rope_local_base_freq"},
      // Mixtures of experts, by HF's names: Mixtral's and gpt-oss's num_local_experts is Qwen's num_experts.
      {.name = "num_local_experts", .kind = K::integer, .lo = 1, .hi = 1 << 16, .applies = local_experts,
       .set = set_field(&ModelConfig::num_experts), .get = field_if(local_experts, &ModelConfig::num_experts),
       .hf = "num_local_experts"},
      {.name = "num_experts", .kind = K::integer, .lo = 1, .hi = 1 << 16, .applies = qwen_moe,
       .set = set_field(&ModelConfig::num_experts), .get = field_if(qwen_moe, &ModelConfig::num_experts), .hf = "num_experts"},
      {.name = "num_experts_per_tok", .kind = K::integer, .lo = 1, .hi = 1 << 16, .applies = moe,
       .set = set_field(&ModelConfig::num_experts_per_tok), .get = field_if(moe, &ModelConfig::num_experts_per_tok),
       .hf = "num_experts_per_tok", .aliases = "moe_top_k top_k_experts"},
      {.name = "moe_intermediate_size", .kind = K::integer, .lo = 1, .hi = 1 << 20, .applies = qwen_moe,
       .set = set_field(&ModelConfig::moe_intermediate_size), .get = field_if(qwen_moe, &ModelConfig::moe_intermediate_size),
       .hf = "moe_intermediate_size"},
      {.name = "shared_expert_intermediate_size", .kind = K::integer, .lo = 1, .hi = 1 << 20, .applies = shared_expert,
       .set = set_field(&ModelConfig::shared_expert_intermediate_size),
       .get = field_if(shared_expert, &ModelConfig::shared_expert_intermediate_size), .hf = "shared_expert_intermediate_size"},
      {.name = "decoder_sparse_step", .kind = K::integer, .lo = 1, .hi = 1024, .applies = qwen_moe,
       .set = set_field(&ModelConfig::decoder_sparse_step), .get = field_if(qwen_moe, &ModelConfig::decoder_sparse_step),
       .hf = "decoder_sparse_step"},
      // A list of layer indices; null (HF's default) is none.
      {.name = "mlp_only_layers", .kind = K::list, .applies = qwen_moe,
       .set = [](ModelConfig& m, const json& v) {
         m.mlp_only_layers.clear();
         if (v.is_null()) return;
         for (const json& e : v) {
           if (!e.is_number_integer() || e.get<int64_t>() < 0)
             throw UsageError(str("model.mlp_only_layers: ", e.dump(), " is not a layer index (an integer >= 0)"));
           m.mlp_only_layers.push_back(e.get<int64_t>());
         }
       },
       .get = field_if(qwen_moe, &ModelConfig::mlp_only_layers),
       .at_default = [](const json& s) { return s.value("mlp_only_layers", json()) == json::array(); },
       .hf = "mlp_only_layers",
       .hf_valid = [](const json& v) {
         if (v.is_null()) return true;
         if (!v.is_array()) return false;
         for (const json& e : v)
           if (!e.is_number_integer() || e.get<int64_t>() < 0) return false;
         return true;
       },
       .hf_expects = "a list of layer indices (integers >= 0) or null"},
      {.name = "norm_topk_prob", .kind = K::boolean, .applies = qwen_moe, .set = set_field(&ModelConfig::norm_topk_prob),
       .get = field_if(qwen_moe, &ModelConfig::norm_topk_prob), .hf = "norm_topk_prob"},
      {.name = "output_router_logits", .kind = K::boolean, .applies = moe,
       .set = set_field(&ModelConfig::output_router_logits), .get = field_if(moe, &ModelConfig::output_router_logits),
       .hf = "output_router_logits"},
      {.name = "router_aux_loss_coef", .kind = K::number, .lo = 0, .hi = 1e6, .applies = moe,
       .set = set_field(&ModelConfig::router_aux_loss_coef), .get = field_if(moe, &ModelConfig::router_aux_loss_coef),
       .hf = "router_aux_loss_coef"},
      // gpt-oss's clamped SwiGLU (models/moe.h): both positive, read from config.json as such.
      positive_key("swiglu_limit", &ModelConfig::swiglu_limit, gpt_oss_moe),
      positive_key("swiglu_alpha", &ModelConfig::swiglu_alpha, gpt_oss_moe),
  };
}

}  // namespace

const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::integer: return "an integer";
    case ValueKind::number: return "a number";
    case ValueKind::boolean: return "true or false";
    case ValueKind::string: return "a string";
    case ValueKind::object: return "an object or null";
    case ValueKind::list: return "a list or null";
    case ValueKind::integer_or_auto: return "an integer or \"auto\"";
    case ValueKind::boolean_or_auto: return "true, false or \"auto\"";
    case ValueKind::list_or_string: return "a list or a string";
    case ValueKind::boolean_or_string: return "true, false or a string";
  }
  return "";
}

const std::vector<ModelKey>& model_keys() {
  static const std::vector<ModelKey> keys = make_keys();
  return keys;
}

const ModelKey* find_model_key(std::string_view name) {
  for (const ModelKey& k : model_keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::string_view hf_key_name(const ModelKey& k, const Family& f) { return f.layout == Layout::gpt2 ? k.hf_gpt2 : k.hf; }

bool key_applies(const ModelKey& k, const Family& f) { return k.applies == nullptr || k.applies(f); }

void erase_defaults(json& section) {
  std::vector<std::string> at_default;  // judged on the whole section before any is erased
  for (const ModelKey& k : model_keys())
    if (k.at_default && section.contains(k.name) && k.at_default(section)) at_default.push_back(k.name);
  for (const std::string& name : at_default) section.erase(name);
}

json model_json(const ModelConfig& m) {
  json r = json::object();
  for (const ModelKey& k : model_keys()) {
    json v = k.get(m);
    if (!v.is_null()) r[k.name] = std::move(v);
  }
  erase_defaults(r);
  return r;
}

}  // namespace autosp
