// safetensors: round trips, byte-exact files in both directions, a table of malformed files that
// must each fail with a UsageError naming the problem, fuzzed files that must never crash, and
// atomic writes.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "common/temp_dir.h"
#include "tensor/safetensors.h"

namespace fs = std::filesystem;
using namespace autosp;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("st") {}
  std::string file(const std::string& name) const { return path(name); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) s.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return s;
}

// A safetensors file from a header string and a data section, built by hand.
std::string st_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

// Fills a tensor with a byte pattern that differs per position and per seed.
Tensor patterned(Shape shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), a.nbytes()) == 0;
}

// Loads `path`, which must fail with a UsageError that starts with the path and contains `expect`.
void require_usage_error(const std::string& path, const std::string& expect) {
  try {
    load_safetensors(path);
    FAIL("loaded without error; expected a UsageError containing: " << expect);
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.rfind(path + ": ", 0) == 0);
    CHECK(msg.find(expect) != std::string::npos);
  }
}

// Loads `path`; success and UsageError are both fine, anything else (or a crash) is not.
bool loads_or_usage_error(const std::string& path) {
  try {
    load_safetensors(path);
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype, scalar and zero-size shapes, metadata", "[safetensors]") {
  TempDir dir;
  std::map<std::string, Tensor> in = {
      {"f32.matrix", patterned({2, 3}, DType::f32, 1)},
      {"f64.vector", patterned({4}, DType::f64, 2)},
      {"bf16.3d", patterned({3, 1, 2}, DType::bf16, 3)},
      {"f16.vector", patterned({5}, DType::f16, 4)},
      {"i32.scalar", patterned({}, DType::i32, 5)},
      {"i64.empty", patterned({2, 0, 3}, DType::i64, 6)},
      {"f32.empty", patterned({0}, DType::f32, 7)},
      {"Upper.before.metadata", patterned({1}, DType::f32, 8)},
  };
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"note", "ünïcode \"quoted\"\n\ttab"}, {"empty", ""}};
  const std::string path = dir.file("w.safetensors");
  save_safetensors(path, in, meta);

  SafetensorsFile out = load_safetensors(path);
  CHECK(out.metadata == meta);
  REQUIRE(out.tensors.size() == in.size());
  for (const auto& [name, t] : in) {
    INFO(name);
    REQUIRE(out.tensors.count(name) == 1);
    const Tensor& u = out.tensors.at(name);
    CHECK(u.is_contiguous());
    CHECK(u.device() == Device{});
    CHECK(same_bytes(t, u));
  }
  CHECK(out.tensors.at("i32.scalar").rank() == 0);
  CHECK(out.tensors.at("i32.scalar").numel() == 1);
  CHECK(out.tensors.at("i64.empty").shape() == Shape{2, 0, 3});

  // No metadata and no tensors.
  save_safetensors(path, {});
  out = load_safetensors(path);
  CHECK(out.tensors.empty());
  CHECK(out.metadata.empty());
  CHECK(read_file(path) == le64(8) + "{}      ");
}

