// Atomic checkpoint directories with CRC-32C checksums, keep-last-K pruning and validated loading,
// and the checkpoint directory's lifecycle (its lock, --resume, --start-over, branching).
#include "train/checkpoint.h"
#include "train/adapter.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "models/hf_config.h"
#include "models/weights.h"
#include "tensor/input_file.h"
#include "tensor/safetensors.h"

namespace autosp {
namespace fs = std::filesystem;

namespace {

constexpr int kFormat = 2;  // 2: meta.json carries the files' sizes and CRC-32C
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// The model's weights: one of these is among the files of every checkpoint (models/weights.h).
constexpr const char* kWeightFiles[] = {"model.safetensors", "model.safetensors.index.json"};
constexpr uint64_t kMaxMetaBytes = uint64_t{64} << 20;

// ---- CRC-32C, slicing by 8 ----------------------------------------------------------------------

struct CrcTables {
  uint32_t t[8][256];
};
constexpr CrcTables make_crc_tables() {
  CrcTables T{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    T.t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) T.t[s][i] = (T.t[s - 1][i] >> 8) ^ T.t[0][T.t[s - 1][i] & 0xFF];
  return T;
}
constexpr CrcTables kCrc = make_crc_tables();

// ---- files and directories ----------------------------------------------------------------------

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeFailure(str(p.string(), ": cannot open for fsync: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) throw RuntimeFailure(str(p.string(), ": fsync failed: ", std::strerror(errno)));
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// The step of a "step_<digits>" name, or -1.
int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// The step_N directories under `root`, newest first (complete or not: a complete one has meta.json;
// the save protocol below never leaves an incomplete one under a step_N name).
std::vector<std::pair<int64_t, fs::path>> list_step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t s = step_of(it->path().filename().string());
    if (s >= 0 && it->is_directory(ec)) out.emplace_back(s, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// The complete checkpoints (step_N directories with a meta.json) under `root`, newest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (auto& [step, dir] : list_step_dirs(root))
    if (fs::exists(dir / "meta.json", ec)) out.emplace_back(step, dir);
  return out;
}

// ".step_N.{tmp,old,del}.<pid>" left by a process that is gone (a crash mid-write): the pid.
pid_t stale_pid(const std::string& name) {
  if (name.rfind(".step_", 0) != 0) return 0;
  const auto dot = name.rfind('.');
  const std::string pid = name.substr(dot + 1);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return 0;
  const pid_t p = static_cast<pid_t>(std::stol(pid));
  if (p == ::getpid() || p <= 0) return 0;
  return ::kill(p, 0) != 0 && errno == ESRCH ? p : 0;
}

// Remove all but the newest `keep` checkpoints. Failures here never fail the run: the new
// checkpoint is already in place.
void prune(const fs::path& root, int64_t keep) {
  if (keep <= 0) return;
  auto all = list_checkpoints(root);
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    const fs::path& dir = all[i].second;
    const fs::path trash = root / ("." + dir.filename().string() + ".del." + std::to_string(::getpid()));
    std::error_code rm;
    fs::rename(dir, trash, rm);
    if (!rm) fs::remove_all(trash, rm);
    if (rm) spdlog::warn("{}: cannot remove old checkpoint: {}", dir.string(), rm.message());
  }
}

// The step_N name inside a ".step_N.<kind>.<pid>" leftover.
std::string leftover_step(const std::string& name) {
  const auto first = name.find('.', 1);
  return first == std::string::npos ? "" : name.substr(1, first - 1);
}

// What writers that are gone (their pid no longer runs) left under `root`: an ".old" copy whose
// step_N is missing is put back (it is complete), every other leftover is removed.
void recover_dead_writers(const std::string& root) {
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (stale_pid(it->path().filename().string())) leftovers.push_back(it->path());
  // A dead writer's ".old" copy was a complete step_N, moved aside for a re-save that did not finish
  // (a filesystem without RENAME_EXCHANGE): it goes back when its step_N is missing.
  for (const fs::path& p : leftovers) {
    const std::string name = p.filename().string();
    if (name.find(".old.") == std::string::npos) continue;
    const fs::path back = fs::path(root) / leftover_step(name);
    std::error_code e;
    if (!fs::exists(back, e) && fs::exists(p / "meta.json", e)) {
      fs::rename(p, back, e);
      if (!e) {
        spdlog::warn("{}: recovered the checkpoint a dead writer had moved aside ({})", back.string(), name);
        fsync_path(root);
      }
    }
  }
  for (const fs::path& p : leftovers) {
    std::error_code rm;
    if (fs::exists(p, rm)) fs::remove_all(p, rm);
    if (rm) spdlog::warn("{}: cannot remove a dead writer's leftover: {}", p.string(), rm.message());
  }
}

// `root/step_N` as the newest checkpoint: a newest step_N without meta.json is an error, not a
// reason to go back silently to an older one.
fs::path resolve(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) throw UsageError(str(path, ": no such checkpoint directory"));
  if (fs::exists(p / "meta.json", ec)) return p;
  recover_dead_writers(path);
  auto all = list_step_dirs(p);
  if (all.empty()) {
    if (fs::exists(p / "config.json", ec))
      throw UsageError(str(path, ": a Hugging Face model directory, not a checkpoint (no meta.json): start from it "
                           "with --init-from or \"model\": {\"from\": DIR}"));
    if (const std::string other = other_tool_directory(path); !other.empty()) throw UsageError(str(path, ": ", other));
    throw UsageError(str(path, ": holds no checkpoint (no meta.json, no step_* directory)"));
  }
  if (!fs::exists(all.front().second / "meta.json", ec))
    throw UsageError(str(all.front().second.string(), ": the newest checkpoint has no meta.json (damaged or not "
                         "written by autosp); move it away, or --resume an older step_* directory explicitly"));
  return all.front().second;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Compare each data file with the size and CRC-32C meta.json records for it: every file it lists
// (the weights, their shards and index, config.json, the optimizer state), which must include the
// optimizer state and the weights (a LoRA run's: the adapter, train/adapter.h).
void verify_files(const fs::path& dir, const nlohmann::json& meta, const std::string& meta_path, bool lora) {
  if (!meta.contains("files") || !meta["files"].is_object()) throw UsageError(str(meta_path, ": no 'files' checksums"));
  const nlohmann::json& files = meta["files"];
  if (!files.contains(kOptimizerFile))
    throw UsageError(str(meta_path, ": 'files' has no {bytes, crc32c} entry for ", kOptimizerFile));
  if (lora && !files.contains(kAdapterWeightsFile))
    throw UsageError(str(meta_path, ": 'files' has no {bytes, crc32c} entry for ", kAdapterWeightsFile));
  if (!lora && !files.contains(kWeightFiles[0]) && !files.contains(kWeightFiles[1]))
    throw UsageError(str(meta_path, ": 'files' has no {bytes, crc32c} entry for ", kWeightFiles[0], " or ",
                         kWeightFiles[1]));
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string name = it.key();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw UsageError(str(meta_path, ": 'files' names '", name, "', not a file of the checkpoint directory"));
    const std::string path = (dir / name).string();
    const nlohmann::json& f = *it;
    if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_unsigned() || !f.contains("crc32c") ||
        !f["crc32c"].is_string())
      throw UsageError(str(meta_path, ": 'files' has no {bytes, crc32c} entry for ", name));
    uint64_t size = 0;
    const uint32_t crc = crc32c_file(path, &size);
    if (size != f["bytes"].get<uint64_t>())
      throw UsageError(str(path, ": ", size, " bytes, meta.json records ", f["bytes"].get<uint64_t>(),
                           ": the file is truncated or was replaced"));
    if (hex32(crc) != f["crc32c"].get<std::string>())
      throw UsageError(str(path, ": checksum mismatch (crc32c ", hex32(crc), ", meta.json records ",
                           f["crc32c"].get<std::string>(), "): the file is corrupt"));
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const auto& t = kCrc.t;
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian (safetensors.cpp asserts the host is)
    w ^= crc;
    crc = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
          t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
  }
  for (; n > 0; --n) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

uint32_t crc32c_file(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw UsageError(str(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(str(path, ": not a regular file"));
  }
  std::vector<unsigned char> buf(size_t{1} << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw RuntimeFailure(str(path, ": read failed: ", std::strerror(err)));
    }
    if (got == 0) break;
    crc = crc32c(buf.data(), static_cast<size_t>(got), crc);
    total += static_cast<uint64_t>(got);
  }
  ::close(fd);
  if (size) *size = total;
  return crc;
}

namespace {

// The weights as a Hugging Face model directory (config.json in HF keys, model.safetensors or
// shards with their index; models/weights.h), then the optimizer state.
std::vector<std::string> write_model_files(const fs::path& tmp, const ParamMap& params,
                                           const std::map<std::string, Tensor>& moments, const Config& cfg) {
  // A LoRA run's trained tensors are a PEFT adapter directory (train/adapter.h).
  std::vector<std::string> names =
      cfg.lora.enabled ? save_adapter(tmp.string(), params, cfg)
                       : save_hf_model(tmp.string(), params, cfg.model, static_cast<uint64_t>(cfg.train.max_shard_mb * 1e6));
  for (const std::string& name : names) fsync_path(tmp / name);  // the index is written without one
  if (!params.empty() && !cfg.lora.enabled) {
    const std::string path = (tmp / "config.json").string();
    std::ofstream f(path);
    f << hf_config_json(cfg.model, params.begin()->second.dtype(), cfg.hf_carried).dump(2) << "\n";
    if (!f.flush()) throw RuntimeFailure(str(path, ": write failed"));
    f.close();
    fsync_path(path);
    names.push_back("config.json");
  }
  save_safetensors((tmp / kOptimizerFile).string(), moments);
  names.push_back(kOptimizerFile);
  return names;
}

void write_files(const fs::path& tmp, const ParamMap& params, const std::map<std::string, Tensor>& moments,
                 const AdamW& opt, const Config& cfg, int64_t step, const SaveOptions& options,
                 const std::function<void(const char*)>& at) {
  const nlohmann::json& data_position = options.data_position;
  const std::vector<std::string> names = write_model_files(tmp, params, moments, cfg);
  at("files");
  // Checksums of what is on disk (read back), so a load sees exactly the bytes written here.
  nlohmann::json files = nlohmann::json::object();
  for (const std::string& name : names) {
    uint64_t size = 0;
    const uint32_t crc = crc32c_file((tmp / name).string(), &size);
    files[name] = {{"bytes", size}, {"crc32c", hex32(crc)}};
  }
  // The data order is a pure function of the step and the seed, and nothing else draws random
  // numbers after initialisation, so (step, seed) is the whole RNG state.
  nlohmann::json meta = {{"format", kFormat},
                         {"step", step},
                         {"optimizer_step", opt.step},
                         {"data_position", data_position.is_null() ? nlohmann::json(step) : data_position},
                         {"rng", {{"seed", cfg.train.seed}, {"state", "stateless (step, seed)"}}},
                         {"files", files},
                         {"config", cfg.resolved}};
  if (!options.lora_base.is_null()) meta["lora_base"] = options.lora_base;
  {
    std::ofstream f(tmp / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f.flush()) throw RuntimeFailure(str((tmp / "meta.json").string(), ": write failed"));
  }
  fsync_path(tmp / "meta.json");
  fsync_path(tmp);
}

// Moves the complete `tmp` to `final_dir`. A re-save of an existing step exchanges the two
// directories in one rename (RENAME_EXCHANGE), so step_N is the old or the new checkpoint at every
// instant, never missing; the old one then sits at the temporary name and is removed. Where the
// filesystem cannot exchange, the old copy is moved aside first (".old.<pid>") and a crash before
// the second rename leaves it for recover_dead_writers to put back.
void commit(const fs::path& tmp, const fs::path& final_dir, const fs::path& root,
            const std::function<void(const char*)>& at) {
  std::error_code ec;
  auto fail = [&](const char* what) {
    throw RuntimeFailure(str(final_dir.string(), ": cannot move checkpoint into place (", what, "): ",
                             std::strerror(errno)));
  };
  if (fs::exists(final_dir, ec)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_path(root);
      at("exchanged");
      fs::remove_all(tmp, ec);  // the previous copy, now at the temporary name
      return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) fail("exchange");
    const fs::path old = root / ("." + final_dir.filename().string() + ".old." + std::to_string(::getpid()));
    if (::rename(final_dir.c_str(), old.c_str()) != 0) fail("move aside");
    at("moved_aside");
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      const int err = errno;
      ::rename(old.c_str(), final_dir.c_str());  // the previous copy back where it was
      errno = err;
      fail("rename");
    }
    fsync_path(root);
    at("committed");
    fs::remove_all(old, ec);
    return;
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) fail("rename");
  fsync_path(root);
  at("committed");
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const ParamMap& params, const AdamW& opt,
                            const Config& cfg, const SaveOptions& options) {
  // Nothing non-finite is ever written: such a checkpoint could only be refused on resume.
  std::map<std::string, Tensor> moments;
  for (const auto& [name, t] : opt.exp_avg) moments["exp_avg." + name] = t;
  for (const auto& [name, t] : opt.exp_avg_sq) moments["exp_avg_sq." + name] = t;
  for (const ParamMap* m : {&params, static_cast<const ParamMap*>(&moments)})
    for (const auto& [name, t] : *m)
      if (first_non_finite(t) >= 0)
        throw RuntimeFailure(str("step ", step, ": '", name, "' has non-finite values; not writing a checkpoint (",
                                 root, " keeps its last good one)"));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw RuntimeFailure(str(root, ": cannot create checkpoint directory: ", ec.message()));
  // What dead writers left is cleaned first, so it never takes the space this write needs.
  recover_dead_writers(root);
  const fs::path final_dir = fs::path(root) / step_name(step);
  const fs::path tmp = fs::path(root) / ("." + step_name(step) + ".tmp." + std::to_string(::getpid()));
  auto at = [&](const char* point) {
    if (options.at_point) options.at_point(point);
  };
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw RuntimeFailure(str(tmp.string(), ": cannot create: ", ec.message()));
  try {
    write_files(tmp, params, moments, opt, cfg, step, options, at);
    at("synced");
    if (options.before_commit) options.before_commit();
    commit(tmp, final_dir, fs::path(root), at);
  } catch (...) {  // a failed write (ENOSPC, EIO) leaves nothing behind; step_N is as it was or new
    std::error_code rm;
    fs::remove_all(tmp, rm);
    throw;
  }
  prune(root, options.keep_last);
  at("pruned");
  return final_dir.string();
}

DirLock::DirLock(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw RuntimeFailure(str(root, ": cannot create checkpoint directory: ", ec.message()));
  const std::string path = (fs::path(root) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw RuntimeFailure(str(path, ": cannot open: ", std::strerror(errno)));
  char prev[256] = {};
  const ssize_t got = ::pread(fd_, prev, sizeof prev - 1, 0);
  std::string holder = got > 0 ? std::string(prev, static_cast<size_t>(got)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw UsageError(str(root, ": another run is writing checkpoints here (", path, " is held by pid/host ",
                           holder.empty() ? "unknown" : holder, "); give this run its own train.checkpoint_dir"));
    throw RuntimeFailure(str(path, ": cannot lock: ", std::strerror(err)));
  }
  if (!holder.empty()) spdlog::info("{}: took over the lock of {} (no longer running)", root, holder);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::to_string(::getpid()) + " " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    ::close(fd_);  // the destructor does not run for a throwing constructor: release the lock here
    fd_ = -1;
    throw RuntimeFailure(str(path, ": cannot write: ", std::strerror(err)));
  }
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  // Emptied, so the next run does not report a takeover from a run that ended normally.
  if (::ftruncate(fd_, 0) != 0) spdlog::warn("cannot clear the checkpoint directory lock");
  ::close(fd_);  // releases the flock
}

int64_t newest_step(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return -1;
  auto all = list_step_dirs(root);
  return all.empty() ? -1 : all.front().first;
}

int64_t newest_complete_step_before(const std::string& root, int64_t before) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return -1;
  for (const auto& [step, dir] : list_step_dirs(root))
    if (step < before && fs::is_regular_file(dir / "meta.json", ec)) return step;
  return -1;
}

