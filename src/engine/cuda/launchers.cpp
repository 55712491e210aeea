// CUDA launchers: the CUDA column of the kernel dispatch table (engine/dispatch.cpp), declared in
// engine/launchers.h beside the CPU ones: one launcher per op,
// mapping the op's tensors onto the launchers of src/kernels/cuda exactly as the CPU launchers map
// them onto src/kernels/cpu (engine/cpu/launchers.cpp, name for name). Every kernel is enqueued on
// the compute stream of the tensors' device (device/cuda/device.h); nothing synchronises with the
// host. Compiled only in CUDA builds.
//
// Dtypes: f32 and bf16 everywhere, f64 where the kernel has it (not attention); any other is a
// UsageError naming the op and the dtype. Scalars a bf16 op produces (loss, token count, the
// attention log-sum-exp) have the dtype the op table declares; the kernels write them in f32.
// Ids (embedding, rope positions, labels) are widened to int64 on the device. Embedding ids and
// labels are not checked on the host here (that would cost a device-to-host copy per step): an
// out-of-range id gives a NaN row, and so a non-finite loss that stops training; the trainer checks
// the batch on the host before uploading it.
// Each mirrors its CPU launcher: same shapes, same folding of dims, same planned outputs (c.out,
// c.extra_out, else fresh from c.alloc); strided inputs are made contiguous on the device first.
#include "engine/launchers.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cudnn_attention.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/kinds.h"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/mlp.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "device/cuda/copy.h"
#include "device/cuda/device.h"
#include "engine/ring.h"

namespace autosp::cuda_ops {
namespace {

using cuda::bf16;

cudaStream_t stream(const KernelCall& c) {
  AUTOSP_ASSERT(c.alloc.device().kind == DeviceKind::cuda, "CUDA launcher for ", c.node.name(), " with a ",
                c.alloc.device().str(), " allocator");
  return compute_stream(c.alloc.device().index);
}

// Input i on the device (asserted), as it is (strided views allowed).
const Tensor& on_device(const KernelCall& c, size_t i) {
  const Tensor& t = c.in[i];
  AUTOSP_ASSERT(t.device() == c.alloc.device(), "[", c.node.op_name(), "] ", c.node.name(), ": input ", i, " ",
                t.str(), " is on ", t.device().str(), ", the node runs on ", c.alloc.device().str());
  return t;
}

// Input i on the device, contiguous (copied there when it is a strided view).
Tensor arg(const KernelCall& c, size_t i) { return gpu::contiguous(on_device(c, i), c.alloc, stream(c)); }

// Integer input i as contiguous int64 on the device (i32 ids are widened).
Tensor ids64(const KernelCall& c, size_t i) { return gpu::cast(on_device(c, i), DType::i64, c.alloc, stream(c)); }

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// Call f.template operator()<T>() with T = float, bf16 or (when kF64) double, by dtype.
template <bool kF64 = true, class F>
Tensor by_float(const KernelCall& c, DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::f64:
      if constexpr (kF64) return f.template operator()<double>();
      [[fallthrough]];
    default:
      throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": ", dtype_name(dt),
                           " has no CUDA kernel (use float32 or bfloat16", kF64 ? " or float64" : "", ")"));
  }
}

// The dtype a kernel over T writes its scalars in (acc_t<T>).
template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<cuda::acc_t<T>, double> ? DType::f64 : DType::f32;
}

// `v` in storage type T (bf16 rounded once to nearest even, as the CPU rounds constants).
template <class T>
T host_value(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __double2bfloat16(v);
  else
    return static_cast<T>(v);
}

// `view` (a strided view of a device input) materialised: into the node's output when `as_output`,
// else into a temporary.
Tensor copy_view(const KernelCall& c, const Tensor& view, bool as_output = true) {
  Tensor y = as_output ? out_like(c, view.dtype()).reshape(view.shape()) : Tensor::empty(view.shape(), view.dtype(), c.alloc);
  gpu::copy_strided_into(view, y, stream(c));
  return y;
}

// `height` rows of `width` bytes from src (rows `spitch` apart) to dst (rows `dpitch` apart), on
// the device. cudaMemcpy2DAsync refuses pitches above the device's limit (cudaDevAttrMaxPitch,
// 2^31 - 1 bytes), which a row of a large tensor exceeds (concat or slice_backward along a late dim
// with B = 1): such rows are copied one by one.
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, cudaStream_t s) {
  if (width == 0 || height == 0) return;
  constexpr size_t kMaxPitch = (size_t(1) << 31) - 1;
  if (height == 1 || dpitch > kMaxPitch || spitch > kMaxPitch) {
    for (size_t r = 0; r < height; ++r)
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                                 width, cudaMemcpyDeviceToDevice, s));
    return;
  }
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, s));
}

// A scalar `src` (device) in the dtype of `dst` (device, one element): a copy or a cast.
void settle_scalar(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  if (src.raw() != dst.raw()) gpu::cast_into(src, dst, s);
}

// ---- fused ops (passes/fuse_elementwise) ----

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

// ---- dense algebra ----

// w [V, C], ids [...] → y [..., C]
Tensor embedding(const KernelCall& c) {
  const Tensor w = arg(c, 0);
  const Tensor ids = ids64(c, 1);
  return by_float(c, w.dtype(), [&]<class T>() {
    Tensor y = out_like(c, w.dtype());
    cuda::embedding_forward<T>(ptr<T>(w), ptr<int64_t>(ids), ptr<T>(y), ids.numel(), w.dim(0), w.dim(1), stream(c));
    return y;
  });
}

