// safetensors reading (validate everything, then allocate and read) and atomic writing.
#include "tensor/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "tensor/fd.h"

namespace autosp {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr const char* kMetadataKey = "__metadata__";
constexpr int kMaxHeaderDepth = 8;

// A malformed file: "<prefix><what>".
template <class... Args>
[[noreturn]] void fail(const std::string& prefix, const Args&... what) {
  throw UsageError(str(prefix, what...));
}

// Text from the file for an error message, cut short if long.
std::string clip(const std::string& s, size_t n = 100) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}
std::string brief(const json& j) { return clip(j.dump(-1, ' ', false, json::error_handler_t::replace), 60); }

std::string supported_dtypes() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) s += str(i ? ", " : "", dtype_safetensors_name(static_cast<DType>(i)));
  return s;
}

// Reads exactly n bytes at `offset`. False on error (errno set) or end of file (errno 0).
bool read_at(int fd, void* buf, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// One validated header entry.
struct Entry {
  std::string name;
  DType dtype;  // unused when `bytes`
  bool bytes;   // a "U8" tensor (ByteTensor)
  Shape shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& e, uint64_t data_size,
                  bool with_bytes) {
  const std::string where = str(path, ": tensor '", clip(name), "' ");
  if (!e.is_object()) fail(where, "entry is not an object (got ", brief(e), ")");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!e.contains(field)) fail(where, "has no \"", field, "\" field");

  const json& jd = e["dtype"];
  if (!jd.is_string()) fail(where, "dtype is not a string (got ", brief(jd), ")");
  const std::string& dname = jd.get_ref<const std::string&>();
  const bool bytes = with_bytes && dname == "U8";
  std::optional<DType> dtype = bytes ? DType::f32 : dtype_from_safetensors(dname);
  if (!dtype) fail(where, "has unsupported dtype '", clip(dname), "' (supported: ", supported_dtypes(), ")");
  const uint64_t esize = bytes ? 1 : dtype_size(*dtype);

  // Every dim and the product of the nonzero dims (in bytes) must fit int64, so that numel,
  // nbytes and contiguous strides computed later cannot overflow.
  const json& js = e["shape"];
  if (!js.is_array()) fail(where, "shape is not an array (got ", brief(js), ")");
  Shape shape;
  uint64_t product = 1;  // of the nonzero dims
  bool has_zero = false;
  for (const json& d : js) {
    if (!d.is_number_unsigned()) fail(where, "shape ", brief(js), " is not a list of non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    if (v == 0) {
      has_zero = true;
    } else {
      if (product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / esize / v)
        fail(where, "shape ", brief(js), " has too many elements");
      product *= v;
    }
    shape.push_back(static_cast<int64_t>(v));
  }
  const uint64_t nbytes = has_zero ? 0 : product * esize;

  const json& jo = e["data_offsets"];
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
    fail(where, "data_offsets ", brief(jo), " are not two non-negative integers");
  const uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
  const std::string offsets = str("data_offsets [", begin, ", ", end, "]");
  if (begin > end) fail(where, offsets, " have begin > end");
  if (end > data_size) fail(where, offsets, " exceed the data section (", data_size, " bytes)");
  if (end - begin != nbytes)
    fail(where, offsets, " hold ", end - begin, " bytes but ", bytes ? "u8" : dtype_name(*dtype), shape_str(shape),
         " needs ", nbytes);
  return {name, *dtype, bytes, std::move(shape), begin, end};
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& m) {
  std::map<std::string, std::string> out;
  if (m.is_null()) return out;  // the reference reader accepts null as "no metadata"
  if (!m.is_object()) fail(path, ": ", kMetadataKey, " is not an object (got ", brief(m), ")");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->is_string())
      fail(path, ": ", kMetadataKey, " value for '", clip(it.key()), "' is not a string (got ", brief(*it),
           ")");
    out[it.key()] = it->get<std::string>();
  }
  return out;
}

// A JSON string literal (throws json::type_error on invalid UTF-8).
std::string quoted(const std::string& s) { return json(s).dump(); }

}  // namespace

