// CUDA launchers: what the kernel dispatch runs on CUDA devices. The launchers both devices share
// are written once in engine/launchers.inc.h, which this file includes after defining the vocabulary
// it is written against (below: the CUDA kernels, the compute stream, device pointers and dtypes);
// then the launchers whose work differs on CUDA (cuDNN's sdpa, the device scalars of the losses,
// the tiled MLP and loss's chunk scratch, concat's 2-D copies, the collectives of a group of one,
// expert parallelism's exchange). Every kernel is enqueued on the compute stream of the tensors'
// device (device/cuda/device.h); nothing synchronises with the host but the MoE ops, which route on
// the host (kernels/cuda/moe.cuh; expert parallelism reads its counts back too). Compiled only in
// CUDA builds; knows nothing of the CPU kernels.
//
// Dtypes: f32 and bf16 everywhere, f64 where the kernel has it (not attention); any other is a
// UsageError naming the op and the dtype. Scalars a bf16 op produces (loss, token count, the
// attention log-sum-exp) have the dtype the op table declares; the kernels write them in f32.
// Ids (embedding, rope positions, labels) are widened to int64 on the device. Embedding ids and
// labels are not checked on the host here (that would cost a device-to-host copy per step): an
// out-of-range id gives a NaN row, and so a non-finite loss that stops training; the trainer checks
// the batch on the host before uploading it.
// The outputs are those of the CPU launchers: same shapes, same folding of dims, same planned
// outputs (c.out, c.extra_out, else fresh from c.alloc); strided inputs are made contiguous on the
// device first.
#include "engine/launchers.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <span>
#include <type_traits>
#include <vector>

#include <spdlog/spdlog.h>

#include "device/cuda/copy.h"
#include "device/cuda/device.h"
#include "engine/cuda/expert_parallel.h"
#include "engine/ring.h"
#include "graph/builder.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cudnn_attention.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/loss.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/mlp.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/preference.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/kinds.h"
#include "kernels/moe_aux.h"

namespace autosp::cuda_ops {

// ---- the vocabulary of engine/launchers.inc.h on CUDA ----

namespace dev = autosp::cuda;  // the kernels
template <class T>
using attn_acc_t = float;
// A ring chunk pair's o, dq, dk, dv in T: the kernels write a bf16 pair's outputs rounded to bf16
// before the ring merges and sums them in f32.
template <class T>
using attn_pair_t = T;

namespace {

using cuda::bf16;

using Stream = cudaStream_t;
Stream stream(const KernelCall& c) {
  AUTOSP_ASSERT(c.alloc.device().kind == DeviceKind::cuda, "CUDA launcher for ", c.node.name(), " with a ",
                c.alloc.device().str(), " allocator");
  return compute_stream(c.alloc.device().index);
}

// The kernel on `args` and the stream, its last argument.
template <class F, class... A>
void call(Stream s, F&& kernel, A&&... args) {
  kernel(std::forward<A>(args)..., s);
}

// Input i on the device (asserted), as it is (strided views allowed).
const Tensor& input(const KernelCall& c, size_t i) {
  const Tensor& t = c.in[i];
  AUTOSP_ASSERT(t.device() == c.alloc.device(), "[", c.node.op_name(), "] ", c.node.name(), ": input ", i, " ",
                t.str(), " is on ", t.device().str(), ", the node runs on ", c.alloc.device().str());
  return t;
}

// Input i on the device, contiguous (copied there when it is a strided view).
Tensor arg(const KernelCall& c, size_t i) { return gpu::contiguous(input(c, i), c.alloc, stream(c)); }

// Integer input i as contiguous int64 on the device (i32 ids are widened).
Tensor ids64(const KernelCall& c, size_t i) { return gpu::cast(input(c, i), DType::i64, c.alloc, stream(c)); }

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

// `v` in storage type T (bf16 rounded once to nearest even, as the CPU rounds constants).
template <class T>
T constant(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return __double2bfloat16(v);
  else
    return static_cast<T>(v);
}

void copy_strided(const Tensor& view, const Tensor& y, Stream s) { gpu::copy_strided_into(view, y, s); }
void convert(const Tensor& x, const Tensor& y, Stream s) { gpu::cast_into(x, y, s); }

void zero(const Tensor& t, Stream s) {
  if (t.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), s));
}

