// cuDNN SDPA through the backend graph API (see cudnn_attention.cuh for the contract).
//
// The operation graphs are the "flash fused attention" patterns of the cuDNN graph API (the ones
// cudnn-frontend's SDPA nodes lower to on cuDNN 9.x before the unified SDPA operation), spelled
// with cudnnBackend* descriptors. S = [B, N, Sq, Skv] scores, fp32 virtual tensors throughout;
// K and V enter transposed through their strides (KT = [B, Nkv, D, Skv]), GQA through the head
// dim's broadcast.
//
//   forward:  S = Q·KT → ×scale → [causal: select(row ≥ col, S, -inf)] → M = max_j → E = exp(S - M)
//             → Z = Σ_j E → Stats = M + log Z (= lse, written to our lse) → P = E / Z (T) → O = P·V
//   backward: Δ = (Σ_d dO∘O)×1 (fp32, virtual) ; S = Q·KT → ×scale → [causal select] → - Stats
//             → P = exp (fp32) ; dV = reshape(P)ᵀ·dO (GQA: then Σ over the head group)
//             dP = (dO·VT)×1 ; dS = (dP - Δ)∘P×scale ; dK = reshape(dS)ᵀ·Q (GQA: Σ) ;
//             dQacc = dS·K (fp32, F16x16-reordered, zeroed workspace) ; dQ = identity(dQacc) (T)
// The fused engines match these graphs node by node, so the order and the seemingly useless ×1
// nodes (where dropout's scale and mask go) are exactly those of cudnn-frontend's SDPA backward
// node for cuDNN ≥ 9.0 (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h): the
// causal select comes before "- Stats", Δ is virtual (non-virtual only before cuDNN 8.9.5), and a
// non-virtual F16x16 dQ accumulator is how the backend is told to use its dP-workspace-free path.
// Execution plans come from heuristics mode A (then the fallback list): the first engine config
// that finalizes is kept, per shape.
#include "kernels/cuda/cudnn_attention.cuh"

#include <cstring>
#include <type_traits>

#ifndef AUTOSP_WITH_CUDNN

namespace autosp::cuda {

template <class T>
std::string cudnn_sdpa_unsupported(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool) {
  return "this build has no cuDNN (cudnn.h / libcudnn not found at configure time)";
}

template <class T>
void cudnn_sdpa_forward(const T*, const T*, const T*, T*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        double, bool, cudaStream_t) {
  throw RuntimeFailure("runtime.attention \"cudnn\": this build has no cuDNN");
}

template <class T>
void cudnn_sdpa_backward(const T*, const T*, const T*, const T*, const float*, const T*, T*, T*, T*, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, double, bool, cudaStream_t) {
  throw RuntimeFailure("runtime.attention \"cudnn\": this build has no cuDNN");
}

size_t cudnn_runtime_version() { return 0; }

}  // namespace autosp::cuda

#else  // AUTOSP_WITH_CUDNN

#include <cudnn.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace autosp::cuda {
namespace {

// ---- errors ------------------------------------------------------------------------------------

[[noreturn]] void cudnn_fail(cudnnStatus_t st, const char* expr, const char* file, int line) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw RuntimeFailure(str("cuDNN error ", cudnnGetErrorString(st), " in ", expr, " at ", file, ":", line,
                           last[0] ? str(": ", last) : std::string()));
}

