// CPU launchers: the CPU column of the kernel dispatch table (engine/dispatch.cpp), declared in
// engine/launchers.h; the reference engine/cuda/launchers.cpp mirrors. Dtypes: f32 and f64, bf16
// emulated (bf16_via_f32, at the end). Each reads shapes from tensors, picks the element type and calls a
// kernel in src/kernels/cpu. Every output is a contiguous tensor in its planned place (c.out,
// c.extra_out) or fresh from c.alloc, except reshape, which is a view of its contiguous input.
#include "engine/launchers.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "engine/executor.h"
#include "engine/ring.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mlp.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace autosp::cpu_ops {
namespace {

// Call f.template operator()<T>() with T = float or double, by dtype.
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

// The memory plan's workspace for the node (KernelCall::workspace) as T scratch, when there is one
// of at least `bytes` (a bf16 node's runs in f32); else nullptr.
template <class T>
T* planned_workspace(const KernelCall& c, size_t bytes) {
  return c.workspace.defined() && c.workspace.nbytes() >= bytes ? reinterpret_cast<T*>(c.workspace.data<int64_t>())
                                                                : nullptr;
}

// Integer ids as int64 (i32 ids are widened).
Tensor ids64(const Tensor& t) { return t.dtype() == DType::i64 ? t.contiguous() : t.to(DType::i64); }

// Materialise a strided view as a contiguous tensor: the node's output (reshaped to the view's
// shape) when `as_output`, else a temporary.
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

Tensor copy_view(const KernelCall& c, const Tensor& view, bool as_output = true) {
  Tensor y = as_output ? out_like(c, view.dtype()).reshape(view.shape()) : Tensor::empty(view.shape(), view.dtype(), c.alloc);
  copy_into(view, y);
  return y;
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
void convert(const Tensor& x, const Tensor& y) {
  if (x.dtype() == y.dtype()) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  by_storage(x.dtype(), [&]<class From>() {
    by_storage(y.dtype(), [&]<class To>() { cpu::cast<From, To>(x.data<From>(), y.data<To>(), x.numel()); });
  });
}

}  // namespace

Tensor embedding(const KernelCall& c) {
  const Tensor& w = c.in[0];
  Tensor ids = ids64(c.in[1]);
  return by_float(c, w.dtype(), [&]<class T>() {
    Tensor y = out_like(c, w.dtype());
    cpu::embedding_forward(w.data<T>(), ids.data<int64_t>(), y.data<T>(), ids.numel(), w.dim(0), w.dim(1));
    return y;
  });
}

Tensor matmul(const KernelCall& c) {
  const Tensor a = c.in[0].contiguous(), b = c.in[1].contiguous();
  const bool ta = c.node.attrs().b("trans_a"), tb = c.node.attrs().b("trans_b");
  const int r = a.rank();
  const int64_t M = c.out_shape[r - 2], N = c.out_shape[r - 1], K = a.dim(ta ? -2 : -1);
  int64_t batch = a.numel() / (a.dim(-1) * a.dim(-2));
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (b.rank() == 2 && !ta)  // [..., M, K] · [K, N]: one GEMM with batch·M rows
      cpu::gemm_batched<T>(false, tb, 1, batch * M, N, K, T(1), a.data<T>(), 0, b.data<T>(), 0, T(0), y.data<T>(), 0);
    else
      cpu::gemm_batched<T>(ta, tb, batch, M, N, K, T(1), a.data<T>(), M * K, b.data<T>(), b.rank() == 2 ? 0 : K * N,
                           T(0), y.data<T>(), M * N);
    return y;
  });
}

template <cpu::Binary kOp>
Tensor binary(const KernelCall& c) {
  const Tensor &a = c.in[0], &b = c.in[1];
  const Shape& out = c.out_shape;
  AUTOSP_ASSERT(static_cast<int>(out.size()) <= kMaxRank, "rank ", out.size(), " too large");
  Shape sa = launch::broadcast_strides(a, out), sb = launch::broadcast_strides(b, out);
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (out.empty()) {
      Shape one{1}, z{0};
      cpu::binary<T>(kOp, 1, one.data(), a.data<T>(), z.data(), b.data<T>(), z.data(), y.data<T>());
    } else {
      cpu::binary<T>(kOp, static_cast<int>(out.size()), out.data(), a.data<T>(), sa.data(), b.data<T>(), sb.data(),
                     y.data<T>());
    }
    return y;
  });
}

