// CUDA GEMM launchers on cuBLASLt: batched, strided, row-major; C of the inputs' type, or f32 C
// for bf16 inputs (gemm_bf16_f32). Knows nothing of graphs.
//
// Row-major to cuBLASLt's column-major: a row-major M×N matrix with leading dim N is the
// column-major N×M matrix with the same memory, so C = op(A)·op(B) is computed as
// Cᵀ = op(B)ᵀ·op(A)ᵀ with m = N, n = M: cuBLASLt's "A" is our B (transposed iff trans_b) and its
// "B" is our A (transposed iff trans_a).
//
// Per device: one cuBLASLt handle and, per stream, one workspace of kGemmWorkspaceBytes (kept for
// the process). Per GEMM shape (types, transposes, sizes, strides and the pointers' alignment):
// the descriptors and the heuristic's first algorithm, created once and cached, so a training step
// asks the heuristic only on its first iteration. A shape for which cuBLASLt offers no algorithm
// (odd leading dims of bf16 operands, say) falls back to cublasGemmStridedBatchedEx with the same
// mapping, on a cuBLAS handle of the device given the stream's workspace.
#include "kernels/cuda/matmul.cuh"

#include <cublas_v2.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  cublasHandle_t blas = nullptr;  // the fallback, created when first needed
  std::map<cudaStream_t, void*> workspaces;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (= D)
  cublasLtMatmulAlgo_t algo{};
  bool fallback = false;  // cuBLASLt has no algorithm: use cublasGemmStridedBatchedEx
};

// device, dtype of A and B, dtype of C, trans_a, trans_b, batch, M, N, K, stride_a, stride_b, stride_c,
// alignments a, b, c
using PlanKey = std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           uint32_t, uint32_t, uint32_t>;

std::mutex g_mutex;
std::vector<std::unique_ptr<DeviceState>> g_devices;  // by device ordinal
std::map<PlanKey, Plan> g_plans;                      // never freed: one per GEMM shape of the program

int current_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// The state of device `dev`, created on first use. Call with g_mutex held.
DeviceState& device_state(int dev) {
  if (g_devices.size() <= size_t(dev)) g_devices.resize(size_t(dev) + 1);
  if (!g_devices[dev]) {
    auto s = std::make_unique<DeviceState>();
    CUBLAS_CHECK(cublasLtCreate(&s->handle));
    g_devices[dev] = std::move(s);
  }
  return *g_devices[dev];
}

void* stream_workspace(DeviceState& s, cudaStream_t stream) {
  auto it = s.workspaces.find(stream);
  if (it != s.workspaces.end()) return it->second;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, kGemmWorkspaceBytes));
  s.workspaces.emplace(stream, ws);
  return ws;
}

// Largest power of two ≤ 256 dividing the address (and the batch stride in bytes when batched).
uint32_t alignment(const void* p, int64_t stride_bytes, bool batched) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batched && stride_bytes != 0) v |= uint64_t(stride_bytes);
  return uint32_t(v & (~v + 1));  // lowest set bit
}

template <class T>
struct GemmTypes;  // cuBLAS data, scale and compute types of T
template <>
struct GemmTypes<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F, scale = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using Scale = float;
};
template <>
struct GemmTypes<bf16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF, scale = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using Scale = float;
};
template <>
struct GemmTypes<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F, scale = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  using Scale = double;
};

