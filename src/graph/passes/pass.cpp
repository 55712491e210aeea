// The pass pipeline runner.
#include "graph/passes/pass.h"

#include <algorithm>
#include <chrono>

#include "graph/verify.h"
#include "tensor/check.h"

namespace autosp {

ScopeIndex::ScopeIndex(const std::vector<std::string>& scopes) {
  for (size_t k = 0; k < scopes.size(); ++k) {
    by_prefix_[scopes[k]].push_back(static_cast<int>(k));
    if (std::find(lengths_.begin(), lengths_.end(), scopes[k].size()) == lengths_.end())
      lengths_.push_back(scopes[k].size());
  }
}

std::vector<int> ScopeIndex::matches(std::string_view name) const {
  std::vector<int> out;
  for (size_t len : lengths_) {
    if (len > name.size()) continue;
    auto it = by_prefix_.find(name.substr(0, len));
    if (it != by_prefix_.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int ScopeIndex::first(std::string_view name) const {
  int best = -1;
  for (size_t len : lengths_) {
    if (len > name.size()) continue;
    auto it = by_prefix_.find(name.substr(0, len));
    if (it != by_prefix_.end() && (best < 0 || it->second.front() < best)) best = it->second.front();
  }
  return best;
}

void run_pipeline(Graph& g, const std::vector<Pass>& passes, const PassContext& ctx, std::vector<PassTime>* times,
                  VerifyWhen when) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  auto level = [](const Pass& p) { return p.types_valid_after ? VerifyLevel::full : VerifyLevel::structure; };
  std::string before;
  for (const Pass& p : passes) {
    try {
      const auto t0 = Clock::now();
      p.run(g, ctx);
      const auto t1 = Clock::now();
      if (when == VerifyWhen::each_pass) verify(g, level(p));
      if (times) times->push_back({p.name, seconds(t0, t1), seconds(t1, Clock::now())});
    } catch (const UsageError& e) {
      throw UsageError(str(e.what(), " (in pass ", p.name, " after [", before, "])"));
    }
    before += (before.empty() ? "" : ", ") + std::string(p.name);
  }
  if (when == VerifyWhen::each_pass || passes.empty()) return;
  try {
    const auto t0 = Clock::now();
    verify(g, level(passes.back()));
    if (times) times->push_back({"verify", 0, seconds(t0, Clock::now())});
  } catch (const UsageError& e) {
    throw UsageError(str(e.what(), " (after the passes [", before, "])"));
  }
}

std::unique_ptr<Graph> run_pipeline_verified_once(const std::function<std::unique_ptr<Graph>()>& make,
                                                  const std::vector<Pass>& passes, const PassContext& ctx,
                                                  std::vector<PassTime>* times) {
  std::unique_ptr<Graph> g = make();
  try {
    run_pipeline(*g, passes, ctx, times, VerifyWhen::once);
    return g;
  } catch (const UsageError&) {
    g = make();  // again, to find the pass
    run_pipeline(*g, passes, ctx, nullptr, VerifyWhen::each_pass);
    throw;  // a pass that broke the graph and one that mended it: the one verify's error
  }
}

}  // namespace autosp
