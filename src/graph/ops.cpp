// Shape rules and the op table. Each rule validates its inputs and attributes and throws a
// UsageError that names the op and the shapes: `[matmul] lhs f32[B, S, 256] vs rhs f32[512, 128]: ...`.
#include "graph/ops.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "graph/builder.h"  // attention_inputs
#include "graph/ir.h"
#include "graph/vjp.h"
#include "tensor/check.h"
#include "tensor/tensor.h"  // shard_numel

namespace autosp {

bool ShapeContext::same(const Dim& a, const Dim& b) const {
  if (a == b) return true;
  if (!assumptions) return false;
  return simplify(a, *assumptions) == simplify(b, *assumptions);
}

namespace {

[[noreturn]] void fail(const Node& n, const std::string& what) {
  throw UsageError(str("[", n.op_name(), "] ", n.name(), ": ", what));
}

const TensorType& in(const Node& n, size_t i) { return n.input(i)->type(); }

void expect_float(const Node& n, size_t i) {
  if (!is_floating(in(n, i).dtype)) fail(n, str("input ", i, " is ", in(n, i).str(), ", expected a float tensor"));
}
void expect_int(const Node& n, size_t i) {
  auto t = in(n, i).dtype;
  if (t != DType::i64 && t != DType::i32) fail(n, str("input ", i, " is ", in(n, i).str(), ", expected integer ids"));
}
void expect_same_dtype(const Node& n, size_t i, size_t j) {
  if (in(n, i).dtype != in(n, j).dtype)
    fail(n, str("dtypes differ: ", in(n, i).str(), " vs ", in(n, j).str()));
}
void expect_rank(const Node& n, size_t i, int rank) {
  if (in(n, i).rank() != rank) fail(n, str("input ", i, " is ", in(n, i).str(), ", expected rank ", rank));
}
int norm_axis(const Node& n, int64_t d, int rank) {
  int64_t a = d < 0 ? d + rank : d;
  if (a < 0 || a >= rank) fail(n, str("dim ", d, " out of range for rank ", rank));
  return static_cast<int>(a);
}
Dim product(const SymShape& s) {
  Dim p(1);
  for (const auto& d : s) p = p * d;
  return p;
}

TensorType declared(const Node& n, const ShapeContext&) { return n.type(); }

TensorType embedding_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  expect_rank(n, 0, 2);
  expect_int(n, 1);
  SymShape s = in(n, 1).shape;
  s.push_back(in(n, 0).shape[1]);
  return {in(n, 0).dtype, s};
}

// a [..., M, K] · b [K, N] (2-D, broadcast over the batch) or b [..., K, N] with equal batch dims.
TensorType matmul_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_same_dtype(n, 0, 1);
  const auto& a = in(n, 0);
  const auto& b = in(n, 1);
  bool ta = n.attrs().b("trans_a"), tb = n.attrs().b("trans_b");
  if (a.rank() < 2 || b.rank() < 2) fail(n, str("lhs ", a.str(), " and rhs ", b.str(), " must have rank >= 2"));
  if (b.rank() != 2 && b.rank() != a.rank())
    fail(n, str("lhs ", a.str(), " vs rhs ", b.str(), ": rhs must be 2-D or have the rank of lhs"));
  Dim m = a.shape[a.rank() - (ta ? 1 : 2)], ka = a.shape[a.rank() - (ta ? 2 : 1)];
  Dim kb = b.shape[b.rank() - (tb ? 1 : 2)], nn = b.shape[b.rank() - (tb ? 2 : 1)];
  if (!ctx.same(ka, kb))
    fail(n, str("lhs ", a.str(), " vs rhs ", b.str(), ": inner dims differ (", ka.str(), " vs ", kb.str(), ")"));
  if (b.rank() == a.rank())
    for (int i = 0; i < a.rank() - 2; ++i)
      if (!ctx.same(a.shape[i], b.shape[i]))
        fail(n, str("lhs ", a.str(), " vs rhs ", b.str(), ": batch dim ", i, " differs"));
  SymShape s(a.shape.begin(), a.shape.end() - 2);
  s.push_back(m);
  s.push_back(nn);
  return {a.dtype, s};
}

TensorType binary_rule(const Node& n, const ShapeContext& ctx) {
  expect_same_dtype(n, 0, 1);
  const auto& a = in(n, 0).shape;
  const auto& b = in(n, 1).shape;
  size_t r = std::max(a.size(), b.size());
  SymShape s(r);
  for (size_t i = 0; i < r; ++i) {
    Dim da = i + a.size() >= r ? a[i + a.size() - r] : Dim(1);
    Dim db = i + b.size() >= r ? b[i + b.size() - r] : Dim(1);
    if (ctx.same(da, db) || db == Dim(1))
      s[i] = da;
    else if (da == Dim(1))
      s[i] = db;
    else
      fail(n, str(in(n, 0).str(), " and ", in(n, 1).str(), " do not broadcast (dim ", i, ")"));
  }
  return {in(n, 0).dtype, s};
}

TensorType unary_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  return in(n, 0);
}

TensorType reshape_rule(const Node& n, const ShapeContext& ctx) {
  const auto& target = n.attrs().dims("shape");
  for (const auto& d : target)
    if (d.is_const() && d.value() < 0)
      fail(n, str("target ", sym_shape_str(target), " has a negative dim; spell shapes with symbols, not -1"));
  if (!ctx.same(product(target), product(in(n, 0).shape)))
    fail(n, str("cannot reshape ", in(n, 0).str(), " to ", sym_shape_str(target), ": element counts differ"));
  return {in(n, 0).dtype, target};
}

TensorType transpose_rule(const Node& n, const ShapeContext&) {
  auto t = in(n, 0);
  int a = norm_axis(n, n.attrs().i("dim0"), t.rank()), b = norm_axis(n, n.attrs().i("dim1"), t.rank());
  std::swap(t.shape[a], t.shape[b]);
  return t;
}

TensorType permute_rule(const Node& n, const ShapeContext&) {
  const auto& x = in(n, 0);
  const auto& perm = n.attrs().ints("perm");
  if (static_cast<int>(perm.size()) != x.rank()) fail(n, str("perm has ", perm.size(), " entries for ", x.str()));
  std::vector<bool> seen(perm.size());
  SymShape s;
  for (int64_t p : perm) {
    int a = norm_axis(n, p, x.rank());
    if (seen[a]) fail(n, str("perm repeats dim ", a));
    seen[a] = true;
    s.push_back(x.shape[a]);
  }
  return {x.dtype, s};
}

TensorType slice_rule(const Node& n, const ShapeContext&) {
  auto t = in(n, 0);
  int d = norm_axis(n, n.attrs().i("dim"), t.rank());
  const Dim& start = n.attrs().dim("start");
  const Dim& end = n.attrs().dim("end");
  Dim len = end - start;
  if (len.is_const() && len.value() < 0) fail(n, str("end ", end.str(), " < start ", start.str()));
  if (start.is_const() && start.value() < 0) fail(n, str("negative start ", start.str()));
  if (t.shape[d].is_const() && end.is_const() && end.value() > t.shape[d].value())
    fail(n, str("end ", end.str(), " beyond dim ", d, " of ", t.str()));
  t.shape[d] = len;
  return t;
}

TensorType concat_rule(const Node& n, const ShapeContext& ctx) {
  auto t = in(n, 0);
  int d = norm_axis(n, n.attrs().i("dim"), t.rank());
  for (size_t i = 1; i < n.inputs().size(); ++i) {
    const auto& o = in(n, i);
    if (o.rank() != t.rank() || o.dtype != t.dtype) fail(n, str("cannot concat ", t.str(), " and ", o.str()));
    for (int k = 0; k < t.rank(); ++k)
      if (k != d && !ctx.same(o.shape[k], t.shape[k]))
        fail(n, str("inputs differ off the concat dim: ", in(n, 0).str(), " vs ", o.str()));
    t.shape[d] = t.shape[d] + o.shape[d];
  }
  return t;
}

void expect_weight(const Node& n, size_t i, const ShapeContext& ctx) {
  const auto& x = in(n, 0);
  const auto& w = in(n, i);
  if (w.rank() != 1 || !ctx.same(w.shape[0], x.shape.back()))
    fail(n, str("weight ", w.str(), " does not match the last dim of ", x.str()));
  expect_same_dtype(n, 0, i);
}

TensorType layernorm_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_weight(n, 1, ctx);
  expect_weight(n, 2, ctx);
  return in(n, 0);
}

TensorType rmsnorm_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_weight(n, 1, ctx);
  return in(n, 0);
}

// x [B, N, S, D], position_ids [B, S]
// x [..., C], token_index [...] (x's leading dims): y = x with the elements the mask drops zeroed
// and the rest scaled by 1 / (1 - p).
TensorType dropout_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_int(n, 1);
  const auto& x = in(n, 0).shape;
  const auto& t = in(n, 1).shape;
  bool same = x.size() == t.size() + 1;
  for (size_t i = 0; same && i < t.size(); ++i) same = ctx.same(x[i], t[i]);
  if (!same) fail(n, str("x ", in(n, 0).str(), " [..., C] vs token_index ", in(n, 1).str(), " [...]: x's leading dims"));
  const double p = n.attrs().f("p");
  if (!(p >= 0 && p < 1)) fail(n, str("p = ", p, ": expected a probability in [0, 1)"));
  return in(n, 0);
}

