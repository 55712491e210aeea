// gpt-oss's stacked experts ↔ per-expert tensors, and their MXFP4 form (models/gpt_oss_experts.h).
#include "models/gpt_oss_experts.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>

#include "models/moe.h"
#include "tensor/check.h"
#include "tensor/mxfp4.h"

namespace autosp {
namespace {

const std::string kGateUp = "mlp.experts.gate_up_proj", kGateUpBias = "mlp.experts.gate_up_proj_bias",
                  kDown = "mlp.experts.down_proj", kDownBias = "mlp.experts.down_proj_bias";

// A per-expert tensor as a view of a stacked one: expert e's part is the stacked tensor's elements
// at offset + e · expert_stride + Σ index_d · strides_d over `shape`.
struct View {
  std::string per_expert;  // its name under the layer, "mlp.experts.{e}." left out: "gate_proj.weight"
  const std::string* stacked;
  Shape shape, strides;
  int64_t offset, expert_stride;
};

// The six per-expert tensors of a model with hidden C and expert width I.
std::array<View, 6> views(int64_t C, int64_t I) {
  return {{{"gate_proj.weight", &kGateUp, {I, C}, {2, 2 * I}, 0, C * 2 * I},    // W[c, 2i]ᵀ
           {"up_proj.weight", &kGateUp, {I, C}, {2, 2 * I}, 1, C * 2 * I},      // W[c, 2i + 1]ᵀ
           {"down_proj.weight", &kDown, {C, I}, {1, C}, 0, I * C},              // W[i, c]ᵀ
           {"gate_proj.bias", &kGateUpBias, {I}, {2}, 0, 2 * I},
           {"up_proj.bias", &kGateUpBias, {I}, {2}, 1, 2 * I},
           {"down_proj.bias", &kDownBias, {C}, {1}, 0, C}}};
}

// The stacked tensors' shapes, by name.
std::map<std::string, Shape> stacked_shapes(int64_t E, int64_t C, int64_t I) {
  return {{kGateUp, {E, C, 2 * I}}, {kGateUpBias, {E, 2 * I}}, {kDown, {E, I, C}}, {kDownBias, {E, C}}};
}

std::string expert_name(const std::string& layer, int64_t e, const View& v) {
  return str(layer, "mlp.experts.", e, ".", v.per_expert);
}

// Writes the contiguous `part` into `stacked` at the view's elements of expert e (any dtype).
void scatter(const Tensor& part, Tensor& stacked, const View& v, int64_t e) {
  const Tensor src = part.contiguous();
  const size_t es = dtype_size(src.dtype());
  const auto* from = static_cast<const unsigned char*>(src.raw());
  auto* to = static_cast<unsigned char*>(stacked.raw());
  const int64_t rows = v.shape.size() == 2 ? v.shape[0] : 1, cols = v.shape.back();
  const int64_t row_stride = v.shape.size() == 2 ? v.strides[0] : 0, col_stride = v.strides.back();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t at = v.offset + e * v.expert_stride + r * row_stride + c * col_stride;
      std::memcpy(to + static_cast<size_t>(at) * es, from + static_cast<size_t>(r * cols + c) * es, es);
    }
}

}  // namespace

void split_gpt_oss_experts(std::map<std::string, Tensor>& tensors, const ModelConfig& m, const std::string& path) {
  if (family(m.arch).moe != Moe::gpt_oss) return;
  const int64_t E = m.num_experts, C = m.hidden_size, I = m.expert_width();
  const std::map<std::string, Shape> shapes = stacked_shapes(E, C, I);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string layer = str("model.layers.", l, ".");
    std::string found, missing;
    for (const auto& [name, shape] : shapes) (tensors.count(layer + name) ? found : missing) = layer + name;
    if (found.empty()) continue;  // per expert already
    if (!missing.empty())
      throw UsageError(str(path, ": holds '", found, "' but not '", missing,
                           "': gpt-oss's stacked experts come as gate_up_proj, gate_up_proj_bias, down_proj and "
                           "down_proj_bias"));
    std::map<std::string, Tensor> stacked;
    for (const auto& [name, shape] : shapes) {
      const Tensor t = tensors.at(layer + name).contiguous();
      if (t.shape() != shape)
        throw UsageError(str(path, ": tensor '", layer + name, "' has shape ", shape_str(t.shape()),
                             ", the model expects ", shape_str(shape), " (experts E = ", E, ", hidden C = ", C,
                             ", expert width I = ", I, ")"));
      stacked.emplace(name, t);
    }
    for (int64_t e = 0; e < E; ++e)
      for (const View& v : views(C, I)) {
        const Tensor& s = stacked.at(*v.stacked);
        const std::string name = expert_name(layer, e, v);
        if (!tensors.emplace(name, s.as_strided(v.shape, v.strides, v.offset + e * v.expert_stride).contiguous()).second)
          throw UsageError(str(path, ": holds expert ", e, " of layer ", l, " twice: as '", name, "' and in '",
                               layer + *v.stacked, "'"));
      }
    for (const auto& [name, shape] : shapes) tensors.erase(layer + name);
  }
}

