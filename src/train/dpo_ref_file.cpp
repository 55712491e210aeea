// dpo.precompute_ref's file (train/dpo_ref_file.h): its key, and reading and writing it.
#include "train/dpo_ref_file.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "models/hf_config.h"
#include "models/lora.h"
#include "tensor/check.h"
#include "tensor/safetensors.h"
#include "train/data.h"

namespace autosp {

namespace {

constexpr const char* kFormat = "autosp-dpo-ref-logps/1";

// A 64-bit hash of a byte stream, word by word through splitmix64's finaliser: it only has to tell
// two inputs apart, not resist an adversary.
class Hasher {
 public:
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    size_t i = 0;
    for (; filled_ == 0 && i + 8 <= n; i += 8) {  // whole words (little-endian, as the bytes below)
      std::memcpy(&word_, b + i, 8);
      flush();
    }
    for (; i < n; ++i) {
      word_ |= static_cast<uint64_t>(b[i]) << (8 * filled_);
      if (++filled_ == 8) flush();
    }
  }
  void add(const std::string& s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  void add_u64(uint64_t v) { add(&v, sizeof v); }
  std::string hex() {
    if (filled_) flush();
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return buf;
  }

 private:
  void flush() {
    uint64_t z = h_ ^ word_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h_ = (z ^ (z >> 31)) + 0x9E3779B97F4A7C15ull;
    word_ = 0;
    filled_ = 0;
  }
  uint64_t h_ = 0x6A09E667F3BCC908ull, word_ = 0;
  int filled_ = 0;
};

std::string weights_hash(const ParamMap& reference) {
  Hasher h;
  for (const auto& [name, t] : reference) {
    if (is_lora_param(name)) continue;  // the adapters are off in the reference
    const Tensor c = t.contiguous();
    h.add(name);
    h.add(std::string(dtype_name(c.dtype())));
    for (int64_t d : c.shape()) h.add_u64(static_cast<uint64_t>(d));
    h.add(c.raw(), c.nbytes());
  }
  return h.hex();
}

std::string files_hash(const std::vector<std::string>& patterns) {
  Hasher h;
  std::vector<char> buf(size_t(1) << 20);
  for (const std::string& pattern : patterns)
    for (const std::string& file : expand_path(pattern)) {
      std::ifstream f(file, std::ios::binary);
      if (!f) throw UsageError(str(file, ": cannot open"));
      h.add_u64(std::filesystem::file_size(file));
      while (f) {
        f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        h.add(buf.data(), static_cast<size_t>(f.gcount()));
      }
    }
  return h.hex();
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
  Hasher model;
  model.add(hf_config_json(cfg.model, DType::f32).dump());
  return {{"model", model.hex()},
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