TensorType rope_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_rank(n, 0, 4);
  expect_int(n, 1);
  expect_rank(n, 1, 2);
  const auto& x = in(n, 0).shape;
  const auto& p = in(n, 1).shape;
  if (!ctx.same(x[0], p[0]) || !ctx.same(x[2], p[1]))
    fail(n, str("x ", in(n, 0).str(), " [B, N, S, D] vs position_ids ", in(n, 1).str(), " [B, S]"));
  if (!x[3].is_const() || x[3].value() % 2 != 0) fail(n, str("head dim ", x[3].str(), " must be an even constant"));
  return in(n, 0);
}

// The optional trailing inputs of an attention node (graph/builder.h attention_inputs): the
// document starts i64 [B, Skv] against k [B, Nkv, Skv, D] (only with causal attention), and the
// sinks [N] of q's dtype against q [B, N, Sq, D]; at most one of each, the starts first.
void check_attention_inputs(const Node& n, const ShapeContext& ctx) {
  const AttentionInputs a = attention_inputs(n);
  const size_t given = n.inputs().size() - a.first;
  if (given != size_t(a.doc_start != nullptr) + size_t(a.sinks != nullptr) ||
      (a.sinks && n.inputs().back() != a.sinks))
    fail(n, "expected the optional inputs doc_start (integer) then sinks (float), at most one of each");
  if (a.doc_start) {
    const size_t i = a.first;
    expect_rank(n, i, 2);
    const auto& d = in(n, i).shape;
    const auto& k = in(n, 1).shape;
    if (!ctx.same(d[0], k[0]) || !ctx.same(d[1], k[2]))
      fail(n, str("doc_start ", in(n, i).str(), " vs k ", in(n, 1).str(), ": expected [B, Skv]"));
    if (!n.attrs().b("causal")) fail(n, "a document mask (doc_start) needs causal attention");
  }
  if (a.sinks) {
    const TensorType& t = a.sinks->type();
    const TensorType& q = in(n, 0);
    if (t.dtype != q.dtype || t.rank() != 1 || !ctx.same(t.shape[0], q.shape[1]))
      fail(n, str("sinks ", t.str(), " vs q ", q.str(), ": expected [N] of q's dtype, one per query head"));
  }
}

// The optional attention variants (graph/builder.h AttentionAttrs): window an integer > 0,
// softcap a number > 0.
void check_attention_attrs(const Node& n) {
  const Attrs& a = n.attrs();
  if (a.has("window") && a.i("window") <= 0) fail(n, str("window ", a.i("window"), " must be > 0"));
  if (a.has("softcap") && !(a.f("softcap") > 0)) fail(n, str("softcap ", a.f("softcap"), " must be > 0"));
}

// q [B, N, S, D], k, v [B, Nkv, S, D] with N % Nkv == 0, [doc_start [B, S]], [sinks [N]]
TensorType sdpa_rule(const Node& n, const ShapeContext& ctx) {
  check_attention_attrs(n);
  for (size_t i = 0; i < 3; ++i) {
    expect_float(n, i);
    expect_rank(n, i, 4);
    expect_same_dtype(n, 0, i);
  }
  const auto& q = in(n, 0).shape;
  const auto& k = in(n, 1).shape;
  const auto& v = in(n, 2).shape;
  bool ok = ctx.same(q[0], k[0]) && ctx.same(k[0], v[0]) && ctx.same(k[1], v[1]) && ctx.same(k[2], v[2]) &&
            ctx.same(q[3], k[3]) && ctx.same(k[3], v[3]);
  if (ok && q[1].is_const() && k[1].is_const()) ok = k[1].value() > 0 && q[1].value() % k[1].value() == 0;
  if (ok && n.attrs().b("causal")) ok = ctx.same(q[2], k[2]);
  if (!ok)
    fail(n, str("q ", in(n, 0).str(), ", k ", in(n, 1).str(), ", v ", in(n, 2).str(),
                ": expected [B, N, S, D] and [B, Nkv, S, D] with N % Nkv == 0"));
  check_attention_inputs(n, ctx);
  return in(n, 0);
}

TensorType cross_entropy_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_int(n, 1);
  const auto& l = in(n, 0).shape;
  const auto& y = in(n, 1).shape;
  bool ok = l.size() == y.size() + 1;
  for (size_t i = 0; ok && i < y.size(); ++i) ok = ctx.same(l[i], y[i]);
  if (!ok) fail(n, str("logits ", in(n, 0).str(), " vs labels ", in(n, 1).str(), ": expected [..., V] and [...]"));
  return {accumulate_dtype(in(n, 0).dtype), {}};  // a bf16 model's loss is summed and kept in f32
}

TensorType count_valid_rule(const Node& n, const ShapeContext&) {
  expect_int(n, 0);
  auto t = dtype_from_name(n.attrs().s("dtype"));
  if (!t || !is_floating(*t)) fail(n, str("dtype '", n.attrs().s("dtype"), "' is not a float dtype"));
  return {*t, {}};
}


TensorType full_rule(const Node& n, const ShapeContext&) {
  auto t = dtype_from_name(n.attrs().s("dtype"));
  if (!t) fail(n, str("unknown dtype '", n.attrs().s("dtype"), "'"));
  n.attrs().f("value");
  return {*t, n.attrs().dims("shape")};
}

// moe_experts_backward's extra output i alone (its input i + 1: dprobs, then each weight's
// gradient). It has 1 + 3E extras, each read by its own output node, so building the whole list
// per output node would make typing a layer quadratic in the experts (18,432 weights of
// Qwen3-30B-A3B: most of --plan-memory's time).
std::optional<TensorType> moe_backward_extra_at(const Node& src, int64_t i) {
  if (i < 1 || i + 1 >= static_cast<int64_t>(moe_weights_end(src))) return std::nullopt;
  return in(src, static_cast<size_t>(i + 1));
}

TensorType output_rule(const Node& n, const ShapeContext&) {
  const Node& src = *n.input(0);
  const int64_t i = n.attrs().i("index");
  std::optional<TensorType> t;
  if (src.op() == Op::moe_experts_backward) {
    t = moe_backward_extra_at(src, i);
  } else if (auto extras = extra_types(src); i >= 1 && i <= static_cast<int64_t>(extras.size())) {
    t = std::move(extras[static_cast<size_t>(i - 1)]);
  }
  if (!t) fail(n, str("%", src.name(), " (", src.op_name(), ") has no output ", i));
  return *t;
}

// x [..] summed down to `shape` (right-aligned; each target dim equals x's or is 1).
TensorType sum_to_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  const auto& x = in(n, 0).shape;
  const auto& target = n.attrs().dims("shape");
  bool ok = target.size() <= x.size();
  for (size_t i = 0; ok && i < target.size(); ++i) {
    const Dim& xd = x[x.size() - target.size() + i];
    ok = ctx.same(target[i], xd) || target[i] == Dim(1);
  }
  if (!ok) fail(n, str("cannot sum ", in(n, 0).str(), " to ", sym_shape_str(target)));
  return {in(n, 0).dtype, target};
}

// dy [..., C], ids [...] → dweight [V, C]
TensorType embedding_backward_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  expect_int(n, 1);
  return {in(n, 0).dtype, {n.attrs().dim("num_embeddings"), in(n, 0).shape.back()}};
}

TensorType same_as_second(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_same_dtype(n, 0, 1);
  const auto& a = in(n, 0).shape;
  const auto& b = in(n, 1).shape;
  bool ok = a.size() == b.size();
  for (size_t i = 0; ok && i < a.size(); ++i) ok = ctx.same(a[i], b[i]);
  if (!ok) fail(n, str("gradient ", in(n, 0).str(), " does not match ", in(n, 1).str()));
  return in(n, 1);
}

TensorType slice_backward_rule(const Node& n, const ShapeContext&) {
  auto t = in(n, 0);
  int d = norm_axis(n, n.attrs().i("dim"), t.rank());
  n.attrs().dim("start");
  n.attrs().dim("end");
  t.shape[d] = n.attrs().dim("size");
  return t;
}

// dy, x [..., C], w [C] → dx (extras: dw, db)
TensorType norm_backward_rule(const Node& n, const ShapeContext& ctx) {
  TensorType t = same_as_second(n, ctx);
  const auto& w = in(n, 2);
  if (w.rank() != 1 || !ctx.same(w.shape[0], t.shape.back())) fail(n, str("weight ", w.str(), " vs x ", t.str()));
  return t;
}
std::vector<TensorType> layernorm_backward_extra(const Node& n) { return {in(n, 2), in(n, 2)}; }
std::vector<TensorType> rmsnorm_backward_extra(const Node& n) { return {in(n, 2)}; }