TEST_CASE("safetensors writes non-contiguous tensors as their contiguous values", "[safetensors]") {
  TempDir dir;
  // [2, 3] viewed transposed as [3, 2].
  Tensor base = Tensor::from_vector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor tr = base.as_strided({3, 2}, {1, 3}, 0);
  save_safetensors(dir.file("t.safetensors"), {{"t", tr}});
  Tensor u = load_safetensors(dir.file("t.safetensors")).tensors.at("t");
  CHECK(u.shape() == Shape{3, 2});
  CHECK(u.to_doubles() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("safetensors reads a hand-built file byte for byte", "[safetensors]") {
  TempDir dir;
  // Unpadded header, keys out of order, metadata last, an extra unknown field, trailing bytes
  // after the last tensor, data not 8-byte aligned in the file.
  const std::string header = R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":{"x":[1]}},)"
                             R"("h":{"dtype":"BF16","shape":[1,1],"data_offsets":[16,18]},)"
                             R"("z":{"dtype":"F64","shape":[],"data_offsets":[18,26]},)"
                             R"("e":{"dtype":"I64","shape":[0,5],"data_offsets":[26,26]},)"
                             R"("__metadata__":{"k":"v","key":"value"}})";
  REQUIRE(header.size() % 8 != 0);
  const std::string data = bytes_of<float>({1.5f, -2.0f}) + bytes_of<int32_t>({7, -9}) +
                           bytes_of<uint16_t>({0x3fc0}) + bytes_of<double>({-0.25}) + "trailing";
  const std::string path = dir.file("hand.safetensors");
  write_file(path, st_file(header, data));

  SafetensorsFile f = load_safetensors(path);
  CHECK(f.metadata == std::map<std::string, std::string>{{"k", "v"}, {"key", "value"}});
  REQUIRE(f.tensors.size() == 5);
  const Tensor& a = f.tensors.at("a");
  CHECK(a.str() == "f32[2]");
  CHECK(a.data<float>()[0] == 1.5f);
  CHECK(a.data<float>()[1] == -2.0f);
  const Tensor& b = f.tensors.at("b");
  CHECK(b.str() == "i32[2]");
  CHECK(b.data<int32_t>()[0] == 7);
  CHECK(b.data<int32_t>()[1] == -9);
  const Tensor& h = f.tensors.at("h");
  CHECK(h.str() == "bf16[1, 1]");
  CHECK(h.data<uint16_t>()[0] == 0x3fc0);  // 1.5 in bf16
  const Tensor& z = f.tensors.at("z");
  CHECK(z.str() == "f64[]");
  CHECK(z.data<double>()[0] == -0.25);
  CHECK(f.tensors.at("e").str() == "i64[0, 5]");

  // A null __metadata__ (accepted by the reference reader) means no metadata.
  write_file(path, st_file(R"({"__metadata__":null})"));
  CHECK(load_safetensors(path).metadata.empty());
}

TEST_CASE("safetensors writer output is byte-exact", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("small.safetensors");
  save_safetensors(
      path,
      {{"y", Tensor::from_vector<int64_t>({}, {5})}, {"x", Tensor::from_vector<float>({2}, {1.0f, 2.0f})}},
      {{"m", "1"}});
  const std::string json = R"({"__metadata__":{"m":"1"},)"
                           R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("y":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  REQUIRE(padded.size() % 8 == 0);
  REQUIRE(padded.size() > json.size());  // this case does exercise the padding
  const std::string expected =
      le64(padded.size()) + padded + bytes_of<float>({1.0f, 2.0f}) + bytes_of<int64_t>({5});
  const std::string got = read_file(path);
  CHECK(got == expected);
  CHECK((8 + padded.size()) % 8 == 0);
}

TEST_CASE("safetensors rejects malformed files with a UsageError that says what is wrong", "[safetensors]") {
  TempDir dir;
  // A file holding one tensor 'a' with the given fields (as JSON text) and 8 data bytes.
  const std::string eight = std::string(8, '\x11');
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return str(R"({"dtype":)", dtype, R"(,"shape":)", shape, R"(,"data_offsets":)", offsets, "}");
  };
  auto one = [&](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return st_file(str(R"({"a":)", entry(dtype, shape, offsets), "}"), eight);
  };
  const std::string f32x2 = entry(R"("F32")", "[2]", "[0,8]");
  const std::string u64_max = "18446744073709551615", two40 = "1099511627776";
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, shorter than 8 bytes"},
      {"5 bytes", "\x01\x02\x03\x04\x05", "file is 5 bytes, shorter than 8 bytes"},
      {"header length 2^62", le64(uint64_t{1} << 62) + "{}",
       "header length 4611686018427387904 exceeds the file size (10 bytes)"},
      {"header length 2^64-1", le64(~uint64_t{0}) + "{}", "exceeds the file size"},
      {"header length one past the end", le64(3) + "{}", "header length 3 exceeds the file size (10 bytes)"},
      {"header length 0", le64(0), "header is not valid JSON"},
      {"header not JSON", st_file("{abc"), "header is not valid JSON"},
      {"header truncated JSON", st_file(R"({"a":{"dtype":"F3)"), "header is not valid JSON"},
      {"header invalid UTF-8", st_file("{\"a\xff\":1}"), "header is not valid JSON"},
      {"header NUL padded", st_file(std::string("{}\0\0\0\0\0\0", 8)),
       "header is not valid JSON: it contains a NUL byte"},
      {"header NUL then garbage", st_file(std::string("{}\0garbage", 10)), "header is not valid JSON"},
      {"header NUL in a name", st_file(std::string("{\"a\0\":1}", 8)), "header is not valid JSON"},
      {"header unterminated 1 MiB string", st_file("{\"" + std::string(1 << 20, 'x')),
       "header is not valid JSON"},
      {"deeply nested header", st_file(std::string(1 << 20, '[')), "header is not valid JSON"},
      {"header a JSON array", st_file("[1,2]"), "header is not a JSON object (got [1,2])"},
      {"header a JSON string", st_file(R"("abc")"), "header is not a JSON object"},
      {"entry not an object", st_file(R"({"a":3})"), "tensor 'a' entry is not an object (got 3)"},
      {"missing dtype", st_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight),
       "tensor 'a' has no \"dtype\" field"},
      {"missing shape", st_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       "tensor 'a' has no \"shape\" field"},
      {"missing data_offsets", st_file(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
       "tensor 'a' has no \"data_offsets\" field"},
      {"dtype not a string", one("4", "[2]", "[0,8]"), "tensor 'a' dtype is not a string (got 4)"},
      {"unknown dtype", one(R"("U8")", "[8]", "[0,8]"),
       "tensor 'a' has unsupported dtype 'U8' (supported: F32, F64, BF16, F16, I32, I64)"},
      {"lower-case dtype", one(R"("f32")", "[2]", "[0,8]"), "unsupported dtype 'f32'"},
      {"shape not an array", one(R"("F32")", "2", "[0,8]"), "tensor 'a' shape is not an array (got 2)"},
      {"negative dim", one(R"("F32")", "[-2]", "[0,8]"),
       "tensor 'a' shape [-2] is not a list of non-negative integers"},
      {"fractional dim", one(R"("F32")", "[2.0]", "[0,8]"), "is not a list of non-negative integers"},
      {"string dim", one(R"("F32")", R"(["2"])", "[0,8]"), "is not a list of non-negative integers"},
      {"dim beyond uint64", one(R"("F32")", "[99999999999999999999999]", "[0,8]"),
       "is not a list of non-negative integers"},
      {"huge shape", one(R"("F32")", str("[", two40, ",", two40, "]"), "[0,8]"),
       "tensor 'a' shape [1099511627776,1099511627776] has too many elements"},
      {"huge shape with a zero dim", one(R"("F32")", str("[0,", two40, ",", two40, "]"), "[0,0]"),
       "has too many elements"},
      {"dim above int64", one(R"("I64")", str("[", u64_max, "]"), "[0,8]"), "has too many elements"},
      {"bytes overflow int64", one(R"("F64")", "[2305843009213693952]", "[0,8]"), "has too many elements"},
      {"data_offsets not an array", one(R"("F32")", "[2]", "8"),
       "tensor 'a' data_offsets 8 are not two non-negative integers"},
      {"data_offsets one number", one(R"("F32")", "[2]", "[0]"), "are not two non-negative integers"},
      {"data_offsets three numbers", one(R"("F32")", "[2]", "[0,4,8]"), "are not two non-negative integers"},
      {"data_offsets negative", one(R"("F32")", "[2]", "[-8,0]"), "are not two non-negative integers"},
      {"data_offsets begin > end", one(R"("F32")", "[0]", "[8,4]"),
       "tensor 'a' data_offsets [8, 4] have begin > end"},
      {"truncated data",
       st_file(str(R"({"a.weight":)", entry(R"("F32")", "[24]", "[0,96]"), "}"), std::string(64, 0)),
       "tensor 'a.weight' data_offsets [0, 96] exceed the data section (64 bytes)"},
      {"huge data_offsets", one(R"("F32")", "[2]", str("[18446744073709551607,", u64_max, "]")),
       "exceed the data section (8 bytes)"},
      {"size mismatch", one(R"("F32")", "[3]", "[0,8]"),
       "tensor 'a' data_offsets [0, 8] hold 8 bytes but f32[3] needs 12"},
      {"overlapping tensors",
       st_file(str(R"({"a":)", f32x2, R"(,"b":)", entry(R"("F32")", "[2]", "[4,12]"), "}"),
               std::string(12, 0)),
       "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
      {"identical offsets", st_file(str(R"({"a":)", f32x2, R"(,"b":)", f32x2, "}"), eight),
       "tensors 'a' [0, 8] and 'b' [0, 8] overlap"},
      {"duplicate tensor name", st_file(str(R"({"a":)", f32x2, R"(,"a":)", f32x2, "}"), eight),
       "header names 'a' twice"},
      {"metadata not an object", st_file(R"({"__metadata__":["k","v"]})"),
       "__metadata__ is not an object (got [\"k\",\"v\"])"},
      {"metadata value not a string", st_file(R"({"__metadata__":{"k":"v","n":1}})"),
       "__metadata__ value for 'n' is not a string (got 1)"},
      {"metadata value an object", st_file(R"({"__metadata__":{"k":{"x":"y"}}})"),
       "__metadata__ value for 'k' is not a string"},
  };
  REQUIRE(cases.size() >= 15);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case: " << cases[i].what);
    const std::string path = dir.file(str("case", i, ".safetensors"));
    write_file(path, cases[i].bytes);
    require_usage_error(path, cases[i].expect);
  }

  // Text quoted from the file is cut short in messages.
  const std::string path = dir.file("long.safetensors");
  write_file(path, st_file("{\"" + std::string(1 << 20, 'x')));
  try {
    load_safetensors(path);
    FAIL("loaded without error");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).size() < path.size() + 400);
  }
}