Tensor matmul(const KernelCall& c) {
  const Tensor a = arg(c, 0), b = arg(c, 1);
  const bool ta = c.node.attrs().b("trans_a"), tb = c.node.attrs().b("trans_b");
  const int r = a.rank();
  const int64_t M = c.out_shape[r - 2], N = c.out_shape[r - 1], K = a.dim(ta ? -2 : -1);
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (y.numel() == 0) return y;
    if (K == 0) {  // an empty sum
      CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), stream(c)));
      return y;
    }
    const int64_t batch = a.numel() / (a.dim(-1) * a.dim(-2));
    if (b.rank() == 2 && !ta)  // [..., M, K] · [K, N]: one GEMM with batch·M rows
      cuda::gemm_batched<T>(false, tb, 1, batch * M, N, K, 1.0, ptr<T>(a), 0, ptr<T>(b), 0, 0.0, ptr<T>(y), 0, stream(c));
    else
      cuda::gemm_batched<T>(ta, tb, batch, M, N, K, 1.0, ptr<T>(a), M * K, ptr<T>(b), b.rank() == 2 ? 0 : K * N, 0.0,
                            ptr<T>(y), M * N, stream(c));
    return y;
  });
}

// ---- elementwise ----

template <kernels::Binary kOp>
Tensor binary(const KernelCall& c) {
  const Tensor &a = on_device(c, 0), &b = on_device(c, 1);
  const Shape& out = c.out_shape;
  AUTOSP_ASSERT(static_cast<int>(out.size()) <= kMaxRank, "rank ", out.size(), " too large");
  const Shape sa = launch::broadcast_strides(a, out), sb = launch::broadcast_strides(b, out);
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (out.empty()) {
      const Shape one{1}, z{0};
      cuda::binary<T>(kOp, 1, one.data(), ptr<T>(a), z.data(), ptr<T>(b), z.data(), ptr<T>(y), stream(c));
    } else {
      cuda::binary<T>(kOp, static_cast<int>(out.size()), out.data(), ptr<T>(a), sa.data(), ptr<T>(b), sb.data(),
                      ptr<T>(y), stream(c));
    }
    return y;
  });
}

template <kernels::Unary kOp>
Tensor unary(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const double factor = kOp == kernels::Unary::scale ? c.node.attrs().f("factor") : 0.0;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::unary<T>(kOp, ptr<T>(x), ptr<T>(y), x.numel(), factor, stream(c));
    return y;
  });
}

template <kernels::UnaryGrad kOp>
Tensor unary_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::unary_backward<T>(kOp, ptr<T>(dy), ptr<T>(x), ptr<T>(y), x.numel(), stream(c));
    return y;
  });
}

Tensor cast(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, c.node.dtype());
  gpu::cast_into(x, y, stream(c));
  return y;
}

// ---- layout ----

Tensor reshape(const KernelCall& c) { return arg(c, 0).reshape(c.out_shape); }

// transpose and permute
Tensor permute(const KernelCall& c) { return copy_view(c, launch::permuted_view(c, on_device(c, 0))); }

Tensor slice(const KernelCall& c) { return copy_view(c, launch::slice_view(c, on_device(c, 0))); }

// y [..., Σ n_i, ...] from x_i [..., n_i, ...]: per index over the dims before `d`, the inputs'
// contiguous blocks side by side (one 2-D copy per input: height = outer, width = its block).
Tensor concat(const KernelCall& c) {
  const int d = launch::axis(c.node.attrs().i("dim"), c.in[0].rank());
  Tensor y = out_like(c, c.in[0].dtype());
  const size_t es = dtype_size(y.dtype());
  const int64_t outer = shape_numel(std::span(c.out_shape).first(d));
  const int64_t y_block = outer ? y.numel() / outer : 0;
  int64_t at = 0;  // offset of this input's block inside y's block, in elements
  for (size_t i = 0; i < c.in.size(); ++i) {
    const Tensor x = arg(c, i);
    const int64_t block = outer ? x.numel() / outer : 0;
    copy_rows(static_cast<char*>(y.raw()) + at * es, y_block * es, x.raw(), block * es, block * es, outer, stream(c));
    at += block;
  }
  return y;
}

// dy [.., end-start, ..] placed at [start, end) of dim d of a zero tensor.
Tensor slice_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0);
  const int d = launch::axis(c.node.attrs().i("dim"), dy.rank());
  const int64_t start = c.node.attrs().dim("start").eval(c.bindings);
  Tensor y = out_like(c, dy.dtype());
  if (y.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), stream(c)));
  const size_t es = dtype_size(dy.dtype());
  const int64_t outer = shape_numel(std::span(dy.shape()).first(d));
  const int64_t inner = shape_numel(std::span(dy.shape()).subspan(d + 1));
  const int64_t rows_in = dy.dim(d), rows_out = c.out_shape[d];
  const size_t width = static_cast<size_t>(rows_in * inner) * es;
  copy_rows(static_cast<char*>(y.raw()) + start * inner * es, rows_out * inner * es, dy.raw(), width, width, outer,
            stream(c));
  return y;
}

// ---- normalisation ----

Tensor layernorm(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), b = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::layernorm_forward<T>(ptr<T>(x), ptr<T>(w), ptr<T>(b), ptr<T>(y), nullptr, nullptr, rows, C,
                               c.node.attrs().f("eps"), stream(c));
    return y;
  });
}

