// The device runtime's host side: the device of a local rank, what a build or machine without a
// CUDA device says, and host-only Tensor methods refusing device tensors. Runs in the CPU suite
// (with or without the CUDA backend); the device itself is tested in tests/cuda/test_device.cpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "graph/builder.h"
#include "device/cuda/device.h"
#include "engine/executor.h"
#include "device/local_rank.h"
#include "train/trainer.h"

using namespace autosp;

namespace {

// Sets environment variables for the scope and restores them after.
class EnvGuard {
 public:
  EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old != nullptr, old ? old : ""});
      if (value)
        setenv(name, value, 1);
      else
        unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& s : saved_) {
      if (s.had)
        setenv(s.name, s.value.c_str(), 1);
      else
        unsetenv(s.name);
    }
  }

 private:
  struct Saved {
    const char* name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

const char* const kLocalVars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};

// A "device" allocator handing out host memory, so device tensors exist without a GPU.
class FakeCudaAllocator final : public Allocator {
 public:
  void* allocate(size_t n) override {
    note_alloc(n);
    return std::malloc(n == 0 ? 1 : n);
  }
  void deallocate(void* p, size_t n) override {
    note_free(n);
    std::free(p);
  }
  Device device() const override { return {DeviceKind::cuda, 0}; }
};

}  // namespace