// lse [B, N, Sq], f32 for bf16 q (what the kernels write)
std::vector<TensorType> sdpa_extra(const Node& n) {
  const auto& q = in(n, 0).shape;
  return {{accumulate_dtype(in(n, 0).dtype), {q[0], q[1], q[2]}}};
}

// q, k, v, o, lse, dout, [doc_start], [sinks] → dq (extras: dk, dv, [dsinks])
TensorType sdpa_backward_rule(const Node& n, const ShapeContext& ctx) {
  check_attention_attrs(n);
  const auto& q = in(n, 0);
  for (size_t i : {3, 5}) {
    const auto& t = in(n, i);
    bool ok = t.dtype == q.dtype && t.rank() == q.rank();
    for (int d = 0; ok && d < q.rank(); ++d) ok = ctx.same(t.shape[d], q.shape[d]);
    if (!ok) fail(n, str("input ", i, " ", t.str(), " must match q ", q.str()));
  }
  const auto& lse = in(n, 4);
  if (lse.dtype != accumulate_dtype(q.dtype) || lse.rank() != 3)
    fail(n, str("lse ", lse.str(), " must be ", dtype_name(accumulate_dtype(q.dtype)), "[B, N, Sq] for q ", q.str()));
  check_attention_inputs(n, ctx);
  return q;
}
// dk, dv (, dsinks)
std::vector<TensorType> sdpa_backward_extra(const Node& n) {
  std::vector<TensorType> extra{in(n, 1), in(n, 2)};
  if (Node* sinks = attention_inputs(n).sinks) extra.push_back(sinks->type());
  return extra;
}

// logits [..., V], labels [...], grad [] (the loss's dtype: f32 for bf16 logits) → dlogits
TensorType cross_entropy_backward_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  expect_int(n, 1);
  const auto& g = in(n, 2);
  if (g.rank() != 0 || g.dtype != accumulate_dtype(in(n, 0).dtype))
    fail(n, str("loss gradient ", g.str(), " must be a ", dtype_name(accumulate_dtype(in(n, 0).dtype)),
                " scalar for logits ", in(n, 0).str()));
  return in(n, 0);
}

// x → x in `dtype`; the CPU and CUDA kernels convert between f32, f64 and bf16.
TensorType cast_rule(const Node& n, const ShapeContext&) {
  auto convertible = [](DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; };
  auto t = dtype_from_name(n.attrs().s("dtype"));
  if (!t || !convertible(*t)) fail(n, str("dtype '", n.attrs().s("dtype"), "': expected f32, f64 or bf16"));
  if (!convertible(in(n, 0).dtype)) fail(n, str("input ", in(n, 0).str(), " is not f32, f64 or bf16"));
  return {*t, in(n, 0).shape};
}


// Fused residual add + norm: x, r [..., C] (the same shape, no broadcast), w (, b) [C], and last
// the optional bias of r, rb [C] → y = norm(x + (r + rb)); extra output 1: s = x + (r + rb) (the
// residual stream continues with it).
TensorType add_norm_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_same_dtype(n, 0, 1);
  const auto& x = in(n, 0).shape;
  const auto& r = in(n, 1).shape;
  bool ok = x.size() == r.size() && !x.empty();
  for (size_t i = 0; ok && i < x.size(); ++i) ok = ctx.same(x[i], r[i]);
  if (!ok) fail(n, str("x ", in(n, 0).str(), " and r ", in(n, 1).str(), " must have the same shape [..., C]"));
  for (size_t i = 2; i < n.inputs().size(); ++i) expect_weight(n, i, ctx);  // w (, b) (, rb)
  return in(n, 0);
}
std::vector<TensorType> residual_extra(const Node& n) { return {in(n, 0)}; }

// g, u [...] of one shape and float dtype → silu(g) · u [...]
TensorType swiglu_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  return same_as_second(n, ctx);
}
// dy, g, u [...] → dg [...] (extra output du [...])
TensorType swiglu_backward_rule(const Node& n, const ShapeContext& ctx) {
  TensorType t = same_as_second(n, ctx);
  const auto& u = in(n, 2);
  bool ok = u.dtype == t.dtype && u.rank() == t.rank();
  for (size_t i = 0; ok && i < u.shape.size(); ++i) ok = ctx.same(u.shape[i], t.shape[i]);
  if (!ok) fail(n, str("up ", u.str(), " does not match gate ", t.str()));
  return t;
}
std::vector<TensorType> swiglu_backward_extra(const Node& n) { return {in(n, 2)}; }

// x [..., C], b [C] → gelu_tanh(x + b) [..., C]
TensorType bias_gelu_tanh_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  if (in(n, 0).rank() < 1) fail(n, str("x ", in(n, 0).str(), " must have rank >= 1"));
  const auto& b = in(n, 1);
  if (b.rank() != 1 || !ctx.same(b.shape[0], in(n, 0).shape.back()))
    fail(n, str("bias ", b.str(), " does not match the last dim of ", in(n, 0).str()));
  expect_same_dtype(n, 0, 1);
  return in(n, 0);
}
// dy, x [..., C], b [C] → dx [..., C]
TensorType bias_gelu_tanh_backward_rule(const Node& n, const ShapeContext& ctx) {
  TensorType t = same_as_second(n, ctx);
  const auto& b = in(n, 2);
  if (b.rank() != 1 || !ctx.same(b.shape[0], t.shape.back()) || b.dtype != t.dtype)
    fail(n, str("bias ", b.str(), " vs x ", t.str()));
  return t;
}

// x [B, S, 3·N·D], b [3·N·D] (attribute heads = N) → q [B, N, S, D]; extra outputs k, v of q's type.
TensorType qkv_head_type(const Node& n) {
  const TensorType& x = in(n, 0);
  const int64_t N = n.attrs().i("heads");
  return {x.dtype, {x.shape[0], Dim(N), x.shape[1], Dim(x.shape[2].value() / (3 * N))}};
}
TensorType qkv_heads_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_same_dtype(n, 0, 1);
  const TensorType& x = in(n, 0);
  const int64_t N = n.attrs().i("heads");
  if (x.rank() != 3 || !x.shape[2].is_const() || N <= 0 || x.shape[2].value() % (3 * N) != 0)
    fail(n, str("x ", x.str(), " must be [B, S, 3·N·D] with N = heads = ", N));
  const auto& b = in(n, 1);
  if (b.rank() != 1 || !ctx.same(b.shape[0], x.shape[2]))
    fail(n, str("bias ", b.str(), " does not match the last dim of ", x.str()));
  return qkv_head_type(n);
}
std::vector<TensorType> qkv_heads_extra(const Node& n) {
  const TensorType q = qkv_head_type(n);
  return {q, q};
}
// dq, dk, dv [B, N, S, D] → dx [B, S, 3·N·D] (extra output 1: db [3·N·D])
TensorType qkv_heads_backward_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  const TensorType& q = in(n, 0);
  if (q.rank() != 4 || !q.shape[1].is_const() || !q.shape[3].is_const()) fail(n, str("dq ", q.str(), " must be [B, N, S, D]"));
  for (size_t i = 1; i < 3; ++i) {
    const TensorType& t = in(n, i);
    bool ok = t.dtype == q.dtype && t.rank() == 4;
    for (size_t d = 0; ok && d < 4; ++d) ok = ctx.same(t.shape[d], q.shape[d]);
    if (!ok) fail(n, str("input ", i, " ", t.str(), " does not match dq ", q.str()));
  }
  return {q.dtype, {q.shape[0], q.shape[2], Dim(3 * q.shape[1].value() * q.shape[3].value())}};
}
// extra output 1: the bias gradient db [3·N·D] (dx summed over B and S)
std::vector<TensorType> qkv_heads_backward_extra(const Node& n) {
  const TensorType& q = in(n, 0);
  return {{q.dtype, {Dim(3 * q.shape[1].value() * q.shape[3].value())}}};
}

// x [..., C], w_gate [I, C], w_up [I, C], w_down [C, I] → (silu(x·w_gateᵀ) ∘ (x·w_upᵀ))·w_downᵀ [..., C]
void expect_mlp_weights(const Node& n, size_t x, const ShapeContext& ctx) {
  expect_float(n, x);
  const auto& xt = in(n, x);
  if (xt.rank() < 1) fail(n, str("x ", xt.str(), " must have rank >= 1"));
  const Dim& C = xt.shape.back();
  for (size_t i = x + 1; i < x + 4; ++i) {
    expect_same_dtype(n, x, i);
    expect_rank(n, i, 2);
  }
  const auto& g = in(n, x + 1).shape;
  const auto& u = in(n, x + 2).shape;
  const auto& d = in(n, x + 3).shape;
  if (!ctx.same(g[1], C) || !ctx.same(u[1], C) || !ctx.same(u[0], g[0]) || !ctx.same(d[0], C) || !ctx.same(d[1], g[0]))
    fail(n, str("x ", xt.str(), ", w_gate ", in(n, x + 1).str(), ", w_up ", in(n, x + 2).str(), ", w_down ",
                in(n, x + 3).str(), ": expected x [..., C], w_gate and w_up [I, C], w_down [C, I]"));
}
TensorType swiglu_mlp_rule(const Node& n, const ShapeContext& ctx) {
  expect_mlp_weights(n, 0, ctx);
  return in(n, 0);
}
// dy, x [..., C], w_gate, w_up, w_down → dx [..., C] (extras: dw_gate, dw_up, dw_down)
TensorType swiglu_mlp_backward_rule(const Node& n, const ShapeContext& ctx) {
  TensorType t = same_as_second(n, ctx);
  expect_mlp_weights(n, 1, ctx);
  return t;
}
std::vector<TensorType> swiglu_mlp_backward_extra(const Node& n) { return {in(n, 2), in(n, 3), in(n, 4)}; }