template <cpu::Unary kOp>
Tensor unary(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  double s = kOp == cpu::Unary::scale ? c.node.attrs().f("factor") : 0.0;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::unary<T>(kOp, x.data<T>(), y.data<T>(), x.numel(), s);
    return y;
  });
}

Tensor reshape(const KernelCall& c) { return c.in[0].contiguous().reshape(c.out_shape); }

// transpose and permute
Tensor permute(const KernelCall& c) { return copy_view(c, launch::permuted_view(c, c.in[0])); }

Tensor slice(const KernelCall& c) { return copy_view(c, launch::slice_view(c, c.in[0])); }

// y [..., Σ n_i, ...] from x_i [..., n_i, ...]: for each index over the dims before `d`, the inputs'
// contiguous blocks are laid side by side, one output block at a time (y is written in order, in
// one parallel region: input by input it took 3 regions and 0.35 ms for GPT-2 tiny's qkv gradient).
Tensor concat(const KernelCall& c) {
  const int d = launch::axis(c.node.attrs().i("dim"), c.in[0].rank());
  Tensor y = out_like(c, c.in[0].dtype());
  const size_t es = dtype_size(y.dtype());
  const int64_t outer = shape_numel(std::span(c.out_shape).first(d));
  if (outer == 0) return y;
  const int64_t y_block = y.numel() / outer;
  std::vector<Tensor> xs;  // contiguous inputs, alive until the copy is done
  std::vector<int64_t> blocks;
  for (const Tensor& in : c.in) {
    xs.push_back(in.contiguous());
    blocks.push_back(xs.back().numel() / outer);
  }
  char* dst = static_cast<char*>(y.raw());
#pragma omp parallel for if (outer > 64)
  for (int64_t o = 0; o < outer; ++o) {
    char* row = dst + o * y_block * int64_t(es);
    for (size_t i = 0; i < xs.size(); ++i) {
      const size_t n = size_t(blocks[i]) * es;
      std::memcpy(row, static_cast<const char*>(xs[i].raw()) + size_t(o) * n, n);
      row += n;
    }
  }
  return y;
}

Tensor layernorm(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::layernorm_forward<T>(x.data<T>(), c.in[1].data<T>(), c.in[2].data<T>(), y.data<T>(), nullptr, nullptr, rows,
                              C, c.node.attrs().f("eps"));
    return y;
  });
}

Tensor rmsnorm(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::rmsnorm_forward<T>(x.data<T>(), c.in[1].data<T>(), y.data<T>(), nullptr, rows, C, c.node.attrs().f("eps"));
    return y;
  });
}

Tensor softmax(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::softmax_forward<T>(x.data<T>(), y.data<T>(), rows, C);
    return y;
  });
}

// Rotary embedding and its backward (the rotation by minus the angle): x or dy [B, N, S, D], position_ids [B, S].
template <bool kBackward>
Tensor rope(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  Tensor pos = ids64(c.in[1]);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    auto kernel = kBackward ? cpu::rope_backward<T> : cpu::rope_forward<T>;
    kernel(x.data<T>(), pos.data<int64_t>(), y.data<T>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
           c.node.attrs().f("theta"), rope_scaling_of(c.node));
    return y;
  });
}

namespace {
// The operands sdpa and ring_attention share, contiguous: q, k, v and the optional document starts
// (input 3, as i64); their backward adds o, lse, dout (inputs 3-5) and has the starts at input 6.
struct AttentionArgs {
  Tensor q, k, v, o, lse, dout, docs;
  const int64_t* doc_start() const { return docs.defined() ? docs.data<int64_t>() : nullptr; }
};
AttentionArgs attention_args(const KernelCall& c, bool backward) {
  AttentionArgs args;
  args.q = c.in[0].contiguous();
  args.k = c.in[1].contiguous();
  args.v = c.in[2].contiguous();
  const size_t docs_at = backward ? 6 : 3;
  if (backward) {
    args.o = c.in[3].contiguous();
    args.lse = c.in[4].contiguous();
    args.dout = c.in[5].contiguous();
  }
  if (c.in.size() > docs_at) args.docs = ids64(c.in[docs_at]);
  return args;
}
}  // namespace

