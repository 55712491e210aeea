// The MPI communicator (host tensors, blocking collectives over an MPI_Comm) and the world factory
// for builds with MPI. MPI is initialised only when an MPI launcher started this process, so a
// plain run never pays for OpenMPI's singleton start-up; it is finalised once, at exit (a non-zero
// exit aborts the whole job instead, so one failing rank cannot leave the others hanging).
// Knows nothing of graphs, devices other than the CPU, or the process mesh (comm/single.cpp).
#ifdef AUTOSP_WITH_MPI

// The C API only: OpenMPI's mpi.h otherwise pulls in the deprecated C++ bindings, which the
// autosp library (linked to MPI::MPI_C) does not link against.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "comm/exit.h"

#include "comm/communicator.h"

// Every MPI call goes through MPI_CHECK: communicators use MPI_ERRORS_RETURN, so a failure comes
// back here and becomes a RuntimeFailure naming the call, file:line and MPI's own message.
#define MPI_CHECK(call)                                                                 \
  do {                                                                                  \
    int mpi_check_rc_ = (call);                                                         \
    if (mpi_check_rc_ != MPI_SUCCESS) ::autosp::mpi_fail(#call, __FILE__, __LINE__, mpi_check_rc_); \
  } while (0)

namespace autosp {

[[noreturn]] static void mpi_fail(const char* call, const char* file, int line, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof text, "MPI error %d", rc);
  throw RuntimeFailure(str("MPI failure at ", file, ":", line, ": ", call, ": ", std::string(text, len)));
}

namespace {

bool mpi_initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

// Runs at exit, after the static destructors registered after MPI_Init (glibc's on_exit gives the
// exit status). A normal exit finalises MPI. A non-zero exit aborts the job instead: MPI_Finalize
// waits for every rank, so a rank leaving with an error (say, a UsageError seen only here) while the
// others sit in a collective would hang the job; MPI_Abort ends them all with this exit code.
// An exit every rank agreed on (comm/exit.h) finalises like a normal one. Communicators destroyed
// after this skip MPI_Comm_free.
void finish_mpi(int status, void*) {
  if (mpi_finalized()) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (status != 0 && size > 1 && !exit_agreed()) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  MPI_Finalize();
}

// MPI_Init_thread once per process (unless someone else already initialised MPI; then they finalise
// it too).
void init_mpi_once() {
  static const bool done = [] {
    if (mpi_initialized()) return true;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw RuntimeFailure("MPI_Init_thread failed");
    on_exit(finish_mpi, nullptr);
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    return true;
  }();
  (void)done;
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

// A message of `nbytes` bytes as (count, datatype). MPI counts are ints: up to INT_MAX bytes this is
// (nbytes, MPI_BYTE); beyond, one derived type of exactly nbytes bytes (q blocks of 1 GiB plus the
// remainder, as a struct) that the caller must free. Its extent is nbytes, so chunk j of an
// all_to_all still starts at j * nbytes.
class ByteType {
 public:
  explicit ByteType(size_t nbytes) {
    if (nbytes <= static_cast<size_t>(INT_MAX)) {
      count_ = static_cast<int>(nbytes);
      return;
    }
    constexpr size_t kBlock = size_t{1} << 30;
    const size_t q = nbytes / kBlock, r = nbytes % kBlock;
    AUTOSP_ASSERT(q <= static_cast<size_t>(INT_MAX), "message of ", nbytes, " bytes");
    MPI_Datatype blocks = MPI_DATATYPE_NULL;
    MPI_CHECK(MPI_Type_contiguous(static_cast<int>(kBlock), MPI_BYTE, &blocks));
    MPI_Datatype whole = MPI_DATATYPE_NULL;
    int lengths[2] = {static_cast<int>(q), static_cast<int>(r)};
    MPI_Aint displs[2] = {0, static_cast<MPI_Aint>(q * kBlock)};
    MPI_Datatype types[2] = {blocks, MPI_BYTE};
    int rc = MPI_Type_create_struct(r ? 2 : 1, lengths, displs, types, &whole);
    MPI_Type_free(&blocks);
    MPI_CHECK(rc);
    type_ = whole;
    MPI_CHECK(MPI_Type_commit(&type_));
    owned_ = true;
    count_ = 1;
  }
  ~ByteType() {
    if (owned_ && !mpi_finalized()) MPI_Type_free(&type_);
  }
  ByteType(const ByteType&) = delete;
  ByteType& operator=(const ByteType&) = delete;
  int count() const { return count_; }
  MPI_Datatype type() const { return type_; }

 private:
  int count_ = 0;
  MPI_Datatype type_ = MPI_BYTE;
  bool owned_ = false;
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    default: break;
  }
  AUTOSP_ASSERT(false, "all_reduce_sum of ", dtype_name(t), " (f32, f64, i64 only)");
  return MPI_DATATYPE_NULL;
}

void check_host(const char* what, const Tensor& t) {
  AUTOSP_ASSERT(t.defined(), what, ": undefined tensor");
  AUTOSP_ASSERT(t.device().kind == DeviceKind::cpu, what, ": ", t.str(), " is not on the CPU");
  AUTOSP_ASSERT(t.is_contiguous(), what, ": ", t.str(), " is not contiguous");
}

// MPI_Iallreduce requests (one per 2^30-element piece) in flight. MPI progresses them only inside
// MPI calls, which is why test() exists: the trainer calls it between backward nodes.
class MpiPending final : public PendingCollective {
 public:
  explicit MpiPending(std::vector<MPI_Request> requests) : requests_(std::move(requests)) {}
  ~MpiPending() override {
    if (!mpi_finalized() && !requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  MpiPending(const MpiPending&) = delete;
  MpiPending& operator=(const MpiPending&) = delete;
  bool test() override {
    if (requests_.empty()) return true;
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE));
    if (done) requests_.clear();
    return done != 0;
  }
  void wait() override {
    if (requests_.empty()) return;
    MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE));
    requests_.clear();
  }

 private:
  std::vector<MPI_Request> requests_;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_sum(Tensor& t) override {
    check_host("all_reduce_sum", t);
    const MPI_Datatype type = mpi_type(t.dtype());
    for_each_piece(t, [&](void* p, int n) { MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, type, MPI_SUM, comm_)); });
  }

  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override {
    check_host("all_reduce_sum_async", t);
    const MPI_Datatype type = mpi_type(t.dtype());
    std::vector<MPI_Request> requests;
    for_each_piece(t, [&](void* p, int n) {
      requests.push_back(MPI_REQUEST_NULL);
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p, n, type, MPI_SUM, comm_, &requests.back()));
    });
    return std::make_unique<MpiPending>(std::move(requests));
  }

  void broadcast(Tensor& t, int root) override {
    check_host("broadcast", t);
    AUTOSP_ASSERT(root >= 0 && root < size_, "broadcast from rank ", root, " of ", size_);
    if (t.nbytes() == 0) return;
    ByteType bytes(t.nbytes());
    MPI_CHECK(MPI_Bcast(t.raw(), bytes.count(), bytes.type(), root, comm_));
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    check_host("all_to_all", in);
    check_host("all_to_all", out);
    AUTOSP_ASSERT(in.nbytes() == out.nbytes(), "all_to_all: ", in.str(), " vs ", out.str());
    AUTOSP_ASSERT(in.nbytes() % size_ == 0, "all_to_all: ", in.str(), " does not split into ", size_, " chunks");
    if (in.nbytes() == 0) return;
    ByteType chunk(in.nbytes() / size_);
    // in == out is allowed (as in the single-process backend): MPI wants MPI_IN_PLACE for it.
    const void* send = in.raw() == out.raw() ? MPI_IN_PLACE : in.raw();
    MPI_CHECK(MPI_Alltoall(send, chunk.count(), chunk.type(), out.raw(), chunk.count(), chunk.type(), comm_));
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_host("all_gather", in);
    check_host("all_gather", out);
    AUTOSP_ASSERT(out.nbytes() == in.nbytes() * size_, "all_gather: ", in.str(), " from ", size_,
                  " ranks into ", out.str());
    if (in.nbytes() == 0) return;
    ByteType chunk(in.nbytes());
    // `in` already sitting in this rank's slot of `out` is MPI_IN_PLACE.
    const void* send = in.raw() == static_cast<char*>(out.raw()) + rank_ * in.nbytes() ? MPI_IN_PLACE : in.raw();
    MPI_CHECK(MPI_Allgather(send, chunk.count(), chunk.type(), out.raw(), chunk.count(), chunk.type(), comm_));
  }

  // MPI_Irecv then MPI_Isend (the receive posted first, so a large message never waits for an
  // unexpected-message buffer); both progress inside MPI calls, test() and wait() among them.
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override {
    check_host("send_recv_async", send);
    check_host("send_recv_async", recv);
    AUTOSP_ASSERT(dest >= 0 && dest < size_ && src >= 0 && src < size_, "send_recv_async to rank ", dest,
                  " from rank ", src, " of ", size_);
    AUTOSP_ASSERT(send.raw() != recv.raw() || send.nbytes() == 0 || recv.nbytes() == 0,
                  "send_recv_async: recv aliases send");
    std::vector<MPI_Request> requests;
    constexpr int kTag = 29;
    if (recv.nbytes() > 0) {  // an empty side is no message at all (its peer skips it alike)
      ByteType bytes(recv.nbytes());
      requests.push_back(MPI_REQUEST_NULL);
      MPI_CHECK(MPI_Irecv(recv.raw(), bytes.count(), bytes.type(), src, kTag, comm_, &requests.back()));
    }
    if (send.nbytes() > 0) {
      ByteType bytes(send.nbytes());
      requests.push_back(MPI_REQUEST_NULL);
      MPI_CHECK(MPI_Isend(send.raw(), bytes.count(), bytes.type(), dest, kTag, comm_, &requests.back()));
    }
    return std::make_unique<MpiPending>(std::move(requests));
  }

  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) override {
    check_host("all_gather_async", in);
    check_host("all_gather_async", out);
    AUTOSP_ASSERT(out.nbytes() == in.nbytes() * size_, "all_gather_async: ", in.str(), " from ", size_,
                  " ranks into ", out.str());
    AUTOSP_ASSERT(in.raw() != out.raw() || in.nbytes() == 0, "all_gather_async: out aliases in");
    std::vector<MPI_Request> requests;
    if (in.nbytes() == 0) return std::make_unique<MpiPending>(std::move(requests));
    ByteType chunk(in.nbytes());
    requests.push_back(MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Iallgather(in.raw(), chunk.count(), chunk.type(), out.raw(), chunk.count(), chunk.type(), comm_,
                             &requests.back()));
    return std::make_unique<MpiPending>(std::move(requests));
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override { start_reduce_scatter(in, out)->wait(); }

  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override {
    return start_reduce_scatter(in, out);
  }

  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    AUTOSP_ASSERT(color >= 0, "split: color ", color, " (must be >= 0)");
    MPI_Comm child = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
    return std::make_unique<MpiCommunicator>(child);
  }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler and broken MPIs
  }

 private:
  // MPI counts are ints: `f(pointer, count)` over pieces of at most 2^30 elements of `t`.
  template <class F>
  static void for_each_piece(Tensor& t, F&& f) {
    constexpr int64_t kPiece = int64_t{1} << 30;
    char* p = static_cast<char*>(t.raw());
    const size_t esize = dtype_size(t.dtype());
    for (int64_t done = 0; done < t.numel(); done += kPiece) f(p + done * esize, static_cast<int>(std::min(kPiece, t.numel() - done)));
  }

  // MPI_Ireduce_scatter_block when a chunk fits MPI's int count, else one MPI_Ireduce per owner
  // and 2^30-element piece of its chunk (the same sums, in more calls).
  std::unique_ptr<MpiPending> start_reduce_scatter(const Tensor& in, Tensor& out) {
    check_host("reduce_scatter_sum", in);
    check_host("reduce_scatter_sum", out);
    AUTOSP_ASSERT(in.dtype() == out.dtype() && in.nbytes() == out.nbytes() * static_cast<size_t>(size_),
                  "reduce_scatter_sum: ", in.str(), " over ", size_, " ranks into ", out.str());
    AUTOSP_ASSERT(in.raw() != out.raw() || in.numel() == 0, "reduce_scatter_sum: out aliases in");
    const MPI_Datatype type = mpi_type(in.dtype());
    constexpr int64_t kPiece = int64_t{1} << 30;
    const int64_t chunk = out.numel();
    const size_t esize = dtype_size(in.dtype());
    std::vector<MPI_Request> requests;
    if (chunk == 0) return std::make_unique<MpiPending>(std::move(requests));
    if (chunk <= kPiece) {
      requests.push_back(MPI_REQUEST_NULL);
      MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), out.raw(), static_cast<int>(chunk), type, MPI_SUM, comm_,
                                          &requests.back()));
      return std::make_unique<MpiPending>(std::move(requests));
    }
    const char* src = static_cast<const char*>(in.raw());
    char* dst = static_cast<char*>(out.raw());
    for (int owner = 0; owner < size_; ++owner)
      for (int64_t done = 0; done < chunk; done += kPiece) {
        const int n = static_cast<int>(std::min(kPiece, chunk - done));
        requests.push_back(MPI_REQUEST_NULL);
        MPI_CHECK(MPI_Ireduce(src + (owner * chunk + done) * esize, owner == rank_ ? dst + done * esize : nullptr, n,
                              type, MPI_SUM, owner, comm_, &requests.back()));
      }
    return std::make_unique<MpiPending>(std::move(requests));
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_world_communicator() {
  if (!launched_by_mpi() && !mpi_initialized()) return make_single_process_communicator();
  init_mpi_once();
  MPI_Comm world = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  return std::make_unique<MpiCommunicator>(world);
}

}  // namespace autosp

#endif  // AUTOSP_WITH_MPI
