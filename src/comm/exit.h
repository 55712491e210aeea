// An exit the whole job takes together: every rank has passed a barrier and leaves with the same
// code (the trainer stopped by a preemption signal, after its checkpoint). The MPI exit hook then
// finalises MPI as for a normal exit instead of aborting the job (comm/mpi.cpp), so a requeued job
// sees the agreed code and no abort messages. Knows nothing of MPI itself.
#pragma once

namespace autosp {

void mark_exit_agreed();
bool exit_agreed();

}  // namespace autosp
