// CPU launchers and the dispatch table. Each launcher reads shapes from tensors, picks the element
// type and calls a kernel in src/kernels/cpu. Every output is a fresh contiguous tensor, except
// reshape, which is a view of its contiguous input.
#include "engine/dispatch.h"

#include <array>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#ifdef AUTOSP_WITH_CUDA
#include "engine/cuda/launchers.h"
// The CUDA column names the launcher of engine/cuda/launchers.h; builds without CUDA name no_cuda.
#define AUTOSP_CUDA(launcher) cuda_ops::launcher
#else
#define AUTOSP_CUDA(launcher) no_cuda
#endif

namespace autosp {

// The node's output: the planned place in the arena when there is one, else a fresh tensor.
Tensor out_like(const KernelCall& c, DType dt) {
  if (c.out.defined()) {
    AUTOSP_ASSERT(c.out.dtype() == dt && c.out.shape() == c.out_shape, "planned output of ", c.node.name(), " is ",
                  c.out.str());
    return c.out;
  }
  return Tensor::empty(c.out_shape, dt, c.alloc);
}

// The next extra output (index = how many were pushed so far), planned or fresh.
Tensor extra_like(const KernelCall& c, Shape shape, DType dt) {
  const size_t i = c.extras.size();
  if (i < c.extra_out.size() && c.extra_out[i].defined()) {
    AUTOSP_ASSERT(c.extra_out[i].dtype() == dt && c.extra_out[i].shape() == shape, "planned extra output ", i + 1,
                  " of ", c.node.name(), " is ", c.extra_out[i].str());
    return c.extra_out[i];
  }
  return Tensor::empty(std::move(shape), dt, c.alloc);
}

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

// Integer ids as int64 (i32 ids are widened).
Tensor ids64(const Tensor& t) { return t.dtype() == DType::i64 ? t.contiguous() : t.to(DType::i64); }

Tensor embedding_cpu(const KernelCall& c) {
  const Tensor& w = c.in[0];
  Tensor ids = ids64(c.in[1]);
  return by_float(c, w.dtype(), [&]<class T>() {
    Tensor y = out_like(c, w.dtype());
    cpu::embedding_forward(w.data<T>(), ids.data<int64_t>(), y.data<T>(), ids.numel(), w.dim(0), w.dim(1));
    return y;
  });
}

Tensor matmul_cpu(const KernelCall& c) {
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
Tensor binary_cpu(const KernelCall& c) {
  const Tensor &a = c.in[0], &b = c.in[1];
  const Shape& out = c.out_shape;
  AUTOSP_ASSERT(static_cast<int>(out.size()) <= cpu::kMaxRank, "rank ", out.size(), " too large");
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
Tensor unary_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  double s = kOp == cpu::Unary::scale ? c.node.attrs().f("factor") : 0.0;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::unary<T>(kOp, x.data<T>(), y.data<T>(), x.numel(), s);
    return y;
  });
}

// Materialise a strided view as a contiguous tensor: the node's output (reshaped to the view's
// shape) when `as_output`, else a temporary.
Tensor copy_view(const KernelCall& c, const Tensor& view, bool as_output = true) {
  Tensor y = as_output ? out_like(c, view.dtype()).reshape(view.shape()) : Tensor::empty(view.shape(), view.dtype(), c.alloc);
  AUTOSP_ASSERT(view.rank() <= cpu::kMaxRank, "rank ", view.rank(), " too large");
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
  return y;
}

Tensor reshape_cpu(const KernelCall& c) { return c.in[0].contiguous().reshape(c.out_shape); }

// transpose and permute
Tensor permute_cpu(const KernelCall& c) { return copy_view(c, launch::permuted_view(c, c.in[0])); }

Tensor slice_cpu(const KernelCall& c) { return copy_view(c, launch::slice_view(c, c.in[0])); }

// y [..., Σ n_i, ...] from x_i [..., n_i, ...]: for each index over the dims before `d`, the inputs'
// contiguous blocks are laid side by side.
Tensor concat_cpu(const KernelCall& c) {
  const int d = launch::axis(c.node.attrs().i("dim"), c.in[0].rank());
  Tensor y = out_like(c, c.in[0].dtype());
  const size_t es = dtype_size(y.dtype());
  const int64_t outer = shape_numel(std::span(c.out_shape).first(d));
  const int64_t y_block = outer ? y.numel() / outer : 0;
  int64_t at = 0;  // offset of this input's block inside y's block, in elements
  for (const Tensor& in : c.in) {
    const Tensor x = in.contiguous();
    const int64_t block = outer ? x.numel() / outer : 0;
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw());
#pragma omp parallel for if (outer > 64)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + (o * y_block + at) * es, src + o * block * es, static_cast<size_t>(block) * es);
    at += block;
  }
  return y;
}