#define CUDNN_CHECK(expr)                                                                \
  do {                                                                                   \
    const cudnnStatus_t autosp_cudnn_st_ = (expr);                                       \
    if (autosp_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                        \
      ::autosp::cuda::cudnn_fail(autosp_cudnn_st_, #expr, __FILE__, __LINE__);           \
  } while (0)

// ---- descriptors -------------------------------------------------------------------------------

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

#define SET_ATTR(desc, name, type, count, ptr) CUDNN_CHECK(cudnnBackendSetAttribute((desc), (name), (type), (count), (ptr)))

struct TensorRef {
  cudnnBackendDescriptor_t desc = nullptr;
  int64_t uid = 0;
  std::array<int64_t, 4> dims{}, strides{};
};

std::array<int64_t, 4> packed(const std::array<int64_t, 4>& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// Builds one operation graph: every descriptor it creates lives as long as the builder (the plan
// keeps the builder), virtual tensors get uids from 1000 up.
class GraphBuilder {
 public:
  TensorRef tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides,
                   bool is_virtual, bool by_value = false,
                   cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_NONE) {
    Desc& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (uid == 0) uid = next_virtual_++;
    const int64_t alignment = 16;
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (reorder != CUDNN_TENSOR_REORDERING_NONE)
      SET_ATTR(t.get(), CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder);
    CUDNN_CHECK(cudnnBackendFinalize(t.get()));
    return {t.get(), uid, dims, strides};
  }
  // A virtual tensor shaped like `like` (packed strides unless given).
  TensorRef virt(cudnnDataType_t type, std::array<int64_t, 4> dims) { return tensor(0, type, dims, packed(dims), true); }
  TensorRef scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, /*by_value=*/true);
  }

  void matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c) {
    Desc& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET_ATTR(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    CUDNN_CHECK(cudnnBackendFinalize(mm.get()));
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cudnnBackendDescriptor_t d = mm.get();
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    finish_op(op);
  }

  // y = mode(x[, b[, t]]); `prec` is the math precision (FLOAT, or INT32 / BOOLEAN for indices and
  // comparisons); `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef* b, const TensorRef* t,
                 const TensorRef& y, cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SET_ATTR(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET_ATTR(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) SET_ATTR(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    CUDNN_CHECK(cudnnBackendFinalize(pw.get()));
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    cudnnBackendDescriptor_t d = pw.get();
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    if (b != nullptr) SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->desc);
    if (t != nullptr) SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    finish_op(op);
  }
  TensorRef unary(cudnnPointwiseMode_t mode, const TensorRef& x, cudnnDataType_t out_type = CUDNN_DATA_FLOAT) {
    TensorRef y = virt(out_type, x.dims);
    pointwise(mode, x, nullptr, nullptr, y);
    return y;
  }
  TensorRef binary(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef& b,
                   cudnnDataType_t out_type = CUDNN_DATA_FLOAT) {
    TensorRef y = virt(out_type, x.dims);
    pointwise(mode, x, &b, nullptr, y);
    return y;
  }

  void reduction(cudnnReduceTensorOp_t mode, const TensorRef& x, const TensorRef& y) {
    Desc& red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET_ATTR(red.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    SET_ATTR(red.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    CUDNN_CHECK(cudnnBackendFinalize(red.get()));
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cudnnBackendDescriptor_t d = red.get();
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    finish_op(op);
  }

  // y = x seen with y's dims and strides (a transpose of the last two dims, here).
  void reshape(const TensorRef& x, const TensorRef& y) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    SET_ATTR(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    finish_op(op);
  }

  // The operation graph of every op added so far.
  cudnnBackendDescriptor_t finish_graph(cudnnHandle_t handle) {
    Desc& g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // still required by cuDNN 9.x's heuristics
    SET_ATTR(g.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
#pragma GCC diagnostic pop
    SET_ATTR(g.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
             ops_.data());
    CUDNN_CHECK(cudnnBackendFinalize(g.get()));
    return g.get();
  }

  Desc& make(cudnnBackendDescriptorType_t type) {
    owned_.push_back(std::make_unique<Desc>(type));
    return *owned_.back();
  }

 private:
  void finish_op(Desc& op) {
    CUDNN_CHECK(cudnnBackendFinalize(op.get()));
    ops_.push_back(op.get());
  }

  std::vector<std::unique_ptr<Desc>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = 1000;
};

// ---- the two graphs ----------------------------------------------------------------------------

// Unique ids of the tensors a call binds (the rest are virtual).
enum Uid : int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kScale = 6, kNegInf = 7, kDO = 8, kDQ = 9, kDK = 10, kDV = 11,
  kOne = 12, kDQAcc = 14,
};

struct Shape {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
};

// select(row ≥ col, s, -inf): the causal mask on [B, N, Sq, Skv] scores (Sq == Skv).
TensorRef causal_mask(GraphBuilder& g, const TensorRef& s) {
  TensorRef row = g.virt(CUDNN_DATA_INT32, s.dims), col = g.virt(CUDNN_DATA_INT32, s.dims);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
  TensorRef keep = g.virt(CUDNN_DATA_BOOLEAN, s.dims);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  TensorRef neg_inf = g.scalar(kNegInf);
  TensorRef out = g.virt(CUDNN_DATA_FLOAT, s.dims);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &keep, out);  // y = keep ? s : -inf
  return out;
}

struct Inputs {  // the bound tensors, shared by both graphs
  TensorRef q, kt, v_or_vt;
};

Inputs inputs(GraphBuilder& g, const Shape& s, cudnnDataType_t t, bool v_transposed) {
  const int64_t kv_head = s.Skv * s.D, kv_batch = s.Nkv * kv_head;
  Inputs in;
  in.q = g.tensor(kQ, t, {s.B, s.N, s.Sq, s.D}, packed({s.B, s.N, s.Sq, s.D}), false);
  in.kt = g.tensor(kK, t, {s.B, s.Nkv, s.D, s.Skv}, {kv_batch, kv_head, 1, s.D}, false);
  if (v_transposed)
    in.v_or_vt = g.tensor(kV, t, {s.B, s.Nkv, s.D, s.Skv}, {kv_batch, kv_head, 1, s.D}, false);
  else
    in.v_or_vt = g.tensor(kV, t, {s.B, s.Nkv, s.Skv, s.D}, {kv_batch, kv_head, s.D, 1}, false);
  return in;
}

void build_forward(GraphBuilder& g, const Shape& s, cudnnDataType_t t) {
  const Inputs in = inputs(g, s, t, /*v_transposed=*/false);
  const std::array<int64_t, 4> scores{s.B, s.N, s.Sq, s.Skv}, rows{s.B, s.N, s.Sq, 1};
  TensorRef S = g.virt(CUDNN_DATA_FLOAT, scores);
  g.matmul(in.q, in.kt, S);
  TensorRef scale = g.scalar(kScale);
  S = g.binary(CUDNN_POINTWISE_MUL, S, scale);
  if (s.causal) S = causal_mask(g, S);
  TensorRef M = g.virt(CUDNN_DATA_FLOAT, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, S, M);
  TensorRef E = g.unary(CUDNN_POINTWISE_EXP, g.binary(CUDNN_POINTWISE_SUB, S, M));
  TensorRef Z = g.virt(CUDNN_DATA_FLOAT, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z);
  TensorRef logZ = g.virt(CUDNN_DATA_FLOAT, rows);
  g.pointwise(CUDNN_POINTWISE_LOG, Z, nullptr, nullptr, logZ);
  TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rows, packed(rows), false);
  g.pointwise(CUDNN_POINTWISE_ADD, M, &logZ, nullptr, stats);
  TensorRef P = g.virt(t, scores);  // the second matmul's A operand is in the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, E, &Z, nullptr, P);
  TensorRef O = g.tensor(kO, t, {s.B, s.N, s.Sq, s.D}, packed({s.B, s.N, s.Sq, s.D}), false);
  g.matmul(P, in.v_or_vt, O);
}