TEST_CASE("safetensors rejects missing files, directories and headers over 100 MiB", "[safetensors]") {
  TempDir dir;
  require_usage_error(dir.file("missing.safetensors"), "cannot open: No such file or directory");
  require_usage_error(dir.dir.string(), "not a regular file");

  // A sparse file large enough that a 100 MiB + 8 header length fits in it.
  const std::string path = dir.file("big.safetensors");
  const uint64_t header_len = (uint64_t{100} << 20) + 8;
  write_file(path, le64(header_len) + "{}");
  std::filesystem::resize_file(path, 8 + header_len + 16);
  require_usage_error(path, "header length 104857608 exceeds the 100 MiB limit");
}

TEST_CASE("safetensors survives random and mutated files", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("fuzz.safetensors");
  std::mt19937 rng(1234);
  auto byte = [&] { return static_cast<char>(rng() & 0xff); };

  SECTION("random bytes are rejected") {
    for (int i = 0; i < 300; ++i) {
      std::string s(rng() % 80, '\0');
      for (char& c : s) c = byte();
      if (i % 2 == 1) s = st_file(s, std::string(rng() % 16, 'x'));  // a plausible header length
      write_file(path, s);
      INFO("iteration " << i);
      CHECK_FALSE(loads_or_usage_error(path));
    }
  }

  // A valid file written by us, then damaged.
  std::map<std::string, Tensor> tensors = {{"a", patterned({2, 3}, DType::f32, 1)},
                                           {"b", patterned({4}, DType::bf16, 2)},
                                           {"c", patterned({}, DType::i64, 3)},
                                           {"d", patterned({0, 2}, DType::f16, 4)}};
  save_safetensors(path, tensors, {{"k", "v"}});
  const std::string good = read_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(good[i]);

  SECTION("every truncation is rejected") {
    for (size_t n = 0; n < good.size(); ++n) {
      write_file(path, good.substr(0, n));
      INFO("truncated to " << n << " of " << good.size() << " bytes");
      CHECK_FALSE(loads_or_usage_error(path));
    }
  }

  SECTION("mutated headers load or fail cleanly") {
    const std::string interesting = "0123456789{}[],:\"-.eE \\U";
    int loaded = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s = good;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
        size_t pos = rng() % (8 + header_len);  // mostly the header, sometimes its length
        s[pos] = rng() % 2 ? interesting[rng() % interesting.size()] : byte();
      }
      write_file(path, s);
      loaded += loads_or_usage_error(path);
    }
    CHECK(loaded < 3000);
  }
}

