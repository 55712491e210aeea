// The thread communicator (see threads.h): groups of rank threads meeting in shared memory.
//
// Every collective is one round over its group:
//   publish   each rank writes its buffers into its slot (and, for CUDA tensors, records `ready`
//             on its stream), then the group's barrier;
//   read      each rank reads its peers' slots into its own result (its stream first waits on
//             every peer's `ready`);
//   finish    each rank records `done`, the barrier again, and its stream waits on every peer's
//             `done`: no rank writes its input again before every peer has read it.
// A collective whose result would overwrite an input a peer still reads (all_reduce_sum in place,
// an in-place all_to_all) reads into scratch and copies after `finish`.
// The bytes move through device/buffers.h (host loops, or the rank's CUDA compute stream), so this
// file knows no kernel and no CUDA.
#include "comm/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "device/buffers.h"
#include "device/cuda/device.h"
#include "device/stream_slot.h"

namespace autosp {
namespace threads_detail {

using namespace std::chrono_literals;

// What every group of one world shares: set when a rank's body threw, so the others stop waiting.
struct Job {
  std::atomic<bool> broken{false};
};

// One rank's entry in a round.
struct Slot {
  const void* in = nullptr;
  void* out = nullptr;
  size_t in_bytes = 0, out_bytes = 0;
  DType dtype = DType::f32;
  Device device;
  int color = 0, key = 0;  // split
  int dest = -1;           // send_recv_async
  void* ready = nullptr;   // cudaEvent_t, created by the slot's rank on its first CUDA collective
  void* done = nullptr;
};

class Group {
 public:
  Group(int size, std::shared_ptr<Job> job) : size_(size), job_(std::move(job)), slots_(static_cast<size_t>(size)) {}
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int size() const { return size_; }
  const std::shared_ptr<Job>& job() const { return job_; }
  Slot& slot(int r) { return slots_[static_cast<size_t>(r)]; }

  // The barrier of a round. Throws when the job is broken (a rank failed and will never arrive).
  void wait_all(const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == gen) {
      if (job_->broken.load()) {
        --arrived_;
        throw RuntimeFailure(str("thread communicator ", what, ": another rank failed; stopping this one"));
      }
      cv_.wait_for(lock, 10ms);
    }
  }

  // The sub-group of split number `seq` for `color` (`members` ranks): created by the first of
  // them to ask, dropped from here once all have taken it.
  std::shared_ptr<Group> subgroup(uint64_t seq, int color, int members) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& [group, taken] = splits_[{seq, color}];
    if (!group) group = std::make_shared<Group>(members, job_);
    std::shared_ptr<Group> g = group;
    if (++taken == members) splits_.erase({seq, color});
    return g;
  }

 private:
  const int size_;
  std::shared_ptr<Job> job_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::map<std::pair<uint64_t, int>, std::pair<std::shared_ptr<Group>, int>> splits_;
};

}  // namespace threads_detail

namespace {

using threads_detail::Group;
using threads_detail::Slot;

// ---- the data movement of one rank: device/buffers.h (copy_bytes, sum_parts, events) ---------

// A contiguous tensor like `like` (dtype, device) of `n` elements.
Tensor scratch(const Tensor& like, int64_t n) { return empty_on(n, like.dtype(), like.device()); }

}  // namespace

// ---- all_reduce_sum_async's worker -------------------------------------------------------------

namespace threads_detail {

struct Task {
  std::function<void()> run;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
  }
};

class Pending final : public PendingCollective {
 public:
  explicit Pending(std::shared_ptr<Task> t) : task_(std::move(t)) {}
  ~Pending() override {
    try {
      task_->wait();
    } catch (...) {
    }
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(task_->mu);
    if (task_->done && task_->error) std::rethrow_exception(task_->error);
    return task_->done;
  }
  void wait() override {
    task_->wait();
    if (task_->error) std::rethrow_exception(task_->error);
  }

 private:
  std::shared_ptr<Task> task_;
};

// Runs tasks one after another on a thread of its own, in the order they were queued, in the
// stream slot of the rank that made it (its CUDA work goes on the rank's stream).
class Worker {
 public:
  explicit Worker(int slot) : slot_(slot) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_ptr<Task> enqueue(std::function<void()> run) {
    auto task = std::make_shared<Task>();
    task->run = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!thread_.joinable())
        thread_ = std::thread([this] {
          StreamSlotScope in(slot_);  // drained when the loop ends
          loop();
        });
      queue_.push_back(task);
      last_ = task;
    }
    cv_.notify_all();
    return task;
  }

  // Waits until every queued task has run.
  void drain() {
    std::shared_ptr<Task> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = last_;
    }
    if (last) last->wait();
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = queue_.front();
        queue_.pop_front();
      }
      try {
        task->run();
      } catch (...) {
        task->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(task->mu);
        task->done = true;
      }
      task->cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  std::shared_ptr<Task> last_;
  bool stop_ = false;
  const int slot_;
  std::thread thread_;
};

}  // namespace threads_detail

