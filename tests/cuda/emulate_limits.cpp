// The emulation itself (emulation.h): what it refuses and what it poisons, on kernels written
// here to break a rule. A static shared array the block did not write reads as NaN, in every
// launch (not the previous launch's values); more than 48 KiB of static shared memory, more than
// 1024 threads per block or more dynamic shared memory than sm_90 has is refused.
#include "cuda/emulation.h"
//
#include "kernels/cuda/common.cuh"
//
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

namespace autosp::cuda {
namespace {

// Writes `written` of its 64 shared floats, then copies all 64 out.
__global__ void partly_written_shared_kernel(float* out, int written) {
  __shared__ float tile[64];
  if (static_cast<int>(threadIdx.x) < written) tile[threadIdx.x] = 1.0f + static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = tile[threadIdx.x];
}

// 49 KiB of static shared memory: ptxas refuses it in a CUDA build ("uses too much shared data").
__global__ void too_much_static_shared_kernel(float* out) {
  __shared__ float big[49 * 256];
  big[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void copy_kernel(float* out) { out[threadIdx.x] = 2.0f; }

}  // namespace

TEST_CASE("emulation: unwritten static shared memory reads as NaN in every launch", "[cuda-emulation]") {
  std::vector<float> out(64);
  launch_kernel(partly_written_shared_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 64);
  for (int i = 0; i < 64; ++i) CHECK(out[static_cast<size_t>(i)] == 1.0f + static_cast<float>(i));
  // The same kernel again, writing half: the other half is not the last launch's values.
  launch_kernel(partly_written_shared_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 32);
  for (int i = 0; i < 32; ++i) CHECK(out[static_cast<size_t>(i)] == 1.0f + static_cast<float>(i));
  for (int i = 32; i < 64; ++i) CHECK(std::isnan(out[static_cast<size_t>(i)]));
  // Each block of a grid starts poisoned too.
  std::vector<float> two(64);
  launch_kernel(partly_written_shared_kernel, dim3(2), dim3(64), 0, nullptr, two.data(), 16);
  CHECK(std::isnan(two[40]));
  CHECK(emu::static_shared_of(reinterpret_cast<const void*>(&partly_written_shared_kernel)).size() == 1);
  CHECK(emu::static_shared_of(reinterpret_cast<const void*>(&partly_written_shared_kernel))[0].bytes == 64 * 4);
}

TEST_CASE("emulation: launches the hardware refuses are refused", "[cuda-emulation]") {
  std::vector<float> out(2048);
  CHECK_THROWS_WITH(launch_kernel(too_much_static_shared_kernel, dim3(1), dim3(32), 0, nullptr, out.data()),
                    Catch::Contains("static shared memory"));
  CHECK_THROWS_WITH(launch_kernel(copy_kernel, dim3(1), dim3(1025), 0, nullptr, out.data()),
                    Catch::Contains("1025 threads per block"));
  CHECK_THROWS_WITH(launch_kernel(copy_kernel, dim3(1), dim3(32), 228 * 1024, nullptr, out.data()),
                    Catch::Contains("dynamic shared memory"));
  launch_kernel(copy_kernel, dim3(1), dim3(1024), 0, nullptr, out.data());  // the limit itself is fine
  CHECK(out[1023] == 2.0f);
}

}  // namespace autosp::cuda
