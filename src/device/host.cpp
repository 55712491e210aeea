// set_host_threads over the CPU kernels' own thread setting (kernels/cpu/matmul.h).
#include "device/host.h"

#include "kernels/cpu/matmul.h"

namespace autosp {

void set_host_threads(int n) {
  if (n > 0) cpu::set_num_threads(n);
}

}  // namespace autosp
