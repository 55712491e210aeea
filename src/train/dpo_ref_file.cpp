// dpo.precompute_ref's file (train/dpo_ref_file.h): its key, and reading and writing it.
#include "train/dpo_ref_file.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "models/hf_config.h"
#include "models/lora.h"
#include "tensor/check.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"
#include "train/data.h"

namespace autosp {

namespace {

constexpr const char* kFormat = "autosp-dpo-ref-logps/1";

// The key's hashes are CRC-32C (train/checkpoint.h, the checkpoints' checksum), continued over
// each part: they only have to tell two inputs apart, not resist an adversary.
uint32_t crc_of(const std::string& s, uint32_t crc) {
  const uint64_t n = s.size();
  return crc32c(s.data(), s.size(), crc32c(&n, sizeof n, crc));
}

std::string hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

std::string weights_hash(const ParamMap& reference) {
  uint32_t crc = 0;
  for (const auto& [name, t] : reference) {
    if (is_lora_param(name)) continue;  // the adapters are off in the reference
    const Tensor c = t.contiguous();
    crc = crc_of(std::string(dtype_name(c.dtype())), crc_of(name, crc));
    for (int64_t d : c.shape()) crc = crc32c(&d, sizeof d, crc);
    crc = crc32c(c.raw(), c.nbytes(), crc);
  }
  return hex(crc);
}

std::string files_hash(const std::vector<std::string>& patterns) {
  uint32_t crc = 0;
  for (const std::string& pattern : patterns)
    for (const std::string& file : expand_path(pattern)) {
      uint64_t size = 0;
      const uint32_t own = crc32c_file(file, &size);
      crc = crc32c(&own, sizeof own, crc32c(&size, sizeof size, crc));
    }
  return hex(crc);
}

// What each key entry means, for the reason a file is stale.
std::string what_differs(const std::string& entry) {
  if (entry == "model") return "the model's config differs";
  if (entry == "weights") return "the reference's weights differ";
  if (entry == "data") return "the data files differ";
  if (entry == "seq_len") return "data.seq_len differs";
  if (entry == "dtype") return "runtime.dtype differs";
  return "its " + entry + " differs";
}

}  // namespace

std::string ref_logps_path(const std::string& pairs_pattern) {
  const std::filesystem::path p(pairs_pattern);
  std::string stem = p.filename().string();
  stem = stem.substr(0, stem.find_first_of("*?["));  // pairs_train_*.npy → pairs_train_
  if (const size_t dot = stem.find(".npy"); dot != std::string::npos) stem = stem.substr(0, dot);
  if (stem.rfind("pairs", 0) == 0) stem = stem.substr(5);  // → _train_
  while (!stem.empty() && (stem.front() == '_' || stem.front() == '.')) stem.erase(0, 1);
  while (!stem.empty() && (stem.back() == '_' || stem.back() == '.')) stem.pop_back();
  return (p.parent_path() / ("ref_logps" + (stem.empty() ? "" : "_" + stem) + ".safetensors")).string();
}

RefLogpsKey ref_logps_key(const Config& cfg, const ParamMap& reference, const std::vector<std::string>& data_patterns) {
  return {{"model", hex(crc_of(hf_config_json(cfg.model, DType::f32).dump(), 0))},
          {"weights", weights_hash(reference)},
          {"data", files_hash(data_patterns)},
          {"seq_len", std::to_string(cfg.data.seq_len)},
          {"dtype", std::string(dtype_name(cfg.runtime.dtype))}};
}

std::optional<RefLogps> load_ref_logps(const std::string& path, const RefLogpsKey& key, std::string& why) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    why = "none yet";
    return std::nullopt;
  }
  const SafetensorsFile f = load_safetensors(path);  // garbage or truncated: a UsageError naming it
  auto bad = [&](const std::string& what) {
    return UsageError(str(path, ": ", what, " (dpo.precompute_ref's file of reference log-probabilities; "
                          "remove it to compute them again)"));
  };
  const auto format = f.metadata.find("format");
  if (format == f.metadata.end() || format->second != kFormat)
    throw bad(str("not a file of format ", kFormat));
  for (const auto& [entry, value] : key) {
    const auto it = f.metadata.find(entry);
    if (it == f.metadata.end()) throw bad(str("its key has no \"", entry, "\""));
    if (it->second != value) {
      why = what_differs(entry) + " (" + it->second + " in the file, " + value + " now)";
      return std::nullopt;
    }
  }
  const auto ids = f.tensors.find("pair_ids"), logps = f.tensors.find("logps");
  if (ids == f.tensors.end() || logps == f.tensors.end()) throw bad("it lacks the tensor pair_ids or logps");
  const Tensor& i = ids->second;
  const Tensor& l = logps->second;
  if (i.dtype() != DType::i64 || i.rank() != 1 || l.dtype() != DType::f64 || l.rank() != 2 || l.dim(0) != i.dim(0) ||
      l.dim(1) != 2)
    throw bad("pair_ids must be I64 [N] and logps F64 [N, 2]");
  RefLogps table;
  const int64_t* id = i.data<int64_t>();
  const double* v = l.data<double>();
  for (int64_t n = 0; n < i.dim(0); ++n) {
    if (id[n] <= 0 || (n > 0 && id[n] <= id[n - 1])) throw bad(str("pair id ", id[n], " at ", n, ": ids are > 0 and ascending"));
    if (!std::isfinite(v[2 * n]) || !std::isfinite(v[2 * n + 1]) || v[2 * n] > 0 || v[2 * n + 1] > 0)
      throw bad(str("pair id ", id[n], ": log-probability sums ", v[2 * n], ", ", v[2 * n + 1], " (finite and <= 0 expected)"));
    table[id[n]] = {v[2 * n], v[2 * n + 1]};
  }
  return table;
}

void save_ref_logps(const std::string& path, const RefLogpsKey& key, const RefLogps& table) {
  std::vector<int64_t> ids;
  std::vector<double> logps;
  for (const auto& [id, sums] : table) {
    ids.push_back(id);
    logps.push_back(sums.first);
    logps.push_back(sums.second);
  }
  const auto n = static_cast<int64_t>(ids.size());
  std::map<std::string, std::string> meta = key;
  meta["format"] = kFormat;
  save_safetensors(path, {{"pair_ids", Tensor::from_vector<int64_t>({n}, ids)},
                          {"logps", Tensor::from_vector<double>({n, 2}, logps)}},
                   meta);
}

}  // namespace autosp
