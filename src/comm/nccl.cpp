// The NCCL communicator (see comm/nccl.h for the stream, wait and error contracts). Every NCCL
// communicator here is non-blocking (ncclConfig_t::blocking = 0): a call may return ncclInProgress,
// and then the communicator is polled with ncclCommGetAsyncError until it is ready, within the
// deadline, so no host thread ever blocks inside NCCL (creation and split included).
// Knows nothing of graphs; the device is the caller's current one.
//
// Not run on a GPU yet (written against NCCL 2.28's nccl.h). Risks, with what to try first:
// - The all-to-all is ncclSend/ncclRecv per peer inside ncclGroupStart/End (not ncclAlltoAll,
//   which only NCCL 2.28 has), so any NCCL the GPU image ships links; only ncclGroupEnd may
//   return ncclInProgress, and it is waited on like every other call.
// - ncclCommSplit leaves the new handle NULL until the split completes: split() waits on the parent
//   first, then on the child. An assert "returned no communicator" means the parent's state said
//   ready too early; poll the parent until `child` is set instead.
// - Several communicators (world, sp, dp) each enqueue on their own stream: with more than one GPU
//   and the overlapped gradient all-reduce, kernels of two communicators can interleave differently
//   on different ranks and hang; try NCCL_LAUNCH_ORDER_IMPLICIT=1 first.
#include "comm/nccl.h"

#include "comm/nccl_support.h"

#ifndef AUTOSP_WITH_NCCL

namespace autosp {

bool nccl_built() { return false; }

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator&, void*, double) {
  throw RuntimeFailure("this build has no NCCL backend (it needs CUDA, MPI and NCCL at configure time)");
}

}  // namespace autosp

#else  // AUTOSP_WITH_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