Tensor rmsnorm(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::rmsnorm_forward<T>(ptr<T>(x), ptr<T>(w), ptr<T>(y), nullptr, rows, C, c.node.attrs().f("eps"), stream(c));
    return y;
  });
}

Tensor softmax(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::softmax_forward<T>(ptr<T>(x), ptr<T>(y), rows, C, stream(c));
    return y;
  });
}

// dx; extra outputs dw, db. Inputs: dy, x, w.
Tensor layernorm_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), w = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    Tensor db = extra_like(c, {C}, x.dtype());
    c.extras.push_back(db);
    cuda::layernorm_backward_input<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(dx), rows, C, eps, stream(c));
    cuda::layernorm_backward_params<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(dw), ptr<T>(db), rows, C, eps, stream(c));
    return dx;
  });
}

// dx; extra output dw. Inputs: dy, x, w.
Tensor rmsnorm_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), w = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    cuda::rmsnorm_backward_input<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(dx), rows, C, eps, stream(c));
    cuda::rmsnorm_backward_weight<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(dw), rows, C, eps, stream(c));
    return dx;
  });
}

Tensor softmax_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), y = arg(c, 1);
  const int64_t C = y.dim(-1), rows = y.numel() / C;
  return by_float(c, y.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, y.dtype());
    cuda::softmax_backward<T>(ptr<T>(dy), ptr<T>(y), ptr<T>(dx), rows, C, stream(c));
    return dx;
  });
}

// ---- position, attention ----

// Rotary embedding and its backward: x or dy [B, N, S, D], position_ids [B, S].
template <bool kBackward>
Tensor rope(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const Tensor pos = ids64(c, 1);
  if (x.dim(3) > 256)
    throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": head dim ", x.dim(3),
                         " > 256, which the CUDA rope kernel does not support"));
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    auto kernel = kBackward ? cuda::rope_backward<T> : cuda::rope_forward<T>;
    kernel(ptr<T>(x), ptr<int64_t>(pos), ptr<T>(y), x.dim(0), x.dim(1), x.dim(2), x.dim(3), c.node.attrs().f("theta"),
           rope_scaling_of(c.node), stream(c));
    return y;
  });
}

namespace {
// The sdpa kernels' limits, as a UsageError naming the node (kernels only assert).
void check_attention(const KernelCall& c, const Tensor& q) {
  if (q.dim(3) > 128)
    throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": head dim ", q.dim(3),
                         " > 128, which the CUDA attention kernels do not support"));
}

// Whether this attention node runs on cuDNN's fused SDPA: runtime.attention "cudnn" (the
// executor's options, carried by the KernelCall) and sizes cuDNN supports
// (kernels/cuda/cudnn_attention.cuh). Otherwise our flash attention runs, with one warning per
// distinct reason (both write the same f32 lse, so forward and backward may differ).
template <class T>
bool use_cudnn(const KernelCall& c, const Tensor& q, const Tensor& k) {
  if (c.attention != AttentionBackend::cudnn) return false;
  const bool documents = c.in.size() > (c.node.op() == Op::sdpa ? 3u : 6u);  // config.cpp refuses this pairing
  const std::string why = documents ? std::string("a document mask (doc_start)")
                                    : cuda::cudnn_sdpa_unsupported<T>(q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                                                                      q.dim(3), c.node.attrs().b("causal"));
  if (why.empty()) return true;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(why).second)
    spdlog::warn("runtime.attention \"cudnn\": {} ({}): {}; using our flash attention", c.node.op_name(),
                 c.node.name(), why);
  return false;
}
}  // namespace

namespace {
// The operands sdpa and ring_attention share, on the device and checked (check_attention): q, k, v
// and the optional document starts (input 3, i64); their backward adds o, lse (in f32) and dout
// (inputs 3-5) and has the starts at input 6.
struct AttentionArgs {
  Tensor q, k, v, o, lse, dout, docs;
};
AttentionArgs attention_args(const KernelCall& c, bool backward) {
  AttentionArgs args;
  args.q = arg(c, 0);
  args.k = arg(c, 1);
  args.v = arg(c, 2);
  const size_t docs_at = backward ? 6 : 3;
  if (backward) {
    args.o = arg(c, 3);
    args.lse = gpu::cast(on_device(c, 4), DType::f32, c.alloc, stream(c));
    args.dout = arg(c, 5);
  }
  if (c.in.size() > docs_at) args.docs = ids64(c, docs_at);
  check_attention(c, args.q);
  return args;
}
}  // namespace

// o [B, N, Sq, D]; extra output 1: lse [B, N, Sq] (written in f32; cast when the op table declares
// another dtype). Input 3 (optional): the document starts [B, Sq], i64.
Tensor sdpa(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v, &docs = args.docs;
  return by_float<false>(c, q.dtype(), [&]<class T>() {
    Tensor o = out_like(c, q.dtype());
    const Shape lse_shape{q.dim(0), q.dim(1), q.dim(2)};
    Tensor lse = extra_like(c, lse_shape, extra_types(c.node).at(0).dtype);
    const Tensor lse32 = lse.dtype() == DType::f32 ? lse : Tensor::empty(lse_shape, DType::f32, c.alloc);
    const double scale = c.node.attrs().f("scale");
    const bool causal = c.node.attrs().b("causal");
    if (use_cudnn<T>(c, q, k))
      cuda::cudnn_sdpa_forward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse32), q.dim(0), q.dim(1),
                                  k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale, causal, stream(c));
    else
      cuda::sdpa_forward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse32), q.dim(0), q.dim(1), k.dim(1),
                            q.dim(2), k.dim(2), q.dim(3), scale, causal, stream(c), cuda::SdpaKernel::automatic,
                            docs.defined() ? ptr<int64_t>(docs) : nullptr);
    settle_scalar(lse32, lse, stream(c));
    c.extras.push_back(lse);
    return o;
  });
}

