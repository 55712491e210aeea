// Entry point of autosp-cuda-tests: runs the Catch2 session when a CUDA device is present, and
// otherwise prints why and returns 77, which ctest reports as skipped (SKIP_RETURN_CODE). Listing
// (--list-tests, --list-test-names-only, --list-tags) needs no device: the GPU kit checks its test
// filters with it before it has a GPU (scripts/kit/run.sh).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "common/catch_session.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) return autosp::test::run_catch_session(argc, argv);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipping (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return autosp::test::run_catch_session(argc, argv);
}