// o [B, N, Sq, D]; extra output 1: lse [B, N, Sq] (saved for the backward). Input 3 (optional):
// the document starts [B, Sq].
Tensor sdpa(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor y = out_like(c, q.dtype());
    Tensor lse = extra_like(c, {q.dim(0), q.dim(1), q.dim(2)}, q.dtype());
    cpu::sdpa_forward<T>(q.data<T>(), k.data<T>(), v.data<T>(), y.data<T>(), lse.data<T>(), q.dim(0), q.dim(1),
                         k.dim(1), q.dim(2), k.dim(2), q.dim(3), c.node.attrs().f("scale"), c.node.attrs().b("causal"),
                         args.doc_start());
    c.extras.push_back(lse);
    return y;
  });
}

// dq; extra outputs dk, dv. Inputs: q, k, v, o, lse, dout (, document starts).
Tensor sdpa_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor dq = out_like(c, q.dtype());
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    T* workspace = planned_workspace<T>(c, sdpa_backward_workspace(c.node, c.bindings));
    cpu::sdpa_backward<T>(q.data<T>(), k.data<T>(), v.data<T>(), args.o.data<T>(), args.lse.data<T>(),
                          args.dout.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(), q.dim(0), q.dim(1),
                          k.dim(1), q.dim(2), k.dim(2), q.dim(3), c.node.attrs().f("scale"),
                          c.node.attrs().b("causal"), args.doc_start(), workspace);
    return dq;
  });
}

size_t sdpa_backward_workspace(const Node& n, const Bindings& b) {
  const Shape q = eval_shape(n.input(0)->shape(), b), k = eval_shape(n.input(1)->shape(), b);
  const size_t elem = n.input(0)->dtype() == DType::f64 ? sizeof(double) : sizeof(float);
  return elem * static_cast<size_t>(cpu::sdpa_backward_workspace(q[0], q[1], k[1], q[2], k[2], q[3], n.attrs().b("causal")));
}

// ---- ring attention (engine/ring.h: the schedule and the zigzag layout) ----
//
// The launchers keep every operand in halves: x [B, H, L, D] (L = 2c, this rank's zigzag chunks
// side by side) as [2, B, H, c, D], so each chunk is a contiguous sdpa operand; a K/V block is one
// buffer [k | v] of such halves, sent around the ring as one message. Each step attends the two
// query chunks to the two key chunks of the block it holds, chunk pair by chunk pair: a key chunk
// after the query chunk is skipped (causal), the same chunk is the causal diagonal, an earlier one
// is full; with document starts, a pair whose keys all lie before every query's document is skipped
// too (never visited, not masked).
namespace {

Tensor to_halves(const KernelCall& c, const Tensor& x) { return copy_view(c, halves_view(x), false); }

// [k | v] of one block, each in halves, as one buffer.
Tensor kv_block(const KernelCall& c, const Tensor& k, const Tensor& v) {
  Tensor kv = Tensor::empty({2, 2, k.dim(0), k.dim(1), k.dim(2) / 2, k.dim(3)}, k.dtype(), c.alloc);
  copy_into(halves_view(k), Tensor::view_bytes(kv, 0, {k.numel()}, k.dtype()));
  copy_into(halves_view(v), Tensor::view_bytes(kv, k.nbytes(), {v.numel()}, v.dtype()));
  return kv;
}

template <class T>
void add_into(Tensor& into, const Tensor& from) {
  T* y = into.data<T>();
  const T* x = from.data<T>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < into.numel(); ++i) y[i] += x[i];
}

}  // namespace

