// canonicalize: remove dead nodes; the pipeline's full verifier then checks the result.
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/dce.h"

namespace autosp::passes {

PassResult canonicalize(Graph& g, const PassContext&) { return {eliminate_dead_code(g) > 0}; }

}  // namespace autosp::passes