namespace {
using threads_detail::Pending;
using threads_detail::Worker;

}  // namespace

// ---- the communicator ----------------------------------------------------------------------------

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

ThreadCommunicator::~ThreadCommunicator() { worker_.reset(); }

int ThreadCommunicator::size() const { return group_->size(); }

void ThreadCommunicator::all_reduce_sum(Tensor& t) {
  drain();
  reduce_into(t, t, /*chunk_of_rank=*/false, "all_reduce_sum");
}

std::unique_ptr<PendingCollective> ThreadCommunicator::all_reduce_sum_async(Tensor& t) {
  return start(t, t, [this](const Tensor& in, Tensor& out) { reduce_into(in, out, false, "all_reduce_sum_async"); });
}

std::unique_ptr<PendingCollective> ThreadCommunicator::reduce_scatter_sum_async(const Tensor& in, Tensor& out) {
  return start(in, out,
               [this](const Tensor& i, Tensor& o) { reduce_into(i, o, /*chunk_of_rank=*/true, "reduce_scatter_sum_async"); });
}

std::unique_ptr<PendingCollective> ThreadCommunicator::all_gather_async(const Tensor& in, Tensor& out) {
  return start(in, out, [this](const Tensor& i, Tensor& o) { gather_into(i, o, "all_gather_async"); });
}

// A collective round queued on this communicator's worker (`in` and `out` stay alive until it is done).
std::unique_ptr<PendingCollective> ThreadCommunicator::start(const Tensor& in, Tensor& out,
                                                             std::function<void(const Tensor&, Tensor&)> round) {
  if (!worker_) worker_ = std::make_unique<Worker>(stream_slot());
  const Device d = out.device();
  // Handles to the caller's buffers (the Tensor objects themselves may be temporaries).
  return std::make_unique<Pending>(worker_->enqueue([this, src = in, dst = out, d, round = std::move(round)]() mutable {
    if (d.kind == DeviceKind::cuda) use_device(d.index);  // the worker thread's current device
    round(src, dst);
  }));
}

void ThreadCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  drain();
  reduce_into(in, out, /*chunk_of_rank=*/true, "reduce_scatter_sum");
}

void ThreadCommunicator::broadcast(Tensor& t, int root) {
  drain();
  AUTOSP_ASSERT(root >= 0 && root < size(), "broadcast from rank ", root, " of ", size());
  publish("broadcast", &t, &t);
  const Slot& r = group_->slot(root);
  AUTOSP_ASSERT(r.in_bytes == t.nbytes(), "broadcast: ", t.str(), " here vs ", r.in_bytes, " bytes on the root");
  if (rank_ != root) copy_bytes(t.raw(), r.in, t.nbytes(), t.device());
  finish("broadcast");
}

void ThreadCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  drain();
  AUTOSP_ASSERT(in.nbytes() == out.nbytes() && in.nbytes() % static_cast<size_t>(size()) == 0, "all_to_all: ",
                in.str(), " vs ", out.str(), " over ", size(), " ranks");
  publish("all_to_all", &in, &out);
  const size_t chunk = in.nbytes() / static_cast<size_t>(size());
  const bool aliased = in.raw() == out.raw() && size() > 1;  // peers still read it: gather into scratch
  Tensor buf = aliased ? scratch(out, out.numel()) : out;
  for (int i = 0; i < size(); ++i)
    copy_bytes(static_cast<char*>(buf.raw()) + static_cast<size_t>(i) * chunk,
               static_cast<const char*>(group_->slot(i).in) + static_cast<size_t>(rank_) * chunk, chunk, out.device());
  finish("all_to_all");
  if (aliased) copy_bytes(out.raw(), buf.raw(), out.nbytes(), out.device());
}

void ThreadCommunicator::all_gather(const Tensor& in, Tensor& out) {
  drain();
  gather_into(in, out, "all_gather");
}

