// The `--device-count` mode of the multi-rank GPU test programs, which tests/cuda/nccl_test.sh runs
// before mpirun to skip (77) a machine with fewer GPUs than ranks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

namespace autosp::cudatest {

// When argv[1] is --device-count: prints cudaGetDeviceCount and returns the exit code (1 when there
// is no device); otherwise -1 (run the program).
inline int device_count_mode(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "--device-count") return -1;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) return 1;
  std::printf("%d\n", count);
  return 0;
}

}  // namespace autosp::cudatest
