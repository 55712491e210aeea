// CUDA launchers of the fused ops (declared in launchers.h, the dispatch table's CUDA column):
// residual add + norm (add_layernorm, add_rmsnorm: y, and s = x + r as extra output 1) and
// bias + tanh-GELU with its backward. Each mirrors its CPU launcher in src/runtime/dispatch.cpp;
// the small helpers repeat launchers.cpp's (kept private there). Compiled only in CUDA builds.
#include <cuda_runtime_api.h>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/norm.cuh"
#include "runtime/cuda/copy.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/launchers.h"

namespace autosp::cuda_ops {
namespace {

using cuda::bf16;

cudaStream_t stream(const KernelCall& c) {
  AUTOSP_ASSERT(c.alloc.device().kind == DeviceKind::cuda, "CUDA launcher for ", c.node.name(), " with a ",
                c.alloc.device().str(), " allocator");
  return compute_stream(c.alloc.device().index);
}

// Input i on the device, contiguous (copied there when it is a strided view).
Tensor arg(const KernelCall& c, size_t i) {
  const Tensor& t = c.in[i];
  AUTOSP_ASSERT(t.device() == c.alloc.device(), "[", c.node.op_name(), "] ", c.node.name(), ": input ", i, " ",
                t.str(), " is on ", t.device().str(), ", the node runs on ", c.alloc.device().str());
  return cudart::contiguous(t, c.alloc, stream(c));
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// Call f.template operator()<T>() with T = float, bf16 or double, by dtype.
template <class F>
Tensor by_float(const KernelCall& c, DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f64: return f.template operator()<double>();
    default:
      throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": ", dtype_name(dt),
                           " has no CUDA kernel (use float32 or bfloat16 or float64)"));
  }
}

// y = norm(x + r); extra output 1: s = x + r. Inputs: x, r, w (, b).
Tensor add_norm(const KernelCall& c, bool rms) {
  const Tensor x = arg(c, 0), r = arg(c, 1), w = arg(c, 2);
  const Tensor b = rms ? Tensor() : arg(c, 3);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    Tensor s = extra_like(c, x.shape(), x.dtype());
    c.extras.push_back(s);
    cuda::add_norm_forward<T>(ptr<T>(x), ptr<T>(r), ptr<T>(w), rms ? nullptr : ptr<T>(b), ptr<T>(y), ptr<T>(s), rows,
                              C, c.node.attrs().f("eps"), rms, stream(c));
    return y;
  });
}

}  // namespace

Tensor add_layernorm(const KernelCall& c) { return add_norm(c, false); }
Tensor add_rmsnorm(const KernelCall& c) { return add_norm(c, true); }

// gelu_tanh(x + b): x [..., C], b [C].
Tensor bias_gelu_tanh(const KernelCall& c) {
  const Tensor x = arg(c, 0), b = arg(c, 1);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::bias_gelu_tanh<T>(ptr<T>(x), ptr<T>(b), ptr<T>(y), rows, C, stream(c));
    return y;
  });
}

// dx = dy · gelu_tanh'(x + b). Inputs: dy, x, b.
Tensor bias_gelu_tanh_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), b = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    cuda::bias_gelu_tanh_backward<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(b), ptr<T>(dx), rows, C, stream(c));
    return dx;
  });
}

}  // namespace autosp::cuda_ops
