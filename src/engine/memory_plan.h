// The memory planner: with the symbols bound, every intermediate value the executor would allocate
// gets a byte offset in one arena, by liveness. Buffers are placed best-fit in execution order and
// freed after their last use (views — reshape, and `output` nodes reading extra outputs — extend the
// life of the buffer they view); an elementwise op whose input dies at it and has its size writes in
// place. Leaves and graph outputs stay outside the arena (the caller owns them). The arena's size
// is the planned peak of intermediates.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ir.h"
#include "tensor/allocator.h"

namespace autosp {

struct MemoryPlan {
  static constexpr int64_t kHeap = -1;  // not in the arena: fed, a graph output, or a view
  std::vector<int64_t> offset;                    // per node position: its output's byte offset
  std::vector<std::vector<int64_t>> extra_offset;  // per node position: its extra outputs' offsets
  // per node position: its kernel's scratch (engine/dispatch.h workspace_bytes), live while the
  // node runs; kHeap and 0 bytes when it wants none
  std::vector<int64_t> workspace_offset;
  std::vector<size_t> workspace_bytes;
  size_t arena_bytes = 0;     // the planned peak of intermediates
  size_t max_live_bytes = 0;  // the largest total of simultaneously live planned buffers (lower bound)
  size_t in_place = 0;        // number of ops planned to write over their input
  // Where max_live_bytes is reached: the node position, and the arena buffers live there as
  // (defining node position, output index: 0 its output, k its extra output k, -1 its kernel's
  // workspace), with their bytes.
  struct LiveBuffer {
    size_t position = 0;
    int output = 0;
    size_t bytes = 0;
  };
  size_t peak_position = 0;
  std::vector<LiveBuffer> live_at_peak;
};

// `device`: whose kernels' scratch is planned (the CPU's; CUDA kernels plan none).
MemoryPlan plan_memory(const Graph& g, const Bindings& b, DeviceKind device = DeviceKind::cpu);

// Collectives the executor runs in the background, and the position by which each must have
// finished (per node; its own position for everything else): an all_gather (ZeRO-3's prefetch)
// by its first reader, a reduce_scatter (ZeRO-3's gradients) by its first reader or the next
// collective of the graph, whichever comes first (or the end). Its inputs stay allocated until then: the planner extends their lives to it.
std::vector<size_t> background_until(const Graph& g);

}  // namespace autosp