// o [B, N, L, D]; extra output 1: lse [B, N, L]. Inputs q, k, v (this rank's zigzag chunks, after
// the Ulysses all-to-all), optional document starts [B, L].
Tensor ring_attention(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    RingChunks g = ring_chunks(c, q, k, args.doc_start());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = to_halves(c, q);
    Tensor o = Tensor::empty(qh.shape(), q.dtype(), c.alloc), lse = Tensor::empty({2, g.B, g.N, g.c}, q.dtype(), c.alloc);
    std::fill(o.data<T>(), o.data<T>() + o.numel(), T(0));
    std::fill(lse.data<T>(), lse.data<T>() + lse.numel(), -std::numeric_limits<T>::infinity());
    Tensor o_blk = Tensor::empty({g.B, g.N, g.c, g.D}, q.dtype(), c.alloc);
    Tensor lse_blk = Tensor::empty({g.B, g.N, g.c}, q.dtype(), c.alloc);
    Tensor kv = kv_block(c, k, v);
    std::vector<int64_t> dh;
    ring_forward(*c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc),
                 [&](int owner, const Tensor& block, const std::function<void()>& progress) {
                   g.k = g.chunks_of(owner);
                   const T* kp = block.data<T>();
                   const T* vp = kp + 2 * g.kv_half(1);
                   for (int a = 0; a < 2; ++a)
                     for (int b = 0; b < 2; ++b) {
                       bool diagonal = false;
                       if (!g.visits(a, b, diagonal, dh)) continue;
                       cpu::sdpa_forward<T>(qh.data<T>() + g.q_half(a), kp + g.kv_half(b), vp + g.kv_half(b),
                                            o_blk.data<T>(), lse_blk.data<T>(), g.B, g.N, g.Nkv, g.c, g.c, g.D, scale,
                                            diagonal, g.doc_start ? dh.data() : nullptr);
                       cpu::merge_attention<T>(o.data<T>() + g.q_half(a), lse.data<T>() + g.lse_half(a),
                                               o_blk.data<T>(), lse_blk.data<T>(), g.B * g.N * g.c, g.D);
                       progress();
                     }
                 });
    Tensor y = out_like(c, q.dtype());
    copy_into(interleaved_view(o), y);
    Tensor lse_out = extra_like(c, {g.B, g.N, 2 * g.c}, q.dtype());
    copy_into(interleaved_view(lse.reshape({2, g.B, g.N, g.c, 1})), lse_out);
    c.extras.push_back(lse_out);
    return y;
  });
}

// dq; extra outputs dk, dv. Inputs: q, k, v, o, lse, dout (, document starts).
Tensor ring_attention_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  return by_float(c, q.dtype(), [&]<class T>() {
    RingChunks g = ring_chunks(c, q, k, args.doc_start());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = to_halves(c, q), oh = to_halves(c, args.o), doh = to_halves(c, args.dout);
    const Tensor lseh = copy_view(c, halves_view(args.lse.reshape({g.B, g.N, 2 * g.c, 1})), false);
    Tensor dqh = Tensor::empty(qh.shape(), q.dtype(), c.alloc);
    std::fill(dqh.data<T>(), dqh.data<T>() + dqh.numel(), T(0));
    Tensor dq_blk = Tensor::empty({g.B, g.N, g.c, g.D}, q.dtype(), c.alloc);
    Tensor dk_blk = Tensor::empty({2, g.B, g.Nkv, g.c, g.D}, q.dtype(), c.alloc);  // dk, dv of one chunk pair
    Tensor kv = kv_block(c, k, v);
    Tensor grads[3] = {Tensor::empty(kv.shape(), kv.dtype(), c.alloc), Tensor::empty(kv.shape(), kv.dtype(), c.alloc),
                       Tensor::empty(kv.shape(), kv.dtype(), c.alloc)};
    const int64_t pair = g.B * g.Nkv * g.c * g.D;  // elements of one chunk's dk (or dv)
    std::vector<int64_t> dh;
    auto accumulate = [](T* y, const T* x, int64_t n) {
      for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    };
    ring_backward(
        *c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc), grads,
        [&](int owner, const Tensor& block, Tensor& part, const std::function<void()>& progress) {
          g.k = g.chunks_of(owner);
          const T* kp = block.data<T>();
          const T* vp = kp + 2 * g.kv_half(1);
          T* dkp = part.data<T>();
          T* dvp = dkp + 2 * g.kv_half(1);
          std::fill(dkp, dkp + part.numel(), T(0));
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
              bool diagonal = false;
              if (!g.visits(a, b, diagonal, dh)) continue;
              T* dkb = dk_blk.data<T>();
              cpu::sdpa_backward<T>(qh.data<T>() + g.q_half(a), kp + g.kv_half(b), vp + g.kv_half(b),
                                    oh.data<T>() + g.q_half(a), lseh.data<T>() + g.lse_half(a),
                                    doh.data<T>() + g.q_half(a), dq_blk.data<T>(), dkb, dkb + pair, g.B, g.N, g.Nkv,
                                    g.c, g.c, g.D, scale, diagonal, g.doc_start ? dh.data() : nullptr);
              accumulate(dqh.data<T>() + g.q_half(a), dq_blk.data<T>(), dq_blk.numel());
              accumulate(dkp + g.kv_half(b), dkb, pair);
              accumulate(dvp + g.kv_half(b), dkb + pair, pair);
              progress();
            }
        },
        [](Tensor& into, const Tensor& from) { add_into<T>(into, from); });
    Tensor dq = out_like(c, q.dtype());
    copy_into(interleaved_view(dqh), dq);
    const Tensor& whole = grads[0];  // [dk | dv] of this rank's own block, in halves
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    const Shape halves{2, g.B, g.Nkv, g.c, g.D};
    copy_into(interleaved_view(Tensor::view_bytes(whole, 0, halves, k.dtype())), dk);
    copy_into(interleaved_view(Tensor::view_bytes(whole, k.nbytes(), halves, v.dtype())), dv);
    return dq;
  });
}

