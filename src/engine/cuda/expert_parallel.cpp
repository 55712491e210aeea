// Expert parallelism's exchange on CUDA (engine/cuda/expert_parallel.h): the layout of
// engine/expert_parallel_layout.h, the pieces of kernels/cuda/moe.cuh, the group's collectives on
// device tensors. Host code; the CUDA emulation (tests/cuda/emulation.h) compiles it for the host
// with the kernels, so tests/cuda/emulate_moe.cpp runs it on thread-rank communicators.
#include "engine/cuda/expert_parallel.h"

#include <type_traits>
#include <vector>

#include "engine/expert_parallel_layout.h"
#include "kernels/cuda/moe.cuh"
#include "kernels/moe_routing.h"
#include "tensor/check.h"
#include "tensor/tensor.h"

namespace autosp::cuda {
namespace {

template <class V>
DType dtype_for() {
  if constexpr (std::is_same_v<V, bf16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<V, double>)
    return DType::f64;
  else
    return DType::f32;
}

template <class V>
V* at(const Tensor& t) {
  return static_cast<V*>(t.raw());
}

// A host list of int64 on the device (at least one element, so the pointer is never null).
Tensor upload(const std::vector<int64_t>& v, Allocator& alloc, cudaStream_t s) {
  Tensor t = Tensor::empty({std::max<int64_t>(1, int64_t(v.size()))}, DType::i64, alloc);
  if (!v.empty())
    CUDA_CHECK(cudaMemcpyAsync(t.raw(), v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  return t;
}

Tensor zeros(Shape shape, DType dt, Allocator& alloc, cudaStream_t s) {
  Tensor t = Tensor::empty(std::move(shape), dt, alloc);
  if (t.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), s));
  return t;
}

// Counts first: every rank's rows per expert [G, E], all-gathered over the group on the device
// and read back.
EpLayout exchange_counts(Communicator& ep, Allocator& alloc, const kernels::MoeRouting& r, cudaStream_t s) {
  const int G = ep.size();
  AUTOSP_ASSERT(r.E % G == 0, "expert parallelism: ", r.E, " experts over ", G, " ranks");
  std::vector<int64_t> mine(size_t(r.E)), all(size_t(G * r.E));
  for (int64_t e = 0; e < r.E; ++e) mine[size_t(e)] = r.rows_of(e);
  const Tensor dm = upload(mine, alloc, s);
  Tensor da = Tensor::empty({G, r.E}, DType::i64, alloc);
  CUDA_CHECK(cudaStreamSynchronize(s));  // `mine` is a host temporary
  ep.all_gather(dm, da);
  CUDA_CHECK(cudaMemcpyAsync(all.data(), da.raw(), all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return EpLayout(G, ep.rank(), r.E, std::move(all));
}

Tensor exchange(Communicator& ep, const Tensor& send, Allocator& alloc) {
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), alloc);
  ep.all_to_all(send, recv);
  return recv;
}

// The send buffer [G, M, C]: src's rows (row slot / k) for each destination's experts, by slot.
template <class V>
Tensor pack(const EpLayout& ex, const Tensor& send_slot, const V* src, int64_t C, int64_t k, Allocator& alloc,
            cudaStream_t s) {
  Tensor t = Tensor::empty({ex.G, ex.M, C}, dtype_for<V>(), alloc);
  moe_gather_rows<V>(src, at<int64_t>(send_slot), at<V>(t), ex.G * ex.M, C, k, s);
  return t;
}

// One message of several row sets: each row of the message is its parts' rows side by side
// ([x | dy | w] out, [dx | g] back), so the backward's exchange is one all-to-all each way, as
// the CPU's (decision 226). `parts` are contiguous tensors of the same row count; their row bytes
// may differ (a bf16 x and an f32 w). The message is bytes in rows of the summed widths, padded to
// 8 bytes (NCCL moves it as bytes).
struct Message {
  std::vector<size_t> width, offset;  // bytes of each part's row, and where it starts in a row
  size_t pitch = 0;                   // bytes of a message row
  int64_t rows = 0;
};

Message message_of(const std::vector<const Tensor*>& parts, int64_t rows) {
  Message m;
  m.rows = rows;
  for (const Tensor* t : parts) {
    m.offset.push_back(m.pitch);
    m.width.push_back(rows == 0 ? 0 : t->nbytes() / size_t(rows));
    m.pitch += m.width.back();
  }
  m.pitch = (m.pitch + 7) / 8 * 8;
  return m;
}

// [G, M] message rows of m.pitch bytes, as int64 words (the all-to-all moves bytes).
Tensor pack_message(const EpLayout& ex, const Message& m, const std::vector<const Tensor*>& parts, Allocator& alloc,
                    cudaStream_t s) {
  Tensor t = Tensor::empty({ex.G, ex.M, int64_t(m.pitch / 8)}, DType::i64, alloc);
  for (size_t i = 0; i < parts.size(); ++i)
    CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(t.raw()) + m.offset[i], m.pitch, parts[i]->raw(), m.width[i],
                                 m.width[i], size_t(m.rows), cudaMemcpyDeviceToDevice, s));
  return t;
}

