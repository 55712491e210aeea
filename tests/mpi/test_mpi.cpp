// The MPI communicator against closed forms, on however many ranks mpirun started (ctest runs 2
// and 4): every value a rank sends is tagged with the sending rank (and chunk), so each received
// element names where it came from. The case tagged [.big] moves chunks over INT_MAX bytes (the
// derived datatype path) and reduces over 2^30 elements; it needs 4-9 GiB per rank, so run it by
// hand, a section at a time if memory is short:
//   mpirun -np 2 build/bin/autosp-mpi-tests "[.big]" [-c "all_to_all in place"]
// [.bench] prints all_reduce_sum throughput.
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/mesh.h"
#include "mpi/mpi_test.h"

namespace autosp::test {
namespace {

// A tensor of `shape` and `dtype` with element i set to f(i).
template <class T, class F>
Tensor filled(Shape shape, F f) {
  Tensor t = Tensor::empty(std::move(shape), dtype_of<T>);
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(f(i));
  return t;
}

TEST_CASE("mpi: world identity", "[mpi]") {
  Communicator& w = test_world();
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    CHECK(w.backend() == "mpi");
    CHECK(w.size() == std::atoi(n));
    CHECK(w.rank() == std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  }
  CHECK(w.rank() >= 0);
  CHECK(w.rank() < w.size());
  w.barrier();
}

TEMPLATE_TEST_CASE("mpi: all_reduce_sum matches the closed form", "[mpi]", float, double, int64_t) {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 20}) {
    // Rank r holds (r + 1) * (i % 1000 + 1): the sum is (i % 1000 + 1) * P (P + 1) / 2, exact in f32.
    Tensor t = filled<TestType>({n}, [&](int64_t i) { return (r + 1) * (i % 1000 + 1); });
    w.all_reduce_sum(t);
    const TestType* p = t.data<TestType>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      if (p[i] != static_cast<TestType>((i % 1000 + 1) * P * (P + 1) / 2)) ++wrong;
    INFO("n = " << n);
    CHECK(wrong == 0);
  }
}

TEST_CASE("mpi: all_reduce_sum of a 2-D view and of negative values", "[mpi]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  Tensor t = filled<double>({3, 5}, [&](int64_t i) { return (r % 2 ? -1.0 : 1.0) * (i + 0.5); });
  w.all_reduce_sum(t);
  const int64_t odd = P / 2, even = P - odd;
  for (int64_t i = 0; i < 15; ++i) CHECK(t.data<double>()[i] == (even - odd) * (i + 0.5));
}

TEST_CASE("mpi: all_reduce_sum rejects other dtypes on every rank", "[mpi]") {
  if (test_world().backend() != "mpi") return;  // the single-process backend accepts any dtype
  Tensor t = Tensor::zeros({4}, DType::i32);
  CHECK_THROWS_AS(test_world().all_reduce_sum(t), std::logic_error);
  test_world().barrier();  // nobody is left inside a collective
}

TEST_CASE("mpi: broadcast from the first and the last rank", "[mpi]") {
  Communicator& w = test_world();
  const int64_t r = w.rank();
  for (int root : {0, w.size() - 1}) {
    Tensor f = filled<float>({2, 500}, [&](int64_t i) { return r * 1000 + i; });
    Tensor b = Tensor::empty({3}, DType::bf16);
    for (int i = 0; i < 3; ++i) b.data<uint16_t>()[i] = static_cast<uint16_t>(r * 10 + i);
    w.broadcast(f, root);
    w.broadcast(b, root);
    INFO("root " << root);
    int64_t wrong = 0;
    for (int64_t i = 0; i < f.numel(); ++i) wrong += f.data<float>()[i] != static_cast<float>(root * 1000 + i);
    CHECK(wrong == 0);
    for (int i = 0; i < 3; ++i) CHECK(b.data<uint16_t>()[i] == root * 10 + i);
  }
}

