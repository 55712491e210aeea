// CPU launchers: what the kernel dispatch runs on the CPU. The launchers both devices share are
// written once in engine/launchers.inc.h, which this file includes after defining the vocabulary
// it is written against (below: the CPU's kernels, pointers and dtypes); then the launchers whose
// work differs on the CPU, and the bf16 emulation. The CPU kernels are the reference the CUDA
// ones match. Dtypes: f32 and f64; bf16 natively where kNativeBf16 (at the end) has a launcher,
// else emulated (bf16_via_f32). Every output is a contiguous tensor in its planned place (c.out,
// c.extra_out) or fresh from c.alloc, except reshape, which is a view of its contiguous input.
// Knows nothing of CUDA.
#include "engine/launchers.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <type_traits>

#include "engine/executor.h"
#include "engine/expert_parallel.h"
#include "engine/ring.h"
#include "graph/builder.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mlp.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/moe_bf16.h"
#include "kernels/moe_aux.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/preference.h"
#include "kernels/cpu/rope.h"

namespace autosp::cpu_ops {

// ---- the vocabulary of engine/launchers.inc.h on the CPU ----

namespace dev = autosp::cpu;  // the kernels
template <class T>
using attn_acc_t = cpu::attention_acc_t<T>;  // T for f32 and f64; f32 for bf16 (raw bits, uint16_t)
// A ring chunk pair's o, dq, dk, dv in attn_acc_t too: the bf16 kernels write them unrounded in f32
// (kernels/cpu/attention.h), so a bf16 ring rounds each result once, at the end, as sdpa does.
template <class T>
using attn_pair_t = attn_acc_t<T>;

// The CPU runs each kernel in the calling thread (its OpenMP regions inside): no stream.
struct Stream {};

namespace {

Stream stream(const KernelCall&) { return {}; }

template <class F, class... A>
void call(Stream, F&& kernel, A&&... args) {
  kernel(std::forward<A>(args)...);
}

const Tensor& input(const KernelCall& c, size_t i) { return c.in[i]; }
Tensor arg(const KernelCall& c, size_t i) { return c.in[i].contiguous(); }

// Integer ids as int64 (i32 ids are widened).
Tensor ids64(const KernelCall& c, size_t i) {
  const Tensor& t = c.in[i];
  return t.dtype() == DType::i64 ? t.contiguous() : t.to(DType::i64);
}

template <class T>
T* ptr(const Tensor& t) {
  return t.data<T>();
}

// Call f.template operator()<T>() with T = float or double, by dtype (bf16 nodes arrive widened to
// f32: bf16_via_f32).
template <class F>
Tensor by_float(const KernelCall& c, DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    default:
      throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": ", dtype_name(dt),
                           " compute is not supported on CPU (use float32 or float64)"));
  }
}

template <class T>
T constant(double v) {
  return static_cast<T>(v);
}

// Copy a strided view into the contiguous `y` of its element count and element size.
void copy_into(const Tensor& view, const Tensor& y) {
  AUTOSP_ASSERT(view.rank() <= kMaxRank, "rank ", view.rank(), " too large");
  AUTOSP_ASSERT(y.numel() == view.numel() && dtype_size(y.dtype()) == dtype_size(view.dtype()), "copy of ", view.str(),
                " into ", y.str());
  const int64_t* sh = view.shape().data();
  const int64_t* st = view.strides().data();
  switch (dtype_size(view.dtype())) {
    case 2: cpu::copy_strided(view.rank(), sh, view.data<uint16_t>(), st, y.data<uint16_t>()); break;
    case 4:
      cpu::copy_strided(view.rank(), sh, static_cast<const int32_t*>(view.raw()), st, static_cast<int32_t*>(y.raw()));
      break;
    default:
      cpu::copy_strided(view.rank(), sh, static_cast<const int64_t*>(view.raw()), st, static_cast<int64_t*>(y.raw()));
  }
}

// The CUDA copy's contract (device/cuda/copy.h), so that a launcher written once fails here too.
void copy_strided(const Tensor& view, const Tensor& y, Stream) {
  AUTOSP_ASSERT(y.is_contiguous() && y.shape() == view.shape(), "strided copy of ", view.str(), " into ", y.str());
  copy_into(view, y);
}

// Call f.template operator()<T>() with T the storage type of a cast's dtype (bf16 as its raw bits).
template <class F>
void by_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f.template operator()<float>(); break;
    case DType::f64: f.template operator()<double>(); break;
    case DType::bf16: f.template operator()<uint16_t>(); break;
    default: AUTOSP_ASSERT(false, "cast of ", dtype_name(dt), " (f32, f64, bf16 only)");
  }
}

// y = x converted elementwise (both contiguous, same element count); the same dtype is a copy
// (an integer extra output, such as linear_cross_entropy_sum's predictions, into its planned place).
void convert(const Tensor& x, const Tensor& y, Stream = {}) {
  if (x.dtype() == y.dtype()) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  by_storage(x.dtype(), [&]<class From>() {
    by_storage(y.dtype(), [&]<class To>() { cpu::cast<From, To>(x.data<From>(), y.data<To>(), x.numel()); });
  });
}

void zero(const Tensor& t, Stream) { std::memset(t.raw(), 0, t.nbytes()); }

// `height` rows of `width` bytes, rows `spitch` apart in src and `dpitch` apart in dst (one
// parallel region when there are many).
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, Stream) {
#pragma omp parallel for if (height > 64)
  for (int64_t r = 0; r < static_cast<int64_t>(height); ++r)
    std::memcpy(static_cast<char*>(dst) + size_t(r) * dpitch, static_cast<const char*>(src) + size_t(r) * spitch,
                width);
}

Communicator& group(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, c.node.op_name(), " without a communicator");
  return *c.comm;
}

// The CPU kernels take any head dim.
constexpr int64_t kRopeMaxHeadDim = std::numeric_limits<int64_t>::max();
constexpr int64_t kAttentionMaxHeadDim = std::numeric_limits<int64_t>::max();
constexpr const char* kDeviceName = "CPU";

// Attention: the f32 and f64 kernels keep the log-sum-exp in the compute type T, and ring
// attention sums its blocks in T; the bf16 kernels (T = uint16_t) keep it in f32, and ring
// attention sums in f32. A bf16 node reaches the shared launchers only through its native bf16
// launcher (kNativeBf16: where the CPU has the bf16 attention), else it arrives widened.
template <class F>
Tensor by_attention_float(const KernelCall& c, DType dt, F&& f) {
  if (dt == DType::bf16) return f.template operator()<uint16_t>();
  return by_float(c, dt, std::forward<F>(f));
}
Tensor lse_input(const KernelCall& c, size_t i) { return arg(c, i); }
// The kernels read the sinks in attn_acc_t: a bf16 node's [N] sinks widened to f32 (a copy of N).
Tensor sinks_input(const KernelCall& c, size_t i) {
  if (c.in[i].dtype() != DType::bf16) return arg(c, i);
  Tensor f = Tensor::empty(c.in[i].shape(), DType::f32, c.alloc);
  convert(c.in[i].contiguous(), f);
  return f;
}

// The node's window and softcap (graph/builder.h AttentionAttrs) as the kernels' variant, with a
// ring chunk pair's key offset.
template <class T>
AttentionVariant<attn_acc_t<T>> variant_of(const KernelCall& c, int64_t offset = 0) {
  const AttentionAttrs a = attention_attrs(c.node);
  return {.window = a.window, .softcap = a.softcap, .offset = offset};
}

// The flash attention of one ring chunk pair: f32 and f64 on the T kernels, bf16 (raw bits) on the
// bf16 units with f32 outputs (attn_pair_t).
template <class T>
void attend(Stream, const T* q, const T* k, const T* v, attn_pair_t<T>* o, attn_acc_t<T>* lse, int64_t B, int64_t N,
            int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start,
            const AttentionVariant<attn_acc_t<T>>& var) {
  if constexpr (std::is_same_v<T, uint16_t>)
    cpu::sdpa_forward_bf16(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, var);
  else
    cpu::sdpa_forward<T>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, var);
}
template <class T>
void attend_backward(Stream, const T* q, const T* k, const T* v, const T* o, const attn_acc_t<T>* lse, const T* dout,
                     attn_pair_t<T>* dq, attn_pair_t<T>* dk, attn_pair_t<T>* dv, int64_t B, int64_t N, int64_t Nkv,
                     int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start,
                     const AttentionVariant<attn_acc_t<T>>& var) {
  if constexpr (std::is_same_v<T, uint16_t>)
    cpu::sdpa_backward_bf16(q, k, v, o, lse, dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, nullptr,
                            var);
  else
    cpu::sdpa_backward<T>(q, k, v, o, lse, dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, nullptr,
                          var);
}

// Ids already on the host.
std::span<const int64_t> host_ids(const KernelCall&, const Tensor& ids) {
  if (!ids.defined()) return {};
  return {ids.data<int64_t>(), static_cast<size_t>(ids.numel())};
}

// The kernels read a chunk pair's document starts where they are.
const int64_t* pair_doc_start(const KernelCall&, const std::vector<int64_t>& dh, Tensor&, Stream) { return dh.data(); }

