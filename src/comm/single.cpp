// The single-process communicator (every collective over a group of one is a copy or nothing) and
// the world factory for builds without MPI.
#include <cstdio>
#include <cstdlib>

#include <atomic>

#include "comm/communicator.h"
#include "comm/exit.h"
#include "device/buffers.h"

namespace autosp {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce_sum(Tensor&) override {}
  void broadcast(Tensor&, int root) override { AUTOSP_ASSERT(root == 0, "broadcast from rank ", root, " of 1"); }
  void all_to_all(const Tensor& in, Tensor& out) override { copy(in, out); }
  void all_gather(const Tensor& in, Tensor& out) override { copy(in, out); }
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override { copy(in, out); }
  // A ring of one: this rank sends to and receives from itself.
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override {
    AUTOSP_ASSERT(dest == 0 && src == 0, "send_recv_async to rank ", dest, " from rank ", src, " of 1");
    copy(send, recv);
    return finished_collective();
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::exit(exit_code);
  }

 private:
  // On the tensors' device (a CUDA tensor's bytes are not the host's to memcpy).
  static void copy(const Tensor& in, Tensor& out) {
    AUTOSP_ASSERT(in.nbytes() == out.nbytes() && in.device() == out.device(), "collective: ", in.str(), " vs ",
                  out.str());
    copy_bytes(out.raw(), in.raw(), in.nbytes(), out.device());
  }
};

class Finished final : public PendingCollective {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class FollowedBy final : public PendingCollective {
 public:
  FollowedBy(std::unique_ptr<PendingCollective> inner, std::function<void()> then)
      : inner_(std::move(inner)), then_(std::move(then)) {}
  ~FollowedBy() override {
    if (then_) inner_->wait();  // an unfinished one waits (and the copy it guards is not needed)
  }
  bool test() override {
    if (!then_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (!then_) return;
    inner_->wait();
    finish();
  }

 private:
  void finish() {
    auto then = std::move(then_);
    then_ = nullptr;
    then();
  }
  std::unique_ptr<PendingCollective> inner_;
  std::function<void()> then_;
};

}  // namespace

std::unique_ptr<PendingCollective> finished_collective() { return std::make_unique<Finished>(); }

std::unique_ptr<PendingCollective> Communicator::send_recv_async(const Tensor&, int, Tensor&, int) {
  throw RuntimeFailure(str("the ", backend(), " communicator has no point-to-point send/recv (ring attention)"));
}

std::unique_ptr<PendingCollective> followed_by(std::unique_ptr<PendingCollective> inner, std::function<void()> then) {
  return std::make_unique<FollowedBy>(std::move(inner), std::move(then));
}

std::unique_ptr<Communicator> make_single_process_communicator() { return std::make_unique<SingleProcess>(); }

namespace {
std::atomic<bool> g_exit_agreed{false};
}  // namespace
void mark_exit_agreed() { g_exit_agreed.store(true); }
bool exit_agreed() { return g_exit_agreed.load(); }

#ifndef AUTOSP_WITH_MPI
std::unique_ptr<Communicator> make_world_communicator() { return make_single_process_communicator(); }
#endif

}  // namespace autosp
