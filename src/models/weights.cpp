// Safetensors ↔ ParamMap with Hugging Face names: single files, shards with their index, model
// directories.
#include "models/weights.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "models/fused_experts.h"
#include "models/gpt_oss_experts.h"
#include "models/hf_config.h"
#include "tensor/safetensors.h"

namespace autosp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The head of a tied model, which files may carry (a copy of the embedding) or leave out.
std::string tied_head(const ModelConfig& m) {
  const Family& f = family(m.arch);
  return present(f.tied_head, m.tie_word_embeddings) ? std::string(f.embedding) : "";
}

// Why a model ties its head, and what to do about a file whose head is its own: the end of the
// message for an lm_head that differs from the embedding.
std::string why_tied(const Family& f) {
  if (f.tied_head == Presence::always) return str(f.name, " always ties its head: tie_word_embeddings must be true)");
  return "model.tie_word_embeddings true): set model.tie_word_embeddings false";
}

// Map a name found in the file to our canonical name; "" = a buffer to ignore. The family's
// optional prefix may be missing (GPT-2's "transformer."); lm_head.weight is checked against the
// tied embedding by the caller.
std::string canonical_name(const std::string& name, const ModelConfig& m) {
  const Family& f = family(m.arch);
  for (std::string_view buffer : f.buffers)
    if (ends_with(name, std::string(buffer))) return "";
  if (name == "lm_head.weight" || f.optional_prefix.empty() || name.rfind(f.optional_prefix, 0) == 0) return name;
  return str(f.optional_prefix, name);
}

// A NaN or infinity in the weights would only surface as a NaN loss steps later.
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const int64_t i = first_non_finite(t);
  if (i < 0) return;
  const double v = t.dtype() == DType::f32 ? t.data<float>()[i] : t.data<double>()[i];
  throw UsageError(str(path, ": tensor '", name, "' holds a non-finite value (", v, ") at index ", i));
}

bool equal_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (x.data<double>()[i] != y.data<double>()[i]) return false;
  return true;
}

// The first bytes of a file that is not safetensors, named: llm.c's files (a 256 × int32 header:
// magic, version), a PyTorch pickle or a JSON file.
void refuse_other_formats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[8] = {};
  f.read(head, 8);
  int32_t magic = 0, version = 0;
  std::memcpy(&magic, head, 4);
  std::memcpy(&version, head + 4, 4);
  if (f.gcount() == 8 && magic == 20240326)
    throw UsageError(str(path, ": an llm.c model checkpoint (magic 20240326, version ", version,
                         "), not safetensors: export it to a Hugging Face directory with llm.c's dev/eval/export_hf.py "
                         "and give that directory"));
  if (f.gcount() == 8 && (magic == 20240520 || magic == 20240801))
    throw UsageError(str(path, ": an llm.c token shard (magic ", magic,
                         "), not model weights: token files go in data.path with data.source \"tokens\""));
  const bool zip = head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4;
  const bool pickle = static_cast<unsigned char>(head[0]) == 0x80 && head[1] >= 2 && head[1] <= 5;
  if (zip || pickle)
    throw UsageError(str(path, ": a PyTorch pickle (torch.save ", zip ? "zip" : "legacy",
                         " format, like pytorch_model.bin), not safetensors: autosp does not unpickle; convert "
                         "it with transformers' save_pretrained(dir, safe_serialization=True)"));
  if (head[0] == '{')
    throw UsageError(str(path, ": a JSON file, not safetensors (a config.json? pass the model directory or its ",
                         kIndexName, ")"));
}

SafetensorsFile load_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) refuse_other_formats(path);
  return load_safetensors(path, /*with_bytes=*/true);  // U8: MXFP4 experts (dequantize_gpt_oss_experts)
}

json read_index(const std::string& path) {
  const json j = read_json_file(path, uint64_t{64} << 20);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw UsageError(str(path, ": not a safetensors index (no \"weight_map\" object)"));
  return j;
}

// The tensors of a sharded set: each shard named by the index is read once, and must hold exactly
// the tensors the index maps to it.
SafetensorsFile load_sharded(const std::string& index_path) {
  const json index = read_index(index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, std::set<std::string>> by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it->is_string()) throw UsageError(str(index_path, ": weight_map['", it.key(), "'] is not a file name"));
    const std::string shard = it->get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      throw UsageError(str(index_path, ": weight_map['", it.key(), "'] = \"", shard,
                           "\": expected a file name in the index's directory"));
    by_shard[shard].insert(it.key());
  }
  if (by_shard.empty()) throw UsageError(str(index_path, ": weight_map is empty"));
  SafetensorsFile out;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (dir / shard).string();
    SafetensorsFile f = load_file(path);
    auto take = [&](auto& from, auto& to) {
      for (auto& [name, t] : from) {
        if (!names.count(name))
          throw UsageError(str(path, ": tensor '", name, "' is not mapped to this shard by ", index_path));
        to.emplace(name, std::move(t));
      }
    };
    take(f.tensors, out.tensors);
    take(f.bytes, out.bytes);
    for (const auto& name : names)
      if (!out.tensors.count(name) && !out.bytes.count(name))
        throw UsageError(str(path, ": has no tensor '", name, "', which ", index_path, " maps to it"));
  }
  return out;
}