// y += x (T = attn_acc_t<T>: the ring's pairs write their results in it, so nothing is widened).
template <class T>
void add_into(attn_acc_t<T>* y, const T* x, int64_t n, attn_acc_t<T>*, Stream) {
  static_assert(std::is_same_v<T, attn_acc_t<T>>, "add_into: the CPU's ring sums attn_acc_t");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
constexpr bool kAddIntoWidens = false;

// The memory plan's workspace for the node (KernelCall::workspace) as T scratch, when there is one
// of at least `bytes` (a bf16 node's runs in f32); else nullptr.
template <class T>
T* planned_workspace(const KernelCall& c, size_t bytes) {
  return c.workspace.defined() && c.workspace.nbytes() >= bytes ? reinterpret_cast<T*>(c.workspace.data<int64_t>())
                                                                : nullptr;
}


}  // namespace

#include "engine/launchers.inc.h"  // the shared launchers and the launcher table

// ---- the launchers whose work differs on the CPU ----

// y [..., Σ n_i, ...] from x_i [..., n_i, ...] (launch::concat_rows): the inputs' contiguous blocks
// are laid side by side, one output row at a time (y is written in order, in one parallel region:
// input by input it took 3 regions and 0.35 ms for GPT-2 tiny's qkv gradient).
Tensor concat(const KernelCall& c) {
  Tensor y = out_like(c, c.in[0].dtype());
  const launch::ConcatRows r = launch::concat_rows(c);
  if (r.outer == 0) return y;
  std::vector<Tensor> xs;  // contiguous inputs, alive until the copy is done
  for (const Tensor& in : c.in) xs.push_back(in.contiguous());
  char* dst = static_cast<char*>(y.raw());
#pragma omp parallel for if (r.outer > 64)
  for (int64_t o = 0; o < r.outer; ++o) {
    char* row = dst + o * r.row_bytes;
    for (size_t i = 0; i < xs.size(); ++i) {
      const size_t n = size_t(r.block_bytes[i]);
      std::memcpy(row, static_cast<const char*>(xs[i].raw()) + size_t(o) * n, n);
      row += n;
    }
  }
  return y;
}

// o [B, N, Sq, D]; extra output 1: lse [B, N, Sq] (saved for the backward). Optional inputs: the
// document starts [B, Sq], the sinks [N].
Tensor sdpa(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor y = out_like(c, q.dtype());
    Tensor lse = extra_like(c, {q.dim(0), q.dim(1), q.dim(2)}, q.dtype());
    cpu::sdpa_forward<T>(q.data<T>(), k.data<T>(), v.data<T>(), y.data<T>(), lse.data<T>(), q.dim(0), q.dim(1),
                         k.dim(1), q.dim(2), k.dim(2), q.dim(3), c.node.attrs().f("scale"), c.node.attrs().b("causal"),
                         args.doc_start(), with_sinks(variant_of<T>(c), args));
    c.extras.push_back(lse);
    return y;
  });
}

// dq; extra outputs dk, dv (, dsinks). Inputs: q, k, v, o, lse, dout (, document starts) (, sinks).
Tensor sdpa_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor dq = out_like(c, q.dtype());
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    Tensor dsinks;
    if (args.sinks.defined()) c.extras.push_back(dsinks = extra_like(c, args.sinks.shape(), args.sinks.dtype()));
    T* workspace = planned_workspace<T>(c, sdpa_backward_workspace(c.node, c.bindings));
    cpu::sdpa_backward<T>(q.data<T>(), k.data<T>(), v.data<T>(), args.o.data<T>(), args.lse.data<T>(),
                          args.dout.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(), q.dim(0), q.dim(1),
                          k.dim(1), q.dim(2), k.dim(2), q.dim(3), c.node.attrs().f("scale"),
                          c.node.attrs().b("causal"), args.doc_start(), workspace,
                          with_sinks(variant_of<T>(c), args, dsinks.defined() ? dsinks.data<T>() : nullptr));
    return dq;
  });
}

// f32 or f64 elements; a bf16 node's f32 partial sums (with the last chunk's, which the bf16
// kernel keeps in f32 too: a superset of what its emulation needs).
size_t sdpa_backward_workspace(const Node& n, const Bindings& b) {
  const Shape q = eval_shape(n.input(0)->shape(), b), k = eval_shape(n.input(1)->shape(), b);
  const bool causal = n.attrs().b("causal");
  if (n.input(0)->dtype() == DType::bf16)
    return sizeof(float) * static_cast<size_t>(cpu::sdpa_backward_bf16_workspace(q[0], q[1], k[1], q[2], k[2], q[3], causal));
  const size_t elem = n.input(0)->dtype() == DType::f64 ? sizeof(double) : sizeof(float);
  return elem * static_cast<size_t>(cpu::sdpa_backward_workspace(q[0], q[1], k[1], q[2], k[2], q[3], causal));
}

Tensor cross_entropy_sum(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1);
  const int64_t V = logits.dim(-1);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor y = out_like(c, logits.dtype());
    *y.data<T>() = static_cast<T>(cpu::cross_entropy_sum<T>(logits.data<T>(), labels.data<int64_t>(), labels.numel(), V,
                                                            c.node.attrs().i("ignore_index")));
    return y;
  });
}

Tensor count_valid(const KernelCall& c) {
  const Tensor labels = ids64(c, 0);
  const DType dt = c.node.dtype();
  if (dt == DType::bf16) {
    Tensor y = out_like(c, dt);
    *y.data<uint16_t>() = cpu::f64_to_bf16(static_cast<double>(
        cpu::count_valid(labels.data<int64_t>(), labels.numel(), c.node.attrs().i("ignore_index"))));
    return y;
  }
  return by_float(c, dt, [&]<class T>() {
    Tensor y = out_like(c, dt);
    *y.data<T>() = static_cast<T>(cpu::count_valid(labels.data<int64_t>(), labels.numel(), c.node.attrs().i("ignore_index")));
    return y;
  });
}

Tensor full(const KernelCall& c) {
  const DType dt = c.node.dtype();
  if (dt == DType::bf16) {  // the constant rounded once
    Tensor y = out_like(c, dt);
    cpu::fill<uint16_t>(y.data<uint16_t>(), y.numel(), cpu::f64_to_bf16(c.node.attrs().f("value")));
    return y;
  }
  return by_float(c, dt, [&]<class T>() {
    Tensor y = out_like(c, dt);
    cpu::fill<T>(y.data<T>(), y.numel(), static_cast<T>(c.node.attrs().f("value")));
    return y;
  });
}

// dlogits = g · (softmax(logits) - onehot(labels)). Inputs: logits, labels, g (scalar).
Tensor cross_entropy_backward(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1);
  const double g = c.in[2].to_doubles()[0];
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, logits.dtype());
    cpu::cross_entropy_backward<T>(logits.data<T>(), labels.data<int64_t>(), dx.data<T>(), labels.numel(),
                                   logits.dim(-1), g, c.node.attrs().i("ignore_index"));
    return dx;
  });
}

// Ulysses all-to-all (launch::all_to_all_send_view / recv_view).
Tensor all_to_all(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, "all_to_all without a communicator");
  Tensor send = copy_view(c, launch::all_to_all_send_view(c, c.in[0].contiguous(), *c.comm), false);
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), c.alloc);
  c.comm->all_to_all(send, recv);
  return copy_view(c, launch::all_to_all_recv_view(c, recv)).reshape(c.out_shape);
}

Tensor all_reduce(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, "all_reduce without a communicator");
  Tensor y = out_like(c, c.in[0].dtype());
  std::memcpy(y.raw(), c.in[0].contiguous().raw(), y.nbytes());
  c.comm->all_reduce_sum(y);
  return y;
}

// moe_experts keeping each assignment's gate and up projections (kernels/cpu/moe.h
// moe_experts_forward_keeping): the block is the node's extra output 1.
Tensor moe_experts_keeping(const KernelCall& c) {
  return by_float(c, c.in[0].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, false);
    c.extras.push_back(extra_like(c, {2, m.R * m.k, m.w.I}, m.x.dtype()));
    cpu::moe_experts_forward_keeping<T>(ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(), m.w.down.data(),
                                        ptr<T>(m.out), m.R, m.C, m.w.E, m.w.I, m.k, m.norm, m.opt,
                                        ptr<T>(c.extras.back()));
    return m.out;
  });
}

// Its backward from the kept block, the last input (moe_experts_backward_from_kept), which the
// kernel only reads.
Tensor moe_experts_backward_kept(const KernelCall& c) {
  return by_float(c, c.in[1].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, true);
    const Tensor kept = arg(c, c.in.size() - 1);
    cpu::moe_experts_backward_from_kept<T>(ptr<T>(m.dy), ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(),
                                           m.w.down.data(), ptr<T>(m.out), m.dprobs(c), m.dw.data(),
                                           m.dw.data() + m.w.E, m.dw.data() + 2 * m.w.E, m.R, m.C, m.w.E, m.w.I,
                                           m.k, m.norm, m.opt, ptr<T>(kept));
    return m.out;
  });
}

// ---- the experts over an expert group (engine/expert_parallel.h: the exchange) ----

