// The launchers of both devices, written once: each maps an op's tensors onto a kernel family of
// src/kernels/cpu or src/kernels/cuda (unpack the call, check what the kernels cannot take, place
// the outputs, pick the element type, call the kernel), and at the end the device's launcher
// table, one row per op in Op order, which engine/dispatch.cpp runs. Not an ordinary header (no
// include guard, no includes): engine/cpu/launchers.cpp and engine/cuda/launchers.cpp each include
// it once, inside their namespace (cpu_ops, cuda_ops), after the includes it needs and the
// vocabulary below, so every launcher here is compiled once per device against that device's
// kernels. Launchers whose work differs per device (sdpa, the scalar losses, the tiled MLP and
// loss, concat, two collectives, the load-balancing loss) are declared before the table and
// defined in the device files
// after it. Knows nothing of either device beyond the vocabulary.
//
// The vocabulary each device file defines (and says what it means there):
//   dev::                 the device's kernels (namespace autosp::cpu or autosp::cuda); the CPU
//                         and CUDA kernels the launchers here call take the same arguments, the
//                         CUDA ones the stream last
//   Stream, stream(c)     what the kernels are enqueued on (the CUDA compute stream; nothing on the CPU)
//   call(s, f, args...)   the kernel f on args (and the stream on CUDA)
//   input(c, i)           input i as it is (strided views allowed), on the device
//   arg(c, i)             input i contiguous on the device
//   ids64(c, i)           integer input i as contiguous int64 (i32 ids widened)
//   ptr<T>(t)             t's first element as T*
//   by_float(c, dt, f)    f.template operator()<T>() for the element type T of dt, among those
//                         the device computes in (else a UsageError naming the node and dtype);
//                         by_attention_float likewise for the attention kernels
//   constant<T>(v)        the double v in element type T
//   copy_strided(v, y, s) the strided view v copied into the contiguous y
//   convert(x, y, s)      y = x converted elementwise (both contiguous; the same dtype: a copy)
//   zero(t, s)            t's bytes set to 0
//   copy_rows(dst, dpitch, src, spitch, width, height, s)   `height` rows of `width` bytes
//   group(c)              the node's communicator, checked to carry this device's tensors
//   kRopeMaxHeadDim, kAttentionMaxHeadDim   the largest head dims the kernels take
//   kDeviceName           "CPU", "CUDA" (in messages)
// and for attention (sdpa's own launchers and ring attention's chunk pairs):
//   attn_acc_t<T>         the type the attention kernels write the log-sum-exp in (the CPU's: T,
//                         float for bf16; CUDA's: float), in which ring attention also sums its blocks
//   lse_input(c, i)       an attention backward's saved log-sum-exp, contiguous in attn_acc_t
//   sinks_input(c, i)     an attention node's sinks [N], contiguous on the device, where the
//                         kernels' AttentionVariant reads them (in attn_acc_t: the CPU's f32 and
//                         f64 as they are, bf16 widened; CUDA: f32)
//   attn_pair_t<T>        the type attend and attend_backward write a ring chunk pair's o, dq, dk,
//                         dv in, before the ring merges and sums them in attn_acc_t (the CPU's:
//                         attn_acc_t, so a bf16 pair's results are summed unrounded; CUDA's: T)
//   attend<T>(s, ...), attend_backward<T>(s, ...)   the device's flash attention forward and
//                         backward on one chunk pair's operands (kernels/cpu/attention.h's
//                         arguments; the outputs in attn_pair_t)
//   variant_of<T>(c, offset)   the node's window and softcap (graph/builder.h AttentionAttrs) as
//                         the kernels' AttentionVariant (a ring chunk pair's key offset added)
//   host_ids(c, ids)      device ids readable on the host
//   pair_doc_start(c, dh, buf, s)   a chunk pair's document starts (dh, on the host) where the
//                         kernels read them (on CUDA uploaded into buf)
//   add_into<P>(y, x, n, scratch, s)   y (attn_acc_t) += x (P: attn_pair_t or attn_acc_t) over n
//                         elements
//   kAddIntoWidens        whether add_into needs `scratch` (n attn_acc_t) to widen a P that is
//                         not attn_acc_t (CUDA: it casts, then adds; the CPU's P is attn_acc_t)

namespace {

// A rope node's rope_scaling attributes (Builder::rope; none when absent).
kernels::RopeScaling rope_scaling_of(const Node& n) {
  kernels::RopeScaling s;
  if (!n.attrs().has("rope_type")) return s;
  const std::string& type = n.attrs().s("rope_type");
  AUTOSP_ASSERT(type == "linear" || type == "llama3" || type == "yarn", "rope_type ", type);
  s.kind = type == "linear" ? kernels::RopeScaling::linear
           : type == "llama3" ? kernels::RopeScaling::llama3
                              : kernels::RopeScaling::yarn;
  s.factor = n.attrs().f("factor");
  if (s.kind == kernels::RopeScaling::llama3) {
    s.low_freq_factor = n.attrs().f("low_freq_factor");
    s.high_freq_factor = n.attrs().f("high_freq_factor");
    s.original_max_position_embeddings = n.attrs().f("original_max_position_embeddings");
  }
  if (s.kind == kernels::RopeScaling::yarn) {  // models/model.cpp with_rope_scaling resolves HF's defaults
    s.original_max_position_embeddings = n.attrs().f("original_max_position_embeddings");
    s.beta_fast = n.attrs().f("beta_fast");
    s.beta_slow = n.attrs().f("beta_slow");
    s.attention_factor = n.attrs().f("attention_factor");
    s.mscale = n.attrs().f("mscale");
    s.mscale_all_dim = n.attrs().f("mscale_all_dim");
    s.truncate = n.attrs().f("truncate") != 0;
  }
  return s;
}

// A dpo_loss node's attributes as its kernels take them (kernels/dpo.h).
kernels::DpoArgs dpo_args(const Node& n) {
  const auto& a = n.attrs();
  return {.beta = a.f("beta"), .ipo = a.s("loss_type") == "ipo", .label_smoothing = a.f("label_smoothing"),
          .rpo_alpha = a.f("rpo_alpha"), .share = a.f("share")};
}

// A head dim the device's kernels do not take, as a UsageError naming the node (kernels only assert).
void check_head_dim(const KernelCall& c, int64_t D, int64_t max, const char* kernel) {
  if (D > max)
    throw UsageError(str("[", c.node.op_name(), "] ", c.node.name(), ": head dim ", D, " > ", max, ", which the ",
                         kDeviceName, " ", kernel, " kernels do not support"));
}

// A strided view materialised as a contiguous tensor: the node's output (reshaped to the view's
// shape) when `as_output`, else a temporary.
Tensor copy_view(const KernelCall& c, const Tensor& view, bool as_output = true) {
  Tensor y = as_output ? out_like(c, view.dtype()).reshape(view.shape()) : Tensor::empty(view.shape(), view.dtype(), c.alloc);
  copy_strided(view, y, stream(c));
  return y;
}

// The operands sdpa and ring_attention share, contiguous on the device and checked: q, k, v and the
// optional document starts (as i64) and sinks (sinks_input; graph/builder.h attention_inputs);
// their backward adds o, lse (lse_input) and dout (inputs 3-5) before the optional ones.
struct AttentionArgs {
  Tensor q, k, v, o, lse, dout, docs, sinks;
  const int64_t* doc_start() const { return docs.defined() ? ptr<int64_t>(docs) : nullptr; }
};
AttentionArgs attention_args(const KernelCall& c, bool backward) {
  AttentionArgs args;
  args.q = arg(c, 0);
  args.k = arg(c, 1);
  args.v = arg(c, 2);
  if (backward) {
    args.o = arg(c, 3);
    args.lse = lse_input(c, 4);
    args.dout = arg(c, 5);
  }
  const AttentionInputs opt = attention_inputs(c.node);
  size_t i = opt.first;
  if (opt.doc_start) args.docs = ids64(c, i++);
  if (opt.sinks) args.sinks = sinks_input(c, i);
  check_head_dim(c, args.q.dim(3), kAttentionMaxHeadDim, "attention");
  return args;
}

// The variant with the sinks (when the node has them) and where their gradient goes (null: not
// computed). V is the kernels' variant type, which the caller has the sinks in.
template <class V>
AttentionVariant<V> with_sinks(AttentionVariant<V> var, const AttentionArgs& args, V* dsinks = nullptr) {
  if (!args.sinks.defined()) return var;
  var.sinks = ptr<V>(args.sinks);
  var.dsinks = dsinks;
  return var;
}

}  // namespace