std::string move_aside(const std::string& root, int64_t newer_than) {
  std::vector<fs::path> moving;
  for (const auto& [step, dir] : list_step_dirs(root))
    if (step > newer_than) moving.push_back(dir);
  if (moving.empty()) return "";
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  const fs::path aside = fs::path(root) / (std::string("previous-") + when + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::create_directory(aside, ec);
  if (ec) throw RuntimeFailure(str(aside.string(), ": cannot create: ", ec.message()));
  for (const fs::path& dir : moving) {
    fs::rename(dir, aside / dir.filename(), ec);
    if (ec) throw RuntimeFailure(str(dir.string(), ": cannot move aside: ", ec.message()));
  }
  fsync_path(aside);
  fsync_path(root);
  return aside.string();
}

Checkpoint load_checkpoint(const std::string& path, const Config& cfg, DType dtype) {
  const fs::path dir = resolve(path);
  const std::string meta_path = (dir / "meta.json").string();
  nlohmann::json meta = parse_json(read_input_file(meta_path, "a checkpoint's meta.json", kMaxMetaBytes), meta_path);
  auto bad = [&](const std::string& what) { throw UsageError(str(meta_path, ": ", what)); };
  if (!meta.is_object()) bad("not a JSON object");
  if (!meta.contains("format") || meta["format"] != kFormat)
    bad(str("unsupported checkpoint format ", meta.contains("format") ? meta["format"].dump() : "(none)",
            " (expected ", kFormat, "; format 1 predates checksums)"));
  for (const char* k : {"step", "optimizer_step"})
    if (!meta.contains(k) || !meta[k].is_number_integer() || meta[k].get<int64_t>() < 0)
      bad(str("'", k, "' must be a non-negative integer"));
  const int64_t dir_step = step_of(dir.filename().string());
  if (dir_step >= 0 && dir_step != meta["step"].get<int64_t>())
    bad(str("'step' is ", meta["step"].get<int64_t>(), " but the directory is ", dir.filename().string()));
  if (!meta.contains("config") || !meta["config"].is_object() || !meta["config"].contains("model"))
    bad("missing the config it was written with");
  if (meta["config"]["model"] != cfg.resolved["model"])
    bad(str("was written for model ", meta["config"]["model"].dump(), ", this run's model is ",
            cfg.resolved["model"].dump()));
  // The data order is a function of (step, seed): another seed would not continue this run.
  if (meta.contains("rng") && meta["rng"].is_object() && meta["rng"].contains("seed") &&
      meta["rng"]["seed"] != cfg.train.seed)
    bad(str("was written with train.seed ", meta["rng"]["seed"].dump(), ", this run has ", cfg.train.seed,
            ": the data order follows the seed, so set train.seed ",
            meta["rng"]["seed"].dump(), " to continue that run"));
  if (meta["config"].contains("lora") != cfg.lora.enabled)
    bad(cfg.lora.enabled ? "is a full checkpoint, and this run trains LoRA adapters (a lora section): start the "
                           "adapters from scratch, or resume without the lora section"
                         : "holds LoRA adapters (it was written by a run with a lora section), and this run trains "
                           "every parameter: resume with the same lora section");
  verify_files(dir, meta, meta_path, cfg.lora.enabled);

  Checkpoint ck;
  ck.meta = meta;
  ck.dir = dir.string();
  ck.step = meta["step"].get<int64_t>();
  ck.params = cfg.lora.enabled ? load_adapter(dir.string(), cfg, dtype) : load_weights(dir.string(), cfg.model, dtype);
  const std::string opt_path = (dir / kOptimizerFile).string();
  SafetensorsFile opt = load_safetensors(opt_path);
  for (const auto& [name, p] : ck.params)
    for (const char* kind : {"exp_avg.", "exp_avg_sq."}) {
      auto it = opt.tensors.find(kind + name);
      if (it == opt.tensors.end()) throw UsageError(str(opt_path, ": missing '", kind, name, "'"));
      if (it->second.shape() != p.shape())
        throw UsageError(str(opt_path, ": '", kind, name, "' has shape ", shape_str(it->second.shape()), ", expected ",
                             shape_str(p.shape())));
      if (!is_floating(it->second.dtype())) throw UsageError(str(opt_path, ": '", kind, name, "' is not a float tensor"));
      (std::string(kind) == "exp_avg." ? ck.optimizer.exp_avg : ck.optimizer.exp_avg_sq)[name] =
          it->second.dtype() == dtype ? it->second : it->second.to(dtype);
    }
  if (opt.tensors.size() != 2 * ck.params.size())
    throw UsageError(str(opt_path, ": holds ", opt.tensors.size(), " tensors, expected ", 2 * ck.params.size()));
  ck.optimizer.step = meta["optimizer_step"].get<int64_t>();
  return ck;
}

namespace {

// Whether `resume` names `root` itself or one of its step_* directories.
bool resumes_from(const std::string& resume, const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(resume, ec), d = fs::weakly_canonical(root, ec);
  return r == d || r.parent_path() == d;
}

}  // namespace

std::unique_ptr<DirLock> open_checkpoint_dir(const std::string& root, const std::string& resume, bool start_over) {
  auto lock = std::make_unique<DirLock>(root);
  const int64_t newest = newest_step(root);
  if (start_over || newest < 0) return lock;  // --start-over's move waits for settle_checkpoint_dir
  if (resume.empty())
    throw UsageError(str("train.checkpoint_dir ", root, " already holds step_", fmt::format("{:08d}", newest),
                         " of an earlier run: --resume ", root, " to continue it, or --start-over to move its "
                         "checkpoints aside and start again"));
  if (!resumes_from(resume, root))
    throw UsageError(str("train.checkpoint_dir ", root, " holds checkpoints of another run than --resume ", resume,
                         ": give this run its own train.checkpoint_dir, or --start-over"));
  return lock;
}

void settle_checkpoint_dir(const std::string& root, const std::string& resume, bool start_over, int64_t step) {
  if (root.empty()) return;
  if (start_over) {
    const int64_t newest = newest_step(root);
    if (const std::string aside = move_aside(root, -1); !aside.empty())
      spdlog::info("--start-over: moved the earlier run's checkpoints (to step {}) into {}", newest, aside);
    return;
  }
  if (resume.empty() || !resumes_from(resume, root)) return;
  if (const std::string aside = move_aside(root, step); !aside.empty())
    spdlog::info("branching from step {}: the newer checkpoints of {} moved into {}", step, root, aside);
}

}  // namespace autosp
