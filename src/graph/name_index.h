// The graph's index of its nodes by name (graph/ir.h Graph::find, and the uniquing of new names):
// an open-addressing hash table of (hash, node) slots, probed linearly, whose key is the node's own
// name. A lookup that misses reads one slot (and its neighbours in the same cache line), where a
// node-based std::unordered_map reads its bucket array, then a list node, and allocates one list
// node per entry (decision 207). Knows of a Node only its name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace autosp {

class Node;

class NameIndex {
 public:
  Node* find(std::string_view name) const;
  // Enters n under its name (which must not change while it is entered); false, and nothing
  // entered, when another node holds that name.
  bool insert(Node* n);
  void erase(const Node* n);  // n must be entered
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    Node* node = nullptr;  // null: empty
  };
  size_t mask() const { return slots_.size() - 1; }
  void grow();
  std::vector<Slot> slots_;  // a power of two of them, at most 3/4 full
  size_t size_ = 0;
};

}  // namespace autosp