void ThreadCommunicator::gather_into(const Tensor& in, Tensor& out, const char* what) {
  AUTOSP_ASSERT(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), what, ": ", in.str(), " into ", out.str(),
                " over ", size(), " ranks");
  publish(what, &in, &out);
  for (int i = 0; i < size(); ++i)
    copy_bytes(static_cast<char*>(out.raw()) + static_cast<size_t>(i) * in.nbytes(), group_->slot(i).in, in.nbytes(),
               out.device());
  finish(what);
}

std::unique_ptr<PendingCollective> ThreadCommunicator::send_recv_async(const Tensor& send, int dest, Tensor& recv,
                                                                     int src) {
  AUTOSP_ASSERT(dest >= 0 && dest < size() && src >= 0 && src < size(), "send_recv_async to rank ", dest, " from rank ",
                src, " of ", size());
  AUTOSP_ASSERT(send.raw() != recv.raw() || send.nbytes() == 0, "send_recv_async: recv aliases send");
  if (!worker_) worker_ = std::make_unique<Worker>(stream_slot());
  return std::make_unique<Pending>(worker_->enqueue([this, from = send, into = recv, dest, src]() mutable {
    if (into.device().kind == DeviceKind::cuda) use_device(into.device().index);
    Slot& mine = group_->slot(rank_);
    mine.dest = dest;  // every rank's `src` must send to it
    publish("send_recv_async", &from, &into, false);
    AUTOSP_ASSERT(group_->slot(src).dest == rank_, "send_recv_async: rank ", rank_, " receives from rank ", src,
                  ", which sends to rank ", group_->slot(src).dest);
    for (int i = 0; i < size(); ++i) {  // every rank checks every pair alike, so a mismatch throws on all
      const Slot& p = group_->slot(i);
      AUTOSP_ASSERT(group_->slot(p.dest).out_bytes == p.in_bytes, "send_recv_async: rank ", i, " sends ", p.in_bytes,
                    " bytes to rank ", p.dest, ", which receives ", group_->slot(p.dest).out_bytes);
    }
    copy_bytes(into.raw(), group_->slot(src).in, into.nbytes(), into.device());
    finish("send_recv_async");
  }));
}

void ThreadCommunicator::barrier() {
  drain();
  publish("barrier", nullptr, nullptr);
  finish("barrier");
}

std::unique_ptr<Communicator> ThreadCommunicator::split(int color, int key) {
  drain();
  Slot& mine = group_->slot(rank_);
  mine.color = color;
  mine.key = key;
  publish("split", nullptr, nullptr);
  std::vector<std::pair<int, int>> members;  // (key, rank) of this color
  for (int i = 0; i < size(); ++i)
    if (group_->slot(i).color == color) members.emplace_back(group_->slot(i).key, i);
  std::sort(members.begin(), members.end());
  const auto me = std::find(members.begin(), members.end(), std::make_pair(key, rank_));
  const int sub_rank = static_cast<int>(me - members.begin());
  auto sub = group_->subgroup(splits_++, color, static_cast<int>(members.size()));
  finish("split");
  return std::make_unique<ThreadCommunicator>(std::move(sub), sub_rank);
}

void ThreadCommunicator::abort(const std::string& message, int exit_code) {
  // The ranks are this process: ending it ends all of them. _Exit, not exit: the other rank
  // threads are still running, and static destructors must not run under them.
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}

void ThreadCommunicator::drain() {
  if (worker_) worker_->drain();
}

// Round start: this rank's buffers into its slot, the barrier, the checks every rank makes alike
// (so a mismatch throws on all of them: one dtype and device, and unless !same_size, one input
// size), and for CUDA tensors the wait for every peer's inputs.
void ThreadCommunicator::publish(const char* what, const Tensor* in, const Tensor* out, bool same_size) {
  Slot& s = group_->slot(rank_);
  s.in = in ? in->raw() : nullptr;
  s.out = out ? out->raw() : nullptr;
  s.in_bytes = in ? in->nbytes() : 0;
  s.out_bytes = out ? out->nbytes() : 0;
  s.dtype = in ? in->dtype() : DType::f32;
  s.device = in ? in->device() : Device{};
  AUTOSP_ASSERT(!in || in->is_contiguous(), what, ": a non-contiguous input ", in->str());
  AUTOSP_ASSERT(!out || out->is_contiguous(), what, ": a non-contiguous output ", out->str());
  AUTOSP_ASSERT(!in || !out || in->device() == out->device(), what, ": input on ", in->device().str(), ", output on ",
                out->device().str());
  device_ = s.device;
  record(s.ready);
  group_->wait_all(what);
  for (int i = 0; i < size(); ++i) {
    const Slot& p = group_->slot(i);
    // Every collective here takes inputs of one size on all ranks.
    AUTOSP_ASSERT(p.dtype == s.dtype && p.device.kind == s.device.kind && (p.in_bytes == s.in_bytes || !same_size),
                  what, ": rank ", i,
                  " has ", p.in_bytes, " bytes of ", dtype_name(p.dtype), " on ", p.device.str(), ", rank ", rank_, " ",
                  s.in_bytes, " bytes of ", dtype_name(s.dtype), " on ", s.device.str());
    if (i != rank_) wait_event(p.ready);
  }
}