// `height` rows of `width` bytes from src (rows `spitch` apart) to dst (rows `dpitch` apart), on
// the device. cudaMemcpy2DAsync refuses pitches above the device's limit (cudaDevAttrMaxPitch,
// 2^31 - 1 bytes), which a row of a large tensor exceeds (concat or slice_backward along a late dim
// with B = 1): such rows are copied one by one.
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, Stream s) {
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

// The group's communicator, checked to move device tensors (the MPI backend reads host memory).
Communicator& group(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, c.node.op_name(), " without a communicator");
  if (c.comm->size() > 1 && c.comm->backend() == "mpi")
    throw RuntimeFailure(str("[", c.node.op_name(), "] ", c.node.name(), ": group '", c.node.attrs().s("group"),
                             "' uses the MPI communicator, which cannot move CUDA tensors; CUDA runs need NCCL"));
  return *c.comm;
}

constexpr int64_t kRopeMaxHeadDim = 256;       // kernels/cuda/rope.cuh
constexpr int64_t kAttentionMaxHeadDim = 128;  // kernels/cuda/attention.cuh
constexpr const char* kDeviceName = "CUDA";

// Attention: f32 and bf16 (no f64 kernels); the kernels (ours and cuDNN's) keep the log-sum-exp in
// f32 whatever T is, and ring attention sums its blocks in f32.
template <class F>
Tensor by_attention_float(const KernelCall& c, DType dt, F&& f) {
  return by_float<false>(c, dt, std::forward<F>(f));
}
Tensor lse_input(const KernelCall& c, size_t i) { return gpu::cast(input(c, i), DType::f32, c.alloc, stream(c)); }
// The kernels read the sinks in f32 whatever T is (a bf16 model's [N] sinks: a copy of N).
Tensor sinks_input(const KernelCall& c, size_t i) { return gpu::cast(input(c, i), DType::f32, c.alloc, stream(c)); }

// The node's window and softcap (graph/builder.h AttentionAttrs) as the kernels' variant, with a
// ring chunk pair's key offset.
template <class T>
AttentionVariant<float> variant_of(const KernelCall& c, int64_t offset = 0) {
  const AttentionAttrs a = attention_attrs(c.node);
  return {.window = a.window, .softcap = a.softcap, .offset = offset};
}

template <class T>
void attend(Stream s, const T* q, const T* k, const T* v, attn_pair_t<T>* o, float* lse, int64_t B, int64_t N,
            int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start,
            const AttentionVariant<float>& var) {
  cuda::sdpa_forward<T>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, s, cuda::SdpaKernel::automatic,
                        doc_start, var);
}
template <class T>
void attend_backward(Stream s, const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout,
                     attn_pair_t<T>* dq, attn_pair_t<T>* dk, attn_pair_t<T>* dv, int64_t B, int64_t N, int64_t Nkv,
                     int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start,
                     const AttentionVariant<float>& var) {
  cuda::sdpa_backward<T>(q, k, v, o, lse, dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, scale, causal, s,
                         cuda::SdpaKernel::automatic, doc_start, var);
}

// Device int64 ids on the host (the stream drained first).
std::vector<int64_t> host_ids(const KernelCall& c, const Tensor& ids) {
  std::vector<int64_t> h(ids.defined() ? static_cast<size_t>(ids.numel()) : 0);
  if (h.empty()) return h;
  CUDA_CHECK(cudaMemcpyAsync(h.data(), ids.raw(), ids.nbytes(), cudaMemcpyDeviceToHost, stream(c)));
  CUDA_CHECK(cudaStreamSynchronize(stream(c)));
  return h;
}

// A chunk pair's document starts uploaded into `buf` (allocated on first use), where the kernels
// read them.
const int64_t* pair_doc_start(const KernelCall& c, const std::vector<int64_t>& dh, Tensor& buf, Stream s) {
  if (!buf.defined()) buf = Tensor::empty({static_cast<int64_t>(dh.size())}, DType::i64, c.alloc);
  CUDA_CHECK(cudaMemcpyAsync(buf.raw(), dh.data(), buf.nbytes(), cudaMemcpyHostToDevice, s));
  return ptr<int64_t>(buf);
}