// x [..., C] as rows [R, C], probs [R, E], this rank's local expert weights (and biases) → y [..., C].
Tensor moe_experts_ep(const KernelCall& c) {
  return by_float(c, c.in[0].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, false);
    moe_ep_forward<T>(group(c), c.alloc, ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(), m.w.down.data(),
                      ptr<T>(m.out), m.R, m.C, m.E, m.w.I, m.k, m.norm, m.opt);
    return m.out;
  });
}

// dx; extra outputs dprobs, then each local expert weight's and bias's gradient. Inputs: dy, x,
// probs, the weights, the biases.
Tensor moe_experts_ep_backward(const KernelCall& c) {
  return by_float(c, c.in[1].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, true);
    moe_ep_backward<T>(group(c), c.alloc, ptr<T>(m.dy), ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(),
                       m.w.down.data(), ptr<T>(m.out), m.dprobs(c), m.dw.data(), m.dw.data() + m.w.E,
                       m.dw.data() + 2 * m.w.E, m.R, m.C, m.E, m.w.I, m.k, m.norm, m.opt);
    return m.out;
  });
}

// x [..., C] as rows [R, C]; w_gate, w_up [I, C], w_down [C, I] → y [..., C].
Tensor swiglu_mlp(const KernelCall& c) {
  const Tensor x = arg(c, 0), wg = arg(c, 1), wu = arg(c, 2), wd = arg(c, 3);
  const int64_t C = x.dim(-1), I = wg.dim(0);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::swiglu_mlp_forward<T>(x.data<T>(), wg.data<T>(), wu.data<T>(), wd.data<T>(), y.data<T>(), x.numel() / C, C, I);
    return y;
  });
}

// dx; extra outputs dw_gate, dw_up, dw_down. Inputs: dy, x, w_gate, w_up, w_down.
Tensor swiglu_mlp_backward(const KernelCall& c) {
  std::vector<Tensor> t;
  for (const Tensor& x : c.in) t.push_back(x.contiguous());
  const Tensor &dy = t[0], &x = t[1], &wg = t[2], &wu = t[3], &wd = t[4];
  const int64_t C = x.dim(-1), I = wg.dim(0);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    for (const Tensor& w : {wg, wu, wd}) c.extras.push_back(extra_like(c, w.shape(), w.dtype()));
    cpu::swiglu_mlp_backward<T>(dy.data<T>(), x.data<T>(), wg.data<T>(), wu.data<T>(), wd.data<T>(), dx.data<T>(),
                                c.extras[0].data<T>(), c.extras[1].data<T>(), c.extras[2].data<T>(), x.numel() / C, C,
                                I);
    return dx;
  });
}

// ---- the tiled head + loss ----

// The logits chunk (kernels/cpu/loss.h) as a T buffer: the planned workspace, else a fresh one.
template <class T>
T* logits_chunk(const KernelCall& c, int64_t rows, int64_t V, Tensor& own) {
  const int64_t n = cpu::linear_ce_scratch_elems(rows, V);
  if (T* planned = planned_workspace<T>(c, size_t(n) * sizeof(T))) return planned;
  own = Tensor::empty({n}, dtype_of<T>, c.alloc);
  return own.data<T>();
}

// The tiled head's DPO form (pair slots at input `i`): each row's cross entropy, for the sums into
// the [B, 2, K] table (forward) or each row's gradient from the table's (backward).
struct HeadSlots {
  Tensor slots;                 // i64 [B, S]
  int64_t B = 0, S = 0, K = 0;  // K = 0: not the DPO form
  std::vector<double> rows;     // per-row loss (forward) or gradient (backward)
};
HeadSlots head_slots(const KernelCall& c, size_t i, const Tensor& labels) {
  HeadSlots h;
  if (c.in.size() <= i) return h;
  h.slots = ids64(c, i);
  h.B = labels.dim(0), h.S = labels.dim(1), h.K = c.node.attrs().i("slots");
  h.rows.assign(size_t(labels.numel()), 0.0);
  return h;
}
// The forward's result: the scalar sum, or the DPO form's [B, 2, K] sums of its rows' losses.
template <class T>
void head_loss_out(Tensor& y, double sum, const HeadSlots& h, const Tensor& labels) {
  if (!h.K) *y.data<T>() = static_cast<T>(sum);
  else cpu::slot_sums<T>(h.rows.data(), labels.data<int64_t>(), h.slots.data<int64_t>(), y.data<T>(), h.B, h.S, h.K);
}
// The backward's row gradients from the table's gradient g [B, 2, K] (the DPO form; else none).
const double* head_row_grads(const KernelCall& c, HeadSlots& h, const Tensor& labels) {
  if (!h.K) return nullptr;
  const Tensor g = c.in[3].contiguous().to(DType::f64);
  cpu::slot_row_grads<double>(labels.data<int64_t>(), h.slots.data<int64_t>(), g.data<double>(), h.rows.data(), h.B,
                              h.S, h.K);
  return h.rows.data();
}

// x [..., C], w [V, C], labels [...] → the summed loss; extra output: the rows' argmax, i64 [...].
// With the pair slots fourth (the DPO form), x [B, S, C] → each sequence's log-probability [B, 2, K].
Tensor linear_cross_entropy_sum(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  HeadSlots h = head_slots(c, 3, labels);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    c.extras.push_back(extra_like(c, labels.shape(), DType::i64));
    Tensor own;
    const double sum = cpu::linear_cross_entropy_sum<T>(
        x.data<T>(), w.data<T>(), labels.data<int64_t>(), c.extras[0].data<int64_t>(), logits_chunk<T>(c, rows, V, own),
        rows, C, V, c.node.attrs().i("ignore_index"), 0, h.K ? h.rows.data() : nullptr, linear_ce_softcap(c.node));
    head_loss_out<T>(y, sum, h, labels);
    return y;
  });
}

// dx; extra output dw. Inputs: x, w, labels, g (the loss's gradient, a scalar; [B, 2, K] in the DPO
// form, with the slots fifth).
Tensor linear_cross_entropy_backward(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  HeadSlots h = head_slots(c, 4, labels);
  const double g = h.K ? 0.0 : c.in[3].to_doubles()[0];
  const double* row_grad = head_row_grads(c, h, labels);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    const bool dw = linear_ce_weight_grad(c.node);  // false: a frozen head, no dw
    c.extras.push_back(extra_like(c, dw ? w.shape() : Shape{0}, w.dtype()));
    Tensor own;
    cpu::linear_cross_entropy_backward<T>(x.data<T>(), w.data<T>(), labels.data<int64_t>(), g, dx.data<T>(),
                                          dw ? c.extras[0].data<T>() : nullptr, logits_chunk<T>(c, rows, V, own), rows, C, V,
                                          c.node.attrs().i("ignore_index"), 0, row_grad, linear_ce_softcap(c.node));
    return dx;
  });
}

// Preference training (kernels/cpu/preference.h). sequence_logps: logits [B, S, V], labels, slots
// [B, S] → [B, 2, K]; its backward takes the gradient [B, 2, K] fourth.
Tensor sequence_logps(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor y = out_like(c, logits.dtype());
    cpu::sequence_logps<T>(logits.data<T>(), labels.data<int64_t>(), slots.data<int64_t>(), y.data<T>(),
                           logits.dim(0), logits.dim(1), logits.dim(2), y.dim(2), c.node.attrs().i("ignore_index"));
    return y;
  });
}

Tensor sequence_logps_backward(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2), grad = arg(c, 3);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, logits.dtype());
    cpu::sequence_logps_backward<T>(logits.data<T>(), labels.data<int64_t>(), slots.data<int64_t>(), grad.data<T>(),
                                    dx.data<T>(), logits.dim(0), logits.dim(1), logits.dim(2), grad.dim(2),
                                    c.node.attrs().i("ignore_index"));
    return dx;
  });
}

// dpo_loss: policy, reference, tokens [B, 2, K], norms [2] → []; its backward takes the loss's
// gradient [] fifth and returns the policy's.
Tensor dpo_loss(const KernelCall& c) {
  const Tensor policy = arg(c, 0), reference = arg(c, 1), tokens = arg(c, 2), norms = arg(c, 3);
  return by_float(c, policy.dtype(), [&]<class T>() {
    Tensor y = out_like(c, policy.dtype());
    *y.data<T>() = static_cast<T>(cpu::dpo_loss<T>(policy.data<T>(), reference.data<T>(), tokens.data<T>(),
                                                   norms.data<T>(), policy.dim(0), policy.dim(2), dpo_args(c.node)));
    return y;
  });
}

Tensor dpo_loss_backward(const KernelCall& c) {
  const Tensor policy = arg(c, 0), reference = arg(c, 1), tokens = arg(c, 2), norms = arg(c, 3);
  const double g = c.in[4].to_doubles()[0];
  return by_float(c, policy.dtype(), [&]<class T>() {
    Tensor d = out_like(c, policy.dtype());
    cpu::dpo_loss<T>(policy.data<T>(), reference.data<T>(), tokens.data<T>(), norms.data<T>(), policy.dim(0),
                     policy.dim(2), dpo_args(c.node), d.data<T>(), g);
    return d;
  });
}

// ---- the load-balancing loss (kernels/moe_aux.h) ----

