// The known devices (see the header).
#include "tools/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "tensor/check.h"

namespace autosp {
namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

// NVLink 4 (450 GB/s per direction, ~80% in all-to-all) and one 400 Gb/s NDR NIC per GPU (~90%):
// docs/scaling.md's figures. NVLink 3 and HDR (200 Gb/s) for the A100s, NVLink 5 for the B200.
Cluster gpu(const char* name, double memory_bytes, double peak_tflops, double nvlink_GBps, double ib_GBps) {
  Cluster c;
  c.device = name;
  c.memory_bytes = memory_bytes;
  c.reserve_fraction = 0.1;
  c.peak_tflops = peak_tflops;
  c.achieved_fraction = 0.4;
  c.ranks_per_node = 8;
  c.intra = {5e-6, nvlink_GBps * 1e9};
  c.inter = {10e-6, ib_GBps * 1e9};
  return c;
}

// This machine: every rank a process on it (one node), MPI moving bytes through shared memory. The
// rate and the memory are the whole machine's (about 40 GFLOP/s of autosp's f32 kernels per core):
// the ranks of a job share them (for_ranks).
Cluster this_cpu() {
  Cluster c;
  c.device = "cpu";
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  c.memory_bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 8 * GiB;
  c.reserve_fraction = 0.1;
  c.peak_tflops = 0.04 * std::max(1u, std::thread::hardware_concurrency());
  c.achieved_fraction = 1;
  c.ranks_per_node = 1 << 20;
  c.intra = c.inter = {20e-6, 4e9};
  return c;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

const std::vector<Cluster>& known_devices() {
  static const std::vector<Cluster> devices = {
      gpu("H100-80GB", 80 * GiB, 989, 360, 45),  gpu("H200", 141e9, 989, 360, 45),
      gpu("A100-80GB", 80 * GiB, 312, 240, 22.5), gpu("A100-40GB", 40 * GiB, 312, 240, 22.5),
      gpu("B200", 180e9, 2250, 720, 45),         this_cpu(),
  };
  return devices;
}

std::string known_device_names() {
  std::string names;
  for (const Cluster& c : known_devices()) names += (names.empty() ? "" : ", ") + c.device;
  return names;
}

Cluster for_ranks(Cluster c, int64_t ranks) {
  if (c.device == "cpu" && ranks > 1) {
    c.peak_tflops /= static_cast<double>(ranks);
    c.memory_bytes /= static_cast<double>(ranks);
  }
  return c;
}

Cluster find_device(const std::string& name) {
  for (const Cluster& c : known_devices())
    if (lower(c.device) == lower(name)) return c;
  throw UsageError(str("--device '", name, "': unknown device; known: ", known_device_names(),
                       " (or give --memory BYTES and --tflops)"));
}

}  // namespace autosp