// ---- dense algebra ----

// w [V, C], ids [...] → y [..., C]
Tensor embedding(const KernelCall& c) {
  const Tensor w = arg(c, 0), ids = ids64(c, 1);
  const Stream s = stream(c);
  return by_float(c, w.dtype(), [&]<class T>() {
    Tensor y = out_like(c, w.dtype());
    call(s, dev::embedding_forward<T>, ptr<T>(w), ptr<int64_t>(ids), ptr<T>(y), ids.numel(), w.dim(0), w.dim(1));
    return y;
  });
}

// a [..., M, K] (stored [..., K, M] when trans_a) · b [(...,) K, N] (stored [N, K] when trans_b)
// as one batched GEMM (gemm_batched's arguments; a 2-D b is broadcast over the batch).
struct MatmulGemm {
  bool ta, tb;
  int64_t batch, M, N, K, stride_a, stride_b, stride_c;
};
MatmulGemm matmul_gemm(const KernelCall& c, const Tensor& a, const Tensor& b) {
  const bool ta = c.node.attrs().b("trans_a"), tb = c.node.attrs().b("trans_b");
  const int r = a.rank();
  const int64_t M = c.out_shape[r - 2], N = c.out_shape[r - 1], K = a.dim(ta ? -2 : -1);
  const int64_t batch = a.numel() / (a.dim(-1) * a.dim(-2));
  if (b.rank() == 2 && !ta) return {false, tb, 1, batch * M, N, K, 0, 0, 0};  // [..., M, K] · [K, N]: batch·M rows
  return {ta, tb, batch, M, N, K, M * K, b.rank() == 2 ? 0 : K * N, M * N};
}

Tensor matmul(const KernelCall& c) {
  const Tensor a = arg(c, 0), b = arg(c, 1);
  const MatmulGemm g = matmul_gemm(c, a, b);
  const Stream s = stream(c);
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (y.numel() == 0) return y;
    if (g.K == 0) {  // an empty sum
      zero(y, s);
      return y;
    }
    call(s, dev::gemm_batched<T>, g.ta, g.tb, g.batch, g.M, g.N, g.K, 1.0, ptr<T>(a), g.stride_a, ptr<T>(b), g.stride_b,
         0.0, ptr<T>(y), g.stride_c);
    return y;
  });
}

// ---- elementwise ----

// a, b broadcast (right-aligned) to the output: strides of 0 on their broadcast dims.
template <kernels::Binary kOp>
Tensor binary(const KernelCall& c) {
  const Tensor &a = input(c, 0), &b = input(c, 1);
  const Shape& out = c.out_shape;
  AUTOSP_ASSERT(static_cast<int>(out.size()) <= kMaxRank, "rank ", out.size(), " too large");
  const Shape sa = launch::broadcast_strides(a, out), sb = launch::broadcast_strides(b, out);
  const Stream s = stream(c);
  return by_float(c, a.dtype(), [&]<class T>() {
    Tensor y = out_like(c, a.dtype());
    if (out.empty()) {
      const Shape one{1}, z{0};
      call(s, dev::binary<T>, kOp, 1, one.data(), ptr<T>(a), z.data(), ptr<T>(b), z.data(), ptr<T>(y));
    } else {
      call(s, dev::binary<T>, kOp, static_cast<int>(out.size()), out.data(), ptr<T>(a), sa.data(), ptr<T>(b),
           sb.data(), ptr<T>(y));
    }
    return y;
  });
}

template <kernels::Unary kOp>
Tensor unary(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const double factor = kOp == kernels::Unary::scale ? c.node.attrs().f("factor") : 0.0;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::unary<T>, kOp, ptr<T>(x), ptr<T>(y), x.numel(), factor);
    return y;
  });
}

// Inverted dropout: x [..., C] masked by token_index [...] (kernels/kinds.h). Its backward is
// itself (the vjp applies the same mask to dy).
Tensor dropout(const KernelCall& c) {
  const Tensor x = arg(c, 0), token = ids64(c, 1);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double p = c.node.attrs().f("p");
  const uint64_t seed = static_cast<uint64_t>(c.node.attrs().i("seed")), threshold = kernels::dropout_threshold(p);
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::dropout<T>, ptr<T>(x), ptr<int64_t>(token), ptr<T>(y), rows, C, seed, threshold, 1.0 / (1.0 - p));
    return y;
  });
}

// dx = dy · f'(x). Inputs: dy, x.
template <kernels::UnaryGrad kOp>
Tensor unary_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1);
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    call(s, dev::unary_backward<T>, kOp, ptr<T>(dy), ptr<T>(x), ptr<T>(dx), x.numel());
    return dx;
  });
}

Tensor cast(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, c.node.dtype());
  convert(x, y, stream(c));
  return y;
}

// ---- layout ----

Tensor reshape(const KernelCall& c) { return arg(c, 0).reshape(c.out_shape); }

// transpose and permute
Tensor permute(const KernelCall& c) { return copy_view(c, launch::permuted_view(c, input(c, 0))); }

Tensor slice(const KernelCall& c) { return copy_view(c, launch::slice_view(c, input(c, 0))); }

