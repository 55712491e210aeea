// The pass pipeline runner.
#include "graph/passes/pass.h"

#include "graph/verify.h"
#include "tensor/check.h"

namespace autosp {

void run_pipeline(Graph& g, const std::vector<Pass>& passes, const PassContext& ctx) {
  std::string before;
  for (const Pass& p : passes) {
    try {
      p.run(g, ctx);
      verify(g, p.types_valid_after ? VerifyLevel::full : VerifyLevel::structure);
    } catch (const UsageError& e) {
      throw UsageError(str(e.what(), " (in pass ", p.name, " after [", before, "])"));
    }
    before += (before.empty() ? "" : ", ") + std::string(p.name);
  }
}

}  // namespace autosp