TEST_CASE("mpi: all_to_all sends chunk j to rank j", "[mpi]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  const int64_t m = 37;  // elements per chunk
  // in[j, k] = tag(sender r, chunk j, k); rank r receives out[i, k] = tag(i, r, k).
  auto tag = [](int64_t sender, int64_t chunk, int64_t k) { return sender * 1000000 + chunk * 1000 + k; };
  Tensor in = filled<int64_t>({P, m}, [&](int64_t i) { return tag(r, i / m, i % m); });
  Tensor out = Tensor::zeros({P, m}, DType::i64);
  w.all_to_all(in, out);
  int64_t wrong = 0;
  for (int64_t i = 0; i < P; ++i)
    for (int64_t k = 0; k < m; ++k) wrong += out.data<int64_t>()[i * m + k] != tag(i, r, k);
  CHECK(wrong == 0);
  // `in` is untouched.
  for (int64_t i = 0; i < P * m; ++i) wrong += in.data<int64_t>()[i] != tag(r, i / m, i % m);
  CHECK(wrong == 0);

  SECTION("in place") {
    w.all_to_all(in, in);
    for (int64_t i = 0; i < P * m; ++i) wrong += in.data<int64_t>()[i] != tag(i / m, r, i % m);
    CHECK(wrong == 0);
  }
  SECTION("odd byte counts (bf16 chunks of 3)") {
    Tensor a = Tensor::empty({P * 3}, DType::bf16), b = Tensor::empty({P * 3}, DType::bf16);
    for (int64_t i = 0; i < P * 3; ++i) a.data<uint16_t>()[i] = static_cast<uint16_t>(r * 100 + i);
    w.all_to_all(a, b);
    for (int64_t i = 0; i < P; ++i)
      for (int64_t k = 0; k < 3; ++k) wrong += b.data<uint16_t>()[i * 3 + k] != i * 100 + r * 3 + k;
    CHECK(wrong == 0);
  }
}

TEST_CASE("mpi: all_to_all and all_gather check their sizes", "[mpi]") {
  Communicator& w = test_world();
  const int64_t P = w.size();
  Tensor in = Tensor::zeros({P, 4}, DType::f32), small = Tensor::zeros({P, 3}, DType::f32);
  CHECK_THROWS_AS(w.all_to_all(in, small), std::logic_error);
  if (P > 2) {  // 6P + 2 bytes: every dtype is a whole number of 2-byte units, so P = 2 always divides
    Tensor odd = Tensor::zeros({P * 3 + 1}, DType::bf16);
    CHECK_THROWS_AS(w.all_to_all(odd, odd), std::logic_error);
  }
  CHECK_THROWS_AS(w.all_gather(small, in), std::logic_error);
  w.barrier();
}

TEST_CASE("mpi: all_gather concatenates in rank order", "[mpi]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  const int64_t m = 101;
  Tensor in = filled<double>({m}, [&](int64_t k) { return r * 1000 + k; });
  Tensor out = Tensor::zeros({P, m}, DType::f64);
  w.all_gather(in, out);
  int64_t wrong = 0;
  for (int64_t i = 0; i < P; ++i)
    for (int64_t k = 0; k < m; ++k) wrong += out.data<double>()[i * m + k] != static_cast<double>(i * 1000 + k);
  CHECK(wrong == 0);

  SECTION("in place: `in` is this rank's row of `out`") {
    Tensor all = Tensor::zeros({P, m}, DType::f64);
    Tensor mine = all.as_strided({m}, {1}, r * m);
    for (int64_t k = 0; k < m; ++k) mine.data<double>()[k] = static_cast<double>(r * 1000 + k);
    w.all_gather(mine, all);
    for (int64_t i = 0; i < P * m; ++i) wrong += all.data<double>()[i] != out.data<double>()[i];
    CHECK(wrong == 0);
  }
}