void fuse_gpt_oss_experts(std::map<std::string, Tensor>& params, const ModelConfig& m) {
  if (family(m.arch).moe != Moe::gpt_oss) return;
  const int64_t E = m.num_experts, C = m.hidden_size, I = m.expert_width();
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const std::string layer = str("model.layers.", l, ".");
    const std::array<View, 6> vs = views(C, I);
    AUTOSP_ASSERT(params.count(expert_name(layer, 0, vs[0])), "fuse_gpt_oss_experts: no experts in layer ", l);
    std::map<std::string, Tensor> stacked;
    for (const auto& [name, shape] : stacked_shapes(E, C, I)) {
      const View& first = *std::find_if(vs.begin(), vs.end(), [&](const View& v) { return *v.stacked == name; });
      stacked.emplace(name, Tensor::empty(shape, params.at(expert_name(layer, 0, first)).dtype()));
    }
    for (int64_t e = 0; e < E; ++e)
      for (const View& v : vs) {
        auto it = params.find(expert_name(layer, e, v));
        AUTOSP_ASSERT(it != params.end() && it->second.shape() == v.shape, "fuse_gpt_oss_experts: ", expert_name(layer, e, v));
        scatter(it->second, stacked.at(*v.stacked), v, e);
        params.erase(it);
      }
    for (auto& [name, t] : stacked) params.emplace(layer + name, std::move(t));
  }
}

void dequantize_gpt_oss_experts(SafetensorsFile& file, const ModelConfig& m, const std::string& path) {
  if (file.bytes.empty()) return;
  if (family(m.arch).moe == Moe::gpt_oss) {
    const int64_t C = m.hidden_size, I = m.expert_width();
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
      const std::string layer = str("model.layers.", l, ".");
      // gate_up_proj's blocks hold its 2I output rows of C inputs, down_proj's C rows of I.
      for (const auto& [proj, rows, inputs] : {std::tuple{kGateUp, 2 * I, C}, std::tuple{kDown, C, I}}) {
        const std::string name = layer + proj, blocks = name + "_blocks", scales = name + "_scales";
        const bool has_blocks = file.bytes.count(blocks) > 0, has_scales = file.bytes.count(scales) > 0;
        if (!has_blocks && !has_scales) continue;
        if (has_blocks != has_scales)
          throw UsageError(str(path, ": holds '", has_blocks ? blocks : scales, "' but not '",
                               has_blocks ? scales : blocks, "': MXFP4 weights come as blocks and scales"));
        const ByteTensor& b = file.bytes.at(blocks);
        const Shape want{m.num_experts, rows, inputs / 32, 16};
        if (inputs % 32 != 0 || b.shape != want)
          throw UsageError(str(path, ": tensor '", blocks, "' has shape ", shape_str(b.shape), ", the model expects ",
                               inputs % 32 == 0 ? shape_str(want) : str("a multiple of 32 inputs (has ", inputs, ")"),
                               " (experts, output rows, blocks of 32 inputs, 16 bytes)"));
        const Tensor rows_major = mxfp4_dequantize(b, file.bytes.at(scales), blocks, scales, path);  // [E, rows, K]
        if (file.tensors.count(name))
          throw UsageError(str(path, ": holds '", name, "' both dequantized and as MXFP4 ('", blocks, "')"));
        const Tensor t = rows_major.as_strided({m.num_experts, inputs, rows}, {rows * inputs, 1, inputs}, 0);
        file.tensors.emplace(name, t.contiguous());
        file.bytes.erase(blocks);
        file.bytes.erase(scales);
      }
    }
  }
  if (!file.bytes.empty())
    throw UsageError(str(path, ": tensor '", file.bytes.begin()->first, "' is U8, which autosp reads only as ",
                         "gpt-oss's MXFP4 expert weights (model.layers.{i}.mlp.experts.{gate_up_proj,down_proj}_",
                         "{blocks,scales}); store it as a float dtype"));
}

}  // namespace autosp
