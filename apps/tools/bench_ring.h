// autosp-bench --mode ring: how evenly ring attention's causal work falls on the ring ranks, with
// the zigzag layout (what the passes slice: ring rank r holds chunks r and 2R-1-r of 2R) and with
// a contiguous one (ring rank r holds the r-th S/R of the sequence), engine/ring.h.
//
// For each (S, R) and layout, every ring rank in turn runs the ring_attention op and its backward
// (the CPU launchers, through the executor) on its own local sequence of S/R tokens, with a ring
// communicator that stands for the other R − 1 ranks: its send/recv copies at once, so the time is
// the rank's attention work alone, never a wait for a slower rank. In a real ring every step waits
// for the slowest rank, so the step's attention time is the maximum over the ranks. Turns
// alternate the layouts (zigzag, contiguous, zigzag, ...). With --attn-window W the two turns are
// the zigzag ring without a window and with the window W (the windowed exchange, decision 135),
// and each row also gives bytes_per_rank: what each ring rank sends (CountingCommunicator's
// send_recv bytes) in one forward + backward. Knows nothing of models.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

namespace autosp {

struct RingBenchOptions {
  std::vector<int64_t> seqs{4096, 16384};
  std::vector<int64_t> rings{4};
  int64_t batch = 1, hidden = 256, dim = 64, group = 2;  // heads = hidden / dim, kv heads = heads / group
  int threads = 1;           // per rank (a ring rank is one process)
  int warmup = 1, iters = 2; // per rank and turn
  int pairs = 3;             // alternated turns of each layout
  int64_t window = 0;        // > 0: compare the zigzag ring without and with this sliding window
};

// One row per (S, R, layout or window): the shape, window (0: none), rank_ms (each ring rank's
// median forward + backward time over the turns), max_ms, mean_ms, max_over_mean, max_over_min,
// bytes_per_rank; the second row adds slowest_vs_zigzag (its max_ms ÷ the first row's: the step's
// attention time without zigzag, or with the window against without).
void run_ring_bench(const RingBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace autosp
