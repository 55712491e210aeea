// Helpers of the CPU MoE kernel tests: the expert weights of a layer are stacked [E, ...] arrays in
// the tests, and the kernels take one pointer per expert.
#pragma once

#include <cstdint>
#include <vector>

namespace autosp::test {

// Pointers to expert e's block of a stacked [E, ...] array.
template <class T>
std::vector<T*> experts(std::vector<T>& w, int64_t E) {
  std::vector<T*> out;
  for (int64_t e = 0; e < E; ++e) out.push_back(w.data() + e * static_cast<int64_t>(w.size()) / E);
  return out;
}
template <class T>
std::vector<const T*> experts_const(std::vector<T>& w, int64_t E) {
  const std::vector<T*> p = experts(w, E);
  return {p.begin(), p.end()};
}

}  // namespace autosp::test