TEST_CASE("mpi: zero-size tensors are no-ops on every collective", "[mpi]") {
  Communicator& w = test_world();
  const int64_t P = w.size();
  Tensor z = Tensor::zeros({0}, DType::f32), zp = Tensor::zeros({P, 0}, DType::f32);
  Tensor zi = Tensor::zeros({0, 3}, DType::i64);
  w.all_reduce_sum(z);
  w.all_reduce_sum(zi);
  w.broadcast(z, w.size() - 1);
  w.all_to_all(zp, zp);
  w.all_gather(z, zp);
  w.barrier();
  CHECK(z.numel() == 0);
  CHECK(zp.numel() == 0);
}

TEST_CASE("mpi: split orders each group by key", "[mpi]") {
  Communicator& w = test_world();
  const int P = w.size(), r = w.rank();
  // Two groups by parity; key = -rank reverses the order inside each group.
  std::unique_ptr<Communicator> g = w.split(r % 2, -r);
  const int members = (P - r % 2 + 1) / 2;  // ranks of my parity
  CHECK(g->backend() == w.backend());
  CHECK(g->size() == members);
  CHECK(g->rank() == members - 1 - r / 2);
  Tensor t = Tensor::from_vector<int64_t>({1}, {r});
  g->all_reduce_sum(t);
  int64_t expect = 0;
  for (int i = r % 2; i < P; i += 2) expect += i;
  CHECK(t.data<int64_t>()[0] == expect);
  // A split of a split.
  std::unique_ptr<Communicator> single = g->split(g->rank(), 0);
  CHECK(single->size() == 1);
  CHECK(single->rank() == 0);
  single->barrier();
}

TEST_CASE("mpi: make_mesh groups consecutive ranks", "[mpi]") {
  Communicator& w = test_world();
  const int P = w.size(), r = w.rank();
  for (int sp : {1, 2, 4}) {
    if (P % sp != 0) continue;
    INFO("sp = " << sp);
    ProcessMesh m = make_mesh(w, sp);
    const int dp = P / sp;
    CHECK(m.world_size == P);
    CHECK(m.world_rank == r);
    CHECK(m.sp == sp);
    CHECK(m.dp == dp);
    CHECK(m.sp_rank == r % sp);
    CHECK(m.dp_rank == r / sp);
    CHECK(m.sp_group->size() == sp);
    CHECK(m.sp_group->rank() == m.sp_rank);
    CHECK(m.dp_group->size() == dp);
    CHECK(m.dp_group->rank() == m.dp_rank);

    // Sums inside a group add only that group's world ranks.
    Tensor s = Tensor::from_vector<int64_t>({1}, {r}), d = Tensor::from_vector<int64_t>({1}, {r});
    m.sp_group->all_reduce_sum(s);
    m.dp_group->all_reduce_sum(d);
    int64_t sp_sum = 0, dp_sum = 0;
    for (int i = 0; i < sp; ++i) sp_sum += m.dp_rank * sp + i;
    for (int i = 0; i < dp; ++i) dp_sum += i * sp + m.sp_rank;
    CHECK(s.data<int64_t>()[0] == sp_sum);
    CHECK(d.data<int64_t>()[0] == dp_sum);

    // The SP group gathers its consecutive world ranks in order.
    Tensor mine = Tensor::from_vector<int64_t>({1}, {r}), all = Tensor::zeros({sp}, DType::i64);
    m.sp_group->all_gather(mine, all);
    for (int i = 0; i < sp; ++i) CHECK(all.data<int64_t>()[i] == m.dp_rank * sp + i);
  }
}

TEST_CASE("mpi: make_mesh with an sp that does not divide the world is a UsageError", "[mpi]") {
  Communicator& w = test_world();
  CHECK_THROWS_AS(make_mesh(w, w.size() + 1), UsageError);
  CHECK_THROWS_AS(make_mesh(w, 0), UsageError);
  if (w.size() == 4) CHECK_THROWS_AS(make_mesh(w, 3), UsageError);
  if (w.size() == 2) CHECK_THROWS_AS(make_mesh(w, 4), UsageError);
  w.barrier();
}