SafetensorsFile load_safetensors(const std::string& path, bool with_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO must not block the open
  if (fd.get() < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw RuntimeFailure(str(path, ": cannot stat: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  auto read_or_throw = [&](void* buf, size_t n, uint64_t offset) {
    if (!read_at(fd.get(), buf, n, offset))
      throw RuntimeFailure(
          str(path, ": read failed: ", errno ? std::strerror(errno) : "unexpected end of file"));
  };

  // Header length, checked against the file before the header is allocated.
  if (file_size < 8) fail(path, ": file is ", file_size, " bytes, shorter than 8 bytes (the header length)");
  unsigned char len_bytes[8];
  read_or_throw(len_bytes, 8, 0);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
  if (header_len > file_size - 8)
    fail(path, ": header length ", header_len, " exceeds the file size (", file_size, " bytes)");
  if (header_len > kMaxHeaderBytes) fail(path, ": header length ", header_len, " exceeds the 100 MiB limit");
  std::string header(header_len, '\0');
  read_or_throw(header.data(), header.size(), 8);
  const uint64_t data_start = 8 + header_len, data_size = file_size - data_start;

  // nlohmann stops at a NUL byte as if the input ended there; JSON never contains one.
  if (header.find('\0') != std::string::npos)
    fail(path, ": header is not valid JSON: it contains a NUL byte");
  // Parse, rejecting a tensor name given twice (nlohmann would keep the last silently).
  std::set<std::string> names;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    // A valid header nests 3 levels ({name: {shape: [..]}}); deeper input would only make the error
    // messages below recurse deeply.
    if (depth > kMaxHeaderDepth)
      fail(path, ": header is not valid JSON: nested deeper than ", kMaxHeaderDepth, " levels (a header nests 3)");
    if (depth == 1 && event == json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second)
      fail(path, ": header names '", clip(parsed.get<std::string>()), "' twice");
    return true;
  };
  json j;
  try {
    j = json::parse(header, on_event);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON: ", clip(e.what(), 300));
  }
  if (!j.is_object()) fail(path, ": header is not a JSON object (got ", brief(j), ")");

  // Validate every entry before allocating anything.
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey)
      out.metadata = parse_metadata(path, *it);
    else
      entries.push_back(parse_entry(path, it.key(), *it, data_size, with_bytes));
  }
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);  // an empty tensor occupies no bytes
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry &a = *by_offset[i - 1], &b = *by_offset[i];
    if (b.begin < a.end)
      fail(path, ": tensors '", clip(a.name), "' [", a.begin, ", ", a.end, "] and '", clip(b.name), "' [",
           b.begin, ", ", b.end, "] overlap");
  }

  // Non-overlapping and inside the file, so the total allocated is at most the file size.
  for (const Entry& e : entries) {
    if (e.bytes) {
      ByteTensor t{e.shape, std::vector<uint8_t>(e.end - e.begin)};
      if (e.end > e.begin) read_or_throw(t.data.data(), t.data.size(), data_start + e.begin);
      out.bytes.emplace(e.name, std::move(t));
      continue;
    }
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) read_or_throw(t.raw(), e.end - e.begin, data_start + e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Header as the reference writer lays it out: compact JSON, metadata first, then the tensors in
  // name order with fields dtype, shape, data_offsets, their data packed back to back.
  std::string header = "{";
  try {
    if (!metadata.empty()) header += str(quoted(kMetadataKey), ":", json(metadata).dump());
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
      AUTOSP_ASSERT(name != kMetadataKey, "a tensor may not be named ", kMetadataKey);
      AUTOSP_ASSERT(t.defined() && t.device().kind == DeviceKind::cpu, "tensor '", name,
                    "' is not on the CPU");
      std::string shape = "[";
      for (int i = 0; i < t.rank(); ++i) shape += str(i ? "," : "", t.dim(i));
      header +=
          str(header.size() > 1 ? "," : "", quoted(name), ":{\"dtype\":\"", dtype_safetensors_name(t.dtype()),
              "\",\"shape\":", shape, "],\"data_offsets\":[", offset, ",", offset + t.nbytes(), "]}");
      offset += t.nbytes();
    }
  } catch (const json::exception& e) {  // a name or value that is not valid UTF-8
    throw UsageError(str(path, ": cannot write a safetensors header: ", e.what()));
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(uint64_t{header.size()} >> (8 * i));

  // Write "<path>.tmp.<pid>"; on any failure remove it and leave `path` as it was.
  const std::string tmp = str(path, ".tmp.", ::getpid());
  auto io_fail = [&](const std::string& what) {
    throw RuntimeFailure(str(path, ": cannot save: ", what, ": ", std::strerror(errno)));
  };
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) io_fail(str("cannot create ", tmp));
  bool renamed = false;
  struct RemoveTmp {
    const std::string& tmp;
    const bool& renamed;
    ~RemoveTmp() {
      if (!renamed) ::unlink(tmp.c_str());
    }
  } remove_tmp{tmp, renamed};

  if (!write_all(fd.get(), len_bytes, 8) || !write_all(fd.get(), header.data(), header.size()))
    io_fail(str("write to ", tmp));
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    if (!write_all(fd.get(), c.raw(), c.nbytes())) io_fail(str("write to ", tmp));
  }
  if (::fsync(fd.get()) != 0) io_fail(str("fsync ", tmp));
  if (fd.close() != 0) io_fail(str("close ", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail(str("rename ", tmp, " to ", path));
  renamed = true;

  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) io_fail(str("open directory ", dir));
  if (::fsync(dfd.get()) != 0 && errno != EINVAL)
    io_fail(str("fsync directory ", dir));  // EINVAL: unsupported
}

}  // namespace autosp
