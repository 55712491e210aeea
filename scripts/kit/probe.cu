// autosp-kit-probe: the GPU kit's first step (scripts/kit/run.sh). One trivial kernel on device 0,
// its result checked on the host, so that a driver the kit's CUDA runtime cannot use reads as an
// error naming both versions, not as every CUDA test "skipping". The runtime is linked statically
// (nvcc -cudart static): the probe needs only the driver (libcuda.so.1).
//   autosp-kit-probe   prints "probe: ok ..." and exits 0; exit 1 with "error: ..." otherwise
#include <cuda_runtime.h>

#include <cstdio>

__global__ void add_one(int* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1;
}

static int fail(const char* what, cudaError_t e) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("error: %s: %s (%s); driver supports CUDA %d.%d, this kit's runtime is CUDA %d.%d\n", what,
              cudaGetErrorName(e), cudaGetErrorString(e), driver / 1000, driver % 1000 / 10, runtime / 1000,
              runtime % 1000 / 10);
  return 1;
}

int main() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return fail("cudaGetDeviceCount", e);
  if (count == 0) {
    std::printf("error: no CUDA device visible\n");
    return 1;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) return fail("cudaGetDeviceProperties", e);
  const int n = 1024;
  int host[n];
  for (int i = 0; i < n; ++i) host[i] = i;
  int* dev = nullptr;
  if (const cudaError_t e = cudaMalloc(&dev, sizeof host); e != cudaSuccess) return fail("cudaMalloc", e);
  cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
  add_one<<<(n + 255) / 256, 256>>>(dev, n);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return fail("kernel launch", e);
  if (const cudaError_t e = cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost); e != cudaSuccess)
    return fail("kernel result copy", e);
  cudaFree(dev);
  for (int i = 0; i < n; ++i)
    if (host[i] != i + 1) {
      std::printf("error: the probe kernel computed %d at %d, expected %d\n", host[i], i, i + 1);
      return 1;
    }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("probe: ok, %d device(s), device 0 %s sm_%d%d, %.1f GiB, %d SMs; driver CUDA %d.%d, runtime %d.%d\n",
              count, prop.name, prop.major, prop.minor, prop.totalGlobalMem / 1073741824.0, prop.multiProcessorCount,
              driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  return 0;
}