Tensor layernorm_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::layernorm_forward<T>(x.data<T>(), c.in[1].data<T>(), c.in[2].data<T>(), y.data<T>(), nullptr, nullptr, rows,
                              C, c.node.attrs().f("eps"));
    return y;
  });
}

Tensor rmsnorm_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::rmsnorm_forward<T>(x.data<T>(), c.in[1].data<T>(), y.data<T>(), nullptr, rows, C, c.node.attrs().f("eps"));
    return y;
  });
}

Tensor softmax_cpu(const KernelCall& c) {
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
Tensor rope_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  Tensor pos = ids64(c.in[1]);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    auto kernel = kBackward ? cpu::rope_backward<T> : cpu::rope_forward<T>;
    kernel(x.data<T>(), pos.data<int64_t>(), y.data<T>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
           c.node.attrs().f("theta"));
    return y;
  });
}

// o [B, N, Sq, D]; extra output 1: lse [B, N, Sq] (saved for the backward)
Tensor sdpa_cpu(const KernelCall& c) {
  const Tensor q = c.in[0].contiguous(), k = c.in[1].contiguous(), v = c.in[2].contiguous();
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor y = out_like(c, q.dtype());
    Tensor lse = extra_like(c, {q.dim(0), q.dim(1), q.dim(2)}, q.dtype());
    cpu::sdpa_forward<T>(q.data<T>(), k.data<T>(), v.data<T>(), y.data<T>(), lse.data<T>(), q.dim(0), q.dim(1),
                         k.dim(1), q.dim(2), k.dim(2), q.dim(3), c.node.attrs().f("scale"), c.node.attrs().b("causal"));
    c.extras.push_back(lse);
    return y;
  });
}

// dq; extra outputs dk, dv. Inputs: q, k, v, o, lse, dout.
Tensor sdpa_backward_cpu(const KernelCall& c) {
  std::vector<Tensor> t;
  for (const Tensor& x : c.in) t.push_back(x.contiguous());
  const Tensor &q = t[0], &k = t[1], &v = t[2];
  return by_float(c, q.dtype(), [&]<class T>() {
    Tensor dq = out_like(c, q.dtype());
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    cpu::sdpa_backward<T>(q.data<T>(), k.data<T>(), v.data<T>(), t[3].data<T>(), t[4].data<T>(), t[5].data<T>(),
                          dq.data<T>(), dk.data<T>(), dv.data<T>(), q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2),
                          q.dim(3), c.node.attrs().f("scale"), c.node.attrs().b("causal"));
    return dq;
  });
}

