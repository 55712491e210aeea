// CountingCommunicator: forwards every collective, counts calls and the bytes defined in
// comm/counting.h (checked on a fake group of 4 that only pretends to communicate), counts 0 bytes
// on a group of one, and its split() children add into the parent's totals.
#include <catch2/catch.hpp>

#include <cstring>

#include "comm/counting.h"
#include "comm/mesh.h"

namespace autosp {
namespace {

// A group of `n` ranks that copies instead of communicating and records what it was asked to do.
class FakeGroup final : public Communicator {
 public:
  explicit FakeGroup(int n, int* calls) : n_(n), calls_(calls) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  std::string backend() const override { return "fake"; }
  void all_reduce_sum(Tensor&) override { ++*calls_; }
  void broadcast(Tensor&, int) override { ++*calls_; }
  void all_to_all(const Tensor& in, Tensor& out) override {
    ++*calls_;
    std::memcpy(out.raw(), in.raw(), in.nbytes());
  }
  void all_gather(const Tensor&, Tensor&) override { ++*calls_; }
  void reduce_scatter_sum(const Tensor&, Tensor&) override { ++*calls_; }
  void barrier() override { ++*calls_; }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<FakeGroup>(n_ / 2, calls_); }
  [[noreturn]] void abort(const std::string&, int) override { std::abort(); }

 private:
  int n_;
  int* calls_;
};

TEST_CASE("counting: bytes per collective on a group of 4", "[comm]") {
  int inner_calls = 0;
  FakeGroup g(4, &inner_calls);
  CountingCommunicator c(g);
  CHECK(c.size() == 4);
  CHECK(c.backend() == "fake");

  Tensor t = Tensor::from_vector<float>({8}, {1, 2, 3, 4, 5, 6, 7, 8});  // 32 bytes
  Tensor out = Tensor::zeros({8}, DType::f32);
  c.all_to_all(t, out);  // sends 3 of its 4 chunks: 24 bytes
  c.all_to_all(t, out);
  CHECK(out.to_doubles() == t.to_doubles());
  c.all_reduce_sum(t);   // the buffer: 32 bytes
  Tensor g32 = Tensor::zeros({32}, DType::f32);
  c.all_gather(t, g32);  // its input to 3 others: 96 bytes
  c.broadcast(t, 0);     // the buffer: 32 bytes
  c.barrier();
  Tensor chunk = Tensor::zeros({2}, DType::f32);
  c.reduce_scatter_sum(t, chunk);  // 3 of its 4 chunks to their owners: 24 bytes
  c.reduce_scatter_sum_async(t, chunk)->wait();
  CHECK(inner_calls == 8);

  const CommStats& s = c.stats();
  CHECK(s.all_to_all.calls == 2);
  CHECK(s.all_to_all.bytes == 48);
  CHECK(s.all_reduce.calls == 1);
  CHECK(s.all_reduce.bytes == 32);
  CHECK(s.all_gather.bytes == 96);
  CHECK(s.broadcast.bytes == 32);
  CHECK(s.barrier.calls == 1);
  CHECK(s.barrier.bytes == 0);
  CHECK(s.reduce_scatter.calls == 2);
  CHECK(s.reduce_scatter.bytes == 48);
  CHECK(s.total().calls == 8);
  CHECK(s.total().bytes == 48 + 32 + 96 + 32 + 48);
  CHECK(s.all_to_all.seconds >= 0);

  // Children share the totals: a split group of 2 sends 1 of 2 chunks.
  auto child = c.split(0, 0);
  CHECK(child->size() == 2);
  child->all_to_all(t, out);
  CHECK(c.stats().all_to_all.calls == 3);
  CHECK(c.stats().all_to_all.bytes == 48 + 16);
  auto grandchild = child->split(0, 0);  // a group of one moves nothing
  grandchild->all_reduce_sum(t);
  CHECK(c.stats().all_reduce.calls == 2);
  CHECK(c.stats().all_reduce.bytes == 32);

  c.reset_stats();
  CHECK(c.stats().total().calls == 0);
  child->barrier();
  CHECK(c.stats().barrier.calls == 1);
}

TEST_CASE("counting: a group of one counts calls and no bytes", "[comm]") {
  CountingCommunicator c(make_single_process_communicator());
  Tensor t = Tensor::from_vector<double>({3}, {1.5, -2.0, 4.0});
  c.all_reduce_sum(t);
  Tensor out = Tensor::zeros({3}, DType::f64);
  c.all_to_all(t, out);
  CHECK(out.to_doubles() == t.to_doubles());
  CHECK(c.stats().all_reduce.calls == 1);
  CHECK(c.stats().all_to_all.calls == 1);
  CHECK(c.stats().total().bytes == 0);
  // The mesh splits the world: its groups are counted too.
  ProcessMesh m = make_mesh(c, 1);
  m.sp_group->all_reduce_sum(t);
  m.dp_group->barrier();
  CHECK(c.stats().all_reduce.calls == 2);
  CHECK(c.stats().barrier.calls == 1);
}

}  // namespace
}  // namespace autosp
