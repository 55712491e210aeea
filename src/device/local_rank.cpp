// Node-local rank from the launcher's environment and its device.
#include "device/local_rank.h"

#include <cstdlib>
#include <string>

#include "tensor/check.h"

namespace autosp {
namespace {

// The first of `names` that is set, as a non-negative integer; -1 when none is set. A value that
// is not an integer is a UsageError naming the variable.
int env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1 << 20)
      throw UsageError(str("environment variable ", name, "=\"", v, "\": expected a non-negative integer"));
    return static_cast<int>(x);
  }
  return -1;
}

}  // namespace

int local_rank_from_env() {
  const int r = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"});
  return r < 0 ? 0 : r;
}

int local_size_from_env() { return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}); }

int device_for_local_rank(int local_rank, int local_size, int device_count) {
  if (device_count < 1) throw UsageError("runtime.device \"cuda\": no CUDA device is visible to this process");
  const int ranks = local_size > local_rank ? local_size : local_rank + 1;
  if (ranks > device_count)
    throw UsageError(str("runtime.device \"cuda\": ", ranks, " ranks on this node (local rank ", local_rank, ") but ",
                         device_count, " visible CUDA device", device_count == 1 ? "" : "s",
                         "; run at most one rank per GPU (mpirun -np / --npernode, or CUDA_VISIBLE_DEVICES)"));
  return local_rank;
}

}  // namespace autosp