// out [B, Nkv, Skv, D] = a·b summed over each group of N/Nkv query heads (GQA), or a·b (MHA).
void matmul_to_kv_heads(GraphBuilder& g, const Shape& s, cudnnDataType_t t, const TensorRef& a, const TensorRef& b,
                        const TensorRef& out) {
  if (s.N == s.Nkv) {
    g.matmul(a, b, out);
    return;
  }
  TensorRef full = g.virt(t, {s.B, s.N, s.Skv, s.D});
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

void build_backward(GraphBuilder& g, const Shape& s, cudnnDataType_t t) {
  const Inputs in = inputs(g, s, t, /*v_transposed=*/true);
  const std::array<int64_t, 4> scores{s.B, s.N, s.Sq, s.Skv}, rows{s.B, s.N, s.Sq, 1};
  const std::array<int64_t, 4> qshape{s.B, s.N, s.Sq, s.D}, kvshape{s.B, s.Nkv, s.Skv, s.D};
  // Transposed views of [B, N, Sq, Skv] scores: [B, N, Skv, Sq].
  const std::array<int64_t, 4> scores_t{s.B, s.N, s.Skv, s.Sq}, scores_t_strides{s.N * s.Sq * s.Skv, s.Sq * s.Skv, 1, s.Skv};

  TensorRef O = g.tensor(kO, t, qshape, packed(qshape), false);
  TensorRef dO = g.tensor(kDO, t, qshape, packed(qshape), false);
  TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rows, packed(rows), false);
  TensorRef scale = g.scalar(kScale);
  TensorRef one = g.scalar(kOne);

  // Δ = Σ_d dO ∘ O (×1: where dropout's inverse scale goes), virtual.
  TensorRef dOO = g.binary(CUDNN_POINTWISE_MUL, dO, O);
  TensorRef dOO_sum = g.virt(CUDNN_DATA_FLOAT, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, dOO_sum);
  TensorRef delta = g.binary(CUDNN_POINTWISE_MUL, dOO_sum, one);

  // P = exp(mask(scale · Q·KT) - lse): the mask before the subtraction, as the engines expect.
  TensorRef S = g.virt(CUDNN_DATA_FLOAT, scores);
  g.matmul(in.q, in.kt, S);
  S = g.binary(CUDNN_POINTWISE_MUL, S, scale);
  if (s.causal) S = causal_mask(g, S);
  S = g.binary(CUDNN_POINTWISE_SUB, S, stats);
  TensorRef P = g.unary(CUDNN_POINTWISE_EXP, S);

  // dV = Pᵀ·dO.
  TensorRef PT = g.tensor(0, t, scores_t, scores_t_strides, true);
  g.reshape(P, PT);
  TensorRef dV = g.tensor(kDV, t, kvshape, packed(kvshape), false);
  matmul_to_kv_heads(g, s, t, PT, dO, dV);

  // dS = ((dO·VT)×1 - Δ) ∘ P × scale (×1: where dropout's mask goes).
  TensorRef dP = g.virt(CUDNN_DATA_FLOAT, scores);
  g.matmul(dO, in.v_or_vt, dP);
  dP = g.binary(CUDNN_POINTWISE_MUL, dP, one);
  TensorRef dS = g.binary(CUDNN_POINTWISE_MUL, g.binary(CUDNN_POINTWISE_SUB, dP, delta), P);
  dS = g.binary(CUDNN_POINTWISE_MUL, dS, scale);

  // dK = dSᵀ·Q.
  TensorRef dST = g.tensor(0, t, scores_t, scores_t_strides, true);
  g.reshape(dS, dST);
  TensorRef dK = g.tensor(kDK, t, kvshape, packed(kvshape), false);
  matmul_to_kv_heads(g, s, t, dST, in.q, dK);

  // dQ = dS·K, accumulated in fp32 (zeroed workspace, F16x16 as the frontend declares it), then T.
  TensorRef K = g.tensor(0, t, kvshape, packed(kvshape), true);
  g.reshape(in.kt, K);
  TensorRef dQacc = g.tensor(kDQAcc, CUDNN_DATA_FLOAT, qshape, packed(qshape), false, false,
                             CUDNN_TENSOR_REORDERING_F16x16);
  g.matmul(dS, K, dQacc);
  TensorRef dQ = g.tensor(kDQ, t, qshape, packed(qshape), false);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dQacc, nullptr, nullptr, dQ);
}