void set_batch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  const int32_t count = static_cast<int32_t>(batch);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// Descriptors and algorithm for one GEMM shape: A and B of T, C of TC. Call with g_mutex held.
template <class T, class TC>
const Plan& plan_for(cublasLtHandle_t handle, const PlanKey& key) {
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second;
  const auto [dev, dt, dtc, ta, tb, batch, M, N, K, sa, sb, sc, align_a, align_b, align_c] = key;
  using G = GemmTypes<T>;
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, G::compute, G::scale));
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // Column-major shapes of the stored matrices (rows, cols, leading dim).
  if (!tb)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, G::data, uint64_t(N), uint64_t(K), N));
  else
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, G::data, uint64_t(K), uint64_t(N), K));
  if (!ta)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, G::data, uint64_t(K), uint64_t(M), K));
  else
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, G::data, uint64_t(M), uint64_t(K), M));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, GemmTypes<TC>::data, uint64_t(N), uint64_t(M), N));
  if (batch > 1) {
    set_batch(p.a, batch, sb);
    set_batch(p.b, batch, sa);
    set_batch(p.c, batch, sc);
  }
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kGemmWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLASLt's A is our B: the alignments swap too.
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                                    sizeof(align_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                                    sizeof(align_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                    sizeof(align_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                    sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.fallback = st != CUBLAS_STATUS_SUCCESS || found == 0;
  if (!p.fallback) p.algo = result.algo;
  (void)dev;
  (void)dt;
  (void)dtc;
  return g_plans.emplace(key, p).first->second;
}

}  // namespace

// ==== kernels ===================================================================================

namespace {

// C[b] = beta · C[b] (beta == 0 overwrites, NaN included): the K == 0 case.
template <class T>
__global__ void scale_c_kernel(T* c, int64_t batch, int64_t MN, int64_t stride_c, double beta) {
  AUTOSP_GRID_STRIDE(i, batch * MN) {
    T* ci = c + (i / MN) * stride_c + i % MN;
    *ci = beta == 0.0 ? from_acc<T>(acc_t<T>(0)) : from_acc<T>(acc_t<T>(beta) * to_acc(*ci));
  }
}

}  // namespace

// ==== launchers =================================================================================

cublasLtHandle_t lt_handle() {
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  return device_state(dev).handle;
}

namespace {

// gemm_batched with A and B of T and C of TC (TC = T, or float for bf16 inputs).
template <class T, class TC>
void gemm(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
          int64_t stride_a, const T* b, int64_t stride_b, double beta, TC* c, int64_t stride_c, cudaStream_t stream) {
  AUTOSP_ASSERT(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm sizes ", batch, " ", M, " ", N, " ", K);
  AUTOSP_ASSERT(batch <= INT32_MAX, "gemm batch ", batch, " exceeds int32");
  AUTOSP_ASSERT(batch <= 1 || stride_c != 0, "gemm stride_c 0 with batch ", batch);
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    launch_kernel(scale_c_kernel<TC>, grid_for(batch * M * N, kBlock), kBlock, 0, stream, c, batch, M * N, stride_c,
                  beta);
    return;
  }
  const bool batched = batch > 1;
  const int dev = current_device();
  const PlanKey key{dev,
                    int(GemmTypes<T>::data),
                    int(GemmTypes<TC>::data),
                    trans_a,
                    trans_b,
                    batch,
                    M,
                    N,
                    K,
                    batched ? stride_a : 0,
                    batched ? stride_b : 0,
                    batched ? stride_c : 0,
                    alignment(a, stride_a * int64_t(sizeof(T)), batched),
                    alignment(b, stride_b * int64_t(sizeof(T)), batched),
                    alignment(c, stride_c * int64_t(sizeof(TC)), batched)};
  using G = GemmTypes<T>;
  using Scale = typename G::Scale;
  const Scale al = Scale(alpha), be = Scale(beta);
  std::unique_lock<std::mutex> lock(g_mutex);
  DeviceState& s = device_state(dev);
  void* workspace = stream_workspace(s, stream);
  const Plan& plan = plan_for<T, TC>(s.handle, key);  // std::map nodes are stable
  if (!plan.fallback) {
    lock.unlock();
    CUBLAS_CHECK(cublasLtMatmul(s.handle, plan.desc, &al, b, plan.a, a, plan.b, &be, c, plan.c, c, plan.c, &plan.algo,
                                workspace, kGemmWorkspaceBytes, stream));
    return;
  }
  // The fallback: stream and workspace are per call, so keep the lock until it is enqueued.
  AUTOSP_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "gemm dims exceed int32");
  if (s.blas == nullptr) CUBLAS_CHECK(cublasCreate(&s.blas));
  CUBLAS_CHECK(cublasSetStream(s.blas, stream));
  CUBLAS_CHECK(cublasSetWorkspace(s.blas, workspace, kGemmWorkspaceBytes));
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      s.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K), &al, b,
      G::data, int(trans_b ? K : N), stride_b, a, G::data, int(trans_a ? M : K), stride_a, &be, c, GemmTypes<TC>::data, int(N),
      stride_c, int(batch), G::compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
                  int64_t stride_a, const T* b, int64_t stride_b, double beta, T* c, int64_t stride_c,
                  cudaStream_t stream) {
  gemm<T, T>(trans_a, trans_b, batch, M, N, K, alpha, a, stride_a, b, stride_b, beta, c, stride_c, stream);
}

void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const bf16* a,
                   const bf16* b, double beta, float* c, cudaStream_t stream) {
  gemm<bf16, float>(trans_a, trans_b, 1, M, N, K, alpha, a, 0, b, 0, beta, c, 0, stream);
}

#define AUTOSP_INSTANTIATE(T)                                                                                        \
  template void gemm_batched<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, double, const T*, int64_t, const T*, \
                                int64_t, double, T*, int64_t, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