// dq; extra outputs dk, dv. Inputs: q, k, v, o, lse, dout (, the document starts).
Tensor sdpa_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v, &docs = args.docs;
  const Tensor &o = args.o, &lse = args.lse, &dout = args.dout;
  return by_float<false>(c, q.dtype(), [&]<class T>() {
    Tensor dq = out_like(c, q.dtype());
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    const double scale = c.node.attrs().f("scale");
    const bool causal = c.node.attrs().b("causal");
    if (use_cudnn<T>(c, q, k))
      cuda::cudnn_sdpa_backward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse), ptr<T>(dout),
                                   ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                                   q.dim(3), scale, causal, stream(c));
    else
      cuda::sdpa_backward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse), ptr<T>(dout), ptr<T>(dq),
                             ptr<T>(dk), ptr<T>(dv), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale,
                             causal, stream(c), cuda::SdpaKernel::automatic, docs.defined() ? ptr<int64_t>(docs) : nullptr);
    return dq;
  });
}

// ---- ring attention (engine/ring.h; the CPU launchers are the reference) ----
//
// As on the CPU: operands in halves, one sdpa call per visited chunk pair, the K/V block one
// buffer sent around the ring (NCCL's send/recv on its own stream overlaps the current block's
// kernels). Here the running output and every gradient accumulate in f32 (a bf16 model's blocks
// are merged and summed in f32 and cast once at the end; the dK/dV partials travel in f32), the
// merge is cuda::merge_attention, and the document starts are read to the host once per call (the
// chunk-pair skips are decided there) and each visited pair's shifted starts uploaded.
namespace {

// Device int64 ids on the host (the stream drained first).
std::vector<int64_t> host_ids(const KernelCall& c, const Tensor& ids) {
  std::vector<int64_t> h(ids.defined() ? static_cast<size_t>(ids.numel()) : 0);
  if (h.empty()) return h;
  CUDA_CHECK(cudaMemcpyAsync(h.data(), ids.raw(), ids.nbytes(), cudaMemcpyDeviceToHost, stream(c)));
  CUDA_CHECK(cudaStreamSynchronize(stream(c)));
  return h;
}

// [k | v] of one block, each in halves, as one buffer of `dt` (k and v cast when it differs).
Tensor kv_block(const KernelCall& c, const Tensor& k, const Tensor& v, DType dt) {
  const Shape halves{2, k.dim(0), k.dim(1), k.dim(2) / 2, k.dim(3)};
  Tensor kv = Tensor::empty({2, 2, k.dim(0), k.dim(1), k.dim(2) / 2, k.dim(3)}, dt, c.alloc);
  for (int i = 0; i < 2; ++i) {
    const Tensor& x = i == 0 ? k : v;
    Tensor part = Tensor::view_bytes(kv, size_t(i) * size_t(x.numel()) * dtype_size(dt), halves, dt);
    if (x.dtype() == dt) {
      gpu::copy_strided_into(halves_view(x), part, stream(c));
    } else {
      Tensor same = Tensor::empty(halves, x.dtype(), c.alloc);
      gpu::copy_strided_into(halves_view(x), same, stream(c));
      gpu::cast_into(same, part, stream(c));
    }
  }
  return kv;
}

// y[i] += x[i] (f32, n elements), with x in T (widened first when T is bf16, through `scratch`).
template <class T>
void add_into(float* y, const T* x, int64_t n, float* scratch, cudaStream_t s) {
  const float* xf = reinterpret_cast<const float*>(x);
  if constexpr (!std::is_same_v<T, float>) {
    cuda::cast<T, float>(x, scratch, n, s);
    xf = scratch;
  }
  const int64_t one = 1;
  cuda::binary<float>(kernels::Binary::add, 1, &n, y, &one, xf, &one, y, s);
}

// halves [2, B, H, c, D] (f32) into the node's tensor `dst` [B, H, 2c(, D)] of its dtype.
void from_halves(const KernelCall& c, const Tensor& halves, const Tensor& dst) {
  const Shape inter{halves.dim(1), halves.dim(2), 2, halves.dim(3), halves.dim(4)};
  if (dst.dtype() == DType::f32) return gpu::copy_strided_into(interleaved_view(halves), dst.reshape(inter), stream(c));
  Tensor f32 = Tensor::empty(inter, DType::f32, c.alloc);
  gpu::copy_strided_into(interleaved_view(halves), f32, stream(c));
  gpu::cast_into(f32, dst.reshape(inter), stream(c));
}

}  // namespace

