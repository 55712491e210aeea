// LoRA's names, selections and initialisation over a model's parameters (lora.h).
#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "models/family.h"
#include "models/flops.h"
#include "tensor/check.h"

namespace autosp {

std::string_view module_of(std::string_view param) {
  const size_t dot = param.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : param.substr(0, dot);
}

bool module_matches(std::string_view module, std::string_view key) {
  return module == key ||
         (module.size() > key.size() && module.ends_with(key) && module[module.size() - key.size() - 1] == '.');
}

bool saved_module_matches(std::string_view module, std::string_view key) { return module.ends_with(key); }

namespace {

bool matches_any(std::string_view module, const std::vector<std::string>& keys,
                 bool (*match)(std::string_view, std::string_view) = module_matches) {
  return std::any_of(keys.begin(), keys.end(), [&](const std::string& k) { return match(module, k); });
}

}  // namespace

std::vector<std::string> lora_target_weights(const ModelConfig& m, const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  for (const ParamSpec& p : param_specs(m))
    if (p.name.ends_with(".weight") && p.shape.size() == 2 && matches_any(module_of(p.name), targets) &&
        p.name != family(m.arch).embedding)
      out.push_back(p.name);
  return out;
}

std::vector<std::string> lora_saved_params(const ModelConfig& m, const std::vector<std::string>& modules_to_save) {
  std::vector<std::string> out;
  for (const ParamSpec& p : param_specs(m))
    if (matches_any(module_of(p.name), modules_to_save, saved_module_matches)) out.push_back(p.name);
  return out;
}

std::vector<std::string> model_modules(const ModelConfig& m) {
  std::vector<std::string> out;
  std::set<std::string_view> seen;
  const std::vector<ParamSpec> specs = param_specs(m);
  for (const ParamSpec& p : specs)
    if (seen.insert(module_of(p.name)).second) out.emplace_back(module_of(p.name));
  return out;
}

std::string lora_a_name(std::string_view weight) { return str(module_of(weight), ".lora_A.weight"); }
std::string lora_b_name(std::string_view weight) { return str(module_of(weight), ".lora_B.weight"); }
bool is_lora_param(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::map<std::string, Shape> lora_shapes(const ModelConfig& m, const std::vector<std::string>& weights, int64_t r) {
  std::map<std::string, Shape> base, out;
  for (const ParamSpec& p : param_specs(m)) base[p.name] = p.shape;
  const bool conv1d = family(m.arch).layout == Layout::gpt2;  // GPT-2's Conv1D: W [in, out]
  for (const std::string& w : weights) {
    const Shape& s = base.at(w);
    out[lora_a_name(w)] = {r, conv1d ? s[0] : s[1]};
    out[lora_b_name(w)] = {conv1d ? s[1] : s[0], r};
  }
  return out;
}

LoraFlopParams lora_flop_params(const ModelConfig& m, const std::vector<std::string>& targets,
                                const std::vector<std::string>& modules_to_save, int64_t r) {
  LoraFlopParams out;
  for (const auto& [name, shape] : lora_shapes(m, lora_target_weights(m, targets), r)) out.adapters += shape_numel(shape);
  int64_t trained = 0;  // modules_to_save, but for an input embedding (a lookup, not in the count)
  const std::vector<std::string> saved = lora_saved_params(m, modules_to_save);
  for (const ParamSpec& p : param_specs(m)) {
    const std::string_view module = module_of(p.name);
    const bool lookup = module.ends_with("embed_tokens") || module.ends_with("wpe") ||
                        (module.ends_with("wte") && !m.tie_word_embeddings);
    if (!lookup && std::find(saved.begin(), saved.end(), p.name) != saved.end()) trained += shape_numel(p.shape);
  }
  out.frozen = std::max<int64_t>(0, flop_param_count(m) - trained);
  return out;
}

ParamMap merge_lora(const ModelConfig& m, const ParamMap& params, double scale) {
  const bool conv1d = family(m.arch).layout == Layout::gpt2;
  ParamMap out;
  for (const ParamSpec& spec : param_specs(m)) {
    Tensor w = params.at(spec.name);
    const auto a = params.find(lora_a_name(spec.name)), b = params.find(lora_b_name(spec.name));
    if (a != params.end() && b != params.end() && spec.name.ends_with(".weight")) {
      // BA [out, in] = B [out, r] · A [r, in], summed in double
      const std::vector<double> av = a->second.to_doubles(), bv = b->second.to_doubles();
      std::vector<double> wv = w.to_doubles();
      const int64_t r = a->second.shape()[0], in = a->second.shape()[1], o = b->second.shape()[0];
      for (int64_t i = 0; i < o; ++i)
        for (int64_t j = 0; j < in; ++j) {
          double s = 0;
          for (int64_t k = 0; k < r; ++k) s += bv[static_cast<size_t>(i * r + k)] * av[static_cast<size_t>(k * in + j)];
          wv[static_cast<size_t>(conv1d ? j * o + i : i * in + j)] += scale * s;
        }
      w = Tensor::from_vector(spec.shape, wv).to(w.dtype());
    }
    out[spec.name] = w;
  }
  return out;
}

ParamMap init_lora_params(const ModelConfig& m, const std::vector<std::string>& weights, int64_t r,
                          const std::string& init, uint64_t seed, DType dtype) {
  const std::map<std::string, Shape> shapes = lora_shapes(m, weights, r);
  std::mt19937_64 rng(seed ^ 0x4c6f5241ULL);  // its own stream: the base's initialisation is unchanged
  auto uniform = [&](int64_t rows, int64_t fan_in) {
    std::uniform_real_distribution<double> u(-1.0 / std::sqrt(static_cast<double>(fan_in)),
                                             1.0 / std::sqrt(static_cast<double>(fan_in)));
    std::vector<double> v(static_cast<size_t>(rows * fan_in));
    for (double& x : v) x = u(rng);
    return v;
  };
  ParamMap out;
  for (const std::string& w : weights) {
    const int64_t in = shapes.at(lora_a_name(w))[1], out_dim = shapes.at(lora_b_name(w))[0];
    std::vector<double> a = uniform(r, in), b(static_cast<size_t>(out_dim * r), 0.0);
    if (init == "gaussian") {
      std::normal_distribution<double> nd(0.0, 1.0 / static_cast<double>(r));
      for (double& x : a) x = nd(rng);
    } else if (init == "false") {
      b = uniform(out_dim, r);
    }
    out[lora_a_name(w)] = Tensor::from_vector({r, in}, a).to(dtype);
    out[lora_b_name(w)] = Tensor::from_vector({out_dim, r}, b).to(dtype);
  }
  return out;
}

std::string peft_key(std::string_view name) { return str("base_model.model.", name); }
std::string from_peft_key(std::string_view key) {
  constexpr std::string_view prefix = "base_model.model.";
  return key.starts_with(prefix) ? std::string(key.substr(prefix.size())) : std::string();
}

}  // namespace autosp