// x [..., C], probs [..., E], then per expert w_gate [I, C] (E inputs), w_up [I, C] (E), w_down
// [C, I] (E), and with biases b_gate [I] (E), b_up [I] (E), b_down [C] (E), from input x on; top_k
// in [1, E]; the activation swiglu or clamped_swiglu (alpha finite, limit > 0). The expert-parallel
// ops (group_size G) take the parameters of their E / G local experts only.
void expect_moe_inputs(const Node& n, size_t x, const ShapeContext& ctx) {
  expect_float(n, x);
  const auto& xt = in(n, x);
  const auto& pt = in(n, x + 1);
  if (xt.rank() < 1 || pt.rank() != xt.rank() || !pt.shape.back().is_const())
    fail(n, str("x ", xt.str(), " and probs ", pt.str(), ": expected x [..., C] and probs [..., E], E a number"));
  for (int d = 0; d + 1 < xt.rank(); ++d)
    if (!ctx.same(xt.shape[d], pt.shape[d])) fail(n, str("x ", xt.str(), " and probs ", pt.str(), " differ in dim ", d));
  const int64_t all = pt.shape.back().value();
  const int64_t G = n.attrs().has("group_size") ? n.attrs().i("group_size") : 1;
  if (G < 1 || all % G != 0) fail(n, str("probs ", pt.str(), ": ", all, " experts do not split over ", G, " ranks"));
  const int64_t E = all / G;  // the experts whose parameters the node takes
  const int64_t per = moe_params_per_expert(n);
  const size_t kept = x == 1 && moe_keeps(n) ? 1 : 0;  // a backward's block of the kept projections, last
  if (n.inputs().size() != x + 2 + size_t(per * E) + kept)
    fail(n, str("probs ", pt.str(), " has ", all, " experts (", E, " on this rank): expected ", per * E,
                per == 3 ? " expert weights (gate, up, down each), got " : " expert weights and biases (gate, up, "
                "down, their biases each), got ", n.inputs().size() - x - 2));
  const Dim& C = xt.shape.back();
  const Dim I = in(n, x + 2).shape.size() == 2 ? in(n, x + 2).shape[0] : Dim(0);
  for (size_t i = x + 1; i < n.inputs().size(); ++i) expect_same_dtype(n, x, i);
  if (kept) {
    const auto& ks = in(n, n.inputs().size() - 1).shape;
    if (ks.size() != 3 || !ks[0].is_const() || ks[0].value() != 2 || !ctx.same(ks[2], I))
      fail(n, str("kept ", in(n, n.inputs().size() - 1).str(), ": expected the forward's [2, rows · top_k, I] block"));
  }
  static constexpr const char* kNames[] = {"w_gate ", "w_up ", "w_down ", "b_gate ", "b_up ", "b_down "};
  for (int64_t e = 0; e < E; ++e)
    for (int which = 0; which < per; ++which) {
      const size_t i = x + 2 + size_t(which * E + e);
      expect_rank(n, i, which < 3 ? 2 : 1);
      const auto& w = in(n, i).shape;
      const bool ok = which < 2    ? ctx.same(w[0], I) && ctx.same(w[1], C)
                      : which == 2 ? ctx.same(w[0], C) && ctx.same(w[1], I)
                                   : ctx.same(w[0], which < 5 ? I : C);
      if (!ok)
        fail(n, str("x ", xt.str(), ", expert ", e, "'s ", kNames[which], in(n, i).str(),
                    ": expected x [..., C], w_gate and w_up [I, C], w_down [C, I], b_gate and b_up [I], b_down [C] "
                    "(I = ", I.str(), ")"));
    }
  const int64_t k = n.attrs().i("top_k");
  if (k < 1 || k > all) fail(n, str("top_k ", k, " is not in [1, ", all, "]"));
  if (n.attrs().has("activation")) {
    const std::string& act = n.attrs().s("activation");
    if (act != "swiglu" && act != "clamped_swiglu")
      fail(n, str("activation '", act, "': expected swiglu or clamped_swiglu"));
    if (act == "clamped_swiglu") {
      const double alpha = n.attrs().f("alpha"), limit = n.attrs().f("limit");
      if (!std::isfinite(alpha) || !(limit > 0) || !std::isfinite(limit))
        fail(n, str("clamped_swiglu alpha ", alpha, ", limit ", limit, ": expected a finite alpha and limit > 0"));
    }
  }
}
TensorType moe_experts_rule(const Node& n, const ShapeContext& ctx) {
  expect_moe_inputs(n, 0, ctx);
  return in(n, 0);
}
// With "keep": each assignment's gate and up projections [2, rows · top_k, I] (kernels/cpu/moe.h
// moe_experts_forward_keeping), the backward's last input.
std::vector<TensorType> moe_experts_extra(const Node& n) {
  if (!moe_keeps(n)) return {};
  const TensorType& x = in(n, 0);
  Dim rows(n.attrs().i("top_k"));
  for (int d = 0; d + 1 < x.rank(); ++d) rows = rows * x.shape[static_cast<size_t>(d)];
  return {TensorType{x.dtype, {Dim(2), rows, in(n, 2).shape[0]}}};
}
// dy, x [..., C], probs, the expert weights → dx [..., C] (extras: dprobs, then each weight's gradient)
TensorType moe_experts_backward_rule(const Node& n, const ShapeContext& ctx) {
  TensorType t = same_as_second(n, ctx);
  expect_moe_inputs(n, 1, ctx);
  return t;
}
std::vector<TensorType> moe_experts_backward_extra(const Node& n) {
  std::vector<TensorType> out;
  for (size_t i = 2; i < moe_weights_end(n); ++i) out.push_back(in(n, i));
  return out;
}

// x [..., C], w [V, C], labels [...] (inputs x, x + 1, x + 2), the type checks both ops share.
void expect_head_and_labels(const Node& n, size_t x, const ShapeContext& ctx) {
  expect_float(n, x);
  expect_same_dtype(n, x, x + 1);
  expect_rank(n, x + 1, 2);
  expect_int(n, x + 2);
  const auto& xs = in(n, x).shape;
  const auto& ws = in(n, x + 1).shape;
  const auto& ys = in(n, x + 2).shape;
  bool ok = !xs.empty() && xs.size() == ys.size() + 1 && ctx.same(ws[1], xs.back());
  for (size_t i = 0; ok && i < ys.size(); ++i) ok = ctx.same(xs[i], ys[i]);
  if (!ok)
    fail(n, str("x ", in(n, x).str(), ", w ", in(n, x + 1).str(), ", labels ", in(n, x + 2).str(),
                ": expected x [..., C], w [V, C] and labels [...]"));
}
// The DPO form's pair slots (input `i`, train.objective "dpo" with runtime.tiled_loss): i64 like
// the labels [B, S], and the attribute "slots" K ≥ 1; its sums are [B, 2, K] as sequence_logps's.
SymShape head_slots_shape(const Node& n, size_t i, const ShapeContext& ctx) {
  expect_int(n, i);
  const auto& y = in(n, 2).shape;
  bool ok = y.size() == 2 && in(n, i).shape.size() == 2;
  for (size_t d = 0; ok && d < 2; ++d) ok = ctx.same(y[d], in(n, i).shape[d]);
  if (!ok) fail(n, str("labels ", in(n, 2).str(), ", slots ", in(n, i).str(), ": expected [B, S] and [B, S]"));
  if (!n.attrs().has("slots") || n.attrs().i("slots") < 1) fail(n, "the pair slots need an attribute slots >= 1");
  return {y[0], Dim(2), Dim(n.attrs().i("slots"))};
}
// x, w, labels → the summed loss [] (f32 for bf16 x), as cross_entropy_sum(x · wᵀ, labels); with the
// pair slots fourth, each sequence's summed log-probability [B, 2, K] instead, as
// sequence_logps(x · wᵀ, labels, slots) (DPO's policy sums without the [B, S, V] logits)
TensorType linear_cross_entropy_rule(const Node& n, const ShapeContext& ctx) {
  expect_head_and_labels(n, 0, ctx);
  if (n.inputs().size() == 4) return {accumulate_dtype(in(n, 0).dtype), head_slots_shape(n, 3, ctx)};
  return {accumulate_dtype(in(n, 0).dtype), {}};
}
// extra output 1: the argmax over the vocabulary of each row's logits, i64 [...] like labels
std::vector<TensorType> linear_cross_entropy_extra(const Node& n) { return {{DType::i64, in(n, 2).shape}}; }
// x, w, labels, grad [] (the loss's dtype) → dx like x (extra: dw like w); the DPO form takes the
// slots fifth and grad [B, 2, K]
TensorType linear_cross_entropy_backward_rule(const Node& n, const ShapeContext& ctx) {
  expect_head_and_labels(n, 0, ctx);
  const auto& g = in(n, 3);
  if (n.inputs().size() == 5) {
    head_slots_shape(n, 4, ctx);
    if (g.rank() != 3 || g.dtype != accumulate_dtype(in(n, 0).dtype))
      fail(n, str("gradient ", g.str(), " must be ", dtype_name(accumulate_dtype(in(n, 0).dtype)), " [B, 2, K]"));
    return in(n, 0);
  }
  if (g.rank() != 0 || g.dtype != accumulate_dtype(in(n, 0).dtype))
    fail(n, str("loss gradient ", g.str(), " must be a ", dtype_name(accumulate_dtype(in(n, 0).dtype)),
                " scalar for x ", in(n, 0).str()));
  return in(n, 0);
}
// dw, or nothing ([0]) with weight_grad false (a frozen head).
std::vector<TensorType> linear_cross_entropy_backward_extra(const Node& n) {
  if (!linear_ce_weight_grad(n)) return {{in(n, 1).dtype, {Dim(0)}}};
  return {in(n, 1)};
}

