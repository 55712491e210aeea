// Tensor storage, views and CPU copies / conversions (the element loops: tensor/strided.h,
// tensor/convert.h).
#include "tensor/tensor.h"

#include <cmath>
#include <cstring>

#include "tensor/convert.h"
#include "tensor/strided.h"

namespace autosp {

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Storage::Storage(Allocator& alloc, size_t nbytes)
    : alloc_(alloc), data_(alloc.allocate(nbytes)), nbytes_(nbytes) {}
Storage::~Storage() { alloc_.deallocate(data_, nbytes_); }

Tensor Tensor::empty(Shape shape, DType dtype, Allocator& alloc) {
  for (int64_t d : shape) AUTOSP_ASSERT(d >= 0, "negative dim in ", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>(alloc, t.nbytes());
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

template <class T>
Tensor Tensor::from_vector(Shape shape, const std::vector<T>& values) {
  AUTOSP_ASSERT(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_vector: ",
                values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(std::move(shape), dtype_of<T>);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(T));
  return t;
}
template Tensor Tensor::from_vector(Shape, const std::vector<float>&);
template Tensor Tensor::from_vector(Shape, const std::vector<double>&);
template Tensor Tensor::from_vector(Shape, const std::vector<int32_t>&);
template Tensor Tensor::from_vector(Shape, const std::vector<int64_t>&);

void* Tensor::raw() const {
  AUTOSP_ASSERT(storage_, "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view_bytes(const Tensor& base, size_t byte_offset, Shape shape, DType dtype) {
  const size_t es = dtype_size(dtype);
  byte_offset += static_cast<size_t>(base.offset_) * dtype_size(base.dtype_);  // from base's first element
  AUTOSP_ASSERT(byte_offset % es == 0, "view at byte ", byte_offset, " is not aligned to ", es);
  Tensor t;
  t.storage_ = base.storage_;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.offset_ = static_cast<int64_t>(byte_offset / es);
  AUTOSP_ASSERT(base.storage_ && byte_offset + t.nbytes() <= base.storage_->nbytes(), "view of ", t.nbytes(),
                " bytes at ", byte_offset, " exceeds the base's ", base.storage_ ? base.storage_->nbytes() : 0);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  AUTOSP_ASSERT(is_contiguous(), "reshape of a non-contiguous tensor ", str());
  AUTOSP_ASSERT(shape_numel(shape) == numel(), "reshape ", str(), " to ", shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::as_strided(Shape shape, Shape strides, int64_t offset) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.offset_ = offset_ + offset;
  return t;
}

namespace {
// Copy `src` (any strides) into contiguous `dst` of the same shape and element size.
void copy_into(const Tensor& src, const Tensor& dst) {
  AUTOSP_ASSERT(src.rank() <= kMaxRank, "rank ", src.rank(), " exceeds ", kMaxRank);
  const int64_t* shape = src.shape().data();
  const int64_t* st = src.strides().data();
  switch (dtype_size(src.dtype())) {
    case 2: cpu::copy_strided(src.rank(), shape, src.data<uint16_t>(), st, dst.data<uint16_t>()); break;
    case 4:
      cpu::copy_strided(src.rank(), shape, static_cast<const int32_t*>(src.raw()), st,
                        static_cast<int32_t*>(dst.raw()));
      break;
    case 8:
      cpu::copy_strided(src.rank(), shape, static_cast<const int64_t*>(src.raw()), st,
                        static_cast<int64_t*>(dst.raw()));
      break;
    default: AUTOSP_ASSERT(false, "bad element size");
  }
}

double element_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::bf16: return cpu::bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return cpu::f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::i32: return static_cast<const int32_t*>(base)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
  }
  return 0;
}

void store_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(base)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = cpu::f64_to_bf16(v); break;  // rounded once
    case DType::f16: static_cast<uint16_t*>(base)[i] = cpu::f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
  }
}
}  // namespace

namespace {
// The copies and conversions below are host loops: a device tensor gets a clear failure instead of
// a crash (the device runtime has its own: device/cuda/device.h to_device, device/cuda/copy.h).
void expect_host(const Tensor& t, const char* what) {
  AUTOSP_ASSERT(t.device().kind == DeviceKind::cpu, what, " of ", t.str(), " on ", t.device().str(),
                ": host-only; copy it with to_device(t, Device{}) first (device/cuda/device.h)");
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  expect_host(*this, "contiguous()");
  return clone();
}

Tensor Tensor::clone() const {
  expect_host(*this, "clone()");
  Tensor t = empty(shape_, dtype_);
  copy_into(*this, t);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  expect_host(*this, "to(dtype)");
  Tensor src = contiguous();
  if (dtype == dtype_) return src.clone();
  Tensor t = empty(shape_, dtype);
  const int64_t n = numel();
  if (dtype_ == DType::i64 && dtype == DType::i32) {
    // integer narrowing keeps exact values
    for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(src.data<int64_t>()[i]);
    return t;
  }
  for (int64_t i = 0; i < n; ++i) store_double(t.raw(), dtype, i, element_as_double(src.raw(), dtype_, i));
  return t;
}

int64_t first_non_finite(const Tensor& t) {
  const Tensor c = t.contiguous();
  auto scan = [&](const auto* p) -> int64_t {
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  };
  if (c.dtype() == DType::f32) return scan(c.data<float>());
  if (c.dtype() == DType::f64) return scan(c.data<double>());
  return -1;
}

std::vector<double> Tensor::to_doubles() const {
  expect_host(*this, "to_doubles()");
  Tensor src = contiguous();
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = element_as_double(src.raw(), dtype_, i);
  return out;
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

}  // namespace autosp
