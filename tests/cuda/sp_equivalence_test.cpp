// The sequence-parallel equivalence test on GPUs: under `mpirun -np <gpus>` (one GPU per rank, NCCL
// between them when there are several), AutoSP training with P = world size on CUDA must give the
// losses, gradient norms and weights of single-process training on the CPU on the same batches —
// the same bar as tests/mpi/test_autosp.cpp sets on CPU ranks. At np 1 (a one-GPU machine) this is
// the P = 1 CUDA run against the CPU. Registered through tests/cuda/nccl_test.sh, which skips (77)
// when the machine has fewer GPUs than ranks.
//   autosp-gpu-sp-test --device-count   (prints cudaGetDeviceCount; exit 1 when there is none)
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "common/catch_session.h"
#include "cuda/device_count.h"
#include "cuda/sp_equivalence.h"

namespace autosp {
namespace {

Communicator* g_world = nullptr;

void compare(const std::string& arch, const std::string& dtype, double loss_tol, double weight_tol) {
  Communicator& w = *g_world;
  cudatest::compare(arch, dtype, w.size(), loss_tol, weight_tol,
                    [&](const Config& cfg, const TrainArgs& args) { return train(cfg, args, w); }, w.rank() == 0);
}

// f32: our CUDA GEMMs are true FP32 (no TF32) and every reduction is fp32, so the runs differ by
// summation order only (as the CPU P = 2 vs P = 1 runs do, ≤ 1e-6): 1e-4 leaves a wide margin.
// Weights: relative L2, since AdamW's first steps move a near-zero-gradient element by ±lr with
// whatever sign the last bits give (tests/cuda/test_trainer_cuda.cpp).
TEST_CASE("gpu sp: f32 AutoSP training on CUDA equals single-process CPU training", "[gpu][sp]") {
  for (const std::string arch : {"llama", "gpt2"}) compare(arch, "float32", 1e-4, 1e-3);
}

// bf16: both sides compute in f32 and round each result once to bf16 (the CPU emulates the CUDA
// kernels), but different summation orders round differently: bf16 bounds (tests/graph/
// test_mixed_precision.cpp explains 1e-2).
TEST_CASE("gpu sp: bf16 AutoSP training on CUDA tracks the CPU's bf16 emulation", "[gpu][sp]") {
  for (const std::string arch : {"llama", "gpt2"}) compare(arch, "bfloat16", 1e-2, 3e-2);
}

}  // namespace
}  // namespace autosp

int main(int argc, char** argv) {
  if (const int rc = autosp::cudatest::device_count_mode(argc, argv); rc >= 0) return rc;
  auto world = autosp::make_world_communicator();
  autosp::g_world = world.get();
  const int failed = autosp::test::run_catch_session(argc, argv);
  if (failed && world->size() > 1) world->abort("gpu sp test failed on this rank", 1);
  return failed ? 1 : 0;
}
