// The single-process communicator: every collective over a group of one is an identity (or a
// copy), and the only process mesh it allows is sp = 1.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"

namespace autosp {
namespace {

TEST_CASE("single: identities", "[comm]") {
  auto c = make_single_process_communicator();
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  CHECK(c->backend() == "single");

  Tensor t = Tensor::from_vector<double>({3}, {1.5, -2.0, 4.0});
  c->all_reduce_sum(t);
  CHECK(t.to_doubles() == std::vector<double>{1.5, -2.0, 4.0});
  c->broadcast(t, 0);
  CHECK(t.to_doubles() == std::vector<double>{1.5, -2.0, 4.0});
  CHECK_THROWS_AS(c->broadcast(t, 1), std::logic_error);

  Tensor out = Tensor::zeros({3}, DType::f64);
  c->all_to_all(t, out);
  CHECK(out.to_doubles() == t.to_doubles());
  Tensor g = Tensor::zeros({1, 3}, DType::f64);
  c->all_gather(t, g);
  CHECK(g.to_doubles() == t.to_doubles());
  c->all_to_all(t, t);  // in place
  CHECK(t.to_doubles() == std::vector<double>{1.5, -2.0, 4.0});
  Tensor small = Tensor::zeros({2}, DType::f64);
  CHECK_THROWS_AS(c->all_to_all(t, small), std::logic_error);

  Tensor z = Tensor::zeros({0}, DType::f32);
  c->all_reduce_sum(z);
  c->all_to_all(z, z);
  c->barrier();

  auto s = c->split(7, 3);
  CHECK(s->rank() == 0);
  CHECK(s->size() == 1);
  CHECK(s->backend() == "single");
}

TEST_CASE("single: make_mesh", "[comm]") {
  auto c = make_single_process_communicator();
  ProcessMesh m = make_mesh(*c, 1);
  CHECK(m.world_size == 1);
  CHECK(m.world_rank == 0);
  CHECK(m.sp == 1);
  CHECK(m.dp == 1);
  CHECK(m.sp_rank == 0);
  CHECK(m.dp_rank == 0);
  REQUIRE(m.sp_group);
  REQUIRE(m.dp_group);
  CHECK(m.sp_group->size() == 1);
  CHECK(m.dp_group->size() == 1);
  CHECK_THROWS_AS(make_mesh(*c, 2), UsageError);
  CHECK_THROWS_AS(make_mesh(*c, 0), UsageError);
}

TEST_CASE("single: the world outside mpirun is single-process", "[comm]") {
  // ctest runs autosp-tests without a launcher, so no MPI is initialised here.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK")) return;
  auto w = make_world_communicator();
  CHECK(w->backend() == "single");
  CHECK(w->size() == 1);
}

}  // namespace
}  // namespace autosp