TEST_CASE("safetensors save replaces a file atomically", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  const Tensor a = patterned({3}, DType::f32, 1), b = patterned({2, 2}, DType::f64, 2);

  save_safetensors(path, {{"a", a}});
  save_safetensors(path, {{"b", b}}, {{"step", "2"}});
  SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.size() == 1);
  CHECK(same_bytes(f.tensors.at("b"), b));
  CHECK(f.metadata.at("step") == "2");
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});  // no temp file left

  // A path without a directory part writes to the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.dir);
  save_safetensors("rel.safetensors", {{"a", a}});
  fs::current_path(cwd);
  CHECK(same_bytes(load_safetensors(dir.file("rel.safetensors")).tensors.at("a"), a));
}

TEST_CASE("safetensors save failures throw RuntimeFailure and leave the old file alone", "[safetensors]") {
  TempDir dir;
  const Tensor a = patterned({3}, DType::f32, 1), big = patterned({1000}, DType::f32, 2);
  auto require_runtime_failure = [](auto&& fn, const std::string& expect) {
    try {
      fn();
      FAIL("no exception; expected a RuntimeFailure containing: " << expect);
    } catch (const RuntimeFailure& e) {
      INFO("message: " << e.what());
      CHECK(std::string(e.what()).find(expect) != std::string::npos);
    }
  };

  SECTION("into a directory that does not exist") {
    const std::string path = dir.file("no/such/dir/w.safetensors");
    require_runtime_failure(
        [&] {
          save_safetensors(path, {{"a", a}});
        },
        path + ": cannot save: cannot create");
    CHECK(!fs::exists(dir.dir / "no"));
    CHECK(dir.entries().empty());
  }

  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"a", a}});
  const std::string before = read_file(path);

  SECTION("when the temp file cannot be created") {
    fs::create_directory(str(path, ".tmp.", ::getpid()));  // a directory where the temp file goes
    require_runtime_failure([&] { save_safetensors(path, {{"big", big}}); }, path + ": cannot save");
    CHECK(read_file(path) == before);
    CHECK(fs::is_directory(str(path, ".tmp.", ::getpid())));
  }

  SECTION("when a write fails halfway") {
    // Cap this process's file size so the data write fails with EFBIG.
    struct rlimit old {};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 1024;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    bool threw = false;
    try {
      save_safetensors(path, {{"big", big}});
    } catch (const RuntimeFailure& e) {
      threw = std::string(e.what()).find(path + ": cannot save: write to") == 0;
    }
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK(threw);
    CHECK(read_file(path) == before);
    CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
  }

  SECTION("when the rename fails") {
    const std::string dpath = dir.file("a_directory");
    fs::create_directory(dpath);
    write_file(dpath + "/inside", "keep");
    require_runtime_failure([&] { save_safetensors(dpath, {{"a", a}}); }, dpath + ": cannot save: rename");
    CHECK(read_file(dpath + "/inside") == "keep");
    CHECK(dir.entries() == std::vector<std::string>{"a_directory", "ckpt.safetensors"});
  }
}
