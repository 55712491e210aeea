// GradSync's bookkeeping in one process (the sums themselves are checked under mpirun in
// tests/mpi/test_grad_sync.cpp): bucket boundaries by size and dtype, gradients handed back in slot
// order, and misuse caught.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "train/grad_sync.h"

namespace autosp {
namespace {

Tensor ramp(Shape shape, DType dt, double start) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::f32) t.data<float>()[i] = static_cast<float>(start + i);
    else t.data<double>()[i] = start + i;
  }
  return t;
}

TEST_CASE("grad sync: buckets split by size cap and dtype", "[grad_sync]") {
  auto one = make_single_process_communicator();
  // 10 f32 = 40 bytes each; cap 80: [s0 s1] [s2] then a dtype change [s3 (f64)] and [s4].
  const std::vector<GradSync::Slot> slots = {
      {{10}, DType::f32}, {{10}, DType::f32}, {{10}, DType::f32}, {{5}, DType::f64}, {{2, 5}, DType::f32}};
  GradSync sync(*one, slots, true, 80);
  CHECK(sync.num_buckets() == 4);
  // A slot bigger than the cap gets a bucket of its own.
  GradSync big(*one, {{{100}, DType::f32}, {{1}, DType::f32}}, true, 16);
  CHECK(big.num_buckets() == 2);
}

TEST_CASE("grad sync: one process hands every gradient back unchanged, in slot order", "[grad_sync]") {
  auto one = make_single_process_communicator();
  const std::vector<GradSync::Slot> slots = {{{3, 4}, DType::f32}, {{6}, DType::f64}, {{2}, DType::f32}};
  GradSync sync(*one, slots, true, 64);
  for (int step = 0; step < 2; ++step) {
    // Ready out of order: slot 2, then 0, then 1.
    for (size_t k : {size_t{2}, size_t{0}, size_t{1}}) sync.ready(k, ramp(slots[k].shape, slots[k].dtype, 10.0 * k + step));
    const auto out = sync.finish();
    REQUIRE(out.size() == 3);
    for (size_t k = 0; k < 3; ++k) {
      CHECK(out[k].shape() == slots[k].shape);
      CHECK(out[k].dtype() == slots[k].dtype);
      CHECK(out[k].to_doubles() == ramp(slots[k].shape, slots[k].dtype, 10.0 * k + step).to_doubles());
    }
  }
}

// Two "ranks" holding the same values (so a sum doubles them), recording each call: what the
// overlap promises is *when* each bucket's reduction starts.
class Recorder final : public Communicator {
 public:
  std::vector<std::string> log;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "recorder"; }
  void all_reduce_sum(Tensor& t) override {
    log.push_back("blocking " + std::to_string(t.numel()));
    double2(t);
  }
  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override {
    log.push_back("start " + std::to_string(t.numel()));
    double2(t);
    return finished_collective();
  }
  void broadcast(Tensor&, int) override {}
  void all_to_all(const Tensor&, Tensor&) override {}
  void all_gather(const Tensor&, Tensor&) override {}
  // Rank 0's chunk of the sum: twice its first out.numel() elements.
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    log.push_back("blocking rs " + std::to_string(in.numel()));
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = 2 * in.data<float>()[i];
  }
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override {
    reduce_scatter_sum(in, out);
    log.back() = "start rs " + std::to_string(in.numel());
    return finished_collective();
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }
  [[noreturn]] void abort(const std::string& m, int) override { throw std::runtime_error(m); }

 private:
  static void double2(Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 2;
  }
};

TEST_CASE("grad sync: with overlap a bucket's all-reduce starts when its last gradient arrives", "[grad_sync]") {
  const std::vector<GradSync::Slot> slots = {{{4}, DType::f32}, {{4}, DType::f32}, {{8}, DType::f32}};
  for (bool overlap : {true, false}) {
    Recorder comm;
    GradSync sync(comm, slots, overlap, 32);  // buckets [s0 s1] [s2]
    REQUIRE(sync.num_buckets() == 2);
    sync.ready(0, ramp({4}, DType::f32, 1));
    CHECK(comm.log.empty());
    sync.ready(1, ramp({4}, DType::f32, 5));
    // Overlap: bucket 0 (8 floats) is on the wire before slot 2 exists; else nothing moves yet.
    CHECK(comm.log == (overlap ? std::vector<std::string>{"start 8"} : std::vector<std::string>{}));
    sync.ready(2, ramp({8}, DType::f32, 9));
    const auto out = sync.finish();
    CHECK(comm.log == (overlap ? std::vector<std::string>{"start 8", "start 8"}
                               : std::vector<std::string>{"blocking 8", "blocking 8"}));
    CHECK(out[1].to_doubles() == std::vector<double>{10, 12, 14, 16});
    CHECK(out[2].to_doubles()[7] == 32);
    CHECK(sync.stats().calls == 2);
  }
}

TEST_CASE("grad sync: ZeRO pads each bucket to the group, reduce-scatters it when full, frees it at stage 2",
          "[grad_sync]") {
  // Buckets [s0 s1] (7 floats, padded to 8 for 2 ranks) and [s2] (3, padded to 4).
  const std::vector<GradSync::Slot> slots = {{{4}, DType::f32}, {{3}, DType::f32}, {{3}, DType::f32}};
  for (int stage : {1, 2}) {
    Recorder comm;
    GradSync sync(comm, slots, true, 28, stage == 1 ? ZeroMode::sharded_moments : ZeroMode::sharded_gradients);
    REQUIRE(sync.num_buckets() == 2);
    CHECK(sync.layout().buckets[0].numel == 7);
    CHECK(sync.layout().buckets[0].padded == 8);
    CHECK(sync.layout().shard_numel(1) == 2);
    sync.ready(0, ramp({4}, DType::f32, 1));
    sync.ready(1, ramp({3}, DType::f32, 5));
    CHECK(comm.log == std::vector<std::string>{"start rs 8"});
    sync.ready(2, ramp({3}, DType::f32, 8));
    sync.poll();
    const auto shards = sync.finish_shards();
    CHECK(comm.log == std::vector<std::string>{"start rs 8", "start rs 4"});
    REQUIRE(shards.size() == 2);
    CHECK(shards[0].to_doubles() == std::vector<double>{2, 4, 6, 8});  // rank 0's half of bucket 0
    CHECK(shards[1].to_doubles() == std::vector<double>{16, 18});
    // Stage 1 keeps the padded buckets for the next step; stage 2 has freed them.
    CHECK(sync.bucket_bytes_held() == (stage == 1 ? (8 + 4) * 4u : 0u));
    CHECK_THROWS(sync.finish());  // the shards are the result at ZeRO stages
    CHECK(sync.stats().bytes == (8 + 4) * 4u);
  }
}

TEST_CASE("grad sync: a slot given twice, a wrong shape, or a missing slot is caught", "[grad_sync]") {
  auto one = make_single_process_communicator();
  GradSync sync(*one, {{{4}, DType::f32}, {{4}, DType::f32}}, true, 1024);
  sync.ready(0, ramp({4}, DType::f32, 0));
  CHECK_THROWS(sync.ready(0, ramp({4}, DType::f32, 0)));
  CHECK_THROWS(sync.ready(1, ramp({5}, DType::f32, 0)));
  CHECK_THROWS(sync.ready(1, ramp({4}, DType::f64, 0)));
  CHECK_THROWS(sync.finish());  // slot 1 never arrived
}

}  // namespace
}  // namespace autosp
