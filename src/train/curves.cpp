// TensorBoard event files and the metrics CSV (train/curves.h).
#include "train/curves.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/check.h"

namespace autosp {
namespace {

namespace fs = std::filesystem;

// Protobuf's wire format, as much of it as an Event needs.
void varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7F) | 0x80);
  out += static_cast<char>(v);
}
template <class T>
void fixed(std::string& out, T v) {  // little-endian, as protobuf's fixed64/double and fixed32/float
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, std::string_view v) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, v.size());
  out.append(v);
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string event(double wall_time, int64_t step) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, wall_time);
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void make_dir(const std::string& key, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw UsageError(str(key, " '", dir, "': cannot create: ", ec ? ec.message() : "not a directory"));
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

EventFile::EventFile(const std::string& dir) {
  make_dir("train.tensorboard_dir", dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = (fs::path(dir) / str("events.out.tfevents.", static_cast<int64_t>(now_seconds()), ".", host, ".", getpid()))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw UsageError(str("train.tensorboard_dir: cannot open ", path_, " for writing"));
  std::string first = event(now_seconds(), 0);
  bytes_field(first, 3, "brain.Event:2");
  record(first);
}

void EventFile::record(const std::string& data) {
  std::string len;
  fixed(len, static_cast<uint64_t>(data.size()));
  std::string rec = len;
  fixed(rec, masked_crc32c(len));
  rec += data;
  fixed(rec, masked_crc32c(data));
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  out_.flush();
  if (!out_) throw RuntimeFailure(str(path_, ": write failed (disk full or I/O error)"));
}

void EventFile::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    varint(value, 2 << 3 | 5);
    fixed(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string e = event(now_seconds(), step);
  bytes_field(e, 5, summary);
  record(e);
}

Curves::Curves(const Config& cfg, bool lead) {
  if (!lead) return;
  if (!cfg.train.tensorboard_dir.empty()) events_ = std::make_unique<EventFile>(cfg.train.tensorboard_dir);
  if (cfg.train.csv_dir.empty()) return;
  make_dir("train.csv_dir", cfg.train.csv_dir);
  csv_path_ = (fs::path(cfg.train.csv_dir) / "metrics.csv").string();
  std::error_code ec;
  const bool fresh = !fs::exists(csv_path_, ec) || fs::file_size(csv_path_, ec) == 0;
  csv_.open(csv_path_, std::ios::app);
  if (!csv_) throw UsageError(str("train.csv_dir: cannot open ", csv_path_, " for writing"));
  if (fresh) csv_ << "step,loss,lr,grad_norm,tokens_per_sec,mfu,accuracy,val_loss,val_accuracy\n" << std::flush;
}

void Curves::step(const StepRecord& rec) {
  if (!events_ && !csv_.is_open()) return;
  // (tag, value) of what the step has; NaN, and -1 for "none", are left out.
  const bool val = rec.evaluated && rec.val_targets > 0;
  const std::vector<std::pair<std::string, double>> all = {
      {"train/loss", rec.loss},
      {"train/learning_rate", rec.lr},
      {"train/grad_norm", rec.grad_norm},
      {"train/tokens_per_sec", rec.tokens_per_sec},
      {"train/mfu", rec.mfu >= 0 ? rec.mfu : NAN},
      {"train/accuracy", rec.accuracy >= 0 ? rec.accuracy : NAN},
      {"eval/loss", val ? rec.val_loss : NAN},
      {"eval/accuracy", val ? rec.val_accuracy : NAN}};
  std::vector<std::pair<std::string, double>> present;
  for (const auto& tv : all)
    if (std::isfinite(tv.second)) present.push_back(tv);
  if (events_) events_->scalars(rec.step, present);
  if (csv_.is_open()) {
    std::string row = str(rec.step);
    for (const auto& [tag, v] : all) row += std::isfinite(v) ? fmt::format(",{}", v) : ",";
    csv_ << row << "\n" << std::flush;
    if (!csv_) throw RuntimeFailure(str(csv_path_, ": write failed (disk full or I/O error)"));
  }
}

}  // namespace autosp