TEST_CASE("local rank comes from the launcher's environment", "[device]") {
  EnvGuard clean({{kLocalVars[0], nullptr}, {kLocalVars[1], nullptr}, {kLocalVars[2], nullptr},
                  {kLocalVars[3], nullptr}, {kLocalVars[4], nullptr}, {kLocalVars[5], nullptr}});
  CHECK(local_rank_from_env() == 0);
  CHECK(local_size_from_env() == -1);
  {
    EnvGuard slurm({{"SLURM_LOCALID", "3"}});
    CHECK(local_rank_from_env() == 3);
  }
  {
    EnvGuard both({{"SLURM_LOCALID", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    CHECK(local_rank_from_env() == 1);  // Open MPI's variable comes first
    CHECK(local_size_from_env() == 2);
  }
  {
    EnvGuard hydra({{"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}});
    CHECK(local_rank_from_env() == 2);
    CHECK(local_size_from_env() == 4);
  }
  {
    EnvGuard bad({{"OMPI_COMM_WORLD_LOCAL_RANK", "one"}});
    CHECK_THROWS_AS(local_rank_from_env(), UsageError);
    CHECK_THROWS_WITH(local_rank_from_env(), Catch::Contains("OMPI_COMM_WORLD_LOCAL_RANK") && Catch::Contains("one"));
  }
}

TEST_CASE("a local rank maps onto its device; more ranks than devices is a usage error", "[device]") {
  CHECK(device_for_local_rank(0, -1, 1) == 0);
  CHECK(device_for_local_rank(3, 4, 8) == 3);
  CHECK(device_for_local_rank(1, 2, 2) == 1);
  CHECK_THROWS_AS(device_for_local_rank(2, 3, 2), UsageError);
  // Every rank of the node fails, not only those past the device count.
  CHECK_THROWS_WITH(device_for_local_rank(0, 3, 2), Catch::Contains("3 ranks on this node") &&
                                                        Catch::Contains("2 visible CUDA devices"));
  CHECK_THROWS_WITH(device_for_local_rank(0, -1, 0), Catch::Contains("no CUDA device"));
}

TEST_CASE("without a CUDA device the device runtime says why", "[device]") {
  if (cuda_available()) {
    // A GPU machine: the calls work instead.
    CHECK(cuda_device_count() > 0);
    Tensor h = Tensor::from_vector<float>({3}, {1, 2, 3});
    CHECK(to_device(to_device(h, {DeviceKind::cuda, 0}), Device{}).to_doubles() == std::vector<double>{1, 2, 3});
    return;
  }
  CHECK(cuda_device_count() == 0);
  Tensor h = Tensor::from_vector<float>({2}, {1, 2});
  CHECK_THROWS_AS(to_device(h, {DeviceKind::cuda, 0}), UsageError);
  CHECK_THROWS_AS(cuda_allocator(0), UsageError);
  EnvGuard clean({{kLocalVars[0], nullptr}, {kLocalVars[1], nullptr}, {kLocalVars[2], nullptr}});
  CHECK_THROWS_AS(select_device_for_local_rank(), UsageError);
#ifdef AUTOSP_WITH_CUDA
  CHECK_THROWS_WITH(select_device_for_local_rank(), Catch::Contains("no CUDA device"));
#else
  CHECK_THROWS_WITH(select_device_for_local_rank(), Catch::Contains("this build has no CUDA backend"));
  CHECK_THROWS_WITH(to_device(h, {DeviceKind::cuda, 0}), Catch::Contains("this build has no CUDA backend"));
  CHECK_THROWS_WITH(check_attention_backend(AttentionBackend::cudnn), Catch::Contains("no CUDA backend"));
  {  // It says why, as CMake found it: configured without CUDA though nvcc is there, or no nvcc.
    std::ifstream cache(AUTOSP_BINARY_DIR "/CMakeCache.txt");
    std::string line, nvcc;
    while (std::getline(cache, line))
      if (line.rfind("CMAKE_CUDA_COMPILER:", 0) == 0) nvcc = line.substr(line.find('=') + 1);
    const bool found = !nvcc.empty() && nvcc.find("NOTFOUND") == std::string::npos;
    INFO("CMAKE_CUDA_COMPILER " << nvcc);
    CHECK_THROWS_WITH(select_device_for_local_rank(),
                      Catch::Contains(found ? "(it was configured with -DAUTOSP_WITH_CUDA=OFF, though nvcc is at " + nvcc +
                                                  "); use runtime.device \"cpu\", or reconfigure with -DAUTOSP_WITH_CUDA=ON"
                                            : std::string("(nvcc was not found at configure time)")));
  }
  CHECK_NOTHROW(check_attention_backend(AttentionBackend::flash));
  CHECK_NOTHROW(check_attention_backend(AttentionBackend::automatic));  // CPU runs ignore it
#endif
  // A host copy needs no device.
  CHECK(to_device(h, Device{}).to_doubles() == std::vector<double>{1, 2});
}

TEST_CASE("host-only tensor methods refuse device tensors", "[device]") {
  FakeCudaAllocator fake;
  Tensor d = Tensor::empty({2, 3}, DType::f32, fake);
  CHECK(d.device() == Device{DeviceKind::cuda, 0});
  CHECK_THROWS_WITH(d.clone(), Catch::Contains("clone()") && Catch::Contains("cuda:0"));
  CHECK_THROWS_WITH(d.to(DType::f64), Catch::Contains("to(dtype)"));
  CHECK_THROWS_WITH(d.to_doubles(), Catch::Contains("to_doubles()") && Catch::Contains("host-only"));
  CHECK_THROWS_WITH(d.as_strided({3, 2}, {1, 3}, 0).contiguous(), Catch::Contains("contiguous()"));
  CHECK(d.contiguous().raw() == d.raw());  // already contiguous: no copy, no failure
  CHECK(fake.live_bytes() == 24);
}

TEST_CASE("the executor refuses feeds on different devices", "[device][executor]") {
  FakeCudaAllocator fake;
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim::sym("S"), 4}, Role::none);
  Node* y = b.input("y", DType::f32, {Dim::sym("S"), 4}, Role::none);
  g.add_output(b.add(x, y, "z"));
  Executor ex(g);
  const TensorMap feeds{{"x", Tensor::zeros({2, 4}, DType::f32)}, {"y", Tensor::empty({2, 4}, DType::f32, fake)}};
  CHECK_THROWS_AS(ex.run(feeds), UsageError);
  CHECK_THROWS_WITH(ex.run(feeds), Catch::Contains("'y' is on cuda:0") && Catch::Contains("'x' is on cpu"));
}

#ifndef AUTOSP_WITH_CUDA
TEST_CASE("a build without CUDA runs nothing on cuda and says why", "[device][executor]") {
  FakeCudaAllocator fake;
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim::sym("S")}, Role::none);
  g.add_output(b.neg(x));
  Executor ex(g);
  CHECK_THROWS_WITH(ex.run({{"x", Tensor::empty({4}, DType::f32, fake)}}),
                    Catch::Contains("this build has no CUDA backend"));
}
#endif

TEST_CASE("training on cuda without a usable device is a usage error saying why", "[device][trainer]") {
  if (cuda_available()) return;  // tests/cuda/test_trainer_cuda.cpp trains there
  const Config cfg = parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 16},
                                              {"num_hidden_layers", 1}, {"num_attention_heads", 2}}},
                                   {"data", {{"seq_len", 8}, {"batch_size", 1}}},
                                   {"train", {{"steps", 1}}},
                                   {"runtime", {{"device", "cuda"}}}});
  auto world = make_single_process_communicator();
  TrainArgs args;
  args.quiet = true;
  CHECK_THROWS_AS(train(cfg, args, *world), UsageError);
#ifdef AUTOSP_WITH_CUDA
  CHECK_THROWS_WITH(train(cfg, args, *world), Catch::Contains("no CUDA device"));
#else
  CHECK_THROWS_WITH(train(cfg, args, *world), Catch::Contains("this build has no CUDA backend"));
#endif
}
