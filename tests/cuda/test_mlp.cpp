// The tiled SwiGLU MLP's backward on the device (kernels/cuda/mlp.cu on cuBLASLt): bf16 weight
// gradients summed over 128 chunks of 2 rows against the float64 chain rule, within 0.5% relative
// L2 (as tests/cuda/emulate_mlp.cpp checks on the CPU; a sum held in bf16 is 1% to 1.4% off).
#include "cuda/cuda_test.h"
#include "kernels/cuda/mlp.cuh"

using namespace autosp;
using namespace autosp::cudatest;

TEST_CASE("cuda tiled MLP backward: bf16 weight gradients summed over 128 chunks match float64", "[cuda][mlp]") {
  const int64_t R = 256, C = 16, I = 24, chunk = 2;
  const auto x = values<bf16>(around(0.5, R * C, 4100, 0.5)), dy = values<bf16>(around(0.5, R * C, 4101, 0.5));
  const auto wg = values<bf16>(naive::random_normal(I * C, 4102, 0.25)), wu = values<bf16>(around(0.1, I * C, 4103, 0.25));
  const auto wd = values<bf16>(around(0.1, C * I, 4104, 0.25));
  naive::Vec rdx, rdwg, rdwu, rdwd;
  naive::swiglu_mlp_backward(widen(dy), widen(x), widen(wg), widen(wu), widen(wd), R, C, I, rdx, rdwg, rdwu, rdwd);
  Dev<bf16> dx_(size_t(R * C)), dwg(size_t(I * C)), dwu(size_t(I * C)), dwd(size_t(C * I)), s0(size_t(chunk * I)),
      s1(size_t(chunk * I)), s2(size_t(chunk * I)), s3(size_t(chunk * I));
  Dev<bf16> dx(x), ddy(dy), dwg_in(wg), dwu_in(wu), dwd_in(wd);
  Dev<float> acc(size_t(cuda::swiglu_mlp_acc_elems<bf16>(C, I)));
  bf16* const scratch[4] = {s0.get(), s1.get(), s2.get(), s3.get()};
  cuda::swiglu_mlp_backward<bf16>(ddy.get(), dx.get(), dwg_in.get(), dwu_in.get(), dwd_in.get(), dx_.get(), dwg.get(),
                                  dwu.get(), dwd.get(), R, C, I, chunk, scratch, acc.get(), nullptr);
  const double e_dwg = relative_l2(widen(dwg.download()), rdwg), e_dwu = relative_l2(widen(dwu.download()), rdwu),
               e_dwd = relative_l2(widen(dwd.download()), rdwd), e_dx = relative_l2(widen(dx_.download()), rdx);
  INFO("relative L2 error of dWg " << e_dwg << ", dWu " << e_dwu << ", dWd " << e_dwd << ", dx " << e_dx);
  CHECK(e_dwg <= 5e-3);
  CHECK(e_dwu <= 5e-3);
  CHECK(e_dwd <= 5e-3);
  CHECK(e_dx <= 5e-3);
}