// probs [..., E] → stats [2, E] (bf16 probs arrive as f32: the CPU emulates bf16)
Tensor moe_router_stats(const KernelCall& c) {
  const Tensor p = arg(c, 0);
  const int64_t E = p.dim(-1);
  return by_float(c, p.dtype(), [&]<class T>() {
    Tensor y = out_like(c, p.dtype());
    kernels::moe_router_stats<T>(p.data<T>(), p.numel() / E, E, c.node.attrs().i("top_k"), y.data<T>());
    return y;
  });
}

// stats [L, 2, E] → the loss []; its backward takes the loss's gradient [] second and returns dstats.
Tensor moe_aux_loss(const KernelCall& c) {
  const Tensor s = arg(c, 0);
  return by_float(c, s.dtype(), [&]<class T>() {
    Tensor y = out_like(c, s.dtype());
    *y.data<T>() = static_cast<T>(kernels::moe_aux_loss<T>(s.data<T>(), s.dim(0), s.dim(2), c.node.attrs().i("top_k"),
                                                           c.node.attrs().f("share")));
    return y;
  });
}

Tensor moe_aux_loss_backward(const KernelCall& c) {
  const Tensor s = arg(c, 0);
  const double g = c.in[1].to_doubles()[0];
  return by_float(c, s.dtype(), [&]<class T>() {
    Tensor d = out_like(c, s.dtype());
    kernels::moe_aux_loss<T>(s.data<T>(), s.dim(0), s.dim(2), c.node.attrs().i("top_k"), c.node.attrs().f("share"),
                             d.data<T>(), g);
    return d;
  });
}

size_t linear_cross_entropy_workspace(const Node& n, const Bindings& b) {
  const Shape x = eval_shape(n.input(0)->shape(), b), w = eval_shape(n.input(1)->shape(), b);
  const size_t elem = n.input(0)->dtype() == DType::f64 ? sizeof(double) : sizeof(float);
  return elem * static_cast<size_t>(cpu::linear_ce_scratch_elems(shape_numel(x) / x.back(), w[0]));
}

// ---- bf16 without whole f32 copies: the GEMM-bound ops on the bf16 GEMM, chunked elementwise ops ----

// A bf16 matmul on the CPU's bf16 GEMM (kernels/cpu/matmul.h: AMX or vdpbf16ps where the CPU has
// them): the operands are read as bf16, the products accumulate in f32, and each output is
// rounded once into the bf16 output by the GEMM's last k-block (the numerics of the emulation and
// of cuBLASLt); a depth of several k-blocks keeps the earlier blocks' f32 sums in scratch.
Tensor matmul_bf16(const KernelCall& c) {
  const Tensor a = arg(c, 0), b = arg(c, 1);
  const MatmulGemm g = matmul_gemm(c, a, b);
  Tensor y = out_like(c, DType::bf16);
  if (y.numel() == 0) return y;
  const cpu::Bf16Gemm path = cpu::bf16_gemm_best();
  const int64_t sums = cpu::gemm_bf16_partials(path, g.batch, g.M, g.N, g.K);
  Tensor partials = sums > 0 ? Tensor::empty({sums}, DType::f32, c.alloc) : Tensor();
  cpu::gemm_bf16_batched_rounded(path, g.ta, g.tb, g.batch, g.M, g.N, g.K, 1.0f, a.data<uint16_t>(), g.stride_a,
                                 b.data<uint16_t>(), g.stride_b, y.data<uint16_t>(), g.stride_c,
                                 sums > 0 ? partials.data<float>() : nullptr);
  return y;
}

// The tiled MLP on bf16 tensors (kernels/cpu/mlp.h: swiglu_mlp_forward_bf16), its launchers'
// contracts as above.
Tensor swiglu_mlp_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), wg = arg(c, 1), wu = arg(c, 2), wd = arg(c, 3);
  const int64_t C = x.dim(-1), I = wg.dim(0);
  Tensor y = out_like(c, DType::bf16);
  cpu::swiglu_mlp_forward_bf16(cpu::bf16_gemm_best(), x.data<uint16_t>(), wg.data<uint16_t>(), wu.data<uint16_t>(),
                               wd.data<uint16_t>(), y.data<uint16_t>(), x.numel() / C, C, I);
  return y;
}

Tensor swiglu_mlp_backward_bf16(const KernelCall& c) {
  std::vector<Tensor> t;
  for (const Tensor& x : c.in) t.push_back(x.contiguous());
  const Tensor &dy = t[0], &x = t[1], &wg = t[2], &wu = t[3], &wd = t[4];
  const int64_t C = x.dim(-1), I = wg.dim(0);
  Tensor dx = out_like(c, DType::bf16);
  for (const Tensor& w : {wg, wu, wd}) c.extras.push_back(extra_like(c, w.shape(), DType::bf16));
  cpu::swiglu_mlp_backward_bf16(cpu::bf16_gemm_best(), dy.data<uint16_t>(), x.data<uint16_t>(), wg.data<uint16_t>(),
                                wu.data<uint16_t>(), wd.data<uint16_t>(), dx.data<uint16_t>(),
                                c.extras[0].data<uint16_t>(), c.extras[1].data<uint16_t>(),
                                c.extras[2].data<uint16_t>(), x.numel() / C, C, I);
  return dx;
}

// A mixture-of-experts layer's experts on bf16 (kernels/cpu/moe_bf16.h; over an expert group
// engine/expert_parallel.h's bf16 exchange): every input bf16, gpt-oss's biases and clamped SwiGLU
// included (MoeCall's options); a keeping node (f32 and f64 only: keep_moe_projections) and mixed
// dtypes stay on the emulation.
bool moe_bf16_node(const Node& n) { return !moe_keeps(n); }
bool moe_bf16_native(const KernelCall& c) {
  const auto bf16 = [](const Tensor& t) { return t.dtype() == DType::bf16; };
  return moe_bf16_node(c.node) && std::all_of(c.in.begin(), c.in.end(), bf16);
}

// y [..., C]. Inputs: x, probs, the E gate, E up and E down weights (then gpt-oss's biases).
Tensor moe_experts_bf16(const KernelCall& c) {
  if (!moe_bf16_native(c)) return bf16_via_f32(c, moe_experts);
  const MoeCall<uint16_t> m(c, false);
  cpu::moe_experts_forward_bf16(cpu::bf16_gemm_best(), m.x.data<uint16_t>(), m.p.data<uint16_t>(), m.w.gate.data(),
                                m.w.up.data(), m.w.down.data(), m.out.data<uint16_t>(), m.R, m.C, m.E, m.w.I, m.k,
                                m.norm, m.opt);
  return m.out;
}

// dx; extra outputs dprobs and each weight's (and bias's) gradient. Inputs: dy, x, probs, the
// weights, the biases.
Tensor moe_experts_backward_bf16(const KernelCall& c) {
  if (!moe_bf16_native(c)) return bf16_via_f32(c, moe_experts_backward);
  const MoeCall<uint16_t> m(c, true);
  cpu::moe_experts_backward_bf16(cpu::bf16_gemm_best(), m.dy.data<uint16_t>(), m.x.data<uint16_t>(),
                                 m.p.data<uint16_t>(), m.w.gate.data(), m.w.up.data(), m.w.down.data(),
                                 m.out.data<uint16_t>(), m.dprobs(c), m.dw.data(), m.dw.data() + m.w.E,
                                 m.dw.data() + 2 * m.w.E, m.R, m.C, m.E, m.w.I, m.k, m.norm, m.opt);
  return m.out;
}

// moe_experts_ep's and its backward's contracts as above, with this rank's local experts.
Tensor moe_experts_ep_bf16(const KernelCall& c) {
  if (!moe_bf16_native(c)) return bf16_via_f32(c, moe_experts_ep);
  const MoeCall<uint16_t> m(c, false);
  moe_ep_forward_bf16(group(c), c.alloc, cpu::bf16_gemm_best(), m.x.data<uint16_t>(), m.p.data<uint16_t>(),
                      m.w.gate.data(), m.w.up.data(), m.w.down.data(), m.out.data<uint16_t>(), m.R, m.C, m.E, m.w.I,
                      m.k, m.norm, m.opt);
  return m.out;
}

Tensor moe_experts_ep_backward_bf16(const KernelCall& c) {
  if (!moe_bf16_native(c)) return bf16_via_f32(c, moe_experts_ep_backward);
  const MoeCall<uint16_t> m(c, true);
  moe_ep_backward_bf16(group(c), c.alloc, cpu::bf16_gemm_best(), m.dy.data<uint16_t>(), m.x.data<uint16_t>(),
                       m.p.data<uint16_t>(), m.w.gate.data(), m.w.up.data(), m.w.down.data(), m.out.data<uint16_t>(),
                       m.dprobs(c), m.dw.data(), m.dw.data() + m.w.E, m.dw.data() + 2 * m.w.E, m.R, m.C, m.E, m.w.I,
                       m.k, m.norm, m.opt);
  return m.out;
}