// dy [.., end-start, ..] placed at [start, end) of dim d of a zero tensor: one row of
// (end-start)·inner elements per index over the dims before d.
Tensor slice_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0);
  const int d = launch::axis(c.node.attrs().i("dim"), dy.rank());
  const int64_t start = c.node.attrs().dim("start").eval(c.bindings);
  const Stream s = stream(c);
  Tensor y = out_like(c, dy.dtype());
  zero(y, s);
  const size_t es = dtype_size(dy.dtype());
  const int64_t outer = shape_numel(std::span(dy.shape()).first(d));
  const int64_t inner = shape_numel(std::span(dy.shape()).subspan(d + 1));
  const int64_t rows_in = dy.dim(d), rows_out = c.out_shape[d];
  const size_t width = static_cast<size_t>(rows_in * inner) * es;
  copy_rows(static_cast<char*>(y.raw()) + start * inner * es, rows_out * inner * es, dy.raw(), width, width, outer, s);
  return y;
}

// ---- normalisation (over the last dim: rows [R, C]) ----

Tensor layernorm(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1), b = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::layernorm_forward<T>, ptr<T>(x), ptr<T>(w), ptr<T>(b), ptr<T>(y), nullptr, nullptr, rows, C,
         c.node.attrs().f("eps"));
    return y;
  });
}

Tensor rmsnorm(const KernelCall& c) {
  const Tensor x = arg(c, 0), w = arg(c, 1);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::rmsnorm_forward<T>, ptr<T>(x), ptr<T>(w), ptr<T>(y), nullptr, rows, C, c.node.attrs().f("eps"));
    return y;
  });
}

Tensor softmax(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::softmax_forward<T>, ptr<T>(x), ptr<T>(y), rows, C);
    return y;
  });
}

// dx; extra outputs dw, db. Inputs: dy, x, w.
Tensor layernorm_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), w = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    Tensor db = extra_like(c, {C}, x.dtype());
    c.extras.push_back(db);
    call(s, dev::layernorm_backward<T>, ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(dx), ptr<T>(dw), ptr<T>(db), rows, C,
         eps);
    return dx;
  });
}

// dx; extra output dw. Inputs: dy, x, w.
Tensor rmsnorm_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), w = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const double eps = c.node.attrs().f("eps");
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    Tensor dw = extra_like(c, {C}, x.dtype());
    c.extras.push_back(dw);
    call(s, dev::rmsnorm_backward_input<T>, ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(dx), rows, C, eps);
    call(s, dev::rmsnorm_backward_weight<T>, ptr<T>(dy), ptr<T>(x), ptr<T>(dw), rows, C, eps);
    return dx;
  });
}

// dx. Inputs: dy, y (the softmax's output).
Tensor softmax_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), y = arg(c, 1);
  const int64_t C = y.dim(-1), rows = y.numel() / C;
  const Stream s = stream(c);
  return by_float(c, y.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, y.dtype());
    call(s, dev::softmax_backward<T>, ptr<T>(dy), ptr<T>(y), ptr<T>(dx), rows, C);
    return dx;
  });
}

// ---- position, masks ----

// Rotary embedding and its backward (the rotation by minus the angle): x or dy [B, N, S, D],
// position_ids [B, S].
template <bool kBackward>
Tensor rope(const KernelCall& c) {
  const Tensor x = arg(c, 0), pos = ids64(c, 1);
  check_head_dim(c, x.dim(3), kRopeMaxHeadDim, "rope");
  const kernels::RopeScaling scaling = rope_scaling_of(c.node);
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, kBackward ? dev::rope_backward<T> : dev::rope_forward<T>, ptr<T>(x), ptr<int64_t>(pos), ptr<T>(y),
         x.dim(0), x.dim(1), x.dim(2), x.dim(3), c.node.attrs().f("theta"), scaling);
    return y;
  });
}

// x [..., Sq, Skv] with the entries above the (bottom-right aligned) causal diagonal set to `value`.
Tensor causal_mask(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  const int64_t Sq = x.dim(-2), Skv = x.dim(-1);
  const double value = c.node.attrs().f("value");
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::causal_mask<T>, ptr<T>(x), ptr<T>(y), x.numel() / std::max<int64_t>(1, Sq * Skv), Sq, Skv,
         constant<T>(value));
    return y;
  });
}

// ---- reductions, embedding gradient ----

// x [..] summed to out [..] (right-aligned; padded with leading 1s to x's rank for the kernel)
Tensor sum_to(const KernelCall& c) {
  const Tensor x = arg(c, 0);
  Shape out_full(static_cast<size_t>(x.rank()) - c.out_shape.size(), 1);
  out_full.insert(out_full.end(), c.out_shape.begin(), c.out_shape.end());
  AUTOSP_ASSERT(x.rank() <= kMaxRank, "rank ", x.rank(), " too large");
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    if (x.rank() == 0)
      convert(x, y, s);
    else
      call(s, dev::sum_to<T>, ptr<T>(x), x.rank(), x.shape().data(), out_full.data(), ptr<T>(y));
    return y;
  });
}

// An embedding_backward node's padding_idx attribute (HF's nn.Embedding padding_idx): that row of
// its dweight y [V, C] is set to 0 (every launcher of the op calls this after its kernel).
void zero_padding_row(const KernelCall& c, const Tensor& y, Stream s) {
  if (!c.node.attrs().has("padding_idx")) return;
  const int64_t row = c.node.attrs().i("padding_idx"), C = c.out_shape[1];
  zero(Tensor::view_bytes(y, size_t(row * C) * dtype_size(y.dtype()), {C}, y.dtype()), s);
}

// dy [..., C], ids [...] → dweight [V, C] (the padding_idx row 0)
Tensor embedding_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), ids = ids64(c, 1);
  const Stream s = stream(c);
  return by_float(c, dy.dtype(), [&]<class T>() {
    Tensor y = out_like(c, dy.dtype());
    call(s, dev::embedding_backward<T>, ptr<T>(dy), ptr<int64_t>(ids), ptr<T>(y), ids.numel(), c.out_shape[0],
         c.out_shape[1]);
    zero_padding_row(c, y, s);
    return y;
  });
}

// ---- ZeRO-3's collectives ----

// The whole parameter from every rank's shard, straight into the output when the shards tile it,
// else through a padded buffer whose first elements are copied out once it has arrived. In the
// background when the executor asks (KernelCall::pending: the parameter prefetch; NCCL then runs
// it on its stream beside the compute stream's kernels until the handle is waited for). The
// handle holds every buffer the collective touches; its follow-up, the copy out of a padded
// buffer, runs after the join (on the compute stream).
Tensor all_gather(const KernelCall& c) {
  Communicator& comm = group(c);
  (void)launch::shard_group(c);  // the group's size against the graph's
  const Tensor x = arg(c, 0);
  Tensor y = out_like(c, x.dtype());
  const launch::ShardLayout l = launch::shard_layout(comm, y.numel());
  Tensor into = l.direct() ? y.reshape({y.numel()}) : Tensor::empty(l.padded(), x.dtype(), c.alloc);
  auto copy_out = [direct = l.direct(), x, into, y, s = stream(c)] {
    if (!direct) convert(Tensor::view_bytes(into, 0, y.shape(), y.dtype()), y, s);
  };
  if (!c.pending) {
    comm.all_gather(x, into);
    copy_out();
    return y;
  }
  *c.pending = followed_by(comm.all_gather_async(x, into), copy_out);
  return y;
}

