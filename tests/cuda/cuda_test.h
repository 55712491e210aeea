// Helpers of the CUDA kernel tests (autosp-cuda-tests): device buffers that convert on upload and
// download, values rounded to a storage type, and the CUDA-vs-CPU comparison with a tolerance per
// storage type. Every test runs a CUDA launcher and the CPU kernel on the same (rounded) inputs;
// for bf16 the CPU reference computes in float on the bf16-rounded inputs.
#pragma once

#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/naive.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/common.cuh"
#include "kernels/kernel_test.h"

namespace autosp::cudatest {

using cuda::bf16;
using cuda::f16;

// The host type a storage type T is checked in: float for bf16 and f16, else T itself.
template <class T>
using Host = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

// |cuda - cpu| ≤ tol · (1 + |cpu|) per element.
template <class T>
constexpr double tol() {
  if constexpr (std::is_same_v<T, double>)
    return 1e-10;
  else if constexpr (std::is_same_v<T, float>)
    return 1e-5;
  else
    return 1e-2;
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, double>)
    return "f64";
  else if constexpr (std::is_same_v<T, float>)
    return "f32";
  else if constexpr (std::is_same_v<T, bf16>)
    return "bf16";
  else
    return "other";
}

inline uint16_t bits_of(bf16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}
inline bf16 bf16_from_bits(uint16_t b) {
  bf16 v;
  std::memcpy(static_cast<void*>(&v), &b, 2);
  return v;
}

// v rounded to T's precision, as a Host<T>.
template <class T>
Host<T> round_to(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return cpu::bf16_to_f32(cpu::f32_to_bf16(float(v)));
  else
    return Host<T>(v);
}

// Normal values around `mean` (inputs whose rows push a weight gradient the same way, as a trained
// model's do, so a sum over chunks of rows grows with each chunk).
inline naive::Vec around(double mean, int64_t n, uint32_t seed, double stddev) {
  naive::Vec v = naive::random_normal(n, seed, stddev);
  for (double& e : v) e += mean;
  return v;
}

template <class T>
std::vector<Host<T>> values(const naive::Vec& v) {
  std::vector<Host<T>> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = round_to<T>(v[i]);
  return out;
}

// A device array of n T, freed on scope exit. Uploads and downloads convert bf16 ↔ float.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit Dev(const std::vector<Host<T>>& h) : Dev(h.size()) { upload(h); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }

  void upload(const std::vector<Host<T>>& h) {
    REQUIRE(h.size() == n_);
    if (n_ == 0) return;
    if constexpr (std::is_same_v<T, bf16>) {
      std::vector<uint16_t> bits(n_);
      for (size_t i = 0; i < n_; ++i) bits[i] = cpu::f32_to_bf16(h[i]);
      CUDA_CHECK(cudaMemcpy(p_, bits.data(), n_ * 2, cudaMemcpyHostToDevice));
    } else {
      CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    }
  }

  // Waits for the device (cudaMemcpy synchronises) and checks for an asynchronous error.
  std::vector<Host<T>> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<Host<T>> h(n_);
    if (n_ == 0) return h;
    if constexpr (std::is_same_v<T, bf16>) {
      std::vector<uint16_t> bits(n_);
      CUDA_CHECK(cudaMemcpy(bits.data(), p_, n_ * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n_; ++i) h[i] = cpu::bf16_to_f32(bits[i]);
    } else {
      CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Host arrays in storage type T and back (the CPU emulation of the kernels works on host memory).
template <class T>
std::vector<T> to_storage(const std::vector<Host<T>>& h) {
  std::vector<T> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      out[i] = bf16_from_bits(cpu::f32_to_bf16(h[i]));
    else
      out[i] = h[i];
  }
  return out;
}
template <class T>
std::vector<Host<T>> from_storage(const std::vector<T>& d) {
  std::vector<Host<T>> out(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      out[i] = cpu::bf16_to_f32(bits_of(d[i]));
    else
      out[i] = d[i];
  }
  return out;
}

template <class H>
naive::Vec widen(const std::vector<H>& v) {
  return naive::Vec(v.begin(), v.end());
}

// The CUDA result against the CPU reference, with T's tolerance (or `tolerance`).
template <class T, class H>
void check_against(const std::vector<H>& got, const std::vector<H>& ref, double tolerance = tol<T>()) {
  INFO("storage " << type_name<T>());
  test::check_close(widen(got), widen(ref), tolerance);
}

// For a sum of many terms (a GEMM's dot products, a gradient summed over rows): the CUDA result
// against the CPU reference, each element's error relative to 1 + its Σ|term| (`magnitude`: the same
// CPU kernel on the inputs' absolute values). Two correct kernels that add in different orders
// differ by up to about eps·√n·Σ|term|, which a tolerance relative to 1 + |ref| misses where the
// terms cancel (a 768-term f32 dot product: ~5e-5); a lost or doubled term still costs |term| /
// Σ|term|, far above the tolerance.
template <class T, class H>
void check_sum_against(const std::vector<H>& got, const std::vector<H>& ref, const std::vector<H>& magnitude,
                       double tolerance = tol<T>()) {
  INFO("storage " << type_name<T>() << ", error relative to each element's sum of |terms|");
  const naive::Vec m = widen(magnitude);
  test::check_close(widen(got), widen(ref), tolerance, &m);
}

// The elementwise absolute values of v.
template <class H>
std::vector<H> absolute(std::vector<H> v) {
  for (H& x : v) x = x < H(0) ? H(-x) : x;
  return v;
}

using test::relative_l2;  // kernels/kernel_test.h

// Bitwise equality (determinism checks, exact kernels).
template <class H>
void check_identical(const std::vector<H>& a, const std::vector<H>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(H)) == 0);
}

// Right-aligned broadcast strides of a contiguous `shape` against `out` (0 on broadcast dims).
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out) {
  std::vector<int64_t> st(out.size(), 0);
  const size_t off = out.size() - shape.size();
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[off + i] = shape[i] == 1 && out[off + i] != 1 ? 0 : s;
    s *= shape[i];
  }
  return st;
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace autosp::cudatest