// o [B, N, L, D]; extra output 1: lse [B, N, L] (f32). Inputs q, k, v (this rank's zigzag chunks,
// after the Ulysses all-to-all), optional document starts [B, L].
Tensor ring_attention(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v, &docs = args.docs;
  return by_float<false>(c, q.dtype(), [&]<class T>() {
    const cudaStream_t s = stream(c);
    const std::vector<int64_t> starts = host_ids(c, docs);
    RingChunks g = ring_chunks(c, q, k, starts.empty() ? nullptr : starts.data());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = copy_view(c, halves_view(q), false);
    Tensor o = Tensor::empty(qh.shape(), DType::f32, c.alloc), lse = Tensor::empty({2, g.B, g.N, g.c}, DType::f32, c.alloc);
    cuda::fill<float>(ptr<float>(o), o.numel(), 0.0f, s);
    cuda::fill<float>(ptr<float>(lse), lse.numel(), -INFINITY, s);
    Tensor o_blk = Tensor::empty({g.B, g.N, g.c, g.D}, q.dtype(), c.alloc);
    Tensor lse_blk = Tensor::empty({g.B, g.N, g.c}, DType::f32, c.alloc);
    Tensor docs_blk = starts.empty() ? Tensor() : Tensor::empty({g.B, g.c}, DType::i64, c.alloc);
    Tensor kv = kv_block(c, k, v, q.dtype());
    std::vector<int64_t> dh;
    ring_forward(*c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc),
                 [&](int owner, const Tensor& block, const std::function<void()>& progress) {
                   g.k = g.chunks_of(owner);
                   const T* kp = ptr<T>(block);
                   const T* vp = kp + 2 * g.kv_half(1);
                   for (int a = 0; a < 2; ++a)
                     for (int b = 0; b < 2; ++b) {
                       bool diagonal = false;
                       if (!g.visits(a, b, diagonal, dh)) continue;
                       if (g.doc_start)
                         CUDA_CHECK(cudaMemcpyAsync(docs_blk.raw(), dh.data(), docs_blk.nbytes(), cudaMemcpyHostToDevice, s));
                       cuda::sdpa_forward<T>(ptr<T>(qh) + g.q_half(a), kp + g.kv_half(b), vp + g.kv_half(b),
                                             ptr<T>(o_blk), ptr<float>(lse_blk), g.B, g.N, g.Nkv, g.c, g.c, g.D, scale,
                                             diagonal, s, cuda::SdpaKernel::automatic,
                                             g.doc_start ? ptr<int64_t>(docs_blk) : nullptr);
                       cuda::merge_attention<T>(ptr<float>(o) + g.q_half(a), ptr<float>(lse) + g.lse_half(a),
                                                ptr<T>(o_blk), ptr<float>(lse_blk), g.B * g.N * g.c, g.D, s);
                       progress();
                     }
                 });
    Tensor y = out_like(c, q.dtype());
    from_halves(c, o, y);
    Tensor lse_out = extra_like(c, {g.B, g.N, 2 * g.c}, extra_types(c.node).at(0).dtype);
    from_halves(c, lse.reshape({2, g.B, g.N, g.c, 1}), lse_out);
    c.extras.push_back(lse_out);
    return y;
  });
}

// dq; extra outputs dk, dv. Inputs: q, k, v, o, lse, dout (, document starts).
Tensor ring_attention_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v, &docs = args.docs;
  const Tensor &o = args.o, &lse = args.lse, &dout = args.dout;
  return by_float<false>(c, q.dtype(), [&]<class T>() {
    const cudaStream_t s = stream(c);
    const std::vector<int64_t> starts = host_ids(c, docs);
    RingChunks g = ring_chunks(c, q, k, starts.empty() ? nullptr : starts.data());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = copy_view(c, halves_view(q), false), oh = copy_view(c, halves_view(o), false);
    const Tensor doh = copy_view(c, halves_view(dout), false);
    const Tensor lseh = copy_view(c, halves_view(lse.reshape({g.B, g.N, 2 * g.c, 1})), false);
    Tensor dqh = Tensor::empty(qh.shape(), DType::f32, c.alloc);
    cuda::fill<float>(ptr<float>(dqh), dqh.numel(), 0.0f, s);
    Tensor dq_blk = Tensor::empty({g.B, g.N, g.c, g.D}, q.dtype(), c.alloc);
    Tensor dkv_blk = Tensor::empty({2, g.B, g.Nkv, g.c, g.D}, q.dtype(), c.alloc);  // dk, dv of one chunk pair
    Tensor widened = Tensor::empty({std::max(dq_blk.numel(), dkv_blk.numel())}, DType::f32, c.alloc);
    Tensor docs_blk = starts.empty() ? Tensor() : Tensor::empty({g.B, g.c}, DType::i64, c.alloc);
    Tensor kv = kv_block(c, k, v, q.dtype());
    const Shape parts = kv.shape();
    Tensor grads[3] = {Tensor::empty(parts, DType::f32, c.alloc), Tensor::empty(parts, DType::f32, c.alloc),
                       Tensor::empty(parts, DType::f32, c.alloc)};
    const int64_t pair = g.B * g.Nkv * g.c * g.D;  // elements of one chunk's dk (or dv)
    std::vector<int64_t> dh;
    ring_backward(
        *c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc), grads,
        [&](int owner, const Tensor& block, Tensor& part, const std::function<void()>& progress) {
          g.k = g.chunks_of(owner);
          const T* kp = ptr<T>(block);
          const T* vp = kp + 2 * g.kv_half(1);
          float* dkp = ptr<float>(part);
          float* dvp = dkp + 2 * g.kv_half(1);
          cuda::fill<float>(dkp, part.numel(), 0.0f, s);
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
              bool diagonal = false;
              if (!g.visits(a, b, diagonal, dh)) continue;
              if (g.doc_start)
                CUDA_CHECK(cudaMemcpyAsync(docs_blk.raw(), dh.data(), docs_blk.nbytes(), cudaMemcpyHostToDevice, s));
              T* dkb = ptr<T>(dkv_blk);
              cuda::sdpa_backward<T>(ptr<T>(qh) + g.q_half(a), kp + g.kv_half(b), vp + g.kv_half(b),
                                     ptr<T>(oh) + g.q_half(a), ptr<float>(lseh) + g.lse_half(a),
                                     ptr<T>(doh) + g.q_half(a), ptr<T>(dq_blk), dkb, dkb + pair, g.B, g.N, g.Nkv, g.c,
                                     g.c, g.D, scale, diagonal, s, cuda::SdpaKernel::automatic,
                                     g.doc_start ? ptr<int64_t>(docs_blk) : nullptr);
              add_into<T>(ptr<float>(dqh) + g.q_half(a), ptr<T>(dq_blk), dq_blk.numel(), ptr<float>(widened), s);
              add_into<T>(dkp + g.kv_half(b), dkb, pair, ptr<float>(widened), s);
              add_into<T>(dvp + g.kv_half(b), dkb + pair, pair, ptr<float>(widened), s);
              progress();
            }
        },
        [&](Tensor& into, const Tensor& from) { add_into<float>(ptr<float>(into), ptr<float>(from), into.numel(), nullptr, s); });
    Tensor dq = out_like(c, q.dtype());
    from_halves(c, dqh, dq);
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    const Shape halves{2, g.B, g.Nkv, g.c, g.D};
    from_halves(c, Tensor::view_bytes(grads[0], 0, halves, DType::f32), dk);
    from_halves(c, Tensor::view_bytes(grads[0], size_t(2 * pair) * sizeof(float), halves, DType::f32), dv);
    return dq;
  });
}