// The whole gradient summed over the group, this rank's shard of it (padded with zeros past the
// whole tensor's elements). Sent as it is when it needs neither a cast nor padding, else in
// pieces through the staging (launch::ScatterPieces: the planned workspace, or its own), cast and
// zero-filled by the device (on CUDA on the compute stream, which NCCL's stream waits for before
// each piece). In the background when the executor asks and one piece does it; the handle keeps
// what it reads alive.
Tensor reduce_scatter(const KernelCall& c) {
  Communicator& comm = group(c);
  (void)launch::shard_group(c);
  const Tensor g = arg(c, 0);
  Tensor y = out_like(c, c.node.dtype());
  const launch::ScatterPieces p = launch::scatter_pieces(launch::shard_layout(comm, g.numel()), g.dtype(), y.dtype());
  if (p.staged) {
    const Tensor staging = launch::reduce_scatter_staging(c, p);
    const Stream s = stream(c);
    const launch::DeviceFill fill{.convert = [s](const Tensor& from, const Tensor& to) { convert(from, to, s); },
                                  .zero = [s](const Tensor& t) { zero(t, s); }};
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

// ---- fused ops (passes/fuse_elementwise) ----

// y = norm(x + r (+ rb)); extra output 1: that sum. Inputs: x, r, w (, b) (, rb: r's bias).
template <bool kRms>
Tensor add_norm(const KernelCall& c) {
  const Tensor x = arg(c, 0), r = arg(c, 1), w = arg(c, 2);
  const Tensor b = kRms ? Tensor() : arg(c, 3);
  const size_t rb_at = kRms ? 3 : 4;
  const Tensor rb = c.in.size() > rb_at ? arg(c, rb_at) : Tensor();
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    Tensor sum = extra_like(c, x.shape(), x.dtype());
    c.extras.push_back(sum);
    call(s, dev::add_norm_forward<T>, ptr<T>(x), ptr<T>(r), rb.defined() ? ptr<T>(rb) : nullptr, ptr<T>(w),
         kRms ? nullptr : ptr<T>(b), ptr<T>(y), ptr<T>(sum), rows, C, c.node.attrs().f("eps"), kRms);
    return y;
  });
}

// gelu_tanh(x + b): x [..., C], b [C].
Tensor bias_gelu_tanh(const KernelCall& c) {
  const Tensor x = arg(c, 0), b = arg(c, 1);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor y = out_like(c, x.dtype());
    call(s, dev::bias_gelu_tanh<T>, ptr<T>(x), ptr<T>(b), ptr<T>(y), rows, C);
    return y;
  });
}

// q, k, v [B, N, S, D] from x [B, S, 3·N·D] + b [3·N·D] (k and v the extra outputs 1, 2).
Tensor qkv_heads(const KernelCall& c) {
  const Tensor x = arg(c, 0), b = arg(c, 1);
  const int64_t B = c.out_shape[0], N = c.out_shape[1], S = c.out_shape[2], D = c.out_shape[3];
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor q = out_like(c, x.dtype());
    Tensor k = extra_like(c, q.shape(), x.dtype());  // extra_like places extras in push order
    c.extras.push_back(k);
    Tensor v = extra_like(c, q.shape(), x.dtype());
    c.extras.push_back(v);
    call(s, dev::qkv_heads<T>, ptr<T>(x), ptr<T>(b), ptr<T>(q), ptr<T>(k), ptr<T>(v), B, S, N, D);
    return q;
  });
}

// dx [B, S, 3·N·D] from dq, dk, dv [B, N, S, D]; extra output 1: db [3·N·D].
Tensor qkv_heads_backward(const KernelCall& c) {
  const Tensor dq = arg(c, 0), dk = arg(c, 1), dv = arg(c, 2);
  const int64_t B = dq.dim(0), N = dq.dim(1), S = dq.dim(2), D = dq.dim(3);
  const Stream s = stream(c);
  return by_float(c, dq.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, dq.dtype());
    Tensor db = extra_like(c, {3 * N * D}, dq.dtype());
    c.extras.push_back(db);
    call(s, dev::qkv_heads_backward<T>, ptr<T>(dq), ptr<T>(dk), ptr<T>(dv), ptr<T>(dx), ptr<T>(db), B, S, N, D);
    return dx;
  });
}

// dx = dy · gelu_tanh'(x + b). Inputs: dy, x, b.
Tensor bias_gelu_tanh_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), x = arg(c, 1), b = arg(c, 2);
  const int64_t C = x.dim(-1), rows = x.numel() / C;
  const Stream s = stream(c);
  return by_float(c, x.dtype(), [&]<class T>() {
    Tensor dx = out_like(c, x.dtype());
    call(s, dev::bias_gelu_tanh_backward<T>, ptr<T>(dy), ptr<T>(x), ptr<T>(b), ptr<T>(dx), rows, C);
    return dx;
  });
}

// silu(g) · u: g, u of one shape.
Tensor swiglu(const KernelCall& c) {
  const Tensor g = arg(c, 0), u = arg(c, 1);
  const Stream s = stream(c);
  return by_float(c, g.dtype(), [&]<class T>() {
    Tensor h = out_like(c, g.dtype());
    call(s, dev::swiglu<T>, ptr<T>(g), ptr<T>(u), ptr<T>(h), g.numel());
    return h;
  });
}

// dg; extra output du. Inputs: dy, g, u.
Tensor swiglu_backward(const KernelCall& c) {
  const Tensor dy = arg(c, 0), g = arg(c, 1), u = arg(c, 2);
  const Stream s = stream(c);
  return by_float(c, g.dtype(), [&]<class T>() {
    Tensor dg = out_like(c, g.dtype());
    Tensor du = extra_like(c, u.shape(), g.dtype());
    c.extras.push_back(du);
    call(s, dev::swiglu_backward<T>, ptr<T>(dy), ptr<T>(g), ptr<T>(u), ptr<T>(dg), ptr<T>(du), g.numel());
    return dg;
  });
}