// ---- preference training (train.objective "dpo") ----
// logits [B, S, V], labels [B, S], slots [B, S] (target t's pair slot: +(k + 1) chosen, -(k + 1)
// rejected, 0 none) → [B, 2, K] (K = the attribute "slots"), each sequence's summed log-probability
// in the loss's dtype (f32 for bf16 logits)
void expect_logits_labels_slots(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  expect_int(n, 1);
  expect_int(n, 2);
  const auto& l = in(n, 0).shape;
  const auto& y = in(n, 1).shape;
  bool ok = l.size() == 3 && y.size() == 2 && in(n, 2).shape.size() == 2;
  for (size_t i = 0; ok && i < 2; ++i) ok = ctx.same(l[i], y[i]) && ctx.same(y[i], in(n, 2).shape[i]);
  if (!ok)
    fail(n, str("logits ", in(n, 0).str(), ", labels ", in(n, 1).str(), ", slots ", in(n, 2).str(),
                ": expected [B, S, V], [B, S] and [B, S]"));
  if (n.attrs().i("slots") < 1) fail(n, str("slots ", n.attrs().i("slots"), " must be at least 1"));
}
SymShape sequence_shape(const Node& n) { return {in(n, 0).shape[0], Dim(2), Dim(n.attrs().i("slots"))}; }
TensorType sequence_logps_rule(const Node& n, const ShapeContext& ctx) {
  expect_logits_labels_slots(n, ctx);
  return {accumulate_dtype(in(n, 0).dtype), sequence_shape(n)};
}
// logits, labels, slots, grad [B, 2, K] → dlogits like logits
TensorType sequence_logps_backward_rule(const Node& n, const ShapeContext& ctx) {
  expect_logits_labels_slots(n, ctx);
  const TensorType want{accumulate_dtype(in(n, 0).dtype), sequence_shape(n)};
  if (in(n, 3).dtype != want.dtype || in(n, 3).rank() != 3)
    fail(n, str("gradient ", in(n, 3).str(), " must be ", want.str()));
  return in(n, 0);
}
// policy, reference, tokens [B, 2, K] (one dtype), norms [2] (the step's pairs and chosen tokens)
// → the loss [] (dpo_loss), or (with grad [] last) its gradient like policy (dpo_loss_backward)
TensorType dpo_loss_rule(const Node& n, const ShapeContext& ctx) {
  expect_float(n, 0);
  for (size_t i = 1; i < 4; ++i) expect_same_dtype(n, 0, i);
  bool ok = in(n, 0).rank() == 3 && in(n, 3).rank() == 1 && in(n, 3).shape[0].is_const() &&
            in(n, 3).shape[0].value() == 2;
  for (size_t i = 1; ok && i < 3; ++i) {
    ok = in(n, i).rank() == 3;
    for (size_t d = 0; ok && d < 3; ++d) ok = ctx.same(in(n, 0).shape[d], in(n, i).shape[d]);
  }
  if (!ok)
    fail(n, str("policy ", in(n, 0).str(), ", reference ", in(n, 1).str(), ", tokens ", in(n, 2).str(), ", norms ",
                in(n, 3).str(), ": expected three [B, 2, K] and a [2]"));
  const std::string& type = n.attrs().s("loss_type");
  if (type != "sigmoid" && type != "ipo") fail(n, str("loss_type '", type, "': expected sigmoid or ipo"));
  if (n.op() == Op::dpo_loss) return {in(n, 0).dtype, {}};
  if (in(n, 4).rank() != 0 || in(n, 4).dtype != in(n, 0).dtype)
    fail(n, str("loss gradient ", in(n, 4).str(), " must be a ", dtype_name(in(n, 0).dtype), " scalar"));
  return in(n, 0);
}

// probs [..., E] (a router's softmax) → [2, E]: each expert's top-k token count, its summed
// probability (in f32 for bf16 probs: a count in bf16 is exact only to 256)
TensorType moe_router_stats_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  const TensorType& p = in(n, 0);
  if (p.rank() < 2 || !p.shape.back().is_const()) fail(n, str("probs ", p.str(), ": expected [..., E], E a constant"));
  const int64_t E = p.shape.back().value(), k = n.attrs().i("top_k");
  if (k < 1 || k > E) fail(n, str("top_k ", k, " is not in [1, ", E, "]"));
  return {accumulate_dtype(p.dtype), {Dim(2), p.shape.back()}};
}
// stats [L, 2, E] (the layers' moe_router_stats) → the loss [] (moe_aux_loss), or (with grad []
// second) its gradient like stats (moe_aux_loss_backward)
TensorType moe_aux_loss_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  const TensorType& s = in(n, 0);
  if (s.rank() != 3 || !s.shape[1].is_const() || s.shape[1].value() != 2 || !s.shape[2].is_const())
    fail(n, str("stats ", s.str(), ": expected [L, 2, E]"));
  const int64_t E = s.shape[2].value(), k = n.attrs().i("top_k");
  if (k < 1 || k > E) fail(n, str("top_k ", k, " is not in [1, ", E, "]"));
  n.attrs().f("share");
  if (n.op() == Op::moe_aux_loss) return {s.dtype, {}};
  if (in(n, 1).rank() != 0 || in(n, 1).dtype != s.dtype)
    fail(n, str("loss gradient ", in(n, 1).str(), " must be a ", dtype_name(s.dtype), " scalar"));
  return s;
}

// scores [..., Sq, Skv]: entries with j > i + (Skv - Sq) set to `value`.
TensorType causal_mask_rule(const Node& n, const ShapeContext&) {
  expect_float(n, 0);
  if (in(n, 0).rank() < 2) fail(n, str("input ", in(n, 0).str(), " must have rank >= 2"));
  n.attrs().f("value");
  return in(n, 0);
}

// Ulysses all-to-all over a group of `group_size` ranks: dim scatter_dim is split into group_size
// chunks (one per rank), the received chunks are concatenated along gather_dim.
TensorType all_to_all_rule(const Node& n, const ShapeContext& ctx) {
  auto t = in(n, 0);
  const int s = norm_axis(n, n.attrs().i("scatter_dim"), t.rank());
  const int g = norm_axis(n, n.attrs().i("gather_dim"), t.rank());
  const int64_t p = n.attrs().i("group_size");
  n.attrs().s("group");
  if (s == g) fail(n, "scatter_dim and gather_dim must differ");
  if (p < 1) fail(n, str("group_size ", p));
  if (t.shape[s].is_const() && t.shape[s].value() % p != 0)
    fail(n, str("dim ", s, " of ", t.str(), " (", t.shape[s].str(), ") is not divisible by the group size ", p));
  const std::vector<Divisibility> none;
  const auto& as = ctx.assumptions ? *ctx.assumptions : none;
  t.shape[s] = simplify(t.shape[s].floordiv(p), as);
  t.shape[g] = simplify(t.shape[g] * Dim(p), as);
  return t;
}

TensorType all_reduce_rule(const Node& n, const ShapeContext&) {
  n.attrs().s("group");
  return in(n, 0);
}

// ZeRO-3's shards: a tensor of n elements (constant dims) is split into group_size shards of
// ceil(n / group_size) elements each, the last padded with zeros.
int64_t shard_numel_of(const Node& n, const SymShape& whole, int64_t group_size) {
  int64_t numel = 1;
  for (const auto& d : whole) {
    if (!d.is_const()) fail(n, str("a sharded tensor needs constant dims, not ", sym_shape_str(whole)));
    numel *= d.value();
  }
  if (group_size < 1) fail(n, str("group_size ", group_size));
  return shard_numel(numel, group_size);
}