// y[i] += x[i] (f32, n elements), with x in T (widened first when T is bf16, through `scratch`).
template <class T>
void add_into(float* y, const T* x, int64_t n, float* scratch, Stream s) {
  const float* xf = reinterpret_cast<const float*>(x);
  if constexpr (!std::is_same_v<T, float>) {
    cuda::cast<T, float>(x, scratch, n, s);
    xf = scratch;
  }
  const int64_t one = 1;
  cuda::binary<float>(kernels::Binary::add, 1, &n, y, &one, xf, &one, y, s);
}
constexpr bool kAddIntoWidens = true;

// The dtype a kernel over T writes its scalars in (acc_t<T>).
template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<cuda::acc_t<T>, double> ? DType::f64 : DType::f32;
}

// A scalar `src` (device) in the dtype of `dst` (device, one element): a copy or a cast.
void settle_scalar(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  if (src.raw() != dst.raw()) gpu::cast_into(src, dst, s);
}


}  // namespace

#include "engine/launchers.inc.h"  // the shared launchers and the launcher table

// ---- the launchers whose work differs on CUDA ----

// y [..., Σ n_i, ...] from x_i [..., n_i, ...] (launch::concat_rows): the inputs' contiguous blocks
// side by side in each row (one 2-D copy per input: height = outer, width = its block).
Tensor concat(const KernelCall& c) {
  Tensor y = out_like(c, c.in[0].dtype());
  const launch::ConcatRows r = launch::concat_rows(c);
  int64_t at = 0;  // offset of this input's block inside y's row, in bytes
  for (size_t i = 0; i < c.in.size(); ++i) {
    const Tensor x = arg(c, i);
    const int64_t block = r.block_bytes[i];
    copy_rows(static_cast<char*>(y.raw()) + at, r.row_bytes, x.raw(), block, block, r.outer, stream(c));
    at += block;
  }
  return y;
}

// ---- attention ----

namespace {
// Whether this attention node runs on cuDNN's fused SDPA: runtime.attention (the executor's
// options, carried by the KernelCall) is "auto" or "cudnn", there is no document mask, window,
// softcap or sinks (cuDNN's SDPA graph has no sink column: a node with sinks always runs ours),
// and cuDNN supports the sizes (kernels/cuda/cudnn_attention.cuh). Otherwise our flash attention
// runs: silently under "auto" (decision 129), with one warning per distinct reason under "cudnn".
// Both write the same f32 lse, so forward and backward may differ.
template <class T>
bool use_cudnn(const KernelCall& c, const Tensor& q, const Tensor& k) {
  if (c.attention == AttentionBackend::flash) return false;
  const AttentionInputs opt = attention_inputs(c.node);
  const std::string why = opt.doc_start ? std::string("a document mask (doc_start)")  // config.cpp refuses it with "cudnn"
                          : opt.sinks   ? std::string("attention sinks")
                          : !(attention_attrs(c.node) == AttentionAttrs{})
                              ? std::string("a sliding window or softcap")
                              : cuda::cudnn_sdpa_unsupported<T>(q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                                                                q.dim(3), c.node.attrs().b("causal"));
  if (why.empty()) return true;
  if (c.attention == AttentionBackend::automatic) return false;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(why).second)
    spdlog::warn("runtime.attention \"cudnn\": {} ({}): {}; using our flash attention", c.node.op_name(),
                 c.node.name(), why);
  return false;
}
}  // namespace

// o [B, N, Sq, D]; extra output 1: lse [B, N, Sq] (written in f32; cast when the op table declares
// another dtype). Optional inputs: the document starts [B, Sq], the sinks [N].
Tensor sdpa(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_attention_float(c, q.dtype(), [&]<class T>() {
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
                            args.doc_start(), with_sinks(variant_of<T>(c), args));
    settle_scalar(lse32, lse, stream(c));
    c.extras.push_back(lse);
    return o;
  });
}