// ---- by hand: chunks over INT_MAX bytes, and all_reduce throughput -----------------------------

TEST_CASE("mpi: collectives over INT_MAX bytes or 2^30 elements", "[.big]") {
  Communicator& w = test_world();
  const int64_t P = w.size(), r = w.rank();
  const int64_t m = (int64_t{INT_MAX} + 1) / 4 + 3;  // i32 elements per chunk: 2^31 + 12 bytes
  auto tag = [](int64_t sender, int64_t chunk, int64_t k) { return static_cast<int32_t>(k * 7 + chunk * 3 + sender); };
  // Sections, so a run can pick one (-c "all_to_all in place") to fit in memory: 2P chunks per rank
  // for all_to_all, P + 1 for all_gather, P for in place (plus MPI's one-chunk scratch buffer).
  SECTION("all_to_all") {
    Tensor in = filled<int32_t>({P, m}, [&](int64_t i) { return tag(r, i / m, i % m); });
    Tensor out = Tensor::zeros({P, m}, DType::i32);
    w.all_to_all(in, out);
    int64_t wrong = 0;
    for (int64_t i = 0; i < P; ++i)
      for (int64_t k = 0; k < m; ++k) wrong += out.data<int32_t>()[i * m + k] != tag(i, r, k);
    CHECK(wrong == 0);
  }
  SECTION("all_to_all in place") {
    Tensor t = filled<int32_t>({P, m}, [&](int64_t i) { return tag(r, i / m, i % m); });
    w.all_to_all(t, t);
    int64_t wrong = 0;
    for (int64_t i = 0; i < P; ++i)
      for (int64_t k = 0; k < m; ++k) wrong += t.data<int32_t>()[i * m + k] != tag(i, r, k);
    CHECK(wrong == 0);
  }
  SECTION("all_reduce_sum over 2^30 elements (reduced in pieces)") {
    const int64_t n = (int64_t{1} << 30) + 5;
    Tensor t = filled<float>({n}, [&](int64_t i) { return (r + 1) * (i % 3 + 1); });
    w.all_reduce_sum(t);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += t.data<float>()[i] != static_cast<float>((i % 3 + 1) * P * (P + 1) / 2);
    CHECK(wrong == 0);
  }
  SECTION("all_gather and broadcast") {
    Tensor in = filled<int32_t>({m}, [&](int64_t k) { return tag(r, 0, k); });
    Tensor out = Tensor::zeros({P, m}, DType::i32);
    w.all_gather(in, out);
    int64_t wrong = 0;
    for (int64_t i = 0; i < P; ++i)
      for (int64_t k = 0; k < m; ++k) wrong += out.data<int32_t>()[i * m + k] != tag(i, 0, k);
    CHECK(wrong == 0);
    w.broadcast(in, static_cast<int>(P - 1));
    wrong = 0;
    for (int64_t k = 0; k < m; ++k) wrong += in.data<int32_t>()[k] != tag(P - 1, 0, k);
    CHECK(wrong == 0);
  }
}

TEST_CASE("mpi: all_reduce_sum throughput on a gradient bucket", "[.bench]") {
  Communicator& w = test_world();
  for (int64_t n : {int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24}) {
    Tensor t = filled<float>({n}, [](int64_t) { return 1.0f; });
    w.all_reduce_sum(t);  // warm-up
    const int reps = 10;
    w.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) w.all_reduce_sum(t);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    if (w.rank() == 0)
      std::printf("all_reduce_sum f32[%lld] on %d ranks: %.3f ms, %.2f GB/s (buffer bytes / time)\n",
                  static_cast<long long>(n), w.size(), s * 1e3, n * 4.0 / s / 1e9);
  }
}

}  // namespace
}  // namespace autosp::test