// A failed CUDA call: RuntimeFailure "CUDA failure at file:line: call: name: text".
#define COMM_CUDA_CHECK(call)                                                                  \
  do {                                                                                         \
    const cudaError_t comm_cuda_err_ = (call);                                                 \
    if (comm_cuda_err_ != cudaSuccess) ::autosp::cuda_comm_fail(comm_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

namespace autosp {

[[noreturn]] static void cuda_comm_fail(cudaError_t err, const char* call, const char* file, int line) {
  throw RuntimeFailure(str("CUDA failure at ", file, ":", line, ": ", call, ": ", cudaGetErrorName(err), ": ",
                           cudaGetErrorString(err)));
}

bool nccl_built() { return true; }

namespace {

using nccl_support::Poll;
using nccl_support::WaitResult;

// "<ncclGetErrorString> (code N); last NCCL error: <ncclGetLastError>".
std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return str(ncclGetErrorString(r), " (code ", static_cast<int>(r), ")",
             last != nullptr && *last != '\0' ? str("; last NCCL error: ", last) : std::string());
}

[[noreturn]] void nccl_fail(const std::string& what, ncclResult_t r, ncclComm_t comm, const char* file, int line) {
  throw RuntimeFailure(str("NCCL failure at ", file, ":", line, ": ", what, ": ", nccl_text(r, comm)));
}

// Polls `comm` until it is no longer ncclInProgress. On an error or the deadline the communicator
// is aborted (and *aborted set, when given: the handle is freed, nothing may touch it again) and
// RuntimeFailure names `what`.
void wait_ready(ncclComm_t comm, const std::string& what, double timeout_s, const char* file, int line,
                bool* aborted = nullptr) {
  ncclResult_t state = ncclInProgress;
  const WaitResult w = nccl_support::wait_with_deadline(timeout_s, [&] {
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclInProgress) return Poll::pending;
    return state == ncclSuccess ? Poll::done : Poll::failed;
  });
  if (w == WaitResult::done) return;
  const std::string text = nccl_text(w == WaitResult::failed ? state : ncclInProgress, comm);
  if (aborted != nullptr) *aborted = true;
  ncclCommAbort(comm);
  if (w == WaitResult::failed)
    throw RuntimeFailure(str("NCCL failure at ", file, ":", line, ": ", what, ": ", text, "; communicator aborted"));
  throw RuntimeFailure(str("NCCL ", what, " did not finish within ", timeout_s,
                           " s (AUTOSP_COLLECTIVE_TIMEOUT): a peer rank is dead or hung; communicator aborted (", text,
                           ")"));
}

// A NCCL call on `comm`: an error throws; ncclInProgress waits until the communicator is ready
// (aborting it, and setting *aborted, on an error or the deadline).
#define NCCL_CALL(comm, timeout_s, aborted, call)                                             \
  do {                                                                                        \
    const ncclResult_t nccl_call_r_ = (call);                                                 \
    if (nccl_call_r_ == ncclInProgress)                                                       \
      wait_ready((comm), #call, (timeout_s), __FILE__, __LINE__, (aborted));                  \
    else if (nccl_call_r_ != ncclSuccess)                                                     \
      nccl_fail(#call, nccl_call_r_, (comm), __FILE__, __LINE__);                             \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i64: return ncclInt64;
    default: break;
  }
  AUTOSP_ASSERT(false, "NCCL all_reduce_sum of ", dtype_name(t), " (f32, f64, bf16, i64 only)");
  return ncclFloat32;
}

// Clears the cudaErrorNotReady that cudaEventQuery may leave as the last error (and only that), so
// a later launch check does not report it.
void clear_not_ready() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

class NcclComm;

// A non-blocking collective's handle: the done event of the collective on the communicator's
// stream; `what` names the call in its errors.
class NcclPending final : public PendingCollective {
 public:
  NcclPending(NcclComm& comm, cudaEvent_t done, const char* what) : comm_(comm), done_(done), what_(what) {}
  ~NcclPending() override;
  bool test() override;
  void wait() override;

 private:
  NcclComm& comm_;
  cudaEvent_t done_;
  const char* what_;
  bool joined_ = false;  // the compute stream waits for done_
};

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(ncclComm_t comm, Communicator& bootstrap, cudaStream_t compute, double timeout_s, int device)
      : comm_(comm), bootstrap_(bootstrap), compute_(compute), timeout_s_(timeout_s), device_(device) {
    try {  // the destructor does not run when this throws: release what we own here
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclCommUserRank(comm_, &rank_));
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclCommCount(comm_, &size_));
      COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      COMM_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
      COMM_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)));
    } catch (...) {
      if (!aborted_) ncclCommAbort(comm_);
      if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
      throw;
    }
  }

  ~NcclComm() override {
    // Let the last collectives finish, then finalize; anything wrong (a dead peer) aborts instead.
    if (!aborted_) {
      try {
        use_device();
        synchronize();
        NCCL_CALL(comm_, timeout_s_, &aborted_, ncclCommFinalize(comm_));
        ncclCommDestroy(comm_);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: NCCL communicator shutdown: %s\n", e.what());
        if (!aborted_) ncclCommAbort(comm_);
      }
    }
    cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce_sum(Tensor& t) override {
    cudaEvent_t done = start_all_reduce(t);
    join(done);
  }

  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override {
    return std::make_unique<NcclPending>(*this, start_all_reduce(t), "all_reduce_sum_async");
  }

  void broadcast(Tensor& t, int root) override {
    check_device("broadcast", t);
    AUTOSP_ASSERT(root >= 0 && root < size_, "NCCL broadcast from rank ", root, " of ", size_);
    if (t.nbytes() == 0) return;
    begin();
    NCCL_CALL(comm_, timeout_s_, &aborted_, ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, stream_));
    join(record_done());
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    check_device("all_to_all", in);
    check_device("all_to_all", out);
    const size_t count = nccl_support::all_to_all_chunk(in.nbytes(), out.nbytes(), size_, 1);
    if (in.nbytes() == 0) return;
    begin();
    const void* send = in.raw();
    void* scratch = nullptr;
    if (in.raw() == out.raw()) {  // NCCL's all-to-all is not in place: send from a copy
      COMM_CUDA_CHECK(cudaMallocAsync(&scratch, in.nbytes(), stream_));
      COMM_CUDA_CHECK(cudaMemcpyAsync(scratch, in.raw(), in.nbytes(), cudaMemcpyDeviceToDevice, stream_));
      send = scratch;
    }
    // Grouped point-to-point, as PyTorch's all-to-all does (torch/csrc/cuda/nccl.cpp): every NCCL
    // since 2.7 has it, where ncclAlltoAll exists only from 2.28. In a non-blocking communicator
    // only ncclGroupEnd may return ncclInProgress; NCCL_CALL waits for it.
    const char* src = static_cast<const char*>(send);
    char* dst = static_cast<char*>(out.raw());
    NCCL_CALL(comm_, timeout_s_, &aborted_, ncclGroupStart());
    for (int peer = 0; peer < size_; ++peer) {
      const size_t at = static_cast<size_t>(peer) * count;
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclSend(src + at, count, ncclUint8, peer, comm_, stream_));
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclRecv(dst + at, count, ncclUint8, peer, comm_, stream_));
    }
    NCCL_CALL(comm_, timeout_s_, &aborted_, ncclGroupEnd());
    if (scratch != nullptr) COMM_CUDA_CHECK(cudaFreeAsync(scratch, stream_));
    join(record_done());
  }

  void all_gather(const Tensor& in, Tensor& out) override { join(start_all_gather(in, out)); }

  // ZeRO-3's parameter prefetch: the gather runs on this communicator's stream while the compute
  // stream goes on; wait() (or test() once it has passed) makes the compute stream wait for it.
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) override {
    return std::make_unique<NcclPending>(*this, start_all_gather(in, out), "all_gather_async");
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override { join(start_reduce_scatter(in, out)); }

  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override {
    return std::make_unique<NcclPending>(*this, start_reduce_scatter(in, out), "reduce_scatter_sum_async");
  }

  // Ring attention's block exchange: ncclSend to `dest` and ncclRecv from `src` in one group on
  // this communicator's stream, after the compute stream's work so far; returns without making the
  // compute stream wait (the attention of the current block runs meanwhile), like
  // all_reduce_sum_async.
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override {
    check_device("send_recv_async", send);
    check_device("send_recv_async", recv);
    AUTOSP_ASSERT(send.raw() != recv.raw() || send.nbytes() == 0 || recv.nbytes() == 0, "NCCL send_recv_async: ",
                  send.str(), " into ", recv.str());
    AUTOSP_ASSERT(dest >= 0 && dest < size_ && src >= 0 && src < size_, "NCCL send_recv_async to rank ", dest,
                  " from rank ", src, " of ", size_);
    begin();
    if (send.nbytes() > 0 || recv.nbytes() > 0) {  // an empty side is no message (its peer skips it alike)
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclGroupStart());
      if (send.nbytes() > 0)
        NCCL_CALL(comm_, timeout_s_, &aborted_, ncclSend(send.raw(), send.nbytes(), ncclUint8, dest, comm_, stream_));
      if (recv.nbytes() > 0)
        NCCL_CALL(comm_, timeout_s_, &aborted_, ncclRecv(recv.raw(), recv.nbytes(), ncclUint8, src, comm_, stream_));
      NCCL_CALL(comm_, timeout_s_, &aborted_, ncclGroupEnd());
    }
    return std::make_unique<NcclPending>(*this, record_done(), "send_recv_async");
  }

  // Every rank got here: a one-element all-reduce on this communicator's stream, waited for on the
  // host (so every collective enqueued before it has finished too). Does not wait for the compute
  // stream.
  void barrier() override {
    use_device();
    NCCL_CALL(comm_, timeout_s_, &aborted_, ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    cudaEvent_t done = record_done();
    host_wait(done, "barrier");
  }

  void synchronize() override {
    use_device();
    host_wait(record_done(), "synchronize");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    AUTOSP_ASSERT(color >= 0, "NCCL split: color ", color, " (must be >= 0)");
    use_device();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const ncclResult_t r = ncclCommSplit(comm_, color, key, &child, &config);
    if (r != ncclSuccess && r != ncclInProgress) nccl_fail("ncclCommSplit", r, comm_, __FILE__, __LINE__);
    wait_ready(comm_, "ncclCommSplit (parent communicator)", timeout_s_, __FILE__, __LINE__, &aborted_);
    AUTOSP_ASSERT(child != nullptr, "ncclCommSplit with color ", color, " returned no communicator");
    wait_ready(child, "ncclCommSplit (new communicator)", timeout_s_, __FILE__, __LINE__);
    return std::make_unique<NcclComm>(child, bootstrap_, compute_, timeout_s_, device_);
  }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    if (!aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);  // non-blocking communicator: may return ncclInProgress; we leave anyway
    }
    bootstrap_.abort(message, exit_code);
    std::_Exit(exit_code);  // bootstrap abort does not return; this is for the compiler
  }

  // ---- used by NcclPending ----

  // The compute stream waits for `done` (then `done` is destroyed once the device passes it).
  void join(cudaEvent_t done) {
    const cudaError_t e = cudaStreamWaitEvent(compute_, done, 0);
    cudaEventDestroy(done);
    COMM_CUDA_CHECK(e);
  }

  // Whether `done` has passed; a NCCL error seen meanwhile aborts the communicator and throws,
  // naming `what`.
  bool query(cudaEvent_t done, const char* what) {
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) COMM_CUDA_CHECK(e);
    clear_not_ready();
    check_async_error(what);
    return false;
  }

  // A NCCL error reported asynchronously: abort and throw.
  void check_async_error(const char* what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess || state == ncclInProgress) return;
    const std::string text = nccl_text(state, comm_);
    aborted_ = true;
    ncclCommAbort(comm_);
    throw RuntimeFailure(str("NCCL ", what, ": asynchronous error: ", text, "; communicator aborted"));
  }

 private:
  // The communicator was created on device_; a call from a thread on another device would enqueue
  // on the wrong one.
  void use_device() {
    AUTOSP_ASSERT(!aborted_, "NCCL communicator used after it was aborted (an earlier collective failed)");
    int current = -1;
    COMM_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_) COMM_CUDA_CHECK(cudaSetDevice(device_));
  }

  void check_device(const char* what, const Tensor& t) {
    AUTOSP_ASSERT(t.defined(), "NCCL ", what, ": undefined tensor");
    AUTOSP_ASSERT(t.device().kind == DeviceKind::cuda, "NCCL ", what, ": ", t.str(),
                  " is not a CUDA tensor (the NCCL communicator takes device tensors; host tensors go over MPI)");
    AUTOSP_ASSERT(t.device().index == device_, "NCCL ", what, ": ", t.str(), " is on cuda:", t.device().index,
                  ", this communicator on cuda:", device_);
    AUTOSP_ASSERT(t.is_contiguous(), "NCCL ", what, ": ", t.str(), " is not contiguous");
    use_device();
  }

  // This communicator's stream waits for everything enqueued so far on the compute stream.
  void begin() {
    cudaEvent_t ready = nullptr;
    COMM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ready, compute_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready, 0);
    cudaEventDestroy(ready);
    COMM_CUDA_CHECK(e);
  }

  // An event recorded on this communicator's stream now (the caller destroys it).
  cudaEvent_t record_done() {
    cudaEvent_t done = nullptr;
    COMM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    const cudaError_t e = cudaEventRecord(done, stream_);
    if (e != cudaSuccess) {
      cudaEventDestroy(done);
      COMM_CUDA_CHECK(e);
    }
    return done;
  }

  cudaEvent_t start_all_reduce(Tensor& t) {
    check_device("all_reduce_sum", t);
    const ncclDataType_t type = nccl_type(t.dtype());
    begin();
    if (t.numel() > 0)
      NCCL_CALL(comm_, timeout_s_, &aborted_,
                ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, ncclSum, comm_, stream_));
    return record_done();
  }

  cudaEvent_t start_all_gather(const Tensor& in, Tensor& out) {
    check_device("all_gather", in);
    check_device("all_gather", out);
    // In place (in = this rank's slot of out) is NCCL's own in-place case: no special handling.
    (void)nccl_support::all_gather_in_place(in.raw(), in.nbytes(), out.raw(), out.nbytes(), rank_, size_);
    begin();
    if (in.nbytes() > 0)
      NCCL_CALL(comm_, timeout_s_, &aborted_,
                ncclAllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, stream_));
    return record_done();
  }

  cudaEvent_t start_reduce_scatter(const Tensor& in, Tensor& out) {
    check_device("reduce_scatter_sum", in);
    check_device("reduce_scatter_sum", out);
    AUTOSP_ASSERT(in.dtype() == out.dtype() && in.nbytes() == out.nbytes() * static_cast<size_t>(size_),
                  "NCCL reduce_scatter_sum: ", in.str(), " over ", size_, " ranks into ", out.str());
    const ncclDataType_t type = nccl_type(in.dtype());
    begin();
    if (out.numel() > 0)
      NCCL_CALL(comm_, timeout_s_, &aborted_,
                ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()), type, ncclSum, comm_, stream_));
    return record_done();
  }

  // Polls `done` on the host until it passes, a NCCL error shows, or the deadline (then aborts the
  // communicator and throws). Destroys `done`.
  void host_wait(cudaEvent_t done, const char* what) {
    cudaError_t cuda_err = cudaSuccess;
    ncclResult_t nccl_state = ncclSuccess;
    const WaitResult w = nccl_support::wait_with_deadline(timeout_s_, [&] {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) return Poll::done;
      if (e != cudaErrorNotReady) {
        cuda_err = e;
        return Poll::failed;
      }
      clear_not_ready();
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &nccl_state);
      if (q != ncclSuccess) nccl_state = q;
      return nccl_state == ncclSuccess || nccl_state == ncclInProgress ? Poll::pending : Poll::failed;
    });
    cudaEventDestroy(done);
    if (w == WaitResult::done) return;
    if (cuda_err != cudaSuccess) cuda_comm_fail(cuda_err, "cudaEventQuery (NCCL host wait)", __FILE__, __LINE__);
    const std::string text = nccl_text(w == WaitResult::failed ? nccl_state : ncclInProgress, comm_);
    aborted_ = true;
    ncclCommAbort(comm_);
    if (w == WaitResult::failed)
      throw RuntimeFailure(str("NCCL ", what, ": asynchronous error: ", text, "; communicator aborted"));
    throw RuntimeFailure(str("NCCL ", what, " (rank ", rank_, " of ", size_, ") did not finish within ", timeout_s_,
                             " s (AUTOSP_COLLECTIVE_TIMEOUT): a peer rank is dead or hung; communicator aborted"));
  }

  ncclComm_t comm_;
  Communicator& bootstrap_;
  cudaStream_t compute_;
  double timeout_s_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  bool aborted_ = false;
};