Tensor cross_entropy_sum(const KernelCall& c) {
  const Tensor logits = c.in[0].contiguous();
  Tensor labels = ids64(c.in[1]);
  const int64_t V = logits.dim(-1);
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor y = out_like(c, logits.dtype());
    *y.data<T>() = static_cast<T>(cpu::cross_entropy_sum<T>(logits.data<T>(), labels.data<int64_t>(), labels.numel(), V,
                                                            c.node.attrs().i("ignore_index")));
    return y;
  });
}

Tensor count_valid(const KernelCall& c) {
  Tensor labels = ids64(c.in[0]);
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

// x [..] summed to out [..] (right-aligned; padded with leading 1s to x's rank for the kernel)
Tensor sum_to(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  Shape out_full(static_cast<size_t>(x.rank()) - c.out_shape.size(), 1);
  out_full.insert(out_full.end(), c.out_shape.begin(), c.out_shape.end());
  AUTOSP_ASSERT(x.rank() <= kMaxRank, "rank ", x.rank(), " too large");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    if (x.rank() == 0)
      *y.data<T>() = *x.data<T>();
    else
      cpu::sum_to<T>(x.data<T>(), x.rank(), x.shape().data(), out_full.data(), y.data<T>());
    return y;
  });
}

// dy [..., C], ids [...] → dweight [V, C]
Tensor embedding_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous();
  Tensor ids = ids64(c.in[1]);
  return by_float(c, dy.dtype(), [&]<class T>() {
    Tensor y = out_like(c, dy.dtype());
    cpu::embedding_backward<T>(dy.data<T>(), ids.data<int64_t>(), y.data<T>(), ids.numel(), c.out_shape[0],
                               c.out_shape[1]);
    return y;
  });
}

template <cpu::UnaryGrad kOp>
Tensor unary_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous();
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::unary_backward<T>(kOp, dy.data<T>(), x.data<T>(), y.data<T>(), x.numel());
    return y;
  });
}

// dy [.., end-start, ..] placed at [start, end) of dim d of a zero tensor.
Tensor slice_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous();
  const int d = launch::axis(c.node.attrs().i("dim"), dy.rank());
  const int64_t start = c.node.attrs().dim("start").eval(c.bindings);
  Tensor y = out_like(c, dy.dtype());
  std::memset(y.raw(), 0, y.nbytes());
  const size_t es = dtype_size(dy.dtype());
  const int64_t outer = shape_numel(std::span(dy.shape()).first(d));
  const int64_t inner = shape_numel(std::span(dy.shape()).subspan(d + 1));
  const int64_t rows_in = dy.dim(d), rows_out = c.out_shape[d];
  const char* src = static_cast<const char*>(dy.raw());
  char* dst = static_cast<char*>(y.raw());
#pragma omp parallel for if (outer > 64)
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + ((o * rows_out + start) * inner) * es, src + o * rows_in * inner * es,
                static_cast<size_t>(rows_in * inner) * es);
  return y;
}

// dx; extra outputs dw, db. Inputs: dy, x, w.
Tensor layernorm_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    Tensor db = extra_like(c, {C}, x.dtype());
    c.extras.push_back(db);
    cpu::layernorm_backward_input<T>(dy.data<T>(), x.data<T>(), c.in[2].data<T>(), dx.data<T>(), rows, C, eps);
    cpu::layernorm_backward_params<T>(dy.data<T>(), x.data<T>(), dw.data<T>(), db.data<T>(), rows, C, eps);
    return dx;
  });
}

// dx; extra output dw. Inputs: dy, x, w.
Tensor rmsnorm_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    cpu::rmsnorm_backward_input<T>(dy.data<T>(), x.data<T>(), c.in[2].data<T>(), dx.data<T>(), rows, C, eps);
    cpu::rmsnorm_backward_weight<T>(dy.data<T>(), x.data<T>(), dw.data<T>(), rows, C, eps);
    return dx;
  });
}

