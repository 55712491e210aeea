// The host as a device: how many threads the CPU kernels (OpenMP regions and OpenBLAS) use. The
// trainer and the apps set it from runtime.threads through here, so they name no kernel header.
// Plain host code; knows nothing of graphs or CUDA.
#pragma once

namespace autosp {

// Threads for the CPU kernels' OpenMP regions and OpenBLAS (n <= 0: leave them as they are).
void set_host_threads(int n);

}  // namespace autosp