// ---- plans and their cache ---------------------------------------------------------------------

struct Plan {
  GraphBuilder graph;                 // keeps every descriptor of the graph alive
  std::unique_ptr<Desc> plan;         // CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
  std::vector<std::unique_ptr<Desc>> configs;
  int64_t workspace = 0;
};

using PlanKey = std::tuple<int, int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

std::string shape_text(const char* what, const Shape& s, cudnnDataType_t t) {
  return str("cuDNN SDPA ", what, " (", t == CUDNN_DATA_BFLOAT16 ? "bf16" : "f16", ", B ", s.B, ", N ", s.N, ", Nkv ",
             s.Nkv, ", Sq ", s.Sq, ", Skv ", s.Skv, ", D ", s.D, s.causal ? ", causal" : "", ")");
}

// Heuristics mode A, then the fallback list: the first engine config that finalizes.
void choose_plan(Plan& p, cudnnHandle_t handle, cudnnBackendDescriptor_t graph, const std::string& what) {
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    SET_ATTR(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    SET_ATTR(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) {
      tried += str(" heuristics mode ", static_cast<int>(mode), " could not be finalized;");
      continue;
    }
    int64_t count = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr));
    tried += str(" heuristics mode ", static_cast<int>(mode), " offered ", count, " engine config(s);");
    if (count <= 0) continue;
    p.configs.clear();
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      p.configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(p.configs.back()->get());
    }
    int64_t got = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         count, &got, raw.data()));
    for (int64_t i = 0; i < got; ++i) {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      SET_ATTR(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      SET_ATTR(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i]);
      if (cudnnBackendFinalize(plan->get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t ws = 0, n = 0;
      CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &n, &ws));
      p.plan = std::move(plan);
      p.workspace = ws;
      return;
    }
    tried += " none finalized;";
  }
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw RuntimeFailure(str(what, ": no cuDNN engine runs this graph on this device (", cudnn_runtime_version(), ");",
                           tried, last[0] ? str(" last cuDNN error: ", last) : std::string(),
                           ". Use runtime.attention \"flash\"."));
}