// dq; extra outputs dk, dv (, dsinks). Inputs: q, k, v, o, lse, dout (, document starts) (, sinks).
Tensor sdpa_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  const Tensor &o = args.o, &lse = args.lse, &dout = args.dout;
  return by_attention_float(c, q.dtype(), [&]<class T>() {
    Tensor dq = out_like(c, q.dtype());
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    Tensor dsinks;  // the kernels write f32; the node's dsinks has the sinks' dtype
    if (args.sinks.defined()) {
      const DType dt = attention_inputs(c.node).sinks->dtype();
      c.extras.push_back(extra_like(c, args.sinks.shape(), dt));
      dsinks = dt == DType::f32 ? c.extras.back() : Tensor::empty(args.sinks.shape(), DType::f32, c.alloc);
    }
    const double scale = c.node.attrs().f("scale");
    const bool causal = c.node.attrs().b("causal");
    if (use_cudnn<T>(c, q, k))
      cuda::cudnn_sdpa_backward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse), ptr<T>(dout),
                                   ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                                   q.dim(3), scale, causal, stream(c));
    else
      cuda::sdpa_backward<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o), ptr<float>(lse), ptr<T>(dout), ptr<T>(dq),
                             ptr<T>(dk), ptr<T>(dv), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale,
                             causal, stream(c), cuda::SdpaKernel::automatic, args.doc_start(),
                             with_sinks(variant_of<T>(c), args, dsinks.defined() ? ptr<float>(dsinks) : nullptr));
    if (dsinks.defined()) settle_scalar(dsinks, c.extras.back(), stream(c));
    return dq;
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

// ---- the load-balancing loss (kernels/moe_aux.h), on the host ----
// Its inputs are one layer's router probabilities [R, E] (read once per step) and the layers'
// statistics [L, 2, E]: copied to the host in acc_t (bf16 widened to f32 on the device first),
// computed by the CPU's code and copied back, one stream synchronisation per call, as the experts
// route (docs/decisions.md).

template <class A>
std::vector<A> host_values(const KernelCall& c, const Tensor& t) {
  const Tensor w = t.dtype() == dtype_of<A> ? t : gpu::cast(t, dtype_of<A>, c.alloc, stream(c));
  std::vector<A> h(static_cast<size_t>(w.numel()));
  CUDA_CHECK(cudaMemcpyAsync(h.data(), w.raw(), w.nbytes(), cudaMemcpyDeviceToHost, stream(c)));
  CUDA_CHECK(cudaStreamSynchronize(stream(c)));
  return h;
}

// The host values h into y (narrowed on the device when y is bf16); returns y.
template <class A>
Tensor upload_into(const KernelCall& c, const std::vector<A>& h, Tensor y) {
  const Tensor buf = y.dtype() == dtype_of<A> ? y : Tensor::empty(y.shape(), dtype_of<A>, c.alloc);
  CUDA_CHECK(cudaMemcpyAsync(buf.raw(), h.data(), buf.nbytes(), cudaMemcpyHostToDevice, stream(c)));
  settle_scalar(buf, y, stream(c));
  CUDA_CHECK(cudaStreamSynchronize(stream(c)));  // h is freed on return
  return y;
}

// probs [..., E] → stats [2, E]
Tensor moe_router_stats(const KernelCall& c) {
  const Tensor p = arg(c, 0);
  const int64_t E = p.dim(-1);
  return by_float(c, p.dtype(), [&]<class T>() {
    using A = cuda::acc_t<T>;
    const std::vector<A> probs = host_values<A>(c, p);
    std::vector<A> stats(static_cast<size_t>(2 * E));
    kernels::moe_router_stats<A>(probs.data(), p.numel() / E, E, c.node.attrs().i("top_k"), stats.data());
    return upload_into<A>(c, stats, out_like(c, c.node.dtype()));  // f32 for bf16 probs
  });
}

// stats [L, 2, E] → the loss []; its backward takes the loss's gradient [] second and returns dstats.
Tensor moe_aux_loss(const KernelCall& c) {
  const Tensor s = arg(c, 0);
  return by_float(c, s.dtype(), [&]<class T>() {
    using A = cuda::acc_t<T>;
    const std::vector<A> stats = host_values<A>(c, s);
    const std::vector<A> loss{static_cast<A>(kernels::moe_aux_loss<A>(stats.data(), s.dim(0), s.dim(2),
                                                                      c.node.attrs().i("top_k"),
                                                                      c.node.attrs().f("share")))};
    return upload_into<A>(c, loss, out_like(c, s.dtype()));
  });
}