Tensor causal_mask(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const int64_t Sq = x.dim(-2), Skv = x.dim(-1);
  const double value = c.node.attrs().f("value");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cuda::causal_mask<T>(ptr<T>(x), ptr<T>(y), x.numel() / std::max<int64_t>(1, Sq * Skv), Sq, Skv,
                         host_value<T>(value), stream(c));
    return y;
  });
}

// ---- loss ----

// The summed loss of logits [..., V] and labels [...], a device scalar of the node's dtype.
Tensor cross_entropy_sum(const KernelCall& c) {
  const Tensor logits = arg(c, 0);
  const Tensor labels = ids64(c, 1);
  const int64_t V = logits.dim(-1);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor y = out_like(c, c.node.dtype());
    const Tensor acc = y.dtype() == acc_dtype<T>() ? y : Tensor::empty({}, acc_dtype<T>(), c.alloc);
    cuda::cross_entropy_sum<T>(ptr<T>(logits), ptr<int64_t>(labels), ptr<cuda::acc_t<T>>(acc), labels.numel(), V,
                               c.node.attrs().i("ignore_index"), stream(c));
    settle_scalar(acc, y, stream(c));
    return y;
  });
}

Tensor count_valid(const KernelCall& c) {
  const Tensor labels = ids64(c, 0);
  const DType dt = c.node.dtype();
  Tensor y = out_like(c, dt);
  const int64_t ignore = c.node.attrs().i("ignore_index");
  if (dt == DType::f64) {
    cuda::count_valid<double>(ptr<int64_t>(labels), labels.numel(), ignore, ptr<double>(y), stream(c));
  } else if (dt == DType::f32 || dt == DType::bf16) {
    const Tensor acc = dt == DType::f32 ? y : Tensor::empty({}, DType::f32, c.alloc);
    cuda::count_valid<float>(ptr<int64_t>(labels), labels.numel(), ignore, ptr<float>(acc), stream(c));
    settle_scalar(acc, y, stream(c));
  } else {
    throw UsageError(str("[count_valid] ", c.node.name(), ": ", dtype_name(dt), " has no CUDA kernel"));
  }
  return y;
}

// dlogits = g · (softmax(logits) - onehot(labels)). Inputs: logits, labels, g (a device scalar,
// read by the kernel: no host synchronisation).
Tensor cross_entropy_backward(const KernelCall& c) {
  const Tensor logits = arg(c, 0);
  const Tensor labels = ids64(c, 1);
  return by_float(c, logits.dtype(), [&]<class T>() {
    const Tensor g = gpu::cast(on_device(c, 2), acc_dtype<T>(), c.alloc, stream(c));
    Tensor dx = out_like(c, logits.dtype());
    cuda::cross_entropy_backward<T>(ptr<T>(logits), ptr<int64_t>(labels), ptr<T>(dx), labels.numel(), logits.dim(-1),
                                    ptr<cuda::acc_t<T>>(g), c.node.attrs().i("ignore_index"), stream(c));
    return dx;
  });
}

// ---- constants, reductions, embedding gradient ----

Tensor full(const KernelCall& c) {
  const DType dt = c.node.dtype();
  return by_float(c, dt, [&]<class T>() {
    Tensor y = out_like(c, dt);
    cuda::fill<T>(ptr<T>(y), y.numel(), host_value<T>(c.node.attrs().f("value")), stream(c));
    return y;
  });
}

// x [..] summed to out [..] (right-aligned; padded with leading 1s to x's rank for the kernel)
Tensor sum_to(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  Shape out_full(static_cast<size_t>(x.rank()) - c.out_shape.size(), 1);
  out_full.insert(out_full.end(), c.out_shape.begin(), c.out_shape.end());
  AUTOSP_ASSERT(x.rank() <= kMaxRank, "rank ", x.rank(), " too large");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    if (x.rank() == 0)
      CUDA_CHECK(cudaMemcpyAsync(y.raw(), x.raw(), sizeof(T), cudaMemcpyDeviceToDevice, stream(c)));
    else
      cuda::sum_to<T>(ptr<T>(x), x.rank(), x.shape().data(), out_full.data(), ptr<T>(y), stream(c));
    return y;
  });
}

