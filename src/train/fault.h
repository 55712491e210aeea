// Fault injection, which tests what keeps a multi-rank job from hanging (the collective watchdog,
// comm/watchdog.h, and the guarded communicators, comm/guarded.h).
//
// Fault injection (tests only): AUTOSP_FAULT="rank:R,step:K,kind:KIND[,where:WHERE]" makes rank R
// fail in step K (1-based, the number the progress line shows):
//   kind  exit   print an `error:` line and exit(3) (the MPI exit hook aborts the job)
//         abort  Communicator::abort with exit code 3
//         crash  die of SIGSEGV (default handler, no core file): no cleanup at all
//         hang   block forever outside any collective (the other ranks' watchdogs end the job)
//         nan    this rank's gradients become NaN before the all-reduce (every rank then stops on
//                the non-finite loss check, exit 3, before the update or a checkpoint)
//   where step        at the start of step K (default)
//         checkpoint  while step K's checkpoint is written: after its files, before the rename
//                     (rank 0 only, the rank that writes checkpoints)
// A malformed value is a UsageError. Knows nothing of graphs, models or devices.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace autosp {

enum class FaultKind { exit, abort, crash, hang, nan };
enum class FaultWhere { step, checkpoint };

struct Fault {
  int rank = 0;
  int64_t step = 1;
  FaultKind kind = FaultKind::exit;
  FaultWhere where = FaultWhere::step;
};

// Parses an AUTOSP_FAULT value ("" = no fault). Malformed → UsageError naming AUTOSP_FAULT.
std::optional<Fault> parse_fault(const std::string& text);
// The fault in the environment, checked against the job: a rank outside the world, or
// where:checkpoint on a rank other than 0, is a UsageError.
std::optional<Fault> fault_from_env(int world_size);
// Fires `fault` when it names this rank, step and place; returns otherwise (kind nan: see below).
void inject_fault(const std::optional<Fault>& fault, FaultWhere where, int rank, int64_t step, Communicator& world);
// Kind nan: fills `grads` (f32/f64) with NaN when the fault names this rank and step.
void inject_nan(const std::optional<Fault>& fault, int rank, int64_t step, std::vector<Tensor>& grads);

}  // namespace autosp