// What `path` names, read: a directory (its index or its single file), an index, or a file.
SafetensorsFile load_any(const std::string& path, const ModelConfig& m, bool check_config) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (check_config) check_hf_dir_matches(path, m);
    const fs::path d(path);
    if (fs::exists(d / kIndexName, ec)) return load_sharded((d / kIndexName).string());
    if (fs::exists(d / kSingleName, ec)) return load_file((d / kSingleName).string());
    for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
      if (fs::exists(d / pickle, ec))
        throw UsageError(str(path, ": holds PyTorch pickle weights (", pickle, "), not safetensors: convert them with "
                             "transformers' save_pretrained(dir, safe_serialization=True)"));
    if (const std::string other = other_tool_directory(path); !other.empty()) throw UsageError(str(path, ": ", other));
    throw UsageError(str(path, ": holds neither ", kSingleName, " nor ", kIndexName));
  }
  const fs::path parent = fs::path(path).parent_path();
  if (check_config && fs::exists(parent / "config.json", ec) && (ends_with(path, ".safetensors") || ends_with(path, ".index.json")))
    check_hf_dir_matches(parent.empty() ? "." : parent.string(), m);
  if (ends_with(path, ".index.json")) return load_sharded(path);
  return load_file(path);
}

}  // namespace

ParamMap load_weights(const std::string& path, const ModelConfig& m, DType dtype, bool check_dir_config) {
  SafetensorsFile file = load_any(path, m, check_dir_config);
  dequantize_gpt_oss_experts(file, m, path);  // MXFP4 experts (the only U8 tensors read)
  split_fused_experts(file.tensors, m, path);  // transformers 5's fused experts, gpt-oss's stacked ones
  std::map<std::string, Shape> expected;
  for (const auto& s : param_specs(m)) expected[s.name] = s.shape;
  const std::string head = tied_head(m);
  ParamMap out;
  std::optional<Tensor> file_head;  // a tied model's lm_head.weight, when the file has one
  for (auto& [name, t] : file.tensors) {
    std::string c = canonical_name(name, m);
    if (c.empty()) continue;
    if (c == "lm_head.weight" && !head.empty()) {
      file_head = t;
      continue;
    }
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
    if (!out.count(name)) {
      if (name == "lm_head.weight")
        throw UsageError(str(path, ": missing tensor 'lm_head.weight' ", shape_str(shape),
                             ": if this model ties its head to model.embed_tokens, set model.tie_word_embeddings true"));
      throw UsageError(str(path, ": missing tensor '", name, "' ", shape_str(shape)));
    }
  // A tied model computes logits with the embedding: a different lm_head in the file would be lost.
  if (file_head && !equal_values(*file_head, file.tensors.count(head) ? file.tensors.at(head) : out.at(head)))
    throw UsageError(str(path, ": tensor 'lm_head.weight' differs from '", head, "', but the model ties them (",
                         why_tied(family(m.arch))));
  return out;
}

void save_weights(const std::string& path, const ParamMap& params) {
  save_safetensors(path, params, {{"format", "pt"}});
}

std::vector<std::string> save_hf_model(const std::string& dir, ParamMap params, const ModelConfig& m,
                                       uint64_t max_shard_bytes) {
  fuse_gpt_oss_experts(params, m);  // gpt-oss's stacked layout; the other families' per expert
  return save_hf_weights(dir, params, max_shard_bytes);
}

std::vector<std::string> save_hf_weights(const std::string& dir, const ParamMap& params, uint64_t max_shard_bytes) {
  // Shards in name order, each closed before the tensor that would take it past the limit
  // (transformers' split_torch_state_dict_into_shards, which also never splits a tensor).
  std::vector<ParamMap> shards(1);
  uint64_t size = 0, total = 0;
  for (const auto& [name, t] : params) {
    const uint64_t n = static_cast<uint64_t>(t.nbytes());
    if (!shards.back().empty() && size + n > max_shard_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back()[name] = t;
    size += n;
    total += n;
  }
  const fs::path d(dir);
  if (shards.size() == 1) {
    save_weights((d / kSingleName).string(), params);
    return {kSingleName};
  }
  std::vector<std::string> files;
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    save_weights((d / name).string(), shards[i]);
    files.push_back(name);
    for (const auto& [tensor, t] : shards[i]) weight_map[tensor] = name;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string index_path = (d / kIndexName).string();
  std::ofstream f(index_path);
  f << index.dump(2) << "\n";
  if (!f.flush()) throw RuntimeFailure(str(index_path, ": write failed"));
  files.push_back(kIndexName);
  return files;
}

}  // namespace autosp