// dy [..., C], ids [...] → dweight [V, C]
Tensor embedding_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0);
  const Tensor ids = ids64(c, 1);
  return by_float(c, dy.dtype(), [&]<class T>() {
    Tensor y = out_like(c, dy.dtype());
    cuda::embedding_backward<T>(ptr<T>(dy), ptr<int64_t>(ids), ptr<T>(y), ids.numel(), c.out_shape[0], c.out_shape[1],
                                stream(c));
    return y;
  });
}

// ---- collectives ----

namespace {
// The group's communicator, checked to move device tensors (the MPI backend reads host memory).
Communicator& device_comm(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, c.node.op_name(), " without a communicator");
  if (c.comm->size() > 1 && c.comm->backend() == "mpi")
    throw RuntimeFailure(str("[", c.node.op_name(), "] ", c.node.name(), ": group '", c.node.attrs().s("group"),
                             "' uses the MPI communicator, which cannot move CUDA tensors; CUDA runs need NCCL"));
  return *c.comm;
}
}  // namespace

// Ulysses all-to-all (as all_to_all_cpu): chunk j of dim scatter_dim goes to rank j; the chunks
// received are laid side by side along gather_dim in rank order. A group of one is a copy.
Tensor all_to_all(const KernelCall& c) {
  Communicator& comm = device_comm(c);
  const Tensor x = arg(c, 0);
  const Tensor send_view = launch::all_to_all_send_view(c, x, comm);  // checks the group's size
  if (comm.size() == 1) {
    Tensor y = out_like(c, x.dtype());
    gpu::cast_into(x.reshape(c.out_shape), y, stream(c));
    return y;
  }
  Tensor send = copy_view(c, send_view, false);  // [P, chunk...]
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), c.alloc);
  comm.all_to_all(send, recv);
  return copy_view(c, launch::all_to_all_recv_view(c, recv)).reshape(c.out_shape);
}

Tensor all_reduce(const KernelCall& c) {
  Communicator& comm = device_comm(c);
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, x.dtype());
  gpu::cast_into(x, y, stream(c));  // a device copy (same dtype)
  if (comm.size() > 1) comm.all_reduce_sum(y);
  return y;
}

// ZeRO-3 (as the CPU launchers): the whole parameter from the shards, and the gradient's shard. In
// the background when the executor asks (KernelCall::pending): NCCL then runs the collective on
// its stream beside the compute stream's kernels until the handle is waited for (the parameter
// prefetch overlaps the layer before); the handle holds every buffer the collective touches, and
// its follow-up (the copy out of a padded buffer) is enqueued on the compute stream after the join.
Tensor all_gather(const KernelCall& c) {
  Communicator& comm = device_comm(c);
  (void)launch::shard_group(c);
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, x.dtype());
  const launch::ShardLayout l = launch::shard_layout(comm, y.numel());
  Tensor into = l.direct() ? y.reshape({y.numel()}) : Tensor::empty(l.padded(), x.dtype(), c.alloc);
  auto copy_out = [direct = l.direct(), x, into, y, s = stream(c)]() mutable {
    if (!direct) gpu::cast_into(Tensor::view_bytes(into, 0, y.shape(), y.dtype()), y, s);
  };
  if (!c.pending) {
    comm.all_gather(x, into);
    copy_out();
    return y;
  }
  *c.pending = followed_by(comm.all_gather_async(x, into), copy_out);
  return y;
}

// The gradient's shard: as the CPU launcher, the staging's pieces cast and zero-filled on the
// compute stream (NCCL's stream waits for them before each piece's collective).
Tensor reduce_scatter(const KernelCall& c) {
  Communicator& comm = device_comm(c);
  (void)launch::shard_group(c);
  const Tensor g = arg(c, 0);
  Tensor y = out_like(c, c.node.dtype());
  const launch::ScatterPieces p = launch::scatter_pieces(launch::shard_layout(comm, g.numel()), g.dtype(), y.dtype());
  if (p.staged) {
    const Tensor staging = launch::reduce_scatter_staging(c, p);
    cudaStream_t s = stream(c);
    const launch::DeviceFill fill{
        .convert = [s](const Tensor& from, const Tensor& to) { gpu::cast_into(from, to, s); },
        .zero = [s](const Tensor& t) { CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), s)); }};
    launch::staged_reduce_scatter(c, comm, p, g.reshape({g.numel()}), y, staging, fill);
    return y;
  }
  Tensor send = g.reshape({g.numel()});
  if (!c.pending) {
    comm.reduce_scatter_sum(send, y);
    return y;
  }
  *c.pending = followed_by(comm.reduce_scatter_sum_async(send, y), [send, y] {});
  return y;
}

// ---- fused ops ----

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

// ---- the tiled SwiGLU MLP (kernels/cuda/mlp.cuh: kernels/cpu/mlp.h's chunks and steps) ----

// x [..., C] as rows [R, C]; w_gate, w_up [I, C], w_down [C, I] → y [..., C].
Tensor swiglu_mlp(const KernelCall& c) {
  const Tensor x = arg(c, 0), wg = arg(c, 1), wu = arg(c, 2), wd = arg(c, 3);
  const int64_t C = x.dim(-1), I = wg.dim(0), rows = x.numel() / C, chunk = kernels::kMlpChunkRows;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    const int64_t r_max = std::min(rows, chunk);
    const Tensor g = Tensor::empty({r_max, I}, x.dtype(), c.alloc), u = Tensor::empty({r_max, I}, x.dtype(), c.alloc);
    cuda::swiglu_mlp<T>(ptr<T>(x), ptr<T>(wg), ptr<T>(wu), ptr<T>(wd), ptr<T>(y), rows, C, I, chunk, ptr<T>(g),
                        ptr<T>(u), stream(c));
    return y;
  });
}