// ---- ring attention (engine/ring.h: the schedule, the zigzag layout, the windowed exchange) ----
//
// The launchers keep the query-side operands in halves: x [B, H, L, D] (L = 2c, this rank's zigzag
// chunks side by side) as [2, B, H, c, D], so each chunk is a contiguous sdpa operand; a K/V block
// is one buffer [chunk 0: k | v][chunk 1: k | v], sent around the ring as one message (NCCL's
// send/recv on its own stream overlaps the current block's kernels), and under a window only
// the tails of its chunks a rank needs travel, as messages of [k | v] per tail. Each step attends
// the two query chunks to the key chunks (or tails) it holds, chunk pair by chunk pair: a key
// chunk after the query chunk is skipped (causal), the same chunk is the causal diagonal, an
// earlier one is full or cut by the window; with document starts (read to the host once per
// call, where the skips are decided), a pair whose keys all lie before every query's document is
// skipped too (never visited, not masked). Sinks go with each query chunk's own pair only
// (RingChunks::own): its block's log-sum-exp includes exp(sink), so the merged one counts it once;
// the backward reads the merged lse and o, so that pair's dsinks is the whole sum for its rows.
// The running output, its log-sum-exp and the gradients are summed in attn_acc_t (f32 for bf16 on
// both devices, and on CUDA for every T: a bf16 model's blocks are merged and summed in f32, the
// dK/dV partials travel in f32, and each result is rounded once at the end). A pair's own o, dq,
// dk, dv come in attn_pair_t: on the CPU in attn_acc_t too (unrounded), on CUDA in T (a bf16
// pair's rounded to bf16 before they are summed).
namespace {

// Rows [first, first + n) of dim 2 of x [B, H, L, D], as a strided view [B, H, n, D].
Tensor rows_view(const Tensor& x, int64_t first, int64_t n) {
  const int64_t H = x.dim(1), L = x.dim(2), D = x.dim(3);
  return x.as_strided({x.dim(0), H, n, D}, {H * L * D, L * D, D, 1}, first * D);
}

// This rank's block (engine/ring.h's layout) from k, v [B, Nkv, 2c, D].
Tensor kv_block(const KernelCall& c, const Tensor& k, const Tensor& v, Stream s) {
  const int64_t half = k.dim(2) / 2;
  const Shape chunk{k.dim(0), k.dim(1), half, k.dim(3)};
  Tensor kv = Tensor::empty({2, 2, k.dim(0), k.dim(1), half, k.dim(3)}, k.dtype(), c.alloc);
  const size_t bytes = k.nbytes() / 2;
  for (int64_t b = 0; b < 2; ++b) {
    copy_strided(rows_view(k, b * half, half), Tensor::view_bytes(kv, size_t(2 * b) * bytes, chunk, k.dtype()), s);
    copy_strided(rows_view(v, b * half, half), Tensor::view_bytes(kv, size_t(2 * b + 1) * bytes, chunk, v.dtype()), s);
  }
  return kv;
}

// k (which = 0) or v (1) of a block [2, 2, B, H, c, D] seen as [B, H, 2, c, D] (no data moves).
Tensor block_part(const Tensor& block, int which) {
  const int64_t B = block.dim(2), H = block.dim(3), c = block.dim(4), D = block.dim(5);
  return block.as_strided({B, H, 2, c, D}, {H * c * D, c * D, 2 * B * H * c * D, D, 1}, which * B * H * c * D);
}

// The tails of this rank's block `kv` into the message `msg`.
void pack_tails(const RingChunks& g, const Tensor& kv, const std::vector<ChunkTail>& tails, Tensor& msg, Stream s) {
  const size_t es = dtype_size(kv.dtype());
  size_t at = 0;
  for (const ChunkTail& t : tails)
    for (int which = 0; which < 2; ++which) {
      const Tensor whole = Tensor::view_bytes(kv, size_t((2 * t.chunk + which) * g.kv_rows(g.c)) * es,
                                              {g.B, g.Nkv, g.c, g.D}, kv.dtype());
      copy_strided(rows_view(whole, g.c - t.keys, t.keys),
                   Tensor::view_bytes(msg, at, {g.B, g.Nkv, t.keys, g.D}, kv.dtype()), s);
      at += size_t(g.kv_rows(t.keys)) * es;
    }
}

// own (a block's gradient, attn_acc_t) += the message `part` of gradients of its tails.
template <class A>
void add_tails(const RingChunks& g, Tensor& own, const std::vector<ChunkTail>& tails, const Tensor& part, Stream s) {
  const A* from = ptr<A>(part);
  for (const ChunkTail& t : tails)
    for (int which = 0; which < 2; ++which) {
      A* into = ptr<A>(own) + (2 * t.chunk + which) * g.kv_rows(g.c) + (g.c - t.keys) * g.D;
      for (int64_t row = 0; row < g.B * g.Nkv; ++row)  // one head's tail is contiguous
        add_into<A>(into + row * g.c * g.D, from + row * t.keys * g.D, t.keys * g.D, nullptr, s);
      from += g.kv_rows(t.keys);
    }
}

// The dtype of a chunk pair's outputs (attn_pair_t<T>) for a node of dtype dt (T's).
template <class T>
DType pair_dtype(DType dt) {
  return std::is_same_v<attn_pair_t<T>, T> ? dt : dtype_of<attn_pair_t<T>>;
}

// A [B, H, 2, c(, D)] view of the sums (attn_acc_t) into the node's tensor `dst` [B, H, 2c(, D)] of its dtype.
void from_interleaved(const KernelCall& c, const Tensor& sums, const Tensor& dst, Stream s) {
  const Shape inter = sums.shape();
  if (dst.dtype() == sums.dtype()) return copy_strided(sums, dst.reshape(inter), s);
  Tensor same = Tensor::empty(inter, sums.dtype(), c.alloc);
  copy_strided(sums, same, s);
  convert(same, dst.reshape(inter), s);
}

// Calls f(tail, k, v) for each tail of a message at p ([k | v] of each).
template <class T, class F>
void for_tails(const RingChunks& g, const std::vector<ChunkTail>& tails, T* p, F&& f) {
  for (const ChunkTail& t : tails) {
    f(t, p, p + g.kv_rows(t.keys));
    p += 2 * g.kv_rows(t.keys);
  }
}

}  // namespace