NcclPending::~NcclPending() {
  if (joined_) return;
  // Destroying an unfinished collective waits for it, on the compute stream as wait() does.
  try {
    comm_.join(done_);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "warning: NCCL %s: %s\n", what_, ex.what());
  }
}

bool NcclPending::test() {
  if (joined_) return true;
  if (!comm_.query(done_, what_)) return false;
  comm_.join(done_);
  joined_ = true;
  return true;
}

void NcclPending::wait() {
  if (joined_) return;
  comm_.check_async_error(what_);
  comm_.join(done_);
  joined_ = true;
}

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap, void* compute_stream,
                                                         double timeout_s) {
  AUTOSP_ASSERT(timeout_s > 0, "NCCL communicator timeout ", timeout_s, " s");
  int device = -1;
  COMM_CUDA_CHECK(cudaGetDevice(&device));
  // The unique id: created on rank 0, broadcast over the bootstrap (MPI) communicator.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  std::vector<uint8_t> bytes(sizeof id, 0);
  if (bootstrap.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, nullptr, __FILE__, __LINE__);
    std::memcpy(bytes.data(), &id, sizeof id);
  }
  bytes = nccl_support::broadcast_bytes(bootstrap, bytes, 0);
  std::memcpy(&id, bytes.data(), sizeof id);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config);
  if (r != ncclSuccess && r != ncclInProgress)
    nccl_fail(str("ncclCommInitRankConfig (rank ", bootstrap.rank(), " of ", bootstrap.size(), ", cuda:", device, ")"),
              r, comm, __FILE__, __LINE__);
  AUTOSP_ASSERT(comm != nullptr, "ncclCommInitRankConfig returned no communicator");
  wait_ready(comm, str("ncclCommInitRankConfig (rank ", bootstrap.rank(), " of ", bootstrap.size(), ", cuda:", device, ")"),
             timeout_s, __FILE__, __LINE__);
  return std::make_unique<NcclComm>(comm, bootstrap, static_cast<cudaStream_t>(compute_stream), timeout_s, device);
}

}  // namespace autosp

#endif  // AUTOSP_WITH_NCCL
