// DType names and sizes.
#include "tensor/dtype.h"

#include <array>

namespace autosp {
namespace {
struct DTypeRow {
  DType type;
  size_t size;
  std::string_view name, torch_name, st_name;
  bool floating;
};
constexpr std::array<DTypeRow, kNumDTypes> kRows{{
    {DType::f32, 4, "f32", "float32", "F32", true},
    {DType::f64, 8, "f64", "float64", "F64", true},
    {DType::bf16, 2, "bf16", "bfloat16", "BF16", true},
    {DType::f16, 2, "f16", "float16", "F16", true},
    {DType::i32, 4, "i32", "int32", "I32", false},
    {DType::i64, 8, "i64", "int64", "I64", false},
}};
static_assert([] {
  for (size_t i = 0; i < kRows.size(); ++i)
    if (static_cast<size_t>(kRows[i].type) != i) return false;
  return true;
}(), "dtype table out of order");
const DTypeRow& row(DType t) { return kRows[static_cast<size_t>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return row(t).size; }
std::string_view dtype_name(DType t) { return row(t).name; }
std::string_view dtype_torch_name(DType t) { return row(t).torch_name; }
std::string_view dtype_safetensors_name(DType t) { return row(t).st_name; }
bool is_floating(DType t) { return row(t).floating; }

std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& r : kRows)
    if (s == r.name || s == r.torch_name) return r.type;
  if (s == "float") return DType::f32;
  if (s == "double") return DType::f64;
  if (s == "half") return DType::f16;
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& r : kRows)
    if (s == r.st_name) return r.type;
  return std::nullopt;
}

}  // namespace autosp