// The tiled head + loss on bf16 x and w (kernels/cpu/loss.h: linear_cross_entropy_sum_bf16), its
// launchers' contracts as above; the logits chunk is f32, as the emulation's.
Tensor linear_cross_entropy_sum_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  HeadSlots h = head_slots(c, 3, labels);
  Tensor y = out_like(c, DType::f32);  // the op table keeps a bf16 model's loss in f32
  c.extras.push_back(extra_like(c, labels.shape(), DType::i64));
  Tensor own;
  const double sum = cpu::linear_cross_entropy_sum_bf16(
      cpu::bf16_gemm_best(), x.data<uint16_t>(), w.data<uint16_t>(), labels.data<int64_t>(), c.extras[0].data<int64_t>(),
      logits_chunk<float>(c, rows, V, own), rows, C, V, c.node.attrs().i("ignore_index"), 0,
      h.K ? h.rows.data() : nullptr, linear_ce_softcap(c.node));
  head_loss_out<float>(y, sum, h, labels);
  return y;
}

Tensor linear_cross_entropy_backward_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), labels = ids64(c, 2);
  HeadSlots h = head_slots(c, 4, labels);
  const double g = h.K ? 0.0 : c.in[3].to_doubles()[0];
  const double* row_grad = head_row_grads(c, h, labels);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  Tensor dx = out_like(c, DType::bf16);
  const bool dw = linear_ce_weight_grad(c.node);  // false: a frozen head, no dw
  c.extras.push_back(extra_like(c, dw ? w.shape() : Shape{0}, DType::bf16));
  Tensor own;
  cpu::linear_cross_entropy_backward_bf16(cpu::bf16_gemm_best(), x.data<uint16_t>(), w.data<uint16_t>(),
                                          labels.data<int64_t>(), g, dx.data<uint16_t>(),
                                          dw ? c.extras[0].data<uint16_t>() : nullptr, logits_chunk<float>(c, rows, V, own), rows, C,
                                          V, c.node.attrs().i("ignore_index"), 0, row_grad, linear_ce_softcap(c.node));
  return dx;
}

// The attention on bf16 q, k, v (and o, dout) with its tile products on the bf16 units
// (kernels/cpu/attention.h: sdpa_forward_bf16); lse, the sinks (sinks_input widens them) and the
// backward's workspace f32. An odd head dim (the products read pairs of it), one below 32 (the
// f32 kernels are faster there: sdpa_bf16_preferred) or a non-bf16 o or dout stays emulated.
Tensor sdpa_bf16(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  if (!cpu::sdpa_bf16_preferred(q.dim(3))) return bf16_via_f32(c, sdpa);
  Tensor y = out_like(c, DType::bf16);
  Tensor lse = extra_like(c, {q.dim(0), q.dim(1), q.dim(2)}, DType::f32);
  cpu::sdpa_forward_bf16(q.data<uint16_t>(), k.data<uint16_t>(), v.data<uint16_t>(), y.data<uint16_t>(),
                         lse.data<float>(), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3),
                         c.node.attrs().f("scale"), c.node.attrs().b("causal"), args.doc_start(),
                         with_sinks(variant_of<float>(c), args));
  c.extras.push_back(lse);
  return y;
}

Tensor sdpa_backward_bf16(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  if (!cpu::sdpa_bf16_preferred(q.dim(3)) || args.o.dtype() != DType::bf16 || args.dout.dtype() != DType::bf16 ||
      args.lse.dtype() != DType::f32)
    return bf16_via_f32(c, sdpa_backward);
  Tensor dq = out_like(c, DType::bf16);
  Tensor dk = extra_like(c, k.shape(), DType::bf16);
  c.extras.push_back(dk);
  Tensor dv = extra_like(c, v.shape(), DType::bf16);
  c.extras.push_back(dv);
  Tensor dsinks;  // f32, rounded into the node's bf16 dsinks after the kernel
  if (args.sinks.defined()) dsinks = Tensor::empty(args.sinks.shape(), DType::f32, c.alloc);
  float* workspace = planned_workspace<float>(c, sdpa_backward_workspace(c.node, c.bindings));
  cpu::sdpa_backward_bf16(q.data<uint16_t>(), k.data<uint16_t>(), v.data<uint16_t>(), args.o.data<uint16_t>(),
                          args.lse.data<float>(), args.dout.data<uint16_t>(), dq.data<uint16_t>(), dk.data<uint16_t>(),
                          dv.data<uint16_t>(), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3),
                          c.node.attrs().f("scale"), c.node.attrs().b("causal"), args.doc_start(), workspace,
                          with_sinks(variant_of<float>(c), args, dsinks.defined() ? dsinks.data<float>() : nullptr));
  if (dsinks.defined()) {
    c.extras.push_back(extra_like(c, dsinks.shape(), DType::bf16));
    convert(dsinks, c.extras.back());
  }
  return dq;
}

// Ring attention on the bf16 attention kernels: the shared launchers (engine/launchers.inc.h)
// with T = bf16, as on CUDA: each chunk pair on the bf16 units (its q, k, v, o, dout bf16, and the
// o, dq, dk, dv it writes rounded to bf16), the log-sum-exp, the running output and the gradients
// summed in f32 (the dK, dV partials travel in f32), each result rounded once at the end. Where
// sdpa_bf16 would be emulated (an odd head dim or one below 32; the backward's o or dout not
// bf16, or its lse not f32), so is the ring.
Tensor ring_attention_bf16(const KernelCall& c) {
  if (!cpu::sdpa_bf16_preferred(c.in[0].dim(3))) return bf16_via_f32(c, ring_attention);
  return ring_attention(c);
}

Tensor ring_attention_backward_bf16(const KernelCall& c) {
  if (!cpu::sdpa_bf16_preferred(c.in[0].dim(3)) || c.in[3].dtype() != DType::bf16 || c.in[5].dtype() != DType::bf16 ||
      c.in[4].dtype() != DType::f32)
    return bf16_via_f32(c, ring_attention_backward);
  return ring_attention_backward(c);
}

// Elementwise and row-wise ops on bf16 in cache-sized chunks: each chunk of the operands widened
// into the thread's f32 buffers, the op's f32 kernel run on it, the results rounded into the
// outputs. The emulation's numbers (the same f32 kernel, one rounding per result) in one pass,
// without whole f32 copies of the operands and the results. A chunk is a whole number of rows of
// `row` elements: for elementwise ops rows of 16, so the f32 kernels' 16-lane runs start where they
// do on the whole tensor; for the norms rows of C, so each row is normalised as on the whole tensor
// (the same bits). A chunk's rows run on one thread, below the kernels' own threading grain.
constexpr int64_t kBf16Chunk = 4096;

// f(in, out, i0, m): the f32 kernel on elements [i0, i0 + m) of kIn operands into kOut results.
template <size_t kIn, size_t kOut, class F>
void by_chunks_bf16(const std::array<const uint16_t*, kIn>& in, const std::array<uint16_t*, kOut>& out, int64_t n,
                    int64_t row, F f) {
  const int64_t chunk = std::max<int64_t>(1, kBf16Chunk / row) * row;
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel if (chunks > 1)
  {
    std::vector<float> buf(size_t(chunk * (kIn + kOut)));  // kIn operands, then the results
    std::array<const float*, kIn> widened;
    std::array<float*, kOut> results;
    for (size_t k = 0; k < kIn; ++k) widened[k] = buf.data() + k * chunk;
    for (size_t k = 0; k < kOut; ++k) results[k] = buf.data() + (kIn + k) * chunk;
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t i0 = ch * chunk, m = std::min(chunk, n - i0);
      for (size_t k = 0; k < kIn; ++k) cpu::cast<uint16_t, float>(in[k] + i0, buf.data() + k * chunk, m);
      f(widened, results, i0, m);
      for (size_t k = 0; k < kOut; ++k) cpu::cast<float, uint16_t>(results[k], out[k] + i0, m);
    }
  }
}

// A small operand (a norm's weight or bias [C]) widened whole; empty for a missing one.
std::vector<float> widened(const Tensor& t) {
  std::vector<float> w(t.defined() ? size_t(t.numel()) : 0);
  if (!w.empty()) cpu::cast<uint16_t, float>(t.data<uint16_t>(), w.data(), t.numel());
  return w;
}

// a and b broadcast to the output (a bias [C] over [..., C], a gate [..., 1]): chunks of whole
// output rows (its last dim L); each operand's part of a row is widened into the chunk's buffer
// (a broadcast one, stride 0 along the row, filled with its value), the f32 kernel runs on the
// chunk, one rounding. Elementwise, so the emulation's bits; the operands are never widened whole.
template <kernels::Binary kOp>
Tensor broadcast_binary_bf16(const KernelCall& c) {
  const Tensor a = arg(c, 0), b = arg(c, 1);
  const Shape& out = c.out_shape;
  const int rank = static_cast<int>(out.size());
  Tensor y = out_like(c, DType::bf16);
  if (y.numel() == 0) return y;
  const std::array<Shape, 2> strides{launch::broadcast_strides(a, out), launch::broadcast_strides(b, out)};
  const std::array<const uint16_t*, 2> in{a.data<uint16_t>(), b.data<uint16_t>()};
  const int64_t L = out.back(), rows = y.numel() / L, chunk_rows = std::max<int64_t>(1, kBf16Chunk / L);
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
#pragma omp parallel if (chunks > 1)
  {
    std::vector<float> buf(size_t(3 * chunk_rows * L));  // a, b, the result
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t r0 = ch * chunk_rows, m = std::min(chunk_rows, rows - r0) * L;
      for (int64_t r = r0; r < r0 + m / L; ++r) {
        for (size_t k = 0; k < 2; ++k) {
          int64_t off = 0;  // operand k's first element of output row r
          for (int64_t rem = r, d = rank - 2; d >= 0; --d) {
            off += rem % out[size_t(d)] * strides[k][size_t(d)];
            rem /= out[size_t(d)];
          }
          const uint16_t* src = in[k] + off;
          float* dst = buf.data() + k * chunk_rows * L + (r - r0) * L;
          if (strides[k].back() == 0) std::fill(dst, dst + L, cpu::bf16_to_f32(*src));
          else for (int64_t i = 0; i < L; ++i) dst[i] = cpu::bf16_to_f32(src[i]);
        }
      }
      const int64_t unit = 1;
      float* res = buf.data() + 2 * chunk_rows * L;
      cpu::binary<float>(kOp, 1, &m, buf.data(), &unit, buf.data() + chunk_rows * L, &unit, res);
      cpu::cast<float, uint16_t>(res, y.data<uint16_t>() + r0 * L, m);
    }
  }
  return y;
}