void unpack_message(const Message& m, const Tensor& t, const std::vector<Tensor*>& parts, cudaStream_t s) {
  for (size_t i = 0; i < parts.size(); ++i)
    CUDA_CHECK(cudaMemcpy2DAsync(parts[i]->raw(), m.width[i], static_cast<const char*>(t.raw()) + m.offset[i],
                                 m.pitch, m.width[i], size_t(m.rows), cudaMemcpyDeviceToDevice, s));
}

}  // namespace

template <class T>
void moe_ep_forward(Communicator& ep, Allocator& alloc, const T* x, const T* probs, const T* const* w_gate,
                    const T* const* w_up, const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I,
                    int64_t k, bool norm, const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  const kernels::MoeRouting r = moe_route<T>(probs, R, E, k, norm, s);
  const EpLayout ex = exchange_counts(ep, alloc, r, s);
  if (R * C > 0) CUDA_CHECK(cudaMemsetAsync(y, 0, R * C * sizeof(T), s));
  if (ex.M == 0) return;  // no rank routed any token (every rank knows it)
  const DeviceRouting<T> d(r, s);
  std::vector<int64_t> own, offset;
  ex.local_rows(own, offset);
  const Tensor send_slot = upload(ex.send_slots(r), alloc, s), own_rows = upload(own, alloc, s);
  CUDA_CHECK(cudaStreamSynchronize(s));  // the lists are host temporaries
  const Tensor recv = exchange(ep, pack<T>(ex, send_slot, x, C, k, alloc, s), alloc);
  // The owner: each local expert on its rows from every source; out row = the expert's output.
  Tensor out = zeros({ex.G, ex.M, C}, dtype_for<T>(), alloc, s);
  moe_rows_forward<T>(at<T>(recv), {at<int64_t>(own_rows), &offset, 1, nullptr}, w_gate, w_up, w_down, at<T>(out), C,
                      I, opt, s);
  const Tensor back = exchange(ep, out, alloc);
  for (int64_t e = 0; e < E; ++e)  // the source weights and adds, experts in index order as moe_experts
    moe_scatter_add_rows<T>(at<T>(back) + ex.back_row(r, e) * C, d.slots() + r.offset[size_t(e)], d.weights(), y,
                            r.rows_of(e), C, k, s);
}

