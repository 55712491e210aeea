// Out-of-line failure path for AUTOSP_ASSERT.
#include "tensor/check.h"

namespace autosp::detail {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(cat("internal error at ", file, ":", line, ": check `", expr, "` failed",
                             msg.empty() ? "" : ": ", msg));
}

}  // namespace autosp::detail