// all_gather: every rank's shard [c] → the whole tensor of the `shape` attribute (its first
// numel elements of the group_size shards side by side).
TensorType all_gather_rule(const Node& n, const ShapeContext&) {
  const TensorType t = in(n, 0);
  n.attrs().s("group");
  const auto& whole = n.attrs().dims("shape");
  const int64_t c = shard_numel_of(n, whole, n.attrs().i("group_size"));
  if (t.rank() != 1 || !t.shape[0].is_const() || t.shape[0].value() != c)
    fail(n, str("the shard is ", t.str(), "; a ", sym_shape_str(whole), " tensor over ", n.attrs().i("group_size"),
                " ranks has shards of [", c, "]"));
  return {t.dtype, whole};
}

// reduce_scatter: the whole tensor, summed over the group, and this rank's shard of it [c]. The
// optional attribute sum_dtype="f32" sums a bf16 tensor in f32 and returns the f32 shard (ZeRO-3's
// gradients under bf16: no whole f32 copy of the gradient exists, the launcher casts in pieces).
TensorType reduce_scatter_rule(const Node& n, const ShapeContext&) {
  const TensorType t = in(n, 0);
  n.attrs().s("group");
  DType dt = t.dtype;
  if (n.attrs().has("sum_dtype")) {
    const auto sum = dtype_from_name(n.attrs().s("sum_dtype"));
    if (sum != DType::f32) fail(n, str("sum_dtype '", n.attrs().s("sum_dtype"), "': expected f32"));
    if (t.dtype != DType::bf16 && t.dtype != DType::f32) fail(n, str("input ", t.str(), " is not bf16 or f32"));
    dt = *sum;
  }
  return {dt, {Dim(shard_numel_of(n, t.shape, n.attrs().i("group_size")))}};
}

// ---- locality along the sequence (OpInfo::seq; used by AutoSP's shard_seq_dim) ----------------
// `in[i]`: the dim of input i that holds the sequence, or kNoSeq. At least one input holds it.

SeqVerdict seq_same(const Node&, std::span<const int> in, std::string_view) { return {in[0]}; }

// Binary ops broadcast right-aligned: both inputs' sequence dims must land on the same output dim.
SeqVerdict seq_broadcast(const Node& n, std::span<const int> in, std::string_view) {
  const int r = n.type().rank();
  int out = kNoSeq;
  for (size_t i = 0; i < 2; ++i) {
    if (in[i] == kNoSeq) continue;
    const int aligned = in[i] + (r - n.input(i)->type().rank());
    if (out != kNoSeq && out != aligned) return {in[i], "mixes"};
    out = aligned;
  }
  return {out};
}

SeqVerdict seq_causal_mask(const Node& n, std::span<const int> in, std::string_view) {
  if (in[0] >= n.type().rank() - 2) return {in[0], "masks along"};
  return {in[0]};
}

SeqVerdict seq_embedding(const Node&, std::span<const int> in, std::string_view) { return {in[1]}; }

SeqVerdict seq_matmul(const Node& n, std::span<const int> in, std::string_view) {
  const bool ta = n.attrs().b("trans_a"), tb = n.attrs().b("trans_b");
  const int r = n.type().rank(), ra = n.input(0)->type().rank(), rb = n.input(1)->type().rank();
  int out = kNoSeq;
  if (in[0] != kNoSeq) {
    const int m = ta ? ra - 1 : ra - 2, k = ta ? ra - 2 : ra - 1;
    if (in[0] == k) return {in[0], "contracts over"};
    out = in[0] == m ? r - 2 : in[0];
  }
  if (in[1] != kNoSeq) {
    const int k = tb ? rb - 1 : rb - 2, nn = tb ? rb - 2 : rb - 1;
    if (in[1] == k) return {in[1], "contracts over"};
    out = in[1] == nn ? r - 1 : in[1] + (r - rb);
  }
  return {out};
}

// The sequence is the one target dim spelled with the sequence symbol.
SeqVerdict seq_reshape(const Node& n, std::span<const int> in, std::string_view seq) {
  int found = kNoSeq;
  for (int d = 0; d < n.type().rank(); ++d)
    if (n.shape()[d].contains(std::string(seq))) {
      if (found != kNoSeq) return {in[0], "splits"};
      found = d;
    }
  if (found == kNoSeq) return {in[0], "hides"};
  return {found};
}

SeqVerdict seq_transpose(const Node& n, std::span<const int> in, std::string_view) {
  const int r = n.type().rank();
  const int d0 = static_cast<int>((n.attrs().i("dim0") + r) % r), d1 = static_cast<int>((n.attrs().i("dim1") + r) % r);
  return {in[0] == d0 ? d1 : in[0] == d1 ? d0 : in[0]};
}

SeqVerdict seq_permute(const Node& n, std::span<const int> in, std::string_view) {
  const int r = n.type().rank();
  const auto& perm = n.attrs().ints("perm");
  for (int d = 0; d < r; ++d)
    if ((perm[d] + r) % r == in[0]) return {d};
  return {kNoSeq};
}

SeqVerdict seq_slice(const Node& n, std::span<const int> in, std::string_view) {
  const int r = n.type().rank();
  if ((n.attrs().i("dim") + r) % r == in[0]) return {in[0], "slices along"};
  return {in[0]};
}

SeqVerdict seq_concat(const Node& n, std::span<const int> in, std::string_view) {
  const int r = n.type().rank();
  for (int d : in)
    if (d == (n.attrs().i("dim") + r) % r) return {d, "concatenates along"};
  return {in[0]};
}

// layernorm, rmsnorm, softmax: local unless they normalise over the sequence (the last dim).
SeqVerdict seq_norm(const Node& n, std::span<const int> in, std::string_view) {
  if (in[0] == n.type().rank() - 1) return {in[0], "normalises over"};
  return {in[0]};
}

// x [..., C] masked by token_index [...]: token-wise (each token's mask comes from its own index),
// unless the sequence were the feature dim.
SeqVerdict seq_dropout(const Node& n, std::span<const int> in, std::string_view) {
  const int features = n.type().rank() - 1;
  if (in[0] == features) return {in[0], "masks along"};
  if (in[1] != kNoSeq && in[0] != kNoSeq && in[1] != in[0]) return {in[1], "masks along"};
  return {in[0] == kNoSeq ? in[1] : in[0]};
}

// x [B, N, S, D]: the rotation angle comes from position_ids [B, S], so S is dim 2.
SeqVerdict seq_rope(const Node&, std::span<const int> in, std::string_view) {
  if (in[0] != kNoSeq && in[0] != 2) return {in[0], "rotates along"};
  return {in[0] == kNoSeq ? 2 : in[0]};
}

// The one op that attends over the sequence: insert_attention_all_to_all gathers it for sdpa
// (q, k, v along dim 2; the document starts [B, S] along dim 1).
SeqVerdict seq_sdpa(const Node&, std::span<const int> in, std::string_view) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != kNoSeq && in[i] != (i == 3 ? 1 : 2)) return {in[i], "attends over"};
  return {2};
}

// swiglu_mlp is token-wise: the sequence passes through unless it is x's channel dim, which the
// projections contract over (the weights never hold it).
SeqVerdict seq_mlp(const Node& n, std::span<const int> in, std::string_view) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i] != kNoSeq) return {in[i], "contracts over"};
  if (in[0] == n.type().rank() - 1) return {in[0], "contracts over"};
  return {in[0]};
}

// moe_experts routes each token by its own probabilities: token-wise like the MLP, when x and probs
// hold the sequence in the same dim.
SeqVerdict seq_moe(const Node& n, std::span<const int> in, std::string_view) {
  for (size_t i = 2; i < in.size(); ++i)
    if (in[i] != kNoSeq) return {in[i], "contracts over"};
  const int last = n.type().rank() - 1;
  if (in[0] == last) return {in[0], "contracts over"};
  if (in[1] == last || (in[0] != kNoSeq && in[1] != kNoSeq && in[0] != in[1])) return {in[1], "routes over"};
  return {in[0] != kNoSeq ? in[0] : in[1]};
}

// The loss sums over the sequence; normalize_loss makes it exact across ranks.
SeqVerdict seq_loss(const Node&, std::span<const int>, std::string_view) { return {kNoSeq}; }
// qkv_heads: x's sequence dim (1) becomes the heads' dim 2.
SeqVerdict seq_qkv_heads(const Node&, std::span<const int> in, std::string_view) {
  if (in[0] == kNoSeq) return {kNoSeq};
  if (in[0] != 1) return {in[0], "splits heads out of"};
  return {2};
}
// The tiled head + loss likewise, unless the head would contract over the sequence (x's channel
// dim, or the weight).
SeqVerdict seq_head_loss(const Node& n, std::span<const int> in, std::string_view) {
  if (in[0] != kNoSeq && in[0] == n.input(0)->type().rank() - 1) return {in[0], "contracts over"};
  if (in[1] != kNoSeq) return {in[1], "contracts over"};
  return {kNoSeq};
}

