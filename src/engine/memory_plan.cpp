// Liveness-based best-fit memory planning.
#include "engine/memory_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "engine/dispatch.h"
#include "tensor/check.h"
#include "tensor/tensor.h"

namespace autosp {
namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Buffer {
  size_t bytes = 0;
  size_t def = 0, end = 0;  // defined at / last read at (execution positions)
  bool external = false;    // lives outside the arena
  int inherits = -1;        // buffer whose place this one takes over (in-place op)
  bool handed_over = false;  // its place was taken over: never freed by itself
  int64_t offset = MemoryPlan::kHeap;
  int output = 0;            // 0: its node's output; k: the node's extra output k
};

size_t bytes_of(const TensorType& t, const Bindings& b) {
  int64_t n = 1;
  for (const auto& d : t.shape) n *= d.eval(b);
  return static_cast<size_t>(n) * dtype_size(t.dtype);
}

// Best-fit allocation in a growing arena with coalescing frees. The free blocks are kept by offset
// (for coalescing) and by (size, offset) (for the best fit: the smallest block that fits, the
// lowest of equal ones), so an allocation is a lookup, not a scan of every free block.
class Arena {
 public:
  int64_t allocate(size_t bytes) {
    auto best = by_size_.lower_bound({bytes, std::numeric_limits<int64_t>::min()});
    if (best != by_size_.end()) {
      const auto [size, at] = *best;
      remove(at);
      if (size > bytes) insert(at + static_cast<int64_t>(bytes), size - bytes);
      return at;
    }
    // Grow: extend a free block that ends at the top, or start a new one there.
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + static_cast<int64_t>(last->second) == static_cast<int64_t>(top_)) {
        const int64_t at = last->first;
        top_ = static_cast<size_t>(at) + bytes;
        remove(at);
        return at;
      }
    }
    const int64_t at = static_cast<int64_t>(top_);
    top_ += bytes;
    return at;
  }
  void release(int64_t at, size_t bytes) {
    auto next = free_.lower_bound(at);
    if (next != free_.end() && at + static_cast<int64_t>(bytes) == next->first) {
      bytes += next->second;
      remove(next->first);
    }
    auto after = free_.lower_bound(at);
    if (after != free_.begin()) {
      auto prev = std::prev(after);
      if (prev->first + static_cast<int64_t>(prev->second) == at) {
        at = prev->first;
        bytes += prev->second;
        remove(at);
      }
    }
    insert(at, bytes);
  }
  size_t top() const { return top_; }

 private:
  void insert(int64_t at, size_t bytes) {
    free_[at] = bytes;
    by_size_.insert({bytes, at});
  }
  void remove(int64_t at) {
    auto it = free_.find(at);
    by_size_.erase({it->second, at});
    free_.erase(it);
  }
  std::map<int64_t, size_t> free_;            // offset → size
  std::set<std::pair<size_t, int64_t>> by_size_;  // (size, offset)
  size_t top_ = 0;
};

}  // namespace

std::vector<size_t> background_until(const Graph& g) {
  std::vector<size_t> until(g.size());
  size_t next_collective = g.size();
  for (size_t i = g.size(); i-- > 0;) {
    const Node& n = *g.nodes()[i];
    until[i] = i;
    if (n.op() == Op::reduce_scatter) until[i] = next_collective;
    else if (n.op() == Op::all_gather && !n.users().empty()) until[i] = g.size();
    if (until[i] != i)  // and at the latest by its first reader
      for (const Node* u : n.users()) until[i] = std::min(until[i], g.position(u));
    if (op_info(n.op()).collective) next_collective = i;
  }
  return until;
}