Tensor softmax_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), y = c.in[1].contiguous();
  const int64_t C = y.dim(-1), rows = y.numel() / C;
  return by_float(c, y.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, y.dtype());
    cpu::softmax_backward<T>(dy.data<T>(), y.data<T>(), dx.data<T>(), rows, C);
    return dx;
  });
}

// dlogits = g · (softmax(logits) - onehot(labels)). Inputs: logits, labels, g (scalar).
Tensor cross_entropy_backward(const KernelCall& c) {
  const Tensor logits = c.in[0].contiguous();
  Tensor labels = ids64(c.in[1]);
  const double g = c.in[2].to_doubles()[0];
  return by_float(c, logits.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, logits.dtype());
    cpu::cross_entropy_backward<T>(logits.data<T>(), labels.data<int64_t>(), dx.data<T>(), labels.numel(),
                                   logits.dim(-1), g, c.node.attrs().i("ignore_index"));
    return dx;
  });
}

Tensor causal_mask(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t Sq = x.dim(-2), Skv = x.dim(-1);
  const double value = c.node.attrs().f("value");
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::causal_mask<T>(x.data<T>(), y.data<T>(), x.numel() / std::max<int64_t>(1, Sq * Skv), Sq, Skv,
                        static_cast<T>(value));
    return y;
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

// ZeRO-3: the whole parameter from every rank's shard, straight into the output when the shards
// tile it, else through a padded buffer whose first elements are copied out once it has arrived.
// In the background when the executor asks (KernelCall::pending: the parameter prefetch).
Tensor all_gather(const KernelCall& c) {
  Communicator& comm = launch::shard_group(c);
  const Tensor x = c.in[0].contiguous();
  Tensor y = out_like(c, x.dtype());
  const launch::ShardLayout l = launch::shard_layout(comm, y.numel());
  Tensor into = l.direct() ? y.reshape({y.numel()}) : Tensor::empty(l.padded(), x.dtype(), c.alloc);
  auto copy_out = [direct = l.direct(), into, y]() mutable {
    if (!direct) std::memcpy(y.raw(), into.raw(), y.nbytes());
  };
  if (!c.pending) {
    comm.all_gather(x, into);
    copy_out();
    return y;
  }
  *c.pending = followed_by(comm.all_gather_async(x, into), copy_out);
  return y;
}

// ZeRO-3: the whole gradient summed over the group, this rank's shard of it (padded with zeros
// past the whole tensor's elements). Sent as it is when it needs neither a cast nor padding, else
// in pieces through the staging (launch::ScatterPieces: the planned workspace, or its own). In the
// background when the executor asks and one piece does it; the handle keeps what it reads alive.
Tensor reduce_scatter(const KernelCall& c) {
  Communicator& comm = launch::shard_group(c);
  const Tensor g = c.in[0].contiguous();
  Tensor y = out_like(c, c.node.dtype());
  const launch::ScatterPieces p = launch::scatter_pieces(launch::shard_layout(comm, g.numel()), g.dtype(), y.dtype());
  if (p.staged) {
    const Tensor staging = launch::reduce_scatter_staging(c, p);
    const launch::DeviceFill fill{.convert = convert,
                                  .zero = [](const Tensor& t) { std::memset(t.raw(), 0, t.nbytes()); }};
    launch::staged_reduce_scatter(c, comm, p, g.reshape({g.numel()}), y, staging, fill);
    return y;
  }
  Tensor send = g.reshape({g.numel()});
  if (!c.pending) {
    comm.reduce_scatter_sum(send, y);
    return y;
  }
  *c.pending = followed_by(comm.reduce_scatter_sum_async(send, y), [send] {});
  return y;
}

Tensor cast(const KernelCall& c) {
  Tensor y = out_like(c, c.node.dtype());
  convert(c.in[0].contiguous(), y);
  return y;
}

// Fused residual add + norm: y = norm(x + r); extra output 1: s = x + r. Inputs: x, r, w (, b).
template <bool kRms>
Tensor add_norm(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), r = c.in[1].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    Tensor s = extra_like(c, x.shape(), x.dtype());
    c.extras.push_back(s);
    cpu::add_norm_forward<T>(x.data<T>(), r.data<T>(), c.in[2].data<T>(), kRms ? nullptr : c.in[3].data<T>(),
                             y.data<T>(), s.data<T>(), rows, C, c.node.attrs().f("eps"), kRms);
    return y;
  });
}
Tensor add_layernorm(const KernelCall& c) { return add_norm<false>(c); }
Tensor add_rmsnorm(const KernelCall& c) { return add_norm<true>(c); }
// gelu_tanh(x + b): x [..., C], b [C].
Tensor bias_gelu_tanh(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), b = c.in[1].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::bias_gelu_tanh<T>(x.data<T>(), b.data<T>(), y.data<T>(), rows, C);
    return y;
  });
}
// dx = dy · gelu_tanh'(x + b). Inputs: dy, x, b.
Tensor bias_gelu_tanh_backward(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous(), b = c.in[2].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    cpu::bias_gelu_tanh_backward<T>(dy.data<T>(), x.data<T>(), b.data<T>(), dx.data<T>(), rows, C);
    return dx;
  });
}