// a, b and the output of one shape, else a broadcast (above); a scalar output is emulated.
template <kernels::Binary kOp>
Tensor binary_bf16(const KernelCall& c) {
  if (c.out_shape.empty()) return bf16_via_f32(c, binary<kOp>);
  if (c.in[0].shape() != c.out_shape || c.in[1].shape() != c.out_shape) return broadcast_binary_bf16<kOp>(c);
  const Tensor a = arg(c, 0), b = arg(c, 1);
  Tensor y = out_like(c, DType::bf16);
  by_chunks_bf16<2, 1>({a.data<uint16_t>(), b.data<uint16_t>()}, {y.data<uint16_t>()}, y.numel(), 16,
                       [](const std::array<const float*, 2>& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
                         const int64_t unit = 1;
                         cpu::binary<float>(kOp, 1, &m, in[0], &unit, in[1], &unit, out[0]);
                    });
  return y;
}

template <kernels::Unary kOp>
Tensor unary_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const double factor = kOp == kernels::Unary::scale ? c.node.attrs().f("factor") : 0.0;
  Tensor y = out_like(c, DType::bf16);
  by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, y.numel(), 16,
                       [factor](const std::array<const float*, 1>& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
                         cpu::unary<float>(kOp, in[0], out[0], m, factor);
                    });
  return y;
}

// dx = dy · f'(x). Inputs: dy, x.
template <kernels::UnaryGrad kOp>
Tensor unary_backward_bf16(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1);
  Tensor dx = out_like(c, DType::bf16);
  by_chunks_bf16<2, 1>({dy.data<uint16_t>(), x.data<uint16_t>()}, {dx.data<uint16_t>()}, dx.numel(), 16,
                       [](const std::array<const float*, 2>& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
                         cpu::unary_backward<float>(kOp, in[0], in[1], out[0], m);
                    });
  return dx;
}

// ---- norms and rope on bf16: rows widened by chunks ----

// y = norm(x) over the last dim C. Inputs: x, w (, b): w and b [C] widened whole.
template <bool kRms>
Tensor norm_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const std::vector<float> w = widened(arg(c, 1)), b = kRms ? std::vector<float>{} : widened(arg(c, 2));
  const int64_t C = x.dim(-1);
  const double eps = c.node.attrs().f("eps");
  Tensor y = out_like(c, DType::bf16);
  by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C,
                       [&](const std::array<const float*, 1>& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
                         if constexpr (kRms) cpu::rmsnorm_forward<float>(in[0], w.data(), out[0], nullptr, m / C, C, eps);
                         else cpu::layernorm_forward<float>(in[0], w.data(), b.data(), out[0], nullptr, nullptr, m / C, C, eps);
                       });
  return y;
}

// y = norm(s), s = x + r, or x + (r + rb); extra output 1: s. The norm reads s rounded to bf16, as
// the unfused add stores it and the unfused norm reads it, and r + rb is rounded as the unfused
// bias add stores it, so fusing (which activation checkpointing turns off) changes no bit
// (decision 270). Inputs: x, r, w (, b) (, rb: r's bias).
template <bool kRms>
Tensor add_norm_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), r = arg(c, 1);
  const std::vector<float> w = widened(arg(c, 2)), b = kRms ? std::vector<float>{} : widened(arg(c, 3));
  const size_t rb_at = kRms ? 3 : 4;
  const std::vector<float> rb = c.in.size() > rb_at ? widened(arg(c, rb_at)) : std::vector<float>{};
  const int64_t C = x.dim(-1);
  const double eps = c.node.attrs().f("eps");
  Tensor y = out_like(c, DType::bf16);
  Tensor sum = extra_like(c, x.shape(), DType::bf16);
  c.extras.push_back(sum);
  uint16_t* s = sum.data<uint16_t>();
  by_chunks_bf16<2, 2>({x.data<uint16_t>(), r.data<uint16_t>()}, {y.data<uint16_t>(), s}, x.numel(), C,
                       [&](const std::array<const float*, 2>& in, const std::array<float*, 2>& out, int64_t i0, int64_t m) {
                         const float* rr = in[1];
                         if (!rb.empty()) {  // r + rb, rounded (in s's place, then read back); chunks are whole rows
                           for (int64_t i = 0; i < m; ++i) out[1][i] = in[1][i] + rb[size_t(i % C)];
                           cpu::cast<float, uint16_t>(out[1], s + i0, m);
                           cpu::cast<uint16_t, float>(s + i0, out[1], m);
                           rr = out[1];
                         }
                         for (int64_t i = 0; i < m; ++i) out[1][i] = in[0][i] + rr[i];
                         cpu::cast<float, uint16_t>(out[1], s + i0, m);  // s rounded, then read back
                         cpu::cast<uint16_t, float>(s + i0, out[1], m);
                         if constexpr (kRms) cpu::rmsnorm_forward<float>(out[1], w.data(), out[0], nullptr, m / C, C, eps);
                         else cpu::layernorm_forward<float>(out[1], w.data(), b.data(), out[0], nullptr, nullptr, m / C, C, eps);
                       });
  return y;
}

// dx; extra outputs dw (, db). Inputs: dy, x, w. One pass over fixed blocks of kNormParamRows
// rows (the split depends on the sizes alone): each block's dy and x are widened once, the f32
// kernels give its dx (each row as on the whole tensor, rounded once into dx) and its own f32
// partial of dw (and db), and the partials are added in block order in double and rounded once.
// So no result depends on the thread count; dw and db differ from the whole-tensor f32 kernel's
// by the partials' f32 rounding (far below bf16's). (dx and the sums used to be two passes, each
// widening dy and x.)
constexpr int64_t kNormParamRows = 64;

template <bool kRms>
Tensor norm_backward_bf16(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1);
  const std::vector<float> w = widened(arg(c, 2));
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  Tensor dx = out_like(c, DType::bf16);
  const int nacc = kRms ? 1 : 2;  // dw (, db)
  const int64_t blocks = (rows + kNormParamRows - 1) / kNormParamRows;
  std::vector<float> part(size_t(blocks * nacc * C));  // [blocks, nacc, C]
#pragma omp parallel if (blocks > 1)
  {
    std::vector<float> buf(size_t(3 * kNormParamRows * C));  // dy, x, dx
#pragma omp for schedule(static)
    for (int64_t k = 0; k < blocks; ++k) {
      const int64_t r0 = k * kNormParamRows, m = std::min(kNormParamRows, rows - r0);
      float *dyf = buf.data(), *xf = dyf + m * C, *dxf = xf + m * C, *p = part.data() + k * nacc * C;
      cpu::cast<uint16_t, float>(dy.data<uint16_t>() + r0 * C, dyf, m * C);
      cpu::cast<uint16_t, float>(x.data<uint16_t>() + r0 * C, xf, m * C);
      if constexpr (kRms) {
        cpu::rmsnorm_backward_input<float>(dyf, xf, w.data(), dxf, m, C, eps);
        cpu::rmsnorm_backward_weight<float>(dyf, xf, p, m, C, eps);
      } else {
        cpu::layernorm_backward_input<float>(dyf, xf, w.data(), dxf, m, C, eps);
        cpu::layernorm_backward_params<float>(dyf, xf, p, p + C, m, C, eps);
      }
      cpu::cast<float, uint16_t>(dxf, dx.data<uint16_t>() + r0 * C, m * C);
    }
  }
  for (int a = 0; a < nacc; ++a) {
    std::vector<double> total(size_t(C), 0.0);
    for (int64_t k = 0; k < blocks; ++k)
      for (int64_t j = 0; j < C; ++j) total[j] += part[size_t((k * nacc + a) * C + j)];
    Tensor g = extra_like(c, {C}, DType::bf16);
    for (int64_t j = 0; j < C; ++j) g.data<uint16_t>()[j] = cpu::f64_to_bf16(static_cast<double>(static_cast<float>(total[j])));
    c.extras.push_back(g);
  }
  return dx;
}

