// The machines autosp-plan plans for: a device's memory, its dense peak and the rate a training
// step achieves of it, and the links between ranks (inside a node, across nodes) as an alpha-beta
// model. The GPU figures are the vendors' specifications with the achieved fractions of
// docs/scaling.md (assumptions, not measurements); `cpu` is this machine: its physical memory, its
// cores, and MPI over shared memory. Knows nothing of graphs or configs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autosp {

struct Link {
  double alpha_s = 0;        // latency per collective step
  double bytes_per_s = 1e9;  // achieved bandwidth per rank, one direction
};

struct Cluster {
  std::string device;             // the --device name ("" with only --memory)
  double memory_bytes = 0;        // per rank
  double reserve_fraction = 0.1;  // kept free (CUDA context, NCCL buffers, fragmentation, what the plan misses)
  double peak_tflops = 0;         // dense, at the run's precision, per rank (cpu: the machine's)
  double achieved_fraction = 0.4; // of the peak a training step's kernels reach
  int64_t ranks_per_node = 8;
  Link intra, inter;              // inside a node; between nodes
  double usable_bytes() const { return memory_bytes * (1 - reserve_fraction); }
  double achieved_flops() const { return peak_tflops * achieved_fraction * 1e12; }
};

// The devices --device knows, by name.
const std::vector<Cluster>& known_devices();
// `name` (case-insensitive), or a UsageError that lists the known names.
Cluster find_device(const std::string& name);
// The cluster as each of `ranks` ranks sees it: on `cpu` the ranks share the machine's cores and memory.
Cluster for_ranks(Cluster c, int64_t ranks);
// The known names, comma-separated.
std::string known_device_names();

}  // namespace autosp