Tensor cross_entropy_sum_cpu(const KernelCall& c) {
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

Tensor count_valid_cpu(const KernelCall& c) {
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


Tensor full_cpu(const KernelCall& c) {
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
Tensor sum_to_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous();
  Shape out_full(static_cast<size_t>(x.rank()) - c.out_shape.size(), 1);
  out_full.insert(out_full.end(), c.out_shape.begin(), c.out_shape.end());
  AUTOSP_ASSERT(x.rank() <= cpu::kMaxRank, "rank ", x.rank(), " too large");
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
Tensor embedding_backward_cpu(const KernelCall& c) {
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
Tensor unary_backward_cpu(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous();
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::unary_backward<T>(kOp, dy.data<T>(), x.data<T>(), y.data<T>(), x.numel());
    return y;
  });
}

// dy [.., end-start, ..] placed at [start, end) of dim d of a zero tensor.
Tensor slice_backward_cpu(const KernelCall& c) {
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
Tensor layernorm_backward_cpu(const KernelCall& c) {
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
Tensor rmsnorm_backward_cpu(const KernelCall& c) {
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

Tensor softmax_backward_cpu(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), y = c.in[1].contiguous();
  const int64_t C = y.dim(-1), rows = y.numel() / C;
  return by_float(c, y.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, y.dtype());
    cpu::softmax_backward<T>(dy.data<T>(), y.data<T>(), dx.data<T>(), rows, C);
    return dx;
  });
}

// dlogits = g · (softmax(logits) - onehot(labels)). Inputs: logits, labels, g (scalar).
Tensor cross_entropy_backward_cpu(const KernelCall& c) {
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

Tensor causal_mask_cpu(const KernelCall& c) {
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
Tensor all_to_all_cpu(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, "all_to_all without a communicator");
  Tensor send = copy_view(c, launch::all_to_all_send_view(c, c.in[0].contiguous(), *c.comm), false);
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), c.alloc);
  c.comm->all_to_all(send, recv);
  return copy_view(c, launch::all_to_all_recv_view(c, recv)).reshape(c.out_shape);
}

Tensor all_reduce_cpu(const KernelCall& c) {
  AUTOSP_ASSERT(c.comm, "all_reduce without a communicator");
  Tensor y = out_like(c, c.in[0].dtype());
  std::memcpy(y.raw(), c.in[0].contiguous().raw(), y.nbytes());
  c.comm->all_reduce_sum(y);
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

// y = x converted elementwise (both contiguous, same element count).
void convert(const Tensor& x, const Tensor& y) {
  by_storage(x.dtype(), [&]<class From>() {
    by_storage(y.dtype(), [&]<class To>() { cpu::cast<From, To>(x.data<From>(), y.data<To>(), x.numel()); });
  });
}

Tensor cast_cpu(const KernelCall& c) {
  Tensor y = out_like(c, c.node.dtype());
  convert(c.in[0].contiguous(), y);
  return y;
}

// Fused residual add + norm: y = norm(x + r); extra output 1: s = x + r. Inputs: x, r, w (, b).
template <bool kRms>
Tensor add_norm_cpu(const KernelCall& c) {
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
// gelu_tanh(x + b): x [..., C], b [C].
Tensor bias_gelu_tanh_cpu(const KernelCall& c) {
  const Tensor x = c.in[0].contiguous(), b = c.in[1].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    cpu::bias_gelu_tanh<T>(x.data<T>(), b.data<T>(), y.data<T>(), rows, C);
    return y;
  });
}
// dx = dy · gelu_tanh'(x + b). Inputs: dy, x, b.
Tensor bias_gelu_tanh_backward_cpu(const KernelCall& c) {
  const Tensor dy = c.in[0].contiguous(), x = c.in[1].contiguous(), b = c.in[2].contiguous();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    cpu::bias_gelu_tanh_backward<T>(dy.data<T>(), x.data<T>(), b.data<T>(), dx.data<T>(), rows, C);
    return dx;
  });
}

// bf16 on CPU is emulated: a node with a bf16 input or output runs its f32 kernel on inputs
// widened to f32, and each result is rounded once to its (bf16) type: the numerics of the CUDA
// kernels (f32 compute, one rounding per result), not their speed. Ops that only move bytes, and
// the conversion and constant ops, handle bf16 themselves.
bool emulate_bf16(const KernelCall& c) {
  switch (c.node.op()) {
    case Op::reshape: case Op::transpose: case Op::permute: case Op::slice: case Op::concat:
    case Op::slice_backward: case Op::all_to_all: case Op::cast: case Op::full: case Op::count_valid:
      return false;
    default: break;
  }
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
                        .alloc = c.alloc, .extras = extras, .comm = c.comm, .out = {}, .extra_out = {}, .attention = c.attention};
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

Tensor leaf(const KernelCall& c) {
  AUTOSP_ASSERT(false, "node ", c.node.name(), " is resolved by the executor, not dispatched");
  return {};
}

[[maybe_unused]] Tensor no_cuda(const KernelCall& c) {
  throw RuntimeFailure(str(c.node.op_name(), " has no CUDA kernel"));
}

