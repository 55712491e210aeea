// NameIndex: linear probing with deletion by backward shift (no tombstones: an erased slot is
// refilled from the probe run after it, so that a lookup may stop at the first empty slot).
#include "graph/name_index.h"

#include <functional>

#include "graph/ir.h"
#include "tensor/check.h"

namespace autosp {

namespace {
uint64_t hash_of(std::string_view name) { return std::hash<std::string_view>{}(name); }
}  // namespace

Node* NameIndex::find(std::string_view name) const {
  if (slots_.empty()) return nullptr;
  const uint64_t h = hash_of(name);
  for (size_t i = h & mask();; i = (i + 1) & mask()) {
    const Slot& s = slots_[i];
    if (!s.node) return nullptr;
    if (s.hash == h && s.node->name() == name) return s.node;
  }
}

bool NameIndex::insert(Node* n) {
  if ((size_ + 1) * 4 > slots_.size() * 3) grow();
  const std::string_view name = n->name();
  const uint64_t h = hash_of(name);
  for (size_t i = h & mask();; i = (i + 1) & mask()) {
    Slot& s = slots_[i];
    if (!s.node) {
      s = {h, n};
      ++size_;
      return true;
    }
    if (s.hash == h && s.node->name() == name) return false;
  }
}

void NameIndex::erase(const Node* n) {
  const uint64_t h = hash_of(n->name());
  size_t i = h & mask();
  for (; slots_[i].node != n; i = (i + 1) & mask())
    AUTOSP_ASSERT(slots_[i].node, "name index: ", n->name(), " is not entered");
  // Backward shift: each later slot of the run whose home is not in (i, j] moves into the hole.
  for (size_t j = (i + 1) & mask(); slots_[j].node; j = (j + 1) & mask()) {
    const size_t home = slots_[j].hash & mask();
    const bool stays = i < j ? i < home && home <= j : i < home || home <= j;
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = {};
  --size_;
}

void NameIndex::grow() {
  std::vector<Slot> old(slots_.empty() ? 16 : slots_.size() * 2);
  old.swap(slots_);
  for (const Slot& s : old) {
    if (!s.node) continue;
    size_t i = s.hash & mask();
    while (slots_[i].node) i = (i + 1) & mask();
    slots_[i] = s;
  }
}

}  // namespace autosp