// x [..., C] as rows [R, C]; w_gate, w_up [I, C], w_down [C, I] → y [..., C].
Tensor swiglu_mlp(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), wg = c.in[1].contiguous(), wu = c.in[2].contiguous(),
               wd = c.in[3].contiguous();
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

// x [..., C], w [V, C], labels [...] → the summed loss; extra output: the rows' argmax, i64 [...].
Tensor linear_cross_entropy_sum(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), w = c.in[1].contiguous();
  const Tensor labels = ids64(c.in[2]);
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    c.extras.push_back(extra_like(c, labels.shape(), DType::i64));
    Tensor own;
    *y.data<T>() = static_cast<T>(cpu::linear_cross_entropy_sum<T>(
        x.data<T>(), w.data<T>(), labels.data<int64_t>(), c.extras[0].data<int64_t>(), logits_chunk<T>(c, rows, V, own),
        rows, C, V, c.node.attrs().i("ignore_index")));
    return y;
  });
}

// dx; extra output dw. Inputs: x, w, labels, g (the loss's gradient, a scalar).
Tensor linear_cross_entropy_backward(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), w = c.in[1].contiguous();
  const Tensor labels = ids64(c.in[2]);
  const double g = c.in[3].to_doubles()[0];
  const int64_t C = x.dim(-1), V = w.dim(0), rows = labels.numel();
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    c.extras.push_back(extra_like(c, w.shape(), w.dtype()));
    Tensor own;
    cpu::linear_cross_entropy_backward<T>(x.data<T>(), w.data<T>(), labels.data<int64_t>(), g, dx.data<T>(),
                                          c.extras[0].data<T>(), logits_chunk<T>(c, rows, V, own), rows, C, V,
                                          c.node.attrs().i("ignore_index"));
    return dx;
  });
}

size_t linear_cross_entropy_workspace(const Node& n, const Bindings& b) {
  const Shape x = eval_shape(n.input(0)->shape(), b), w = eval_shape(n.input(1)->shape(), b);
  const size_t elem = n.input(0)->dtype() == DType::f64 ? sizeof(double) : sizeof(float);
  return elem * static_cast<size_t>(cpu::linear_ce_scratch_elems(shape_numel(x) / x.back(), w[0]));
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
  const KernelCall call{.node = c.node, .in = in, .out_shape = c.out_shape, .bindings = c.bindings,
                        .alloc = c.alloc, .extras = extras, .comm = c.comm, .out = {}, .extra_out = {},
                        .attention = c.attention, .workspace = c.workspace};
  // A result in its node's dtype, in the planned place when there is one.
  auto settle = [&](const Tensor& y, DType dt, const Tensor& planned) {
    if (!planned.defined() && y.dtype() == dt) return y;
    Tensor out = planned.defined() ? planned : Tensor::empty(y.shape(), dt, c.alloc);
    convert(y, out);
    return out;
  };
  Tensor y = f32_kernel(call);
  const std::vector<TensorType> types = extra_types(c.node);
  for (size_t i = 0; i < extras.size(); ++i)
    c.extras.push_back(settle(extras[i], types.at(i).dtype, i < c.extra_out.size() ? c.extra_out[i] : Tensor{}));
  return settle(y, c.node.dtype(), c.out);
}

AUTOSP_INSTANTIATE_LAUNCHERS  // the template rows (engine/launchers.h)

}  // namespace autosp::cpu_ops