using cpu::Binary;
using cpu::Unary;
constexpr std::array<KernelRow, kNumOps> kKernels{{
    {Op::input, leaf, leaf},
    {Op::parameter, leaf, leaf},
    {Op::embedding, embedding_cpu, AUTOSP_CUDA(embedding)},
    {Op::matmul, matmul_cpu, AUTOSP_CUDA(matmul)},
    {Op::add, binary_cpu<Binary::add>, AUTOSP_CUDA(binary<Binary::add>)},
    {Op::sub, binary_cpu<Binary::sub>, AUTOSP_CUDA(binary<Binary::sub>)},
    {Op::mul, binary_cpu<Binary::mul>, AUTOSP_CUDA(binary<Binary::mul>)},
    {Op::div, binary_cpu<Binary::div>, AUTOSP_CUDA(binary<Binary::div>)},
    {Op::scale, unary_cpu<Unary::scale>, AUTOSP_CUDA(unary<Unary::scale>)},
    {Op::neg, unary_cpu<Unary::neg>, AUTOSP_CUDA(unary<Unary::neg>)},
    {Op::exp, unary_cpu<Unary::exp>, AUTOSP_CUDA(unary<Unary::exp>)},
    {Op::gelu_tanh, unary_cpu<Unary::gelu_tanh>, AUTOSP_CUDA(unary<Unary::gelu_tanh>)},
    {Op::silu, unary_cpu<Unary::silu>, AUTOSP_CUDA(unary<Unary::silu>)},
    {Op::reshape, reshape_cpu, AUTOSP_CUDA(reshape)},
    {Op::transpose, permute_cpu, AUTOSP_CUDA(permute)},
    {Op::permute, permute_cpu, AUTOSP_CUDA(permute)},
    {Op::slice, slice_cpu, AUTOSP_CUDA(slice)},
    {Op::concat, concat_cpu, AUTOSP_CUDA(concat)},
    {Op::layernorm, layernorm_cpu, AUTOSP_CUDA(layernorm)},
    {Op::rmsnorm, rmsnorm_cpu, AUTOSP_CUDA(rmsnorm)},
    {Op::softmax, softmax_cpu, AUTOSP_CUDA(softmax)},
    {Op::rope, rope_cpu<false>, AUTOSP_CUDA(rope<false>)},
    {Op::sdpa, sdpa_cpu, AUTOSP_CUDA(sdpa)},
    {Op::cross_entropy_sum, cross_entropy_sum_cpu, AUTOSP_CUDA(cross_entropy_sum)},
    {Op::count_valid, count_valid_cpu, AUTOSP_CUDA(count_valid)},
    {Op::full, full_cpu, AUTOSP_CUDA(full)},
    {Op::output, leaf, leaf},
    {Op::causal_mask, causal_mask_cpu, AUTOSP_CUDA(causal_mask)},
    {Op::all_to_all, all_to_all_cpu, AUTOSP_CUDA(all_to_all)},
    {Op::all_reduce, all_reduce_cpu, AUTOSP_CUDA(all_reduce)},
    {Op::sum_to, sum_to_cpu, AUTOSP_CUDA(sum_to)},
    {Op::embedding_backward, embedding_backward_cpu, AUTOSP_CUDA(embedding_backward)},
    {Op::gelu_tanh_backward, unary_backward_cpu<cpu::UnaryGrad::gelu_tanh>, AUTOSP_CUDA(unary_backward<cpu::UnaryGrad::gelu_tanh>)},
    {Op::silu_backward, unary_backward_cpu<cpu::UnaryGrad::silu>, AUTOSP_CUDA(unary_backward<cpu::UnaryGrad::silu>)},
    {Op::slice_backward, slice_backward_cpu, AUTOSP_CUDA(slice_backward)},
    {Op::layernorm_backward, layernorm_backward_cpu, AUTOSP_CUDA(layernorm_backward)},
    {Op::rmsnorm_backward, rmsnorm_backward_cpu, AUTOSP_CUDA(rmsnorm_backward)},
    {Op::softmax_backward, softmax_backward_cpu, AUTOSP_CUDA(softmax_backward)},
    {Op::rope_backward, rope_cpu<true>, AUTOSP_CUDA(rope<true>)},
    {Op::sdpa_backward, sdpa_backward_cpu, AUTOSP_CUDA(sdpa_backward)},
    {Op::cross_entropy_backward, cross_entropy_backward_cpu, AUTOSP_CUDA(cross_entropy_backward)},
    {Op::cast, cast_cpu, AUTOSP_CUDA(cast)},
    {Op::add_layernorm, add_norm_cpu<false>, AUTOSP_CUDA(add_layernorm)},
    {Op::add_rmsnorm, add_norm_cpu<true>, AUTOSP_CUDA(add_rmsnorm)},
    {Op::bias_gelu_tanh, bias_gelu_tanh_cpu, AUTOSP_CUDA(bias_gelu_tanh)},
    {Op::bias_gelu_tanh_backward, bias_gelu_tanh_backward_cpu, AUTOSP_CUDA(bias_gelu_tanh_backward)},
}};

