// Which GPU a rank uses: its rank on the node, read from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_RANK from Open MPI, MPI_LOCALRANKID from MPICH/Hydra, SLURM_LOCALID from
// srun; 0 when none is set), mapped one to one onto the visible devices. Plain host code: used by
// src/device/cuda/device.cpp and tested on the CPU. Knows nothing of CUDA.
#pragma once

namespace autosp {

// The node-local rank and the number of ranks on this node (-1 when the launcher does not say).
int local_rank_from_env();
int local_size_from_env();

// The device of `local_rank` among `device_count` visible ones. More ranks on the node than
// devices is a UsageError naming both counts (the caller's fix: fewer ranks per node).
int device_for_local_rank(int local_rank, int local_size, int device_count);

}  // namespace autosp