// o [B, N, L, D]; extra output 1: lse [B, N, L]. Inputs q, k, v (this rank's zigzag chunks, after
// the Ulysses all-to-all), optional document starts [B, L].
Tensor ring_attention(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, false);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  const Stream s = stream(c);
  const auto starts = host_ids(c, args.docs);
  return by_attention_float(c, q.dtype(), [&]<class T>() {
    using A = attn_acc_t<T>;
    using P = attn_pair_t<T>;
    RingChunks g = ring_chunks(c, q, k, starts.empty() ? nullptr : starts.data());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = copy_view(c, halves_view(q), false);
    Tensor o = Tensor::empty(qh.shape(), dtype_of<A>, c.alloc), lse = Tensor::empty({2, g.B, g.N, g.c}, dtype_of<A>, c.alloc);
    call(s, dev::fill<A>, ptr<A>(o), o.numel(), A(0));
    call(s, dev::fill<A>, ptr<A>(lse), lse.numel(), -std::numeric_limits<A>::infinity());
    Tensor o_blk = Tensor::empty({g.B, g.N, g.c, g.D}, pair_dtype<T>(q.dtype()), c.alloc);
    Tensor lse_blk = Tensor::empty({g.B, g.N, g.c}, dtype_of<A>, c.alloc);
    Tensor kv = kv_block(c, k, v, s), docs_blk;
    std::vector<int64_t> dh;
    const auto step = [&](int owner, const std::vector<ChunkTail>& tails, const Tensor& msg,
                          const std::function<void()>& progress) {
      g.k = g.chunks_of(owner);
      for_tails(g, tails, ptr<T>(msg), [&](const ChunkTail& t, const T* kp, const T* vp) {
        for (int a = 0; a < 2; ++a) {
          bool diagonal = false;
          if (!g.visits(a, t.chunk, diagonal, dh, t.keys)) continue;
          const auto var = variant_of<T>(c, g.offset(a, t.chunk));
          attend<T>(s, ptr<T>(qh) + g.q_half(a), kp, vp, ptr<P>(o_blk), ptr<A>(lse_blk), g.B, g.N, g.Nkv, g.c, t.keys,
                    g.D, scale, diagonal, g.doc_start ? pair_doc_start(c, dh, docs_blk, s) : nullptr,
                    g.own(a, t.chunk) ? with_sinks(var, args) : var);
          call(s, dev::merge_attention<P>, ptr<A>(o) + g.q_half(a), ptr<A>(lse) + g.lse_half(a), ptr<P>(o_blk),
               ptr<A>(lse_blk), g.B * g.N * g.c, g.D);
          progress();
        }
      });
    };
    if (g.windowed())
      window_forward(*c.comm, g, kv,
                     {[&](int64_t n) { return Tensor::empty({n}, kv.dtype(), c.alloc); },
                      [&](const std::vector<ChunkTail>& tails, Tensor& msg) { pack_tails(g, kv, tails, msg, s); }},
                     step);
    else
      ring_forward(*c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc),
                   [&](int owner, const Tensor& block, const std::function<void()>& progress) {
                     step(owner, whole_block(g.c), block, progress);
                   });
    Tensor y = out_like(c, q.dtype());
    from_interleaved(c, interleaved_view(o), y, s);
    Tensor lse_out = extra_like(c, {g.B, g.N, 2 * g.c}, extra_types(c.node).at(0).dtype);
    from_interleaved(c, interleaved_view(lse.reshape({2, g.B, g.N, g.c, 1})), lse_out, s);
    c.extras.push_back(lse_out);
    return y;
  });
}

// dq; extra outputs dk, dv (, dsinks). Inputs: q, k, v, o, lse, dout (, document starts) (, sinks).
Tensor ring_attention_backward(const KernelCall& c) {
  const AttentionArgs args = attention_args(c, true);
  const Tensor &q = args.q, &k = args.k, &v = args.v;
  const Stream s = stream(c);
  const auto starts = host_ids(c, args.docs);
  return by_attention_float(c, q.dtype(), [&]<class T>() {
    using A = attn_acc_t<T>;
    using P = attn_pair_t<T>;
    RingChunks g = ring_chunks(c, q, k, starts.empty() ? nullptr : starts.data());
    const double scale = c.node.attrs().f("scale");
    const Tensor qh = copy_view(c, halves_view(q), false), oh = copy_view(c, halves_view(args.o), false);
    const Tensor doh = copy_view(c, halves_view(args.dout), false);
    const Tensor lseh = copy_view(c, halves_view(args.lse.reshape({g.B, g.N, 2 * g.c, 1})), false);
    Tensor dqh = Tensor::empty(qh.shape(), dtype_of<A>, c.alloc);
    call(s, dev::fill<A>, ptr<A>(dqh), dqh.numel(), A(0));
    Tensor dq_blk = Tensor::empty({g.B, g.N, g.c, g.D}, pair_dtype<T>(q.dtype()), c.alloc);
    Tensor dkv_blk = Tensor::empty({2, g.B, g.Nkv, g.c, g.D}, pair_dtype<T>(q.dtype()), c.alloc);  // one pair's dk, dv
    // Where add_into widens a block's P to A (none when they are the same type or it needs none).
    const Tensor widened = std::is_same_v<A, P> || !kAddIntoWidens
                               ? Tensor()
                               : Tensor::empty({std::max(dq_blk.numel(), dkv_blk.numel())}, dtype_of<A>, c.alloc);
    A* const scratch = widened.defined() ? ptr<A>(widened) : nullptr;
    Tensor kv = kv_block(c, k, v, s), docs_blk;
    std::vector<int64_t> dh;
    // dsinks: each own pair's (overwritten by the kernel) added into their sum
    Tensor dsinks, dsinks_blk;
    if (args.sinks.defined()) {
      dsinks = Tensor::empty(args.sinks.shape(), dtype_of<A>, c.alloc);
      dsinks_blk = Tensor::empty(args.sinks.shape(), dtype_of<A>, c.alloc);
      call(s, dev::fill<A>, ptr<A>(dsinks), dsinks.numel(), A(0));
    }
    // The dK, dV of a message of tails into `part` (a message of the same tails in A).
    const auto grad_step = [&](int owner, const std::vector<ChunkTail>& tails, const Tensor& msg, Tensor& part,
                               const std::function<void()>& progress) {
      g.k = g.chunks_of(owner);
      call(s, dev::fill<A>, ptr<A>(part), part.numel(), A(0));
      A* dkp = ptr<A>(part);
      for_tails(g, tails, ptr<T>(msg), [&](const ChunkTail& t, const T* kp, const T* vp) {
        const int64_t n = g.kv_rows(t.keys);
        for (int a = 0; a < 2; ++a) {
          bool diagonal = false;
          if (!g.visits(a, t.chunk, diagonal, dh, t.keys)) continue;
          P* dkb = ptr<P>(dkv_blk);
          const bool sinks = dsinks.defined() && g.own(a, t.chunk);
          const auto var = variant_of<T>(c, g.offset(a, t.chunk));
          attend_backward<T>(s, ptr<T>(qh) + g.q_half(a), kp, vp, ptr<T>(oh) + g.q_half(a),
                             ptr<A>(lseh) + g.lse_half(a), ptr<T>(doh) + g.q_half(a), ptr<P>(dq_blk), dkb, dkb + n,
                             g.B, g.N, g.Nkv, g.c, t.keys, g.D, scale, diagonal,
                             g.doc_start ? pair_doc_start(c, dh, docs_blk, s) : nullptr,
                             sinks ? with_sinks(var, args, ptr<A>(dsinks_blk)) : var);
          if (sinks) add_into<A>(ptr<A>(dsinks), ptr<A>(dsinks_blk), dsinks.numel(), nullptr, s);
          add_into<P>(ptr<A>(dqh) + g.q_half(a), ptr<P>(dq_blk), dq_blk.numel(), scratch, s);
          add_into<P>(dkp, dkb, n, scratch, s);
          add_into<P>(dkp + n, dkb + n, n, scratch, s);
          progress();
        }
        dkp += 2 * n;
      });
    };
    const auto grad_buffer = [&](int64_t n) { return Tensor::empty({n}, dtype_of<A>, c.alloc); };
    Tensor own = Tensor::empty(kv.shape(), dtype_of<A>, c.alloc);  // this rank's whole dK, dV, in the block's layout
    if (g.windowed()) {
      window_backward(*c.comm, g, kv,
                      {[&](int64_t n) { return Tensor::empty({n}, kv.dtype(), c.alloc); },
                       [&](const std::vector<ChunkTail>& tails, Tensor& msg) { pack_tails(g, kv, tails, msg, s); }},
                      grad_buffer, own, grad_step,
                      [&](Tensor& into, const std::vector<ChunkTail>& tails, const Tensor& part) {
                        add_tails<A>(g, into, tails, part, s);
                      });
    } else {
      Tensor grads[3] = {own, Tensor::empty(kv.shape(), dtype_of<A>, c.alloc),
                         Tensor::empty(kv.shape(), dtype_of<A>, c.alloc)};
      ring_backward(
          *c.comm, kv, Tensor::empty(kv.shape(), kv.dtype(), c.alloc), grads,
          [&](int owner, const Tensor& block, Tensor& part, const std::function<void()>& progress) {
            grad_step(owner, whole_block(g.c), block, part, progress);
          },
          [&](Tensor& into, const Tensor& from) { add_into<A>(ptr<A>(into), ptr<A>(from), into.numel(), nullptr, s); });
    }
    Tensor dq = out_like(c, q.dtype());
    from_interleaved(c, interleaved_view(dqh), dq, s);
    Tensor dk = extra_like(c, k.shape(), k.dtype());
    c.extras.push_back(dk);
    Tensor dv = extra_like(c, v.shape(), v.dtype());
    c.extras.push_back(dv);
    from_interleaved(c, block_part(own, 0), dk, s);
    from_interleaved(c, block_part(own, 1), dv, s);
    if (dsinks.defined()) {  // in the node's dtype (args.sinks may be widened)
      c.extras.push_back(extra_like(c, dsinks.shape(), attention_inputs(c.node).sinks->dtype()));
      convert(dsinks, c.extras.back(), s);
    }
    return dq;
  });
}

