// Element types of autosp tensors and their names ("f32", "bf16", ...), as used by the IR,
// the printer, safetensors ("F32", "BF16", ...) and the config's runtime.dtype (PyTorch's
// "float32", "bfloat16", ...). Knows nothing of graphs or devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace autosp {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };
inline constexpr int kNumDTypes = 6;

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);             // "f32"
std::string_view dtype_torch_name(DType t);       // "float32" (PyTorch's; runtime.dtype's spelling)
std::optional<DType> dtype_from_name(std::string_view s);  // accepts "f32" and "float32", "bfloat16", ...
std::string_view dtype_safetensors_name(DType t);  // "F32"
std::optional<DType> dtype_from_safetensors(std::string_view s);
bool is_floating(DType t);

// C++ element type for a dtype (bf16/f16 are stored as raw uint16_t bits).
template <class T> inline constexpr DType dtype_of = DType::f32;
template <> inline constexpr DType dtype_of<double> = DType::f64;
template <> inline constexpr DType dtype_of<int32_t> = DType::i32;
template <> inline constexpr DType dtype_of<int64_t> = DType::i64;

}  // namespace autosp
