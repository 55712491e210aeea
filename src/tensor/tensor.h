// Tensor: a dtype, a shape, strides (in elements) and an offset into shared storage that came from
// an Allocator. Copies share storage (like torch.Tensor); clone() copies data. ParamMap: tensors by
// name (parameters, gradients, optimizer moments). Knows nothing of graphs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/dtype.h"

namespace autosp {

using Shape = std::vector<int64_t>;

std::string shape_str(std::span<const int64_t> shape);  // "[2, 3, 4]"
int64_t shape_numel(std::span<const int64_t> shape);
// ZeRO-3's shard of a tensor of `numel` elements over `ranks` ranks: ceil(numel / ranks) of its
// flattened elements, the last shards padded with zeros (graph/passes/shard_parameters.h). One
// definition for the graph's shapes, the launchers and the trainer's shards.
inline int64_t shard_numel(int64_t numel, int64_t ranks) { return (numel + ranks - 1) / ranks; }
Shape contiguous_strides(std::span<const int64_t> shape);

class Storage {
 public:
  Storage(Allocator& alloc, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return alloc_.device(); }

 private:
  Allocator& alloc_;
  void* data_;
  size_t nbytes_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Allocator& alloc = cpu_allocator());
  static Tensor zeros(Shape shape, DType dtype);  // CPU
  template <class T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values);  // CPU, T in f32/f64/i32/i64

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }

  // Pointer to element 0 (offset applied): a device pointer for a tensor on a CUDA device, which
  // only kernels may dereference. contiguous() (when it must copy), clone(), to() and to_doubles()
  // are host loops and fail with a clear assertion on device tensors (docs/decisions.md).
  void* raw() const;
  template <class T>
  T* data() const {
    AUTOSP_ASSERT(dtype_of<T> == dtype_ || (sizeof(T) == 2 && dtype_size(dtype_) == 2),
                  "data<T>() on a ", dtype_name(dtype_), " tensor");
    return static_cast<T*>(raw());
  }

  // A contiguous tensor of `shape` and `dtype` placed `byte_offset` bytes after `base`'s first element
  // (an arena, or a view of one: a workspace). The offset must be a multiple of the element size.
  static Tensor view_bytes(const Tensor& base, size_t byte_offset, Shape shape, DType dtype);

  // Views (share storage).
  Tensor reshape(Shape shape) const;  // requires contiguous
  Tensor as_strided(Shape shape, Shape strides, int64_t offset) const;

  // Copies.
  Tensor contiguous() const;  // a contiguous copy (or *this when already contiguous)
  Tensor clone() const;
  Tensor to(DType dtype) const;        // CPU dtype conversion (copy)
  std::vector<double> to_doubles() const;  // CPU, any dtype, row-major

  std::string str() const;  // "f32[2, 3]"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements
  Shape shape_, strides_;
  DType dtype_ = DType::f32;
};

// The index of the first NaN or infinity of a host f32 or f64 tensor, scanned in place (no copy);
// -1 when every element is finite, and for other dtypes.
int64_t first_non_finite(const Tensor& t);

// Tensors by name: a model's parameters (Hugging Face names), their gradients, optimizer moments.
using ParamMap = std::map<std::string, Tensor>;

}  // namespace autosp