Tensor moe_aux_loss_backward(const KernelCall& c) {
  const Tensor s = arg(c, 0);
  return by_float(c, s.dtype(), [&]<class T>() {
    using A = cuda::acc_t<T>;
    const std::vector<A> stats = host_values<A>(c, s);
    const double g = static_cast<double>(host_values<A>(c, arg(c, 1))[0]);
    std::vector<A> d(stats.size());
    kernels::moe_aux_loss<A>(stats.data(), s.dim(0), s.dim(2), c.node.attrs().i("top_k"), c.node.attrs().f("share"),
                             d.data(), g);
    return upload_into<A>(c, d, out_like(c, s.dtype()));
  });
}

// ---- preference training (kernels/cuda/preference.cuh) ----

Tensor sequence_logps(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor y = out_like(c, c.node.dtype());
    cuda::sequence_logps<T>(ptr<T>(logits), ptr<int64_t>(labels), ptr<int64_t>(slots), ptr<cuda::acc_t<T>>(y),
                            logits.dim(0), logits.dim(1), logits.dim(2), y.dim(2), c.node.attrs().i("ignore_index"),
                            stream(c));
    return y;
  });
}

Tensor sequence_logps_backward(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2), grad = arg(c, 3);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, logits.dtype());
    cuda::sequence_logps_backward<T>(ptr<T>(logits), ptr<int64_t>(labels), ptr<int64_t>(slots),
                                     ptr<cuda::acc_t<T>>(grad), ptr<T>(dx), logits.dim(0), logits.dim(1), logits.dim(2),
                                     grad.dim(2), c.node.attrs().i("ignore_index"), stream(c));
    return dx;
  });
}

// dpo_loss and its backward: the inputs are in the loss's dtype (f32 or f64, never bf16).
Tensor dpo_loss(const KernelCall& c) {
  const Tensor policy = arg(c, 0), reference = arg(c, 1), tokens = arg(c, 2), norms = arg(c, 3);
  return by_float(c, policy.dtype(), [&]<class T>() {
    using A = cuda::acc_t<T>;
    Tensor y = out_like(c, c.node.dtype());
    cuda::dpo_loss<A>(ptr<A>(policy), ptr<A>(reference), ptr<A>(tokens), ptr<A>(norms), policy.dim(0), policy.dim(2),
                      dpo_args(c.node), ptr<A>(y), nullptr, nullptr, stream(c));
    return y;
  });
}

Tensor dpo_loss_backward(const KernelCall& c) {
  const Tensor policy = arg(c, 0), reference = arg(c, 1), tokens = arg(c, 2), norms = arg(c, 3), grad = arg(c, 4);
  return by_float(c, policy.dtype(), [&]<class T>() {
    using A = cuda::acc_t<T>;
    Tensor d = out_like(c, c.node.dtype());
    cuda::dpo_loss<A>(ptr<A>(policy), ptr<A>(reference), ptr<A>(tokens), ptr<A>(norms), policy.dim(0), policy.dim(2),
                      dpo_args(c.node), nullptr, ptr<A>(d), ptr<A>(grad), stream(c));
    return d;
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
    const Tensor g = gpu::cast(input(c, 2), acc_dtype<T>(), c.alloc, stream(c));
    Tensor dx = out_like(c, logits.dtype());
    cuda::cross_entropy_backward<T>(ptr<T>(logits), ptr<int64_t>(labels), ptr<T>(dx), labels.numel(), logits.dim(-1),
                                    ptr<cuda::acc_t<T>>(g), c.node.attrs().i("ignore_index"), stream(c));
    return dx;
  });
}

// ---- constants ----

Tensor full(const KernelCall& c) {
  const DType dt = c.node.dtype();
  return by_float(c, dt, [&]<class T>() {
    Tensor y = out_like(c, dt);
    cuda::fill<T>(ptr<T>(y), y.numel(), constant<T>(c.node.attrs().f("value")), stream(c));
    return y;
  });
}

// ---- collectives ----