// Round end: every peer has read this rank's inputs (and, on CUDA, this rank's stream knows it).
void ThreadCommunicator::finish(const char* what) {
  record(group_->slot(rank_).done);
  group_->wait_all(what);
  for (int i = 0; i < size(); ++i)
    if (i != rank_) wait_event(group_->slot(i).done);
}

// out = Σ over ranks of the whole of `in` (all_reduce) or of its chunk rank() (reduce_scatter).
void ThreadCommunicator::reduce_into(const Tensor& in, Tensor& out, bool chunk_of_rank, const char* what) {
  const int64_t P = size();
  const int64_t n = out.numel();
  AUTOSP_ASSERT(in.dtype() == out.dtype() && in.numel() == (chunk_of_rank ? n * P : n), what, ": ", in.str(), " into ",
                out.str(), " over ", P, " ranks");
  publish(what, &in, &out);
  const size_t offset = chunk_of_rank ? static_cast<size_t>(rank_) * out.nbytes() : 0;
  std::vector<const void*> parts;
  for (int i = 0; i < size(); ++i) parts.push_back(static_cast<const char*>(group_->slot(i).in) + offset);
  const bool in_place = in.raw() == out.raw() && P > 1;  // peers still read it: sum into scratch
  Tensor buf = in_place ? scratch(out, n) : out;
  sum_parts(parts, buf.raw(), n, out.dtype(), out.device());
  finish(what);
  if (in_place) copy_bytes(out.raw(), buf.raw(), out.nbytes(), out.device());
}

// Events order the ranks' CUDA streams; host rounds need none.
void ThreadCommunicator::record(void*& event) { record_event(event, device_); }

void ThreadCommunicator::wait_event(void* event) {
  if (device_.kind != DeviceKind::cuda) return;
  AUTOSP_ASSERT(event != nullptr, "thread communicator: a peer without CUDA events in a CUDA collective");
  autosp::wait_event(event, device_);
}

namespace threads_detail {

Group::~Group() {
  for (Slot& s : slots_)
    for (void* e : {s.ready, s.done}) destroy_event(e);  // never throws
}

}  // namespace threads_detail

namespace {

std::vector<std::unique_ptr<ThreadCommunicator>> make_world(int ranks, const std::shared_ptr<threads_detail::Job>& job) {
  if (ranks < 1) throw UsageError(str("thread ranks ", ranks, ": expected >= 1"));
  auto group = std::make_shared<Group>(ranks, job);
  std::vector<std::unique_ptr<ThreadCommunicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace

std::vector<std::unique_ptr<ThreadCommunicator>> make_thread_communicators(int ranks) {
  return make_world(ranks, std::make_shared<threads_detail::Job>());
}

void run_thread_ranks(int ranks, const std::function<void(ThreadCommunicator& world)>& body) {
  auto job = std::make_shared<threads_detail::Job>();
  auto comms = make_world(ranks, job);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  // A rank thread that cannot start (the system's thread or memory limit) fails the job: the
  // ranks already running see it broken, and all are joined before the error leaves.
  auto start_failed = [&](int r, const std::system_error& e) {
    job->broken.store(true);
    for (auto& t : threads) t.join();
    throw RuntimeFailure(str("--thread-ranks ", ranks, ": rank thread ", r, " could not start (", e.what(),
                             "); try fewer ranks"));
  };
  for (int r = 0; r < ranks; ++r) try {
    threads.emplace_back([&, r] {
      try {
        StreamSlotScope slot(r + 1);  // a CUDA stream and allocator of its own on each device
        body(*comms[static_cast<size_t>(r)]);
        slot.leave();
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        job->broken.store(true);  // after `first`: the others' "another rank failed" come second
      }
    });
  } catch (const std::system_error& e) {
    start_failed(r, e);
  }
  for (auto& t : threads) t.join();
  comms.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace autosp