MemoryPlan plan_memory(const Graph& g, const Bindings& b, DeviceKind device) {
  const size_t n = g.size();
  std::vector<Buffer> bufs;
  std::vector<int> primary(n, -1);             // node → buffer of its output (-1: a leaf)
  std::vector<std::vector<int>> extras(n);     // node → buffers of its extra outputs
  std::vector<int> scratch(n, -1);             // node → buffer of its kernel's workspace
  // Lifetimes: a buffer lives until the last read of any node that views it, or until a
  // background collective reading it has finished.
  const std::vector<size_t> until = background_until(g);
  auto make = [&](const TensorType& t, size_t at) {
    bufs.push_back({align_up(bytes_of(t, b)), at, at});
    return static_cast<int>(bufs.size() - 1);
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& node = *g.nodes()[i];
    if (node.op() == Op::input || node.op() == Op::parameter) continue;
    if (node.op() == Op::reshape) {
      primary[i] = primary[g.position(node.input(0))];  // a view of its input
    } else if (node.op() == Op::output) {
      primary[i] = extras[g.position(node.input(0))].at(static_cast<size_t>(node.attrs().i("index") - 1));
    } else {
      primary[i] = make(node.type(), i);
      for (const auto& t : extra_types(node)) {
        extras[i].push_back(make(t, i));
        bufs.back().output = static_cast<int>(extras[i].size());
      }
      // Placed after the node's outputs, so it overlaps neither them nor the inputs; freed with
      // the node's last step (def = end = i), or once the collective it left in the background
      // has finished (a reduce_scatter's staging): the executor waits for it before the node at
      // until[i] runs, so that node may reuse the place.
      if (const size_t ws = workspace_bytes(node, b, device); ws > 0) {
        bufs.push_back({align_up(ws), i, std::max(i, std::min(until[i], n) - 1)});
        bufs.back().output = -1;
        scratch[i] = static_cast<int>(bufs.size() - 1);
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Node& node = *g.nodes()[i];
    for (const Node* in : node.inputs()) {
      const int buf = primary[g.position(in)];
      if (buf >= 0) bufs[buf].end = std::max(bufs[buf].end, std::min(until[i], n - 1));
    }
    if (primary[i] >= 0) bufs[primary[i]].end = std::max(bufs[primary[i]].end, i);
    if (g.is_output(&node) && primary[i] >= 0) bufs[primary[i]].external = true;
  }
  // In place: an elementwise op whose same-sized input buffer dies here takes over its place.
  MemoryPlan plan;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = *g.nodes()[i];
    if (!op_info(node.op()).in_place || primary[i] < 0) continue;
    Buffer& out = bufs[primary[i]];
    for (size_t k = 0; k < node.inputs().size(); ++k) {
      const Node* in = node.input(k);
      const int buf = primary[g.position(in)];
      if (buf < 0 || buf == primary[i] || bufs[buf].external || out.external || bufs[buf].end != i ||
          bufs[buf].handed_over || in->dtype() != node.dtype() || !(in->shape() == node.shape()) ||
          bufs[buf].bytes != out.bytes)
        continue;
      out.inherits = buf;
      bufs[buf].handed_over = true;
      ++plan.in_place;
      break;
    }
  }
  // Place buffers in execution order; free after the last read.
  Arena arena;
  std::vector<std::vector<int>> ending(n);
  for (size_t k = 0; k < bufs.size(); ++k)
    if (!bufs[k].external) ending[bufs[k].end].push_back(static_cast<int>(k));
  size_t live = 0, peak_buffer = 0;
  for (size_t i = 0, k = 0; i < n; ++i) {
    for (; k < bufs.size() && bufs[k].def == i; ++k) {
      Buffer& buf = bufs[k];
      if (buf.external) continue;
      if (buf.inherits >= 0) {
        buf.offset = bufs[buf.inherits].offset;
        continue;
      }
      buf.offset = arena.allocate(buf.bytes);
      live += buf.bytes;
      if (live > plan.max_live_bytes) {
        plan.max_live_bytes = live;
        plan.peak_position = i;
        peak_buffer = k;
      }
    }
    for (int k2 : ending[i]) {
      if (bufs[k2].handed_over) continue;
      arena.release(bufs[k2].offset, bufs[k2].bytes);
      live -= bufs[k2].bytes;
    }
  }
  // What is live at the peak: the same sweep again, up to the peak's allocation (collecting the
  // live set at every new maximum instead costs the live set's size per maximum).
  std::set<int> live_bufs;  // placed and not yet released (a buffer taken over in place counts once)
  bool at_peak = plan.max_live_bytes == 0;
  for (size_t i = 0, k = 0; !at_peak && i < n; ++i) {
    for (; !at_peak && k < bufs.size() && bufs[k].def == i; ++k) {
      if (bufs[k].external) continue;
      if (bufs[k].inherits >= 0) live_bufs.erase(bufs[k].inherits);
      live_bufs.insert(static_cast<int>(k));
      at_peak = k == peak_buffer;
    }
    if (at_peak) break;
    for (int k2 : ending[i])
      if (!bufs[k2].handed_over) live_bufs.erase(k2);
  }
  for (int b2 : live_bufs) plan.live_at_peak.push_back({bufs[b2].def, bufs[b2].output, bufs[b2].bytes});
  plan.arena_bytes = arena.top();
  plan.offset.assign(n, MemoryPlan::kHeap);
  plan.extra_offset.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Op op = g.nodes()[i]->op();
    if (primary[i] >= 0 && op != Op::reshape && op != Op::output) plan.offset[i] = bufs[primary[i]].offset;
    for (int e : extras[i]) plan.extra_offset[i].push_back(bufs[e].offset);
    plan.workspace_offset.push_back(scratch[i] >= 0 ? bufs[scratch[i]].offset : MemoryPlan::kHeap);
    plan.workspace_bytes.push_back(scratch[i] >= 0 ? bufs[scratch[i]].bytes : 0);
  }
  return plan;
}

}  // namespace autosp
