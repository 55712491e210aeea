// CUDA kernels of preference training. The rows' log-probabilities come from the cross-entropy
// row pass (kernels/cuda/loss.cuh linear_ce_rows: one block per row), the sums into sequences from
// one thread per table entry walking its row in order, the backward from cross_entropy_backward_rows
// with each row's gradient; the DPO loss over the small table is one thread running the table loop
// of kernels/dpo.h (dpo_table) that the CPU kernel runs too. Deterministic.
#include "kernels/cuda/preference.cuh"

#include "kernels/cuda/loss.cuh"

namespace autosp::cuda {

namespace {

constexpr int kBlock = 256;

// ==== kernels ===================================================================================

// out[i] for entry i = (b, side, k): −Σ row_loss over row b's scored targets of that slot.
template <class A>
__global__ void slot_sums_kernel(const double* row_loss, const int64_t* labels, const int64_t* slots, A* out,
                                 int64_t entries, int64_t S, int64_t K, int64_t ignore_index) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int64_t b = i / (2 * K), k = i % K, want = (i / K) % 2 == 0 ? k + 1 : -(k + 1);
  double sum = 0;
  for (int64_t r = b * S; r < (b + 1) * S; ++r)
    if (labels[r] != ignore_index && slots[r] == want) sum -= row_loss[r];
  out[i] = A(sum);
}

// row_grad[r] = −grad[its slot] on scored targets (the gradient of a log-probability is minus the
// cross entropy's), 0 elsewhere.
template <class A>
__global__ void row_grads_kernel(const int64_t* labels, const int64_t* slots, const A* grad, A* row_grad,
                                 int64_t rows, int64_t S, int64_t K, int64_t ignore_index) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t s = slots[r], k = s > 0 ? s - 1 : -s - 1;
  const bool scored = labels[r] != ignore_index && s != 0 && k < K;
  row_grad[r] = scored ? -grad[((r / S) * 2 + (s > 0 ? 0 : 1)) * K + k] : A(0);
}

template <class A>
__global__ void dpo_loss_kernel(const A* policy, const A* reference, const A* tokens, const A* norms, int64_t B,
                                int64_t K, kernels::DpoArgs a, A* loss, A* dpolicy, const A* grad) {
  const double l = kernels::dpo_table(policy, reference, tokens, norms, B, K, a, dpolicy, dpolicy ? double(*grad) : 0.0);
  if (loss) *loss = A(l);
}

}  // namespace

// ==== launchers =================================================================================

template <class T>
void sequence_logps(const T* logits, const int64_t* labels, const int64_t* slots, acc_t<T>* out, int64_t B,
                    int64_t S, int64_t V, int64_t K, int64_t ignore_index, cudaStream_t stream) {
  const int64_t rows = B * S, entries = B * 2 * K;
  AUTOSP_ASSERT(rows > 0 && K > 0, "sequence_logps rows ", rows, " K ", K);
  Scratch row_loss(size_t(rows) * sizeof(double), stream), argmax(size_t(rows) * sizeof(int64_t), stream);
  linear_ce_rows<T>(logits, labels, row_loss.as<double>(), argmax.as<int64_t>(), rows, V, ignore_index, stream);
  launch_kernel(slot_sums_kernel<acc_t<T>>, grid_for(entries, kBlock), kBlock, 0, stream, row_loss.as<double>(),
                labels, slots, out, entries, S, K, ignore_index);
}

template <class T>
void sequence_logps_backward(const T* logits, const int64_t* labels, const int64_t* slots, const acc_t<T>* grad,
                             T* dlogits, int64_t B, int64_t S, int64_t V, int64_t K, int64_t ignore_index,
                             cudaStream_t stream) {
  const int64_t rows = B * S;
  AUTOSP_ASSERT(rows > 0 && K > 0, "sequence_logps_backward rows ", rows, " K ", K);
  Scratch row_grad(size_t(rows) * sizeof(acc_t<T>), stream);
  launch_kernel(row_grads_kernel<acc_t<T>>, grid_for(rows, kBlock), kBlock, 0, stream, labels, slots, grad,
                row_grad.as<acc_t<T>>(), rows, S, K, ignore_index);
  cross_entropy_backward_rows<T>(logits, labels, dlogits, rows, V, row_grad.as<acc_t<T>>(), ignore_index, stream);
}

template <class A>
void dpo_loss(const A* policy, const A* reference, const A* tokens, const A* norms, int64_t B, int64_t K,
              const kernels::DpoArgs& args, A* loss, A* dpolicy, const A* grad, cudaStream_t stream) {
  launch_kernel(dpo_loss_kernel<A>, 1, 1, 0, stream, policy, reference, tokens, norms, B, K, args, loss, dpolicy, grad);
}

#define AUTOSP_INSTANTIATE(T)                                                                                     \
  template void sequence_logps<T>(const T*, const int64_t*, const int64_t*, acc_t<T>*, int64_t, int64_t, int64_t, \
                                  int64_t, int64_t, cudaStream_t);                                                \
  template void sequence_logps_backward<T>(const T*, const int64_t*, const int64_t*, const acc_t<T>*, T*, int64_t, \
                                           int64_t, int64_t, int64_t, int64_t, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE
template void dpo_loss<float>(const float*, const float*, const float*, const float*, int64_t, int64_t,
                              const kernels::DpoArgs&, float*, float*, const float*, cudaStream_t);
template void dpo_loss<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                               const kernels::DpoArgs&, double*, double*, const double*, cudaStream_t);

}  // namespace autosp::cuda