template <class T>
void moe_ep_backward(Communicator& ep, Allocator& alloc, const T* dy, const T* x, const T* probs,
                     const T* const* w_gate, const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                     T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I,
                     int64_t k, bool norm, const kernels::MoeOptions<T>& opt, cudaStream_t s) {
  using A = acc_t<T>;
  const kernels::MoeRouting r = moe_route<T>(probs, R, E, k, norm, s);
  const EpLayout ex = exchange_counts(ep, alloc, r, s);
  if (R * C > 0) CUDA_CHECK(cudaMemsetAsync(dx, 0, R * C * sizeof(T), s));
  const DeviceRouting<T> d(r, s);
  const Tensor grad = zeros({std::max<int64_t>(1, R * k)}, dtype_for<A>(), alloc, s);  // each slot's weight gradient
  std::vector<int64_t> own, offset;
  ex.local_rows(own, offset);
  const Tensor own_rows = upload(own, alloc, s);
  Tensor rx, rdy, rw, dxo, go;
  if (ex.M > 0) {  // out: [x | dy | the slot's routing weight] (w in acc_t<T>, as the kernel applies it)
    const Tensor send_slot = upload(ex.send_slots(r), alloc, s);
    CUDA_CHECK(cudaStreamSynchronize(s));  // the lists are host temporaries
    const Tensor px = pack<T>(ex, send_slot, x, C, k, alloc, s), pdy = pack<T>(ex, send_slot, dy, C, k, alloc, s);
    const Tensor pw = pack<A>(ex, send_slot, d.weights(), 1, 1, alloc, s);
    const Message out = message_of({&px, &pdy, &pw}, ex.G * ex.M);
    const Tensor recv = exchange(ep, pack_message(ex, out, {&px, &pdy, &pw}, alloc, s), alloc);
    rx = Tensor::empty(px.shape(), px.dtype(), alloc);
    rdy = Tensor::empty(pdy.shape(), pdy.dtype(), alloc);
    rw = Tensor::empty(pw.shape(), pw.dtype(), alloc);
    unpack_message(out, recv, {&rx, &rdy, &rw}, s);
    dxo = zeros({ex.G, ex.M, C}, dtype_for<T>(), alloc, s);
    go = zeros({ex.G, ex.M}, dtype_for<A>(), alloc, s);
  } else {
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // The owner: the seven-GEMM backward of each local expert on its rows from every source (with no
  // rows anywhere it still writes the gradients: zeros).
  const MoeRows<T> rows{at<int64_t>(own_rows), &offset, 1, ex.M > 0 ? at<A>(rw) : nullptr};
  moe_rows_backward<T>(ex.M > 0 ? at<T>(rdy) : nullptr, ex.M > 0 ? at<T>(rx) : nullptr, rows, w_gate, w_up, w_down,
                       ex.M > 0 ? at<T>(dxo) : nullptr, ex.M > 0 ? at<A>(go) : nullptr, dw_gate, dw_up, dw_down, C, I,
                       opt, s);
  if (ex.M > 0) {  // back: [dx | the slot's weight gradient], added at the source
    const Message back = message_of({&dxo, &go}, ex.G * ex.M);
    const Tensor recv = exchange(ep, pack_message(ex, back, {&dxo, &go}, alloc, s), alloc);
    Tensor bdx = Tensor::empty(dxo.shape(), dxo.dtype(), alloc), bg = Tensor::empty(go.shape(), go.dtype(), alloc);
    unpack_message(back, recv, {&bdx, &bg}, s);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t row = ex.back_row(r, e), n = r.rows_of(e);
      const int64_t* slot = d.slots() + r.offset[size_t(e)];
      moe_scatter_add_rows<T>(at<T>(bdx) + row * C, slot, nullptr, dx, n, C, k, s);
      moe_scatter_add_rows<A>(at<A>(bg) + row, slot, nullptr, at<A>(grad), n, 1, 1, s);
    }
  }
  moe_probs_grad<T>(r, norm, at<A>(grad), dprobs, s);
}

#define AUTOSP_MOE_EP(T)                                                                                             \
  template void moe_ep_forward<T>(Communicator&, Allocator&, const T*, const T*, const T* const*, const T* const*,  \
                                  const T* const*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, bool,            \
                                  const kernels::MoeOptions<T>&, cudaStream_t);                                      \
  template void moe_ep_backward<T>(Communicator&, Allocator&, const T*, const T*, const T*, const T* const*,        \
                                   const T* const*, const T* const*, T*, T*, T* const*, T* const*, T* const*,        \
                                   int64_t, int64_t, int64_t, int64_t, int64_t, bool, const kernels::MoeOptions<T>&, \
                                   cudaStream_t);
AUTOSP_MOE_EP(float)
AUTOSP_MOE_EP(double)
AUTOSP_MOE_EP(bf16)
#undef AUTOSP_MOE_EP

}  // namespace autosp::cuda