class PlanCache {
 public:
  static PlanCache& get() {
    static PlanCache* cache = new PlanCache;  // never destroyed: cuDNN may be unloaded at exit
    return *cache;
  }

  // Runs the plan of (backward?, shape, dtype) on `stream` with the given bound pointers; the
  // backward's fp32 dq accumulator is carved from the same workspace after cuDNN's own.
  void run(bool backward, const Shape& s, cudnnDataType_t t, std::vector<std::pair<int64_t, void*>> bound,
           float scale, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudnnHandle_t handle = handle_for(device);
    const std::string what = shape_text(backward ? "backward" : "forward", s, t);
    const Plan& plan = plan_for(device, handle, backward, s, t);

    // Workspace: cuDNN's, then (backward) the dq accumulator [B, N, Sq, D] fp32, zeroed.
    auto align = [](int64_t n) { return (n + 255) / 256 * 256; };
    const int64_t acc_bytes = backward ? s.B * s.N * s.Sq * s.D * 4 : 0;
    const int64_t total = align(plan.workspace) + acc_bytes;
    Scratch ws(static_cast<size_t>(total), stream);
    char* base = ws.as<char>();
    if (backward) {
      void* acc = base + align(plan.workspace);
      CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(acc_bytes), stream));
      bound.emplace_back(kDQAcc, acc);
    }
    // By-value scalars: read from host memory when the plan is enqueued.
    float neg_inf = cudnn_runtime_version() >= 91000 ? -std::numeric_limits<float>::infinity()
                                                     : std::numeric_limits<float>::lowest();
    float one = 1.0f;
    bound.emplace_back(kScale, &scale);
    if (s.causal) bound.emplace_back(kNegInf, &neg_inf);
    if (backward) bound.emplace_back(kOne, &one);

    std::vector<int64_t> uids;
    std::vector<void*> ptrs;
    for (const auto& [uid, p] : bound) {
      uids.push_back(uid);
      ptrs.push_back(p);
    }
    void* workspace = plan.workspace > 0 ? base : nullptr;
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    SET_ATTR(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
             uids.data());
    SET_ATTR(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(ptrs.size()), ptrs.data());
    SET_ATTR(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
    CUDNN_CHECK(cudnnSetStream(handle, stream));
    const cudnnStatus_t st = cudnnBackendExecute(handle, plan.plan->get(), pack.get());
    if (st != CUDNN_STATUS_SUCCESS) {
      char last[1024] = {0};
      cudnnGetLastErrorString(last, sizeof last);
      throw RuntimeFailure(str(what, ": cudnnBackendExecute: ", cudnnGetErrorString(st),
                               last[0] ? str(": ", last) : std::string()));
    }
  }

  // "" when the forward and backward plans of this shape build on the current device (building
  // and caching them now), else why not. A failure is remembered, so it is tried once per shape.
  std::string plan_error(const Shape& s, cudnnDataType_t t) {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      int device = 0;
      CUDA_CHECK(cudaGetDevice(&device));
      cudnnHandle_t handle = handle_for(device);
      for (bool backward : {false, true}) plan_for(device, handle, backward, s, t);
    } catch (const RuntimeFailure& e) {
      return e.what();
    }
    return "";
  }

 private:
  // The cached plan of (device, dtype, backward?, shape), built on first use. A build failure is
  // cached too and thrown again (RuntimeFailure naming the shape and the cuDNN error).
  const Plan& plan_for(int device, cudnnHandle_t handle, bool backward, const Shape& s, cudnnDataType_t t) {
    const PlanKey key{device, static_cast<int>(t), backward, s.B, s.N, s.Nkv, s.Sq, s.Skv, s.D, s.causal};
    if (auto failed = failures_.find(key); failed != failures_.end()) throw RuntimeFailure(failed->second);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    const std::string what = shape_text(backward ? "backward" : "forward", s, t);
    auto plan = std::make_unique<Plan>();
    try {
      if (backward)
        build_backward(plan->graph, s, t);
      else
        build_forward(plan->graph, s, t);
      cudnnBackendDescriptor_t graph = plan->graph.finish_graph(handle);
      choose_plan(*plan, handle, graph, what);
    } catch (const RuntimeFailure& e) {
      const std::string text = str(what, ": building the execution plan: ", e.what());
      failures_.emplace(key, text);
      throw RuntimeFailure(text);
    }
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

  cudnnHandle_t handle_for(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cudnnHandle_t h = nullptr;
    CUDNN_CHECK(cudnnCreate(&h));
    handles_.emplace(device, h);
    return h;
  }

  std::mutex mu_;
  std::map<int, cudnnHandle_t> handles_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
  std::map<PlanKey, std::string> failures_;
};