// Softmax over the last dim C, and its backward (inputs dy, y), on bf16: whole rows widened by chunks.
template <bool kBackward>
Tensor softmax_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const int64_t C = x.dim(-1);
  if (C == 0 || x.numel() == 0) return bf16_via_f32(c, kBackward ? softmax_backward : softmax);
  Tensor y = out_like(c, DType::bf16);
  const auto f32_rows = [C](const auto& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
    if constexpr (kBackward) cpu::softmax_backward<float>(in[0], in[1], out[0], m / C, C);
    else cpu::softmax_forward<float>(in[0], out[0], m / C, C);
  };
  if constexpr (kBackward)
    by_chunks_bf16<2, 1>({x.data<uint16_t>(), arg(c, 1).data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C, f32_rows);
  else by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C, f32_rows);
  return y;
}

// GPT-2's fused bias + tanh-GELU (x [..., C], b [C]) and its backward (inputs dy, x, b) on bf16:
// rows of C widened by chunks, b widened whole, the f32 kernel, one rounding (the emulation's bits).
template <bool kBackward>
Tensor bias_gelu_tanh_bf16(const KernelCall& c) {
  const Tensor x = arg(c, kBackward ? 1 : 0);
  const std::vector<float> b = widened(arg(c, kBackward ? 2 : 1));
  const int64_t C = x.dim(-1);
  if (C == 0 || x.numel() == 0) return bf16_via_f32(c, kBackward ? bias_gelu_tanh_backward : bias_gelu_tanh);
  Tensor y = out_like(c, DType::bf16);
  const auto f32_rows = [&](const auto& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
    if constexpr (kBackward) cpu::bias_gelu_tanh_backward<float>(in[0], in[1], b.data(), out[0], m / C, C);
    else cpu::bias_gelu_tanh<float>(in[0], b.data(), out[0], m / C, C);
  };
  if constexpr (kBackward)
    by_chunks_bf16<2, 1>({arg(c, 0).data<uint16_t>(), x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C, f32_rows);
  else by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C, f32_rows);
  return y;
}

// Inverted dropout on bf16 (LoRA's lora_dropout on a bf16 base; its own backward): chunks of whole
// rows of x [..., C] widened, the f32 kernel with each chunk's token indices, one rounding per
// output (the emulation's bits: a kept element is x · 1/(1 − p) in f32, rounded once).
Tensor dropout_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), token = ids64(c, 1);
  const int64_t C = x.dim(-1);
  const double p = c.node.attrs().f("p");
  const uint64_t seed = static_cast<uint64_t>(c.node.attrs().i("seed")), threshold = kernels::dropout_threshold(p);
  const int64_t* tokens = token.data<int64_t>();
  Tensor y = out_like(c, DType::bf16);
  by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), C,
                       [&](const std::array<const float*, 1>& in, const std::array<float*, 1>& out, int64_t i0,
                           int64_t m) {
                         cpu::dropout<float>(in[0], tokens + i0 / C, out[0], m / C, C, seed, threshold, 1.0 / (1.0 - p));
                       });
  return y;
}

// silu(g) · u (inputs g, u) and its backward (inputs dy, g, u; outputs dg, du) on bf16: chunks
// widened, the f32 kernel, one rounding per output (the emulation's bits).
Tensor swiglu_bf16(const KernelCall& c) {
  const Tensor g = arg(c, 0), u = arg(c, 1);
  Tensor h = out_like(c, DType::bf16);
  by_chunks_bf16<2, 1>({g.data<uint16_t>(), u.data<uint16_t>()}, {h.data<uint16_t>()}, h.numel(), 16,
                       [](const std::array<const float*, 2>& in, const std::array<float*, 1>& out, int64_t, int64_t m) {
                         cpu::swiglu<float>(in[0], in[1], out[0], m);
                       });
  return h;
}
Tensor swiglu_backward_bf16(const KernelCall& c) {
  const Tensor dy = arg(c, 0), g = arg(c, 1), u = arg(c, 2);
  Tensor dg = out_like(c, DType::bf16);
  Tensor du = extra_like(c, u.shape(), DType::bf16);
  c.extras.push_back(du);
  by_chunks_bf16<3, 2>({dy.data<uint16_t>(), g.data<uint16_t>(), u.data<uint16_t>()},
                       {dg.data<uint16_t>(), du.data<uint16_t>()}, dg.numel(), 16,
                       [](const std::array<const float*, 3>& in, const std::array<float*, 2>& out, int64_t, int64_t m) {
                         cpu::swiglu_backward<float>(in[0], in[1], in[2], out[0], out[1], m);
                       });
  return dg;
}

// ---- sums and the embedding on bf16: the kernels read bf16 themselves ----

// DPO's sequence sums on bf16 logits (kernels/cpu/preference.h): the sums and their gradient f32
// (accumulate_dtype), the logits read a row at a time, dlogits bf16.
Tensor sequence_logps_bf16(const KernelCall& c) {
  if (c.node.dtype() != DType::f32) return bf16_via_f32(c, sequence_logps);
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2);
  Tensor y = out_like(c, DType::f32);
  cpu::sequence_logps_bf16(logits.data<uint16_t>(), labels.data<int64_t>(), slots.data<int64_t>(), y.data<float>(),
                           logits.dim(0), logits.dim(1), logits.dim(2), y.dim(2), c.node.attrs().i("ignore_index"));
  return y;
}

Tensor sequence_logps_backward_bf16(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1), slots = ids64(c, 2), grad = arg(c, 3);
  if (c.node.dtype() != DType::bf16 || grad.dtype() != DType::f32) return bf16_via_f32(c, sequence_logps_backward);
  Tensor dx = out_like(c, DType::bf16);
  cpu::sequence_logps_backward_bf16(logits.data<uint16_t>(), labels.data<int64_t>(), slots.data<int64_t>(),
                                    grad.data<float>(), dx.data<uint16_t>(), logits.dim(0), logits.dim(1),
                                    logits.dim(2), grad.dim(2), c.node.attrs().i("ignore_index"));
  return dx;
}

// The untiled loss on bf16 logits (kernels/cpu/loss.h: rows widened one at a time, the f32
// kernel's row work and its sum over rows): the loss f32 as the op table keeps it, dlogits bf16.
Tensor cross_entropy_sum_bf16(const KernelCall& c) {
  const Tensor logits = arg(c, 0), labels = ids64(c, 1);
  if (c.node.dtype() != DType::f32) return bf16_via_f32(c, cross_entropy_sum);
  Tensor y = out_like(c, DType::f32);
  *y.data<float>() = static_cast<float>(cpu::cross_entropy_sum<uint16_t>(
      logits.data<uint16_t>(), labels.data<int64_t>(), labels.numel(), logits.dim(-1), c.node.attrs().i("ignore_index")));
  return y;
}

Tensor cross_entropy_backward_bf16(const KernelCall& c) {
  if (c.node.dtype() != DType::bf16) return bf16_via_f32(c, cross_entropy_backward);
  const Tensor logits = arg(c, 0), labels = ids64(c, 1);
  Tensor dx = out_like(c, DType::bf16);
  cpu::cross_entropy_backward<uint16_t>(logits.data<uint16_t>(), labels.data<int64_t>(), dx.data<uint16_t>(),
                                        labels.numel(), logits.dim(-1), c.in[2].to_doubles()[0],
                                        c.node.attrs().i("ignore_index"));
  return dx;
}

// sum_to (a bias gradient) reads x as bf16 and sums in double as the f32 kernel does
// (kernels/cpu/elementwise.h: the emulation's bits). A result kept in another dtype is emulated.
Tensor sum_to_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  if (c.node.dtype() != DType::bf16 || x.rank() == 0) return bf16_via_f32(c, sum_to);
  Shape out_full(static_cast<size_t>(x.rank()) - c.out_shape.size(), 1);
  out_full.insert(out_full.end(), c.out_shape.begin(), c.out_shape.end());
  Tensor y = out_like(c, DType::bf16);
  cpu::sum_to<uint16_t>(x.data<uint16_t>(), x.rank(), x.shape().data(), out_full.data(), y.data<uint16_t>());
  return y;
}

// The embedding's rows copied as bf16 (no widened copy of the [V, C] table); its backward reads
// dy as bf16 and rounds each double sum once through f32 (kernels/cpu/embedding.h).
template <bool kBackward>
Tensor embedding_bf16(const KernelCall& c) {
  if (c.node.dtype() != DType::bf16) return bf16_via_f32(c, kBackward ? embedding_backward : embedding);
  const Tensor x = arg(c, 0), ids = ids64(c, 1);
  Tensor y = out_like(c, DType::bf16);
  if constexpr (kBackward) {
    cpu::embedding_backward<uint16_t>(x.data<uint16_t>(), ids.data<int64_t>(), y.data<uint16_t>(), ids.numel(),
                                      c.out_shape[0], c.out_shape[1]);
    zero_padding_row(c, y, stream(c));
  } else cpu::embedding_forward<uint16_t>(x.data<uint16_t>(), ids.data<int64_t>(), y.data<uint16_t>(), ids.numel(),
                                        x.dim(0), x.dim(1));
  return y;
}

