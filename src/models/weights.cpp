// Safetensors ↔ ParamMap with Hugging Face names.
#include "models/weights.h"

#include <set>

#include "tensor/safetensors.h"

namespace autosp {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Map a name found in the file to our canonical name; "" = a buffer to ignore.
std::string canonical_name(const std::string& name, const ModelConfig& m) {
  switch (m.arch) {
    case Arch::gpt2:
      if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return "";
      if (name == "lm_head.weight") return "";  // GPT-2 ties the head to wte
      if (name.rfind("transformer.", 0) == 0) return name;
      return "transformer." + name;
    case Arch::llama: return name;
  }
  return name;
}

// A NaN or infinity in the weights would only surface as a NaN loss steps later.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const int64_t i = first_non_finite(t);
  if (i < 0) return;
  const double v = t.dtype() == DType::f32 ? t.data<float>()[i] : t.data<double>()[i];
  throw UsageError(str(path, ": tensor '", name, "' holds a non-finite value (", v, ") at index ", i));
}

}  // namespace

ParamMap load_weights(const std::string& path, const ModelConfig& m, DType dtype) {
  SafetensorsFile file = load_safetensors(path);
  std::map<std::string, Shape> expected;
  for (const auto& s : param_specs(m)) expected[s.name] = s.shape;
  ParamMap out;
  for (auto& [name, t] : file.tensors) {
    std::string c = canonical_name(name, m);
    if (c.empty()) continue;
    auto it = expected.find(c);
    if (it == expected.end())
      throw UsageError(str(path, ": tensor '", name, "' is not a parameter of this ", arch_name(m.arch), " model"));
    if (out.count(c)) throw UsageError(str(path, ": tensor '", c, "' appears twice (with and without prefix)"));
    if (t.shape() != it->second)
      throw UsageError(str(path, ": tensor '", name, "' has shape ", shape_str(t.shape()), ", the model expects ",
                           shape_str(it->second)));
    if (!is_floating(t.dtype()))
      throw UsageError(str(path, ": tensor '", name, "' is ", dtype_name(t.dtype()), ", expected a float dtype"));
    out[c] = t.dtype() == dtype ? t : t.to(dtype);
    check_finite(path, name, out[c]);
  }
  for (const auto& [name, shape] : expected)
    if (!out.count(name)) throw UsageError(str(path, ": missing tensor '", name, "' ", shape_str(shape)));
  return out;
}

void save_weights(const std::string& path, const ParamMap& params) { save_safetensors(path, params); }

}  // namespace autosp