// ---- the mixture-of-experts layer's experts (kernels/cpu/moe.h; routing: kernels/moe_routing.h) ----

// The expert parameters of a moe_experts node from input `first` on (E gates, E ups, E downs, then
// with biases E gate, E up and E down biases), as pointer arrays, and their sizes: E experts of
// width I.
template <class T>
struct ExpertWeights {
  std::vector<Tensor> held;  // contiguous copies where an input was a view
  std::vector<const T*> gate, up, down, b_gate, b_up, b_down;
  int64_t E = 0, I = 0;
  ExpertWeights(const KernelCall& c, size_t first, size_t end) {
    E = (static_cast<int64_t>(end) - static_cast<int64_t>(first)) / moe_params_per_expert(c.node);
    for (size_t i = first; i < end; ++i) held.push_back(arg(c, i));
    I = held[0].dim(0);
    std::vector<const T*>* lists[] = {&gate, &up, &down, &b_gate, &b_up, &b_down};
    for (size_t i = 0; i < held.size(); ++i) lists[i / size_t(E)]->push_back(ptr<T>(held[i]));
  }
};

// A moe node's call unpacked, for moe_experts, moe_experts_ep (each device's launchers) and their
// backwards (`backward`: inputs dy, x, probs, the weights, and last the kept projections where
// the node keeps them, graph/ops.h moe_keeps): x as rows [R, C], probs [R, E] (E: all
// the experts; the weights may be fewer, an expert group's), top_k and norm_topk_prob, the weights,
// gpt-oss's options (biases, the activation; kernels/kinds.h MoeOptions), the output placed and,
// for a backward, its extra outputs: dprobs (extra 0, like probs) and one gradient per weight and
// bias (extras 1 on, also as pointer arrays: dw[0, E'), gates; ups; downs; then the biases').
template <class T>
struct MoeCall {
  Tensor dy, x, p;
  ExpertWeights<T> w;
  int64_t C, R, E, k;
  bool norm;
  Tensor out;
  std::vector<T*> dw;
  kernels::MoeOptions<T> opt;
  MoeCall(const KernelCall& c, bool backward)
      : dy(backward ? arg(c, 0) : Tensor()), x(arg(c, backward ? 1 : 0)), p(arg(c, backward ? 2 : 1)),
        w(c, backward ? 3 : 2, moe_weights_end(c.node)), C(x.dim(-1)), R(x.numel() / C), E(p.dim(-1)), k(c.node.attrs().i("top_k")),
        norm(c.node.attrs().b("norm_topk_prob")), out(out_like(c, x.dtype())) {
    if (moe_biased(c.node)) opt.b_gate = w.b_gate.data(), opt.b_up = w.b_up.data(), opt.b_down = w.b_down.data();
    if (moe_clamped(c.node)) opt.clamped = true, opt.alpha = c.node.attrs().f("alpha"), opt.limit = c.node.attrs().f("limit");
    if (!backward) return;
    for (size_t i = 2; i < moe_weights_end(c.node); ++i) c.extras.push_back(extra_like(c, c.in[i].shape(), c.in[i].dtype()));
    for (size_t i = 1; i < c.extras.size(); ++i) dw.push_back(ptr<T>(c.extras[i]));
    if (opt.b_gate) opt.db_gate = dw.data() + 3 * w.E, opt.db_up = dw.data() + 4 * w.E, opt.db_down = dw.data() + 5 * w.E;
  }
  T* dprobs(const KernelCall& c) const { return ptr<T>(c.extras[0]); }
};

// A node that keeps its gate and up projections (graph/passes/keep_moe_projections): each device
// file defines these (the CPU runs kernels/cpu/moe.h's keeping pair; CUDA refuses the attribute,
// which the program builder sets for CPU runs only). Outputs and inputs as below, with the kept
// block [2, R·k, I] the forward's extra output 1 and the backward's last input.
Tensor moe_experts_keeping(const KernelCall& c);
Tensor moe_experts_backward_kept(const KernelCall& c);

// x [..., C] as rows [R, C], probs [R, E], the expert weights (w_gate[e], w_up[e] [I, C], w_down[e]
// [C, I]) and biases → y [..., C].
Tensor moe_experts(const KernelCall& c) {
  if (moe_keeps(c.node)) return moe_experts_keeping(c);
  return by_float(c, c.in[0].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, false);
    call(stream(c), dev::moe_experts_forward<T>, ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(), m.w.up.data(),
         m.w.down.data(), ptr<T>(m.out), m.R, m.C, m.w.E, m.w.I, m.k, m.norm, m.opt);
    return m.out;
  });
}