// f32 scratch of n elements (bf16's weight-gradient sums), or an undefined tensor for n = 0.
Tensor f32_scratch(const KernelCall& c, int64_t n) {
  return n > 0 ? Tensor::empty({n}, DType::f32, c.alloc) : Tensor();
}

// dx; extra outputs dw_gate, dw_up, dw_down. Inputs: dy, x, w_gate, w_up, w_down.
Tensor swiglu_mlp_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), wg = arg(c, 2), wu = arg(c, 3), wd = arg(c, 4);
  const int64_t C = x.dim(-1), I = wg.dim(0), rows = x.numel() / C, chunk = kernels::kMlpChunkRows;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    for (const Tensor& w : {wg, wu, wd}) c.extras.push_back(extra_like(c, w.shape(), w.dtype()));
    const int64_t r_max = std::max<int64_t>(1, std::min(rows, chunk));
    std::vector<Tensor> scratch;
    for (int i = 0; i < 4; ++i) scratch.push_back(Tensor::empty({r_max, I}, x.dtype(), c.alloc));
    T* const bufs[4] = {ptr<T>(scratch[0]), ptr<T>(scratch[1]), ptr<T>(scratch[2]), ptr<T>(scratch[3])};
    const Tensor acc = f32_scratch(c, cuda::swiglu_mlp_acc_elems<T>(C, I));
    cuda::swiglu_mlp_backward<T>(ptr<T>(dy), ptr<T>(x), ptr<T>(wg), ptr<T>(wu), ptr<T>(wd), ptr<T>(dx),
                                 ptr<T>(c.extras[0]), ptr<T>(c.extras[1]), ptr<T>(c.extras[2]), rows, C, I, chunk, bufs,
                                 acc.defined() ? ptr<float>(acc) : nullptr, stream(c));
    return dx;
  });
}

// ---- the tiled head + loss (kernels/cpu/loss.h: the same chunks of rows) ----

// x [..., C], w [V, C], labels [...] → the summed loss; extra output: the rows' argmax, i64 [...].
// Per chunk: logits = x_c · wᵀ into the [chunk, V] scratch, then each row's loss term and argmax;
// the row terms of all chunks are summed at the end in row order.
Tensor linear_cross_entropy_sum(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel(), chunk = kernels::linear_ce_chunk_rows(rows, V);
  const cudaStream_t s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, c.node.dtype());
    c.extras.push_back(extra_like(c, labels.shape(), DType::i64));
    const Tensor logits = Tensor::empty({kernels::linear_ce_scratch_elems(rows, V)}, x.dtype(), c.alloc);
    const Tensor row_loss = Tensor::empty({rows}, DType::f64, c.alloc);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t r = std::min(chunk, rows - r0);
      cuda::gemm_batched<T>(false, true, 1, r, V, C, 1.0, ptr<T>(x) + r0 * C, 0, ptr<T>(w), 0, 0.0, ptr<T>(logits), 0, s);
      cuda::linear_ce_rows<T>(ptr<T>(logits), ptr<int64_t>(labels) + r0, ptr<double>(row_loss) + r0,
                              ptr<int64_t>(c.extras[0]) + r0, r, V, c.node.attrs().i("ignore_index"), s);
    }
    const Tensor acc = y.dtype() == acc_dtype<T>() ? y : Tensor::empty({}, acc_dtype<T>(), c.alloc);
    cuda::sum_row_losses<cuda::acc_t<T>>(ptr<double>(row_loss), rows, ptr<cuda::acc_t<T>>(acc), s);
    settle_scalar(acc, y, s);
    return y;
  });
}

// dx; extra output dw. Inputs: x, w, labels, g (a device scalar). Per chunk the logits again, then
// dlogits in place, dx_c = dlogits · w, dw += dlogitsᵀ · x_c (kernels/cuda/loss.cuh).
Tensor linear_cross_entropy_backward(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel(), chunk = kernels::linear_ce_chunk_rows(rows, V);
  const cudaStream_t s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    const Tensor g = gpu::cast(on_device(c, 3), acc_dtype<T>(), c.alloc, s);
    Tensor dx = out_like(c, x.dtype());
    c.extras.push_back(extra_like(c, w.shape(), w.dtype()));
    const Tensor logits = Tensor::empty({kernels::linear_ce_scratch_elems(rows, V)}, x.dtype(), c.alloc);
    const Tensor acc = f32_scratch(c, cuda::ChunkedGradient<T>::acc_elems(V, C));
    cuda::linear_cross_entropy_backward<T>(ptr<T>(x), ptr<T>(w), ptr<int64_t>(labels), ptr<cuda::acc_t<T>>(g),
                                           ptr<T>(dx), ptr<T>(c.extras[0]), rows, C, V, chunk,
                                           c.node.attrs().i("ignore_index"), ptr<T>(logits),
                                           acc.defined() ? ptr<float>(acc) : nullptr, s);
    return dx;
  });
}

AUTOSP_INSTANTIATE_LAUNCHERS  // the template rows (engine/launchers.h)

}  // namespace autosp::cuda_ops