template <class T>
constexpr bool kSixteenBit = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
cudnnDataType_t cudnn_type() {
  return std::is_same_v<T, bf16> ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

void check_aligned(const char* name, const void* p) {
  AUTOSP_ASSERT(reinterpret_cast<uintptr_t>(p) % 16 == 0, "cuDNN SDPA: ", name, " = ", p, " is not 16-byte aligned");
}

template <class T>
void check_supported(int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal) {
  const std::string why = cudnn_sdpa_unsupported<T>(B, N, Nkv, Sq, Skv, D, causal);
  AUTOSP_ASSERT(why.empty(), "cuDNN SDPA called where it is not supported (the dispatch checks "
                             "cudnn_sdpa_unsupported first): ", why);
}

}  // namespace

size_t cudnn_runtime_version() { return cudnnGetVersion(); }

template <class T>
std::string cudnn_sdpa_unsupported(int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal) {
  if constexpr (!kSixteenBit<T>) {
    return "cuDNN fused attention takes bf16 or f16 inputs, not f32";
  } else {
    if (cudnn_runtime_version() < 90000) return str("cuDNN ", cudnn_runtime_version(), " is older than 9.0");
    if (D != 64 && D != 128) return str("head dim ", D, " (cuDNN SDPA here: 64 or 128)");
    if (B < 1 || N < 1 || Nkv < 1 || Sq < 1 || Skv < 1) return "empty attention";
    if (N % Nkv != 0) return str(N, " query heads do not group over ", Nkv, " kv heads");
    if (causal && Sq != Skv)
      return str("causal with Sq ", Sq, " != Skv ", Skv, " (cuDNN's causal mask is top-left aligned, ours bottom-right)");
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return "no CUDA device";
    }
    if (major < 8) return str("compute capability ", major, ".x (cuDNN SDPA needs 8.0 or newer)");
    // Last, whether cuDNN has an engine for both graphs of these sizes ("no engine" becomes a
    // fallback to our kernels instead of a failed run); builds and caches both plans.
    return PlanCache::get().plan_error(Shape{B, N, Nkv, Sq, Skv, D, causal}, cudnn_type<T>());
  }
}