// One row per op, in enum order. Unnamed columns keep their defaults (ops.h: OpInfo).
constexpr std::array<OpInfo, kNumOps> kOps{{
    {.op = Op::input, .name = "input", .arity = 0, .infer = declared},
    {.op = Op::parameter, .name = "parameter", .arity = 0, .infer = declared},
    {.op = Op::embedding, .name = "embedding", .arity = 2, .infer = embedding_rule, .vjp = vjp::embedding,
     .seq = seq_embedding},
    {.op = Op::matmul, .name = "matmul", .arity = 2, .attrs = "trans_a,trans_b", .infer = matmul_rule,
     .vjp = vjp::matmul, .seq = seq_matmul},
    {.op = Op::add, .name = "add", .arity = 2, .infer = binary_rule, .vjp = vjp::add, .seq = seq_broadcast,
     .in_place = true},
    {.op = Op::sub, .name = "sub", .arity = 2, .infer = binary_rule, .vjp = vjp::sub, .seq = seq_broadcast,
     .in_place = true},
    {.op = Op::mul, .name = "mul", .arity = 2, .infer = binary_rule, .vjp = vjp::mul, .seq = seq_broadcast,
     .in_place = true},
    {.op = Op::div, .name = "div", .arity = 2, .infer = binary_rule, .vjp = vjp::div, .seq = seq_broadcast,
     .in_place = true},
    {.op = Op::scale, .name = "scale", .arity = 1, .attrs = "factor", .infer = unary_rule, .vjp = vjp::scale,
     .seq = seq_same, .in_place = true},
    {.op = Op::neg, .name = "neg", .arity = 1, .infer = unary_rule, .vjp = vjp::neg, .seq = seq_same, .in_place = true},
    {.op = Op::exp, .name = "exp", .arity = 1, .infer = unary_rule, .vjp = vjp::exp, .seq = seq_same, .in_place = true},
    {.op = Op::gelu_tanh, .name = "gelu_tanh", .arity = 1, .infer = unary_rule, .vjp = vjp::gelu_tanh,
     .seq = seq_same, .in_place = true},
    {.op = Op::silu, .name = "silu", .arity = 1, .infer = unary_rule, .vjp = vjp::silu, .seq = seq_same,
     .in_place = true},
    {.op = Op::dropout, .name = "dropout", .arity = 2, .attrs = "p,seed", .infer = dropout_rule, .vjp = vjp::dropout,
     .seq = seq_dropout, .in_place = true},
    {.op = Op::reshape, .name = "reshape", .arity = 1, .attrs = "shape", .infer = reshape_rule, .vjp = vjp::reshape,
     .seq = seq_reshape, .numerics = Numerics::moves},
    {.op = Op::transpose, .name = "transpose", .arity = 1, .attrs = "dim0,dim1", .infer = transpose_rule,
     .vjp = vjp::transpose, .seq = seq_transpose, .numerics = Numerics::moves},
    {.op = Op::permute, .name = "permute", .arity = 1, .attrs = "perm", .infer = permute_rule, .vjp = vjp::permute,
     .seq = seq_permute, .numerics = Numerics::moves},
    {.op = Op::slice, .name = "slice", .arity = 1, .attrs = "dim,start,end", .infer = slice_rule, .vjp = vjp::slice,
     .seq = seq_slice, .numerics = Numerics::moves},
    {.op = Op::concat, .name = "concat", .arity = -1, .attrs = "dim", .infer = concat_rule, .vjp = vjp::concat,
     .seq = seq_concat, .numerics = Numerics::moves},
    {.op = Op::layernorm, .name = "layernorm", .arity = 3, .attrs = "eps", .infer = layernorm_rule,
     .vjp = vjp::layernorm, .seq = seq_norm},
    {.op = Op::rmsnorm, .name = "rmsnorm", .arity = 2, .attrs = "eps", .infer = rmsnorm_rule, .vjp = vjp::rmsnorm,
     .seq = seq_norm},
    {.op = Op::softmax, .name = "softmax", .arity = 1, .infer = unary_rule, .vjp = vjp::softmax, .seq = seq_norm},
    {.op = Op::rope, .name = "rope", .arity = 2, .attrs = "theta", .infer = rope_rule, .vjp = vjp::rope,
     .seq = seq_rope},
    {.op = Op::sdpa, .name = "sdpa", .arity = 3, .optional = 2, .attrs = "causal,scale", .infer = sdpa_rule, .extra = sdpa_extra,
     .vjp = vjp::sdpa, .seq = seq_sdpa},
    {.op = Op::cross_entropy_sum, .name = "cross_entropy_sum", .arity = 2, .attrs = "ignore_index",
     .infer = cross_entropy_rule, .vjp = vjp::cross_entropy_sum, .seq = seq_loss},
    {.op = Op::count_valid, .name = "count_valid", .arity = 1, .attrs = "ignore_index,dtype",
     .infer = count_valid_rule, .vjp = vjp::no_gradient, .seq = seq_loss, .numerics = Numerics::converts},
    {.op = Op::full, .name = "full", .arity = 0, .attrs = "shape,value,dtype", .infer = full_rule,
     .vjp = vjp::no_gradient, .numerics = Numerics::converts},
    {.op = Op::output, .name = "output", .arity = 1, .attrs = "index", .infer = output_rule, .backward_only = true},
    {.op = Op::causal_mask, .name = "causal_mask", .arity = 1, .attrs = "value", .infer = causal_mask_rule,
     .vjp = vjp::causal_mask, .seq = seq_causal_mask, .in_place = true},
    {.op = Op::all_to_all, .name = "all_to_all", .arity = 1, .attrs = "scatter_dim,gather_dim,group,group_size",
     .infer = all_to_all_rule, .vjp = vjp::all_to_all, .collective = true, .numerics = Numerics::moves},
    {.op = Op::all_reduce, .name = "all_reduce", .arity = 1, .attrs = "group", .infer = all_reduce_rule,
     .vjp = vjp::all_reduce, .collective = true},
    {.op = Op::all_gather, .name = "all_gather", .arity = 1, .attrs = "group,group_size,shape",
     .infer = all_gather_rule, .vjp = vjp::all_gather, .collective = true, .numerics = Numerics::moves},
    {.op = Op::reduce_scatter, .name = "reduce_scatter", .arity = 1, .attrs = "group,group_size",
     .infer = reduce_scatter_rule, .vjp = vjp::reduce_scatter, .collective = true, .numerics = Numerics::converts},
    {.op = Op::ring_attention, .name = "ring_attention", .arity = 3, .optional = 2,
     .attrs = "causal,scale,group,group_size", .infer = sdpa_rule, .extra = sdpa_extra, .vjp = vjp::ring_attention,
     .seq = seq_sdpa, .collective = true},
    {.op = Op::sum_to, .name = "sum_to", .arity = 1, .attrs = "shape", .infer = sum_to_rule, .backward_only = true},
    {.op = Op::embedding_backward, .name = "embedding_backward", .arity = 2, .attrs = "num_embeddings",
     .infer = embedding_backward_rule, .backward_only = true},
    {.op = Op::gelu_tanh_backward, .name = "gelu_tanh_backward", .arity = 2, .infer = same_as_second,
     .backward_only = true},
    {.op = Op::silu_backward, .name = "silu_backward", .arity = 2, .infer = same_as_second, .backward_only = true},
    {.op = Op::slice_backward, .name = "slice_backward", .arity = 1, .attrs = "dim,start,end,size",
     .infer = slice_backward_rule, .backward_only = true, .numerics = Numerics::moves},
    {.op = Op::layernorm_backward, .name = "layernorm_backward", .arity = 3, .attrs = "eps",
     .infer = norm_backward_rule, .extra = layernorm_backward_extra, .backward_only = true},
    {.op = Op::rmsnorm_backward, .name = "rmsnorm_backward", .arity = 3, .attrs = "eps", .infer = norm_backward_rule,
     .extra = rmsnorm_backward_extra, .backward_only = true},
    {.op = Op::softmax_backward, .name = "softmax_backward", .arity = 2, .infer = same_as_second,
     .backward_only = true},
    {.op = Op::rope_backward, .name = "rope_backward", .arity = 2, .attrs = "theta", .infer = rope_rule,
     .backward_only = true},
    {.op = Op::sdpa_backward, .name = "sdpa_backward", .arity = 6, .optional = 2, .attrs = "causal,scale",
     .infer = sdpa_backward_rule, .extra = sdpa_backward_extra, .backward_only = true},
    {.op = Op::ring_attention_backward, .name = "ring_attention_backward", .arity = 6, .optional = 2,
     .attrs = "causal,scale,group,group_size", .infer = sdpa_backward_rule, .extra = sdpa_backward_extra,
     .backward_only = true, .collective = true},
    {.op = Op::cross_entropy_backward, .name = "cross_entropy_backward", .arity = 3, .attrs = "ignore_index",
     .infer = cross_entropy_backward_rule, .backward_only = true},
    {.op = Op::cast, .name = "cast", .arity = 1, .attrs = "dtype", .infer = cast_rule, .vjp = vjp::cast,
     .seq = seq_same, .numerics = Numerics::converts},
    {.op = Op::add_layernorm, .name = "add_layernorm", .arity = 4, .optional = 1, .attrs = "eps", .infer = add_norm_rule,
     .extra = residual_extra, .vjp = vjp::add_layernorm, .differentiable_extras = true},
    {.op = Op::add_rmsnorm, .name = "add_rmsnorm", .arity = 3, .optional = 1, .attrs = "eps", .infer = add_norm_rule,
     .extra = residual_extra, .vjp = vjp::add_rmsnorm, .differentiable_extras = true},
    {.op = Op::bias_gelu_tanh, .name = "bias_gelu_tanh", .arity = 2, .infer = bias_gelu_tanh_rule,
     .vjp = vjp::bias_gelu_tanh, .in_place = true},
    {.op = Op::bias_gelu_tanh_backward, .name = "bias_gelu_tanh_backward", .arity = 3,
     .infer = bias_gelu_tanh_backward_rule, .backward_only = true, .in_place = true},
    {.op = Op::swiglu_mlp, .name = "swiglu_mlp", .arity = 4, .infer = swiglu_mlp_rule, .vjp = vjp::swiglu_mlp,
     .seq = seq_mlp},
    {.op = Op::swiglu_mlp_backward, .name = "swiglu_mlp_backward", .arity = 5, .infer = swiglu_mlp_backward_rule,
     .extra = swiglu_mlp_backward_extra, .backward_only = true},
    {.op = Op::linear_cross_entropy_sum, .name = "linear_cross_entropy_sum", .arity = 3, .optional = 1,
     .attrs = "ignore_index",
     .infer = linear_cross_entropy_rule, .extra = linear_cross_entropy_extra, .vjp = vjp::linear_cross_entropy_sum,
     .seq = seq_head_loss},
    {.op = Op::linear_cross_entropy_backward, .name = "linear_cross_entropy_backward", .arity = 4, .optional = 1,
     .attrs = "ignore_index", .infer = linear_cross_entropy_backward_rule,
     .extra = linear_cross_entropy_backward_extra, .backward_only = true},
    {.op = Op::moe_experts, .name = "moe_experts", .arity = -1, .attrs = "top_k,norm_topk_prob",
     .infer = moe_experts_rule, .extra = moe_experts_extra, .vjp = vjp::moe_experts, .seq = seq_moe},
    {.op = Op::moe_experts_backward, .name = "moe_experts_backward", .arity = -1, .attrs = "top_k,norm_topk_prob",
     .infer = moe_experts_backward_rule, .extra = moe_experts_backward_extra, .backward_only = true},
    {.op = Op::moe_experts_ep, .name = "moe_experts_ep", .arity = -1, .attrs = "top_k,norm_topk_prob,group,group_size",
     .infer = moe_experts_rule, .vjp = vjp::moe_experts_ep, .seq = seq_moe, .collective = true},
    {.op = Op::moe_experts_ep_backward, .name = "moe_experts_ep_backward", .arity = -1,
     .attrs = "top_k,norm_topk_prob,group,group_size", .infer = moe_experts_backward_rule,
     .extra = moe_experts_backward_extra, .backward_only = true, .collective = true},
    {.op = Op::sequence_logps, .name = "sequence_logps", .arity = 3, .attrs = "slots,ignore_index",
     .infer = sequence_logps_rule, .vjp = vjp::sequence_logps, .seq = seq_loss},
    {.op = Op::dpo_loss, .name = "dpo_loss", .arity = 4,
     .attrs = "beta,loss_type,label_smoothing,rpo_alpha,share", .infer = dpo_loss_rule, .vjp = vjp::dpo_loss,
     .seq = seq_loss},
    {.op = Op::sequence_logps_backward, .name = "sequence_logps_backward", .arity = 4,
     .attrs = "slots,ignore_index", .infer = sequence_logps_backward_rule, .backward_only = true},
    {.op = Op::dpo_loss_backward, .name = "dpo_loss_backward", .arity = 5,
     .attrs = "beta,loss_type,label_smoothing,rpo_alpha,share", .infer = dpo_loss_rule, .backward_only = true},
    {.op = Op::moe_router_stats, .name = "moe_router_stats", .arity = 1, .attrs = "top_k",
     .infer = moe_router_stats_rule, .vjp = vjp::moe_router_stats, .seq = seq_loss},
    {.op = Op::moe_aux_loss, .name = "moe_aux_loss", .arity = 1, .attrs = "top_k,share", .infer = moe_aux_loss_rule,
     .vjp = vjp::moe_aux_loss},
    {.op = Op::moe_aux_loss_backward, .name = "moe_aux_loss_backward", .arity = 2, .attrs = "top_k,share",
     .infer = moe_aux_loss_rule, .backward_only = true},
    {.op = Op::tanh, .name = "tanh", .arity = 1, .infer = unary_rule, .vjp = vjp::tanh, .seq = seq_same, .in_place = true},
    {.op = Op::swiglu, .name = "swiglu", .arity = 2, .infer = swiglu_rule, .vjp = vjp::swiglu, .seq = seq_broadcast,
     .in_place = true},
    {.op = Op::swiglu_backward, .name = "swiglu_backward", .arity = 3, .infer = swiglu_backward_rule,
     .extra = swiglu_backward_extra, .backward_only = true, .in_place = true},
    {.op = Op::qkv_heads, .name = "qkv_heads", .arity = 2, .attrs = "heads", .infer = qkv_heads_rule,
     .extra = qkv_heads_extra, .vjp = vjp::qkv_heads, .seq = seq_qkv_heads, .differentiable_extras = true},
    {.op = Op::qkv_heads_backward, .name = "qkv_heads_backward", .arity = 3, .infer = qkv_heads_backward_rule,
     .extra = qkv_heads_backward_extra, .backward_only = true},
}};