// Rotary embedding (and its backward) on bf16: x [B, N, S, D], position_ids [B, S]. The cos and
// sin of every position are computed once (rope_factors), not per head; a chunk may span (b, n)
// planes: each plane's part is rotated with that plane's positions' factors.
template <bool kBackward>
Tensor rope_bf16(const KernelCall& c) {
  const Tensor x = arg(c, 0), pos = ids64(c, 1);
  check_head_dim(c, x.dim(3), kRopeMaxHeadDim, "rope");
  const int64_t N = x.dim(1), S = x.dim(2), D = x.dim(3), H = D / 2;
  std::vector<float> cos_f(size_t(pos.numel() * H)), sin_f(cos_f.size());  // [B·S, D/2]
  cpu::rope_factors<float>(pos.data<int64_t>(), pos.numel(), D, c.node.attrs().f("theta"), rope_scaling_of(c.node),
                           kBackward, cos_f.data(), sin_f.data());
  Tensor y = out_like(c, DType::bf16);
  by_chunks_bf16<1, 1>({x.data<uint16_t>()}, {y.data<uint16_t>()}, x.numel(), D,
                       [&](const std::array<const float*, 1>& in, const std::array<float*, 1>& out, int64_t i0, int64_t m) {
                         for (int64_t done = 0; done < m;) {  // the part of one (b, n) plane
                           const int64_t i = i0 + done, plane = i / (S * D), s0 = i % (S * D) / D;
                           const int64_t rows = std::min((m - done) / D, S - s0), f = (plane / N * S + s0) * H;
                           cpu::rope_apply<float>(in[0] + done, cos_f.data() + f, sin_f.data() + f, out[0] + done, rows,
                                                  D);
                           done += rows * D;
                         }
                       });
  return y;
}

// The ops computed natively where their first `bf16_inputs` inputs are bf16 (else emulated); the
// rest are ids or the loss's f32 gradient, and the outputs have the types the op table gives. The
// GEMM-bound ones (`gemm`) only where the CPU's bf16 GEMM beats widening (AVX512-BF16), the
// chunked elementwise ones everywhere; and where a row names `node_native`, only for the nodes it
// takes, as its launcher decides: the attention at the head dims cpu::sdpa_bf16_preferred takes,
// the experts but gpt-oss's.
bool attention_bf16_node(const Node& n) {
  const Dim& D = n.input(0)->shape().at(3);  // q [B, N, S, D]
  return !D.is_const() || cpu::sdpa_bf16_preferred(D.value());
}
struct NativeBf16Row {
  Op op;
  KernelFn run;
  size_t bf16_inputs;
  bool gemm;
  bool (*node_native)(const Node&) = nullptr;
};
constexpr NativeBf16Row kNativeBf16[] = {
    {Op::matmul, matmul_bf16, 2, true},
    {Op::swiglu_mlp, swiglu_mlp_bf16, 4, true},
    {Op::swiglu_mlp_backward, swiglu_mlp_backward_bf16, 5, true},
    {Op::moe_experts, moe_experts_bf16, 2, true, moe_bf16_node},
    {Op::moe_experts_backward, moe_experts_backward_bf16, 3, true, moe_bf16_node},
    {Op::moe_experts_ep, moe_experts_ep_bf16, 2, true, moe_bf16_node},
    {Op::moe_experts_ep_backward, moe_experts_ep_backward_bf16, 3, true, moe_bf16_node},
    {Op::linear_cross_entropy_sum, linear_cross_entropy_sum_bf16, 2, true},
    {Op::linear_cross_entropy_backward, linear_cross_entropy_backward_bf16, 2, true},
    {Op::sdpa, sdpa_bf16, 3, true, attention_bf16_node},
    {Op::sdpa_backward, sdpa_backward_bf16, 3, true, attention_bf16_node},
    {Op::ring_attention, ring_attention_bf16, 3, true, attention_bf16_node},
    {Op::ring_attention_backward, ring_attention_backward_bf16, 3, true, attention_bf16_node},
    {Op::add, binary_bf16<Binary::add>, 2, false},
    {Op::sub, binary_bf16<Binary::sub>, 2, false},
    {Op::mul, binary_bf16<Binary::mul>, 2, false},
    {Op::div, binary_bf16<Binary::div>, 2, false},
    {Op::scale, unary_bf16<Unary::scale>, 1, false},
    {Op::dropout, dropout_bf16, 1, false},
    {Op::neg, unary_bf16<Unary::neg>, 1, false},
    {Op::exp, unary_bf16<Unary::exp>, 1, false},
    {Op::tanh, unary_bf16<Unary::tanh>, 1, false},
    {Op::gelu_tanh, unary_bf16<Unary::gelu_tanh>, 1, false},
    {Op::silu, unary_bf16<Unary::silu>, 1, false},
    {Op::gelu_tanh_backward, unary_backward_bf16<UnaryGrad::gelu_tanh>, 2, false},
    {Op::silu_backward, unary_backward_bf16<UnaryGrad::silu>, 2, false},
    {Op::layernorm, norm_bf16<false>, 3, false},
    {Op::rmsnorm, norm_bf16<true>, 2, false},
    {Op::add_layernorm, add_norm_bf16<false>, 4, false},
    {Op::add_rmsnorm, add_norm_bf16<true>, 3, false},
    {Op::layernorm_backward, norm_backward_bf16<false>, 3, false},
    {Op::rmsnorm_backward, norm_backward_bf16<true>, 3, false},
    {Op::softmax, softmax_bf16<false>, 1, false},
    {Op::softmax_backward, softmax_bf16<true>, 2, false},
    {Op::rope, rope_bf16<false>, 1, false},
    {Op::rope_backward, rope_bf16<true>, 1, false},
    {Op::bias_gelu_tanh, bias_gelu_tanh_bf16<false>, 2, false},
    {Op::bias_gelu_tanh_backward, bias_gelu_tanh_bf16<true>, 3, false},
    {Op::swiglu, swiglu_bf16, 2, false},
    {Op::swiglu_backward, swiglu_backward_bf16, 3, false},
    {Op::sum_to, sum_to_bf16, 1, false},
    {Op::embedding, embedding_bf16<false>, 1, false},
    {Op::embedding_backward, embedding_bf16<true>, 1, false},
    {Op::cross_entropy_sum, cross_entropy_sum_bf16, 1, false},
    {Op::cross_entropy_backward, cross_entropy_backward_bf16, 1, false},
    {Op::sequence_logps, sequence_logps_bf16, 1, false},
    {Op::sequence_logps_backward, sequence_logps_backward_bf16, 1, false},
};

bool has_native_bf16(const Node& n) {
  for (const NativeBf16Row& row : kNativeBf16) {
    if (row.op != n.op()) continue;
    if (row.gemm && cpu::bf16_gemm_best() == cpu::Bf16Gemm::f32) return false;
    return row.node_native == nullptr || row.node_native(n);
  }
  return false;
}

KernelFn native_bf16(const KernelCall& c) {
  for (const NativeBf16Row& row : kNativeBf16) {
    if (row.op != c.node.op()) continue;
    if (row.gemm && cpu::bf16_gemm_best() == cpu::Bf16Gemm::f32) return nullptr;  // widening is as fast
    const auto bf16 = [](const Tensor& t) { return t.dtype() == DType::bf16; };
    return c.in.size() >= row.bf16_inputs && std::all_of(c.in.begin(), c.in.begin() + row.bf16_inputs, bf16) ? row.run
                                                                                                             : nullptr;
  }
  return nullptr;
}

// bf16 emulation (engine/launchers.h): a node with a bf16 input or output runs its f32 kernel on inputs
// widened to f32, and each result is rounded once to its (bf16) type: the numerics of the CUDA
// kernels (f32 compute, one rounding per result), not their speed. Ops that only move bytes, and
// the conversion and constant ops, handle bf16 themselves.
bool emulates_bf16(const KernelCall& c) {
  if (op_info(c.node.op()).numerics != Numerics::computes) return false;  // the op table's column
  if (c.node.dtype() == DType::bf16) return true;
  for (const Tensor& t : c.in)
    if (t.dtype() == DType::bf16) return true;
  return false;
}

Tensor bf16_via_f32(const KernelCall& c, KernelFn f32_kernel) {
  std::vector<Tensor> in;
  for (const Tensor& t : c.in) {
    if (t.dtype() != DType::bf16) {
      in.push_back(t);
      continue;
    }
    in.push_back(Tensor::empty(t.shape(), DType::f32, c.alloc));
    convert(t.contiguous(), in.back());
  }
  std::vector<Tensor> extras;
  const KernelCall f32_call{.node = c.node, .in = in, .out_shape = c.out_shape, .bindings = c.bindings,
                            .alloc = c.alloc, .extras = extras, .comm = c.comm, .out = {}, .extra_out = {},
                            .attention = c.attention, .workspace = c.workspace};
  // A result in its node's dtype, in the planned place when there is one.
  auto settle = [&](const Tensor& y, DType dt, const Tensor& planned) {
    if (!planned.defined() && y.dtype() == dt) return y;
    Tensor out = planned.defined() ? planned : Tensor::empty(y.shape(), dt, c.alloc);
    convert(y, out);
    return out;
  };
  Tensor y = f32_kernel(f32_call);
  const std::vector<TensorType> types = extra_types(c.node);
  for (size_t i = 0; i < extras.size(); ++i)
    c.extras.push_back(settle(extras[i], types.at(i).dtype, i < c.extra_out.size() ? c.extra_out[i] : Tensor{}));
  return settle(y, c.node.dtype(), c.out);
}

}  // namespace autosp::cpu_ops