template <class T>
void cudnn_sdpa_forward(const T* q, const T* k, const T* v, T* o, float* lse, int64_t B, int64_t N, int64_t Nkv,
                        int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, cudaStream_t stream) {
  check_supported<T>(B, N, Nkv, Sq, Skv, D, causal);
  if constexpr (kSixteenBit<T>) {
    for (auto [name, p] : {std::pair<const char*, const void*>{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse}})
      check_aligned(name, p);
    const Shape s{B, N, Nkv, Sq, Skv, D, causal};
    PlanCache::get().run(false, s, cudnn_type<T>(),
                         {{kQ, const_cast<T*>(q)}, {kK, const_cast<T*>(k)}, {kV, const_cast<T*>(v)}, {kO, o},
                          {kStats, lse}},
                         static_cast<float>(scale), stream);
  }
}

template <class T>
void cudnn_sdpa_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq, T* dk,
                         T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale,
                         bool causal, cudaStream_t stream) {
  check_supported<T>(B, N, Nkv, Sq, Skv, D, causal);
  if constexpr (kSixteenBit<T>) {
    for (auto [name, p] : {std::pair<const char*, const void*>{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"lse", lse},
                           {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}})
      check_aligned(name, p);
    const Shape s{B, N, Nkv, Sq, Skv, D, causal};
    PlanCache::get().run(true, s, cudnn_type<T>(),
                         {{kQ, const_cast<T*>(q)}, {kK, const_cast<T*>(k)}, {kV, const_cast<T*>(v)},
                          {kO, const_cast<T*>(o)}, {kStats, const_cast<float*>(lse)}, {kDO, const_cast<T*>(dout)},
                          {kDQ, dq}, {kDK, dk}, {kDV, dv}},
                         static_cast<float>(scale), stream);
  }
}

}  // namespace autosp::cuda

#endif  // AUTOSP_WITH_CUDNN

// Both builds (with cuDNN or without) define the same instantiations.
namespace autosp::cuda {

#define AUTOSP_CUDNN_INSTANTIATE(T)                                                                                 \
  template std::string cudnn_sdpa_unsupported<T>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool);     \
  template void cudnn_sdpa_forward<T>(const T*, const T*, const T*, T*, float*, int64_t, int64_t, int64_t, int64_t, \
                                      int64_t, int64_t, double, bool, cudaStream_t);                                \
  template void cudnn_sdpa_backward<T>(const T*, const T*, const T*, const T*, const float*, const T*, T*, T*, T*,   \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool,          \
                                       cudaStream_t);
AUTOSP_CUDNN_INSTANTIATE(float)
AUTOSP_CUDNN_INSTANTIATE(bf16)
AUTOSP_CUDNN_INSTANTIATE(f16)

}  // namespace autosp::cuda
