// CUDA layernorm / RMSNorm / softmax, forward and backward, against the CPU kernels on the op-case
// shapes and larger ones (wide rows, odd widths, many rows); the parameter gradients are also run
// twice and must be bitwise equal.
#include "cuda/cuda_test.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/norm.cuh"

namespace {

using namespace autosp;
using namespace autosp::cudatest;

struct NormCase {
  int64_t rows, C;
};

const NormCase kNormCases[] = {{10, 8}, {10, 7}, {1, 1}, {64, 768}, {33, 4099}, {4096, 64}, {3, 20000}};

}  // namespace

TEMPLATE_TEST_CASE("cuda norm forwards match the CPU", "[cuda][norm]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  uint32_t seed = 100;
  for (const NormCase& c : kNormCases) {
    INFO("rows " << c.rows << " C " << c.C);
    const size_t n = size_t(c.rows * c.C);
    const auto x = values<T>(naive::random_normal(int64_t(n), seed++, 2.0));
    const auto w = values<T>(naive::random_normal(c.C, seed++)), b = values<T>(naive::random_normal(c.C, seed++));
    Dev<T> dx(x), dw(w), db(b), dy(n), dmean(static_cast<size_t>(c.rows)), drstd(static_cast<size_t>(c.rows));
    std::vector<H> y(n), mean(static_cast<size_t>(c.rows)), rstd(static_cast<size_t>(c.rows));

    cpu::layernorm_forward<H>(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_forward<T>(dx.get(), dw.get(), db.get(), dy.get(), dmean.get(), drstd.get(), c.rows, c.C, 1e-5,
                               nullptr);
    check_against<T>(dy.download(), y);
    check_against<T>(dmean.download(), mean);
    check_against<T>(drstd.download(), rstd);

    cpu::layernorm_forward<H>(x.data(), w.data(), nullptr, y.data(), nullptr, nullptr, c.rows, c.C, 1e-5);
    cuda::layernorm_forward<T>(dx.get(), dw.get(), nullptr, dy.get(), nullptr, nullptr, c.rows, c.C, 1e-5, nullptr);
    check_against<T>(dy.download(), y);

    cpu::rmsnorm_forward<H>(x.data(), w.data(), y.data(), rstd.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_forward<T>(dx.get(), dw.get(), dy.get(), drstd.get(), c.rows, c.C, 1e-6, nullptr);
    check_against<T>(dy.download(), y);
    check_against<T>(drstd.download(), rstd);

    cpu::softmax_forward<H>(x.data(), y.data(), c.rows, c.C);
    cuda::softmax_forward<T>(dx.get(), dy.get(), c.rows, c.C, nullptr);
    check_against<T>(dy.download(), y);
    cuda::softmax_forward<T>(dx.get(), dx.get(), c.rows, c.C, nullptr);  // in place
    check_against<T>(dx.download(), y);
  }
}

TEMPLATE_TEST_CASE("cuda norm backwards match the CPU", "[cuda][norm]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  uint32_t seed = 200;
  for (const NormCase& c : kNormCases) {
    INFO("rows " << c.rows << " C " << c.C);
    const size_t n = size_t(c.rows * c.C);
    const auto x = values<T>(naive::random_normal(int64_t(n), seed++, 2.0));
    const auto gy = values<T>(naive::random_normal(int64_t(n), seed++));
    const auto w = values<T>(naive::random_normal(c.C, seed++));
    Dev<T> dx(x), dgy(gy), dw(w), dgx(n), dgw(static_cast<size_t>(c.C)), dgb(static_cast<size_t>(c.C)),
        dgw2(static_cast<size_t>(c.C));
    std::vector<H> gx(n), gw(static_cast<size_t>(c.C)), gb(static_cast<size_t>(c.C));

    cpu::layernorm_backward_input<H>(gy.data(), x.data(), w.data(), gx.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_backward_input<T>(dgy.get(), dx.get(), dw.get(), dgx.get(), c.rows, c.C, 1e-5, nullptr);
    check_against<T>(dgx.download(), gx);

    cpu::layernorm_backward_params<H>(gy.data(), x.data(), gw.data(), gb.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_backward_params<T>(dgy.get(), dx.get(), dgw.get(), dgb.get(), c.rows, c.C, 1e-5, nullptr);
    const auto got_w = dgw.download();
    check_against<T>(got_w, gw);
    check_against<T>(dgb.download(), gb);
    cuda::layernorm_backward_params<T>(dgy.get(), dx.get(), dgw2.get(), nullptr, c.rows, c.C, 1e-5, nullptr);
    check_identical(dgw2.download(), got_w);  // deterministic, and the same without db

    cpu::rmsnorm_backward_input<H>(gy.data(), x.data(), w.data(), gx.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_backward_input<T>(dgy.get(), dx.get(), dw.get(), dgx.get(), c.rows, c.C, 1e-6, nullptr);
    check_against<T>(dgx.download(), gx);

    cpu::rmsnorm_backward_weight<H>(gy.data(), x.data(), gw.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_backward_weight<T>(dgy.get(), dx.get(), dgw.get(), c.rows, c.C, 1e-6, nullptr);
    cuda::rmsnorm_backward_weight<T>(dgy.get(), dx.get(), dgw2.get(), c.rows, c.C, 1e-6, nullptr);
    const auto got_rw = dgw.download();
    check_against<T>(got_rw, gw);
    check_identical(dgw2.download(), got_rw);

    // softmax backward from y = softmax(x)
    std::vector<H> y(n);
    cpu::softmax_forward<H>(x.data(), y.data(), c.rows, c.C);
    const auto yv = values<T>(naive::Vec(y.begin(), y.end()));
    Dev<T> dyv(yv);
    cpu::softmax_backward<H>(gy.data(), yv.data(), gx.data(), c.rows, c.C);
    cuda::softmax_backward<T>(dgy.get(), dyv.get(), dgx.get(), c.rows, c.C, nullptr);
    check_against<T>(dgx.download(), gx);
  }
}