constexpr bool table_in_order() {
  for (size_t i = 0; i < kOps.size(); ++i) {
    if (static_cast<size_t>(kOps[i].op) != i || kOps[i].name.empty()) return false;
    if (!kOps[i].backward_only && kOps[i].op != Op::input && kOps[i].op != Op::parameter && !kOps[i].vjp) return false;
  }
  return true;
}
static_assert(kOps.size() == kNumOps, "every op needs a row in the op table");
static_assert(table_in_order(), "op table rows must follow the Op enum order, and every forward op needs a vjp");

}  // namespace

DType accumulate_dtype(DType t) { return t == DType::bf16 || t == DType::f16 ? DType::f32 : t; }

const OpInfo& op_info(Op op) { return kOps.at(static_cast<size_t>(op)); }
std::string_view op_name(Op op) { return op_info(op).name; }

const std::vector<std::string>& op_required_attrs(Op op) {
  // Split once per op: the verifier asks for every node after every pass.
  static const std::vector<std::vector<std::string>> split = [] {
    std::vector<std::vector<std::string>> all(kNumOps);
    for (size_t k = 0; k < kNumOps; ++k) {
      std::string_view s = kOps[k].attrs;
      while (!s.empty()) {
        size_t c = s.find(',');
        all[k].emplace_back(s.substr(0, c));
        s = c == std::string_view::npos ? std::string_view{} : s.substr(c + 1);
      }
    }
    return all;
  }();
  return split.at(static_cast<size_t>(op));
}

bool moe_biased(const Node& n) { return n.attrs().has("biases") && n.attrs().b("biases"); }
bool moe_clamped(const Node& n) { return n.attrs().has("activation") && n.attrs().s("activation") == "clamped_swiglu"; }
bool moe_keeps(const Node& n) { return n.attrs().has("keep") && n.attrs().b("keep"); }
size_t moe_weights_end(const Node& n) {
  return n.inputs().size() - (n.op() == Op::moe_experts_backward && moe_keeps(n) ? 1 : 0);
}

bool linear_ce_weight_grad(const Node& n) { return !n.attrs().has("weight_grad") || n.attrs().b("weight_grad"); }
double linear_ce_softcap(const Node& n) { return n.attrs().has("softcap") ? n.attrs().f("softcap") : 0.0; }

std::vector<TensorType> extra_types(const Node& n) {
  const OpInfo& info = op_info(n.op());
  return info.extra ? info.extra(n) : std::vector<TensorType>{};
}

TensorType infer_type(const Node& n, const std::vector<Divisibility>& assumptions) {
  const OpInfo& info = op_info(n.op());
  const int given = static_cast<int>(n.inputs().size());
  if (info.arity >= 0 && (given < info.arity || given > info.arity + info.optional))
    fail(n, info.optional == 0 ? str("expected ", info.arity, " inputs, got ", given)
                               : str("expected ", info.arity, " to ", info.arity + info.optional, " inputs, got ", given));
  if (info.arity < 0 && n.inputs().empty()) fail(n, "expected at least one input");
  for (const auto& a : op_required_attrs(n.op()))
    if (!n.attrs().has(a)) fail(n, str("missing attribute '", a, "'"));
  ShapeContext ctx{&assumptions};
  return info.infer(n, ctx);
}

}  // namespace autosp
