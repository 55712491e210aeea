// transformers 5's fused experts split into per-expert tensors (models/fused_experts.h).
#include "models/fused_experts.h"

#include "models/gpt_oss_experts.h"
#include "models/moe.h"
#include "tensor/check.h"

namespace autosp {
namespace {

// Rows [row0, row0 + rows) of matrix e of a contiguous [E, R, K] tensor, as a contiguous [rows, K] copy.
Tensor rows_of(const Tensor& t, int64_t e, int64_t row0, int64_t rows) {
  const int64_t R = t.shape()[1], K = t.shape()[2];
  return t.as_strided({rows, K}, {K, 1}, (e * R + row0) * K).contiguous();
}

// Moves `from` to `to` in `tensors` unless the file holds both (an error) or neither.
void rename(std::map<std::string, Tensor>& tensors, const std::string& from, const std::string& to,
            const std::string& path) {
  auto it = tensors.find(from);
  if (it == tensors.end()) return;
  if (tensors.count(to))
    throw UsageError(str(path, ": holds both '", from, "' (transformers 5's name) and '", to, "' (4.x's) for one tensor"));
  tensors.emplace(to, it->second.contiguous());
  tensors.erase(it);
}

}  // namespace

void split_fused_experts(std::map<std::string, Tensor>& tensors, const ModelConfig& m, const std::string& path) {
  const Family& f = family(m.arch);
  if (f.moe == Moe::gpt_oss) return split_gpt_oss_experts(tensors, m, path);  // its own stacked layout
  if (f.moe == Moe::none) return;
  const int64_t E = m.num_experts, I = m.expert_width(), C = m.hidden_size;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    if (!m.sparse_layer(l)) continue;
    const std::string layer = str("model.layers.", l, ".");
    if (f.moe == Moe::mixtral) rename(tensors, layer + "mlp.gate.weight", moe_router_weight(m, layer), path);
    const std::string gate_up = layer + "mlp.experts.gate_up_proj", down = layer + "mlp.experts.down_proj";
    const bool has_gate_up = tensors.count(gate_up) > 0, has_down = tensors.count(down) > 0;
    if (!has_gate_up && !has_down) continue;
    if (has_gate_up != has_down)
      throw UsageError(str(path, ": holds '", has_gate_up ? gate_up : down, "' but not '", has_gate_up ? down : gate_up,
                           "': transformers 5's fused experts come as both"));
    const Tensor gu = tensors.at(gate_up).contiguous(), dn = tensors.at(down).contiguous();
    const Shape want_gu{E, 2 * I, C}, want_dn{E, C, I};
    if (gu.shape() != want_gu)
      throw UsageError(str(path, ": tensor '", gate_up, "' has shape ", shape_str(gu.shape()), ", the model expects ",
                           shape_str(want_gu), " (experts, 2 × expert width, hidden)"));
    if (dn.shape() != want_dn)
      throw UsageError(str(path, ": tensor '", down, "' has shape ", shape_str(dn.shape()), ", the model expects ",
                           shape_str(want_dn), " (experts, hidden, expert width)"));
    for (int64_t e = 0; e < E; ++e) {
      const Tensor parts[3] = {rows_of(gu, e, 0, I), rows_of(gu, e, I, I), rows_of(dn, e, 0, C)};
      for (int which = 0; which < 3; ++which) {
        const std::string name = moe_expert_weight(m, layer, e, which);
        if (!tensors.emplace(name, parts[which]).second)
          throw UsageError(str(path, ": holds expert ", e, " of layer ", l, " twice: as '", name, "' and in '",
                               which == 2 ? down : gate_up, "'"));
      }
    }
    tensors.erase(gate_up);
    tensors.erase(down);
  }
}

}  // namespace autosp