// dx; extra outputs dprobs, then each expert weight's and bias's gradient. Inputs: dy, x, probs,
// the weights, the biases.
Tensor moe_experts_backward(const KernelCall& c) {
  if (moe_keeps(c.node)) return moe_experts_backward_kept(c);
  return by_float(c, c.in[1].dtype(), [&]<class T>() {
    const MoeCall<T> m(c, true);
    call(stream(c), dev::moe_experts_backward<T>, ptr<T>(m.dy), ptr<T>(m.x), ptr<T>(m.p), m.w.gate.data(),
         m.w.up.data(), m.w.down.data(), ptr<T>(m.out), m.dprobs(c), m.dw.data(), m.dw.data() + m.w.E,
         m.dw.data() + 2 * m.w.E, m.R, m.C, m.w.E, m.w.I, m.k, m.norm, m.opt);
    return m.out;
  });
}

// ---- the launchers each device file defines after this file (their work differs per device) ----

Tensor concat(const KernelCall& c);
Tensor sdpa(const KernelCall& c);
Tensor sdpa_backward(const KernelCall& c);
Tensor cross_entropy_sum(const KernelCall& c);
Tensor cross_entropy_backward(const KernelCall& c);
Tensor count_valid(const KernelCall& c);
Tensor full(const KernelCall& c);
Tensor all_to_all(const KernelCall& c);
Tensor all_reduce(const KernelCall& c);
Tensor moe_experts_ep(const KernelCall& c);  // the exchange: engine/expert_parallel.h, engine/cuda/expert_parallel.h
Tensor moe_experts_ep_backward(const KernelCall& c);
Tensor swiglu_mlp(const KernelCall& c);
Tensor swiglu_mlp_backward(const KernelCall& c);
Tensor linear_cross_entropy_sum(const KernelCall& c);
Tensor linear_cross_entropy_backward(const KernelCall& c);
Tensor sequence_logps(const KernelCall& c);
Tensor dpo_loss(const KernelCall& c);
Tensor sequence_logps_backward(const KernelCall& c);
Tensor dpo_loss_backward(const KernelCall& c);
Tensor moe_router_stats(const KernelCall& c);
Tensor moe_aux_loss(const KernelCall& c);
Tensor moe_aux_loss_backward(const KernelCall& c);

// ---- the launcher table: one row per op, in Op enum order ----

namespace {

Tensor leaf(const KernelCall& c) {
  AUTOSP_ASSERT(false, "node ", c.node.name(), " is resolved by the executor, not dispatched");
  return {};
}

using kernels::Binary;
using kernels::Unary;
using kernels::UnaryGrad;
constexpr std::array<LauncherRow, kNumOps> kLaunchers{{
    {Op::input, leaf},
    {Op::parameter, leaf},
    {Op::embedding, embedding},
    {Op::matmul, matmul},
    {Op::add, binary<Binary::add>},
    {Op::sub, binary<Binary::sub>},
    {Op::mul, binary<Binary::mul>},
    {Op::div, binary<Binary::div>},
    {Op::scale, unary<Unary::scale>},
    {Op::neg, unary<Unary::neg>},
    {Op::exp, unary<Unary::exp>},
    {Op::gelu_tanh, unary<Unary::gelu_tanh>},
    {Op::silu, unary<Unary::silu>},
    {Op::dropout, dropout},
    {Op::reshape, reshape},
    {Op::transpose, permute},
    {Op::permute, permute},
    {Op::slice, slice},
    {Op::concat, concat},
    {Op::layernorm, layernorm},
    {Op::rmsnorm, rmsnorm},
    {Op::softmax, softmax},
    {Op::rope, rope<false>},
    {Op::sdpa, sdpa},
    {Op::cross_entropy_sum, cross_entropy_sum},
    {Op::count_valid, count_valid},
    {Op::full, full},
    {Op::output, leaf},
    {Op::causal_mask, causal_mask},
    {Op::all_to_all, all_to_all},
    {Op::all_reduce, all_reduce},
    {Op::all_gather, all_gather},
    {Op::reduce_scatter, reduce_scatter},
    {Op::ring_attention, ring_attention},
    {Op::sum_to, sum_to},
    {Op::embedding_backward, embedding_backward},
    {Op::gelu_tanh_backward, unary_backward<UnaryGrad::gelu_tanh>},
    {Op::silu_backward, unary_backward<UnaryGrad::silu>},
    {Op::slice_backward, slice_backward},
    {Op::layernorm_backward, layernorm_backward},
    {Op::rmsnorm_backward, rmsnorm_backward},
    {Op::softmax_backward, softmax_backward},
    {Op::rope_backward, rope<true>},
    {Op::sdpa_backward, sdpa_backward},
    {Op::ring_attention_backward, ring_attention_backward},
    {Op::cross_entropy_backward, cross_entropy_backward},
    {Op::cast, cast},
    {Op::add_layernorm, add_norm<false>},
    {Op::add_rmsnorm, add_norm<true>},
    {Op::bias_gelu_tanh, bias_gelu_tanh},
    {Op::bias_gelu_tanh_backward, bias_gelu_tanh_backward},
    {Op::swiglu_mlp, swiglu_mlp},
    {Op::swiglu_mlp_backward, swiglu_mlp_backward},
    {Op::linear_cross_entropy_sum, linear_cross_entropy_sum},
    {Op::linear_cross_entropy_backward, linear_cross_entropy_backward},
    {Op::moe_experts, moe_experts},
    {Op::moe_experts_backward, moe_experts_backward},
    {Op::moe_experts_ep, moe_experts_ep},
    {Op::moe_experts_ep_backward, moe_experts_ep_backward},
    {Op::sequence_logps, sequence_logps},
    {Op::dpo_loss, dpo_loss},
    {Op::sequence_logps_backward, sequence_logps_backward},
    {Op::dpo_loss_backward, dpo_loss_backward},
    {Op::moe_router_stats, moe_router_stats},
    {Op::moe_aux_loss, moe_aux_loss},
    {Op::moe_aux_loss_backward, moe_aux_loss_backward},
    {Op::tanh, unary<Unary::tanh>},
    {Op::swiglu, swiglu},
    {Op::swiglu_backward, swiglu_backward},
    {Op::qkv_heads, qkv_heads},
    {Op::qkv_heads_backward, qkv_heads_backward},
}};

constexpr bool launchers_in_order() {
  for (size_t i = 0; i < kLaunchers.size(); ++i)
    if (static_cast<size_t>(kLaunchers[i].op) != i || !kLaunchers[i].run) return false;
  return true;
}
static_assert(kLaunchers.size() == kNumOps, "every op needs a row in the launcher table");
static_assert(launchers_in_order(), "launcher rows must follow the Op enum order and name a launcher");

}  // namespace

KernelFn launcher(Op op) { return kLaunchers[static_cast<size_t>(op)].run; }