// Ulysses all-to-all (as all_to_all_cpu): chunk j of dim scatter_dim goes to rank j; the chunks
// received are laid side by side along gather_dim in rank order. A group of one is a copy.
Tensor all_to_all(const KernelCall& c) {
  Communicator& comm = group(c);
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

// ---- the experts over an expert group (engine/cuda/expert_parallel.h: the exchange on device buffers) ----

// x [..., C] as rows [R, C], probs [R, E], this rank's local expert weights (and biases) → y [..., C].
// Keeping the experts' projections is the CPU kernel's (graph/passes/keep_moe_projections runs for
// CPU runs only); a program that asks for it on CUDA is refused.
Tensor moe_experts_keeping(const KernelCall& c) {
  throw RuntimeFailure(str("[", c.node.op_name(), "] ", c.node.name(),
                           ": keeping the experts' projections (runtime.moe_keep_projections) is CPU-only"));
}
Tensor moe_experts_backward_kept(const KernelCall& c) { return moe_experts_keeping(c); }

Tensor moe_experts_ep(const KernelCall& c) {
  Communicator& comm = group(c);
  return by_float(c, c.in[0].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, false);
    cuda::moe_ep_forward<T>(comm, c.alloc, ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(), m.w.down.data(),
                            ptr<T>(m.out), m.R, m.C, m.E, m.w.I, m.k, m.norm, m.opt, stream(c));
    return m.out;
  });
}

// dx; extra outputs dprobs, then each local expert weight's and bias's gradient. Inputs: dy, x,
// probs, the weights, the biases.
Tensor moe_experts_ep_backward(const KernelCall& c) {
  Communicator& comm = group(c);
  return by_float(c, c.in[1].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, true);
    cuda::moe_ep_backward<T>(comm, c.alloc, ptr<T>(m.dy), ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(),
                             m.w.down.data(), ptr<T>(m.out), m.dprobs(c), m.dw.data(), m.dw.data() + m.w.E,
                             m.dw.data() + 2 * m.w.E, m.R, m.C, m.E, m.w.I, m.k, m.norm, m.opt, stream(c));
    return m.out;
  });
}

Tensor all_reduce(const KernelCall& c) {
  Communicator& comm = group(c);
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, x.dtype());
  gpu::cast_into(x, y, stream(c));  // a device copy (same dtype)
  if (comm.size() > 1) comm.all_reduce_sum(y);
  return y;
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
// The DPO form (pair slots fourth, train.objective "dpo" with runtime.tiled_loss) has none yet.
// A final logit softcap (Gemma's) caps each chunk after its GEMM (cuda::cap_logits).
void no_cuda_dpo_form(const KernelCall& c, size_t slots_input) {
  if (c.in.size() > slots_input)
    throw RuntimeFailure(str(c.node.op_name(), " with pair slots (DPO's tiled loss) has no CUDA kernel"));
}

Tensor linear_cross_entropy_sum(const KernelCall& c) {
  no_cuda_dpo_form(c, 3);
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
      if (const double cap = linear_ce_softcap(c.node); cap > 0) cuda::cap_logits<T>(ptr<T>(logits), r * V, cap, s);
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
  no_cuda_dpo_form(c, 4);
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel(), chunk = kernels::linear_ce_chunk_rows(rows, V);
  const cudaStream_t s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    const Tensor g = gpu::cast(input(c, 3), acc_dtype<T>(), c.alloc, s);
    Tensor dx = out_like(c, x.dtype());
    const bool dw = linear_ce_weight_grad(c.node);  // false: a frozen head, no dw
    c.extras.push_back(extra_like(c, dw ? w.shape() : Shape{0}, w.dtype()));
    const Tensor logits = Tensor::empty({kernels::linear_ce_scratch_elems(rows, V)}, x.dtype(), c.alloc);
    const Tensor acc = f32_scratch(c, dw ? cuda::ChunkedGradient<T>::acc_elems(V, C) : 0);
    cuda::linear_cross_entropy_backward<T>(ptr<T>(x), ptr<T>(w), ptr<int64_t>(labels), ptr<cuda::acc_t<T>>(g),
                                           ptr<T>(dx), dw ? ptr<T>(c.extras[0]) : nullptr, rows, C, V, chunk,
                                           c.node.attrs().i("ignore_index"), ptr<T>(logits),
                                           acc.defined() ? ptr<float>(acc) : nullptr, s, linear_ce_softcap(c.node));
    return dx;
  });
}

}  // namespace autosp::cuda_ops