constexpr bool kernels_in_order() {
  for (size_t i = 0; i < kKernels.size(); ++i)
    if (static_cast<size_t>(kKernels[i].op) != i || !kKernels[i].cpu || !kKernels[i].cuda) return false;
  return true;
}
static_assert(kKernels.size() == kNumOps, "every op needs a row in the kernel dispatch table");
static_assert(kernels_in_order(), "dispatch rows must follow the Op enum order and name both launchers");

}  // namespace

namespace launch {

int axis(int64_t d, int rank) { return static_cast<int>(d < 0 ? d + rank : d); }

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  Shape st(out.size(), 0);
  const size_t off = out.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) st[off + i] = t.shape()[i] == 1 && out[off + i] != 1 ? 0 : t.strides()[i];
  return st;
}

Tensor permuted_view(const KernelCall& c, const Tensor& x) {
  std::vector<int64_t> perm;
  if (c.node.op() == Op::transpose) {
    for (int i = 0; i < x.rank(); ++i) perm.push_back(i);
    std::swap(perm[axis(c.node.attrs().i("dim0"), x.rank())], perm[axis(c.node.attrs().i("dim1"), x.rank())]);
  } else {
    for (int64_t p : c.node.attrs().ints("perm")) perm.push_back(axis(p, x.rank()));
  }
  Shape sh, st;
  for (int64_t p : perm) {
    sh.push_back(x.shape()[p]);
    st.push_back(x.strides()[p]);
  }
  return x.as_strided(sh, st, 0);
}

Tensor slice_view(const KernelCall& c, const Tensor& x) {
  const int d = axis(c.node.attrs().i("dim"), x.rank());
  const int64_t start = c.node.attrs().dim("start").eval(c.bindings);
  const int64_t end = c.node.attrs().dim("end").eval(c.bindings);
  if (start < 0 || end < start || end > x.dim(d))
    throw UsageError(str("[slice] ", c.node.name(), ": bounds [", start, ", ", end, ") outside dim ", d, " of ", x.str()));
  Shape sh = x.shape();
  sh[d] = end - start;
  return x.as_strided(sh, x.strides(), start * x.strides()[d]);
}

Tensor all_to_all_send_view(const KernelCall& c, const Tensor& x, const Communicator& comm) {
  const int64_t P = c.node.attrs().i("group_size");
  if (comm.size() != P)
    throw RuntimeFailure(str("[all_to_all] ", c.node.name(), ": group '", c.node.attrs().s("group"), "' has ",
                             comm.size(), " ranks, the graph was built for ", P));
  // Dim s split as (P, s/P), P moved to the front.
  const int s = axis(c.node.attrs().i("scatter_dim"), x.rank());
  Shape sh{P}, st{x.dim(s) / P * x.strides()[s]};
  for (int d = 0; d < x.rank(); ++d) {
    sh.push_back(d == s ? x.dim(s) / P : x.dim(d));
    st.push_back(x.strides()[d]);
  }
  return x.as_strided(sh, st, 0);
}

Tensor all_to_all_recv_view(const KernelCall& c, const Tensor& recv) {
  // recv [P, chunk...]: move P next to the gather dim (g + 1 in recv), to be merged with it.
  const int rank = recv.rank() - 1;
  const int g = axis(c.node.attrs().i("gather_dim"), rank);
  Shape sh, st;
  for (int d = 1; d <= rank; ++d) {
    if (d == g + 1) {
      sh.push_back(recv.shape()[0]);
      st.push_back(recv.strides()[0]);
    }
    sh.push_back(recv.shape()[d]);
    st.push_back(recv.strides()[d]);
  }
  return recv.as_strided(sh, st, 0);
}

}  // namespace launch

Tensor dispatch(const KernelCall& call, DeviceKind device) {
  const KernelRow& row = kKernels[static_cast<size_t>(call.node.op())];
  if (device == DeviceKind::cuda) return row.cuda(call);
  return emulate_bf16(call) ? bf16_via_f32(call, row.cpu) : row.cpu(call);
}

}  // namespace autosp
