// The CUDA norm launchers (layernorm, RMSNorm, softmax; forward, input and parameter gradients)
// run on the CPU by emulation.h, against the CPU kernels. Small shapes; autosp-cuda-tests runs the
// large ones on a GPU.
#include <cstring>

#include "cuda/emulation.h"
//
#include "kernels/cuda/norm.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/norm.h"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("emulated norm launchers match the CPU", "[cuda-emulation][norm]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  struct Case {
    int64_t rows, C;
  };
  uint32_t seed = 2000;
  for (const Case c : {Case{10, 8}, Case{9, 300}, Case{200, 40}, Case{1, 1}}) {
    INFO("rows " << c.rows << " C " << c.C);
    const size_t n = static_cast<size_t>(c.rows * c.C);
    const auto x = values<T>(naive::random_normal(int64_t(n), seed++, 2.0));
    const auto gy = values<T>(naive::random_normal(int64_t(n), seed++));
    const auto w = values<T>(naive::random_normal(c.C, seed++)), b = values<T>(naive::random_normal(c.C, seed++));
    const auto xs = to_storage<T>(x), gys = to_storage<T>(gy), ws = to_storage<T>(w), bs = to_storage<T>(b);
    std::vector<T> y(n), mean(static_cast<size_t>(c.rows)), rstd(static_cast<size_t>(c.rows));
    std::vector<T> gx(n), gw(static_cast<size_t>(c.C)), gb(static_cast<size_t>(c.C));
    std::vector<H> ry(n), rmean(static_cast<size_t>(c.rows)), rrstd(static_cast<size_t>(c.rows));
    std::vector<H> rgx(n), rgw(static_cast<size_t>(c.C)), rgb(static_cast<size_t>(c.C));

    cpu::layernorm_forward<H>(x.data(), w.data(), b.data(), ry.data(), rmean.data(), rrstd.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_forward<T>(xs.data(), ws.data(), bs.data(), y.data(), mean.data(), rstd.data(), c.rows, c.C, 1e-5,
                               nullptr);
    check_against<T>(from_storage(y), ry);
    check_against<T>(from_storage(mean), rmean);
    check_against<T>(from_storage(rstd), rrstd);

    cpu::rmsnorm_forward<H>(x.data(), w.data(), ry.data(), rrstd.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_forward<T>(xs.data(), ws.data(), y.data(), rstd.data(), c.rows, c.C, 1e-6, nullptr);
    check_against<T>(from_storage(y), ry);
    check_against<T>(from_storage(rstd), rrstd);

    cpu::softmax_forward<H>(x.data(), ry.data(), c.rows, c.C);
    cuda::softmax_forward<T>(xs.data(), y.data(), c.rows, c.C, nullptr);
    check_against<T>(from_storage(y), ry);

    cpu::layernorm_backward_input<H>(gy.data(), x.data(), w.data(), rgx.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_backward_input<T>(gys.data(), xs.data(), ws.data(), gx.data(), c.rows, c.C, 1e-5, nullptr);
    check_against<T>(from_storage(gx), rgx);
    cpu::layernorm_backward_params<H>(gy.data(), x.data(), rgw.data(), rgb.data(), c.rows, c.C, 1e-5);
    cuda::layernorm_backward_params<T>(gys.data(), xs.data(), gw.data(), gb.data(), c.rows, c.C, 1e-5, nullptr);
    check_against<T>(from_storage(gw), rgw);
    check_against<T>(from_storage(gb), rgb);

    cpu::rmsnorm_backward_input<H>(gy.data(), x.data(), w.data(), rgx.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_backward_input<T>(gys.data(), xs.data(), ws.data(), gx.data(), c.rows, c.C, 1e-6, nullptr);
    check_against<T>(from_storage(gx), rgx);
    cpu::rmsnorm_backward_weight<H>(gy.data(), x.data(), rgw.data(), c.rows, c.C, 1e-6);
    cuda::rmsnorm_backward_weight<T>(gys.data(), xs.data(), gw.data(), c.rows, c.C, 1e-6, nullptr);
    check_against<T>(from_storage(gw), rgw);

    cpu::softmax_forward<H>(x.data(), ry.data(), c.rows, c.C);
    const auto yv = values<T>(widen(ry));
    const auto yvs = to_storage<T>(yv);
    cpu::softmax_backward<H>(gy.data(), yv.data(), rgx.data(), c.rows, c.C);
    cuda::softmax_backward<T>(gys.data(), yvs.data(), gx.data(), c.rows, c.C, nullptr);
    check_against<T>(from_storage(gx), rgx);
  }
}

// The fused residual add + norm (add_layernorm, add_rmsnorm: y and the sum s) against the CPU
// kernel, without and with the residual branch's bias rb: s bit for bit x + (r + rb) with each add
// rounded to T (the unfused adds' roundings), computed here on the host.
TEMPLATE_TEST_CASE("emulated fused add + norm matches the CPU", "[cuda-emulation][norm][fuse]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  uint32_t seed = 2100;
  for (const auto& [rows, C] : {std::pair<int64_t, int64_t>{10, 8}, {9, 300}, {200, 40}, {1, 1}}) {
    const size_t n = static_cast<size_t>(rows * C);
    const auto x = values<T>(naive::random_normal(int64_t(n), seed++, 2.0));
    const auto r = values<T>(naive::random_normal(int64_t(n), seed++));
    const auto w = values<T>(naive::random_normal(C, seed++)), b = values<T>(naive::random_normal(C, seed++));
    const auto rb = values<T>(naive::random_normal(C, seed++, 0.5));
    const auto xs = to_storage<T>(x), rs = to_storage<T>(r), ws = to_storage<T>(w), bs = to_storage<T>(b);
    const auto rbs = to_storage<T>(rb);
    for (const bool biased : {false, true})
      for (const bool rms : {false, true}) {
        INFO("rows " << rows << " C " << C << (rms ? " rmsnorm" : " layernorm") << (biased ? ", r's bias" : ""));
        std::vector<H> t(n), sum(n);  // r (+ rb) and x + that, each rounded to T
        for (size_t i = 0; i < n; ++i) t[i] = biased ? H(r[i] + rb[i % size_t(C)]) : r[i];
        t = from_storage<T>(to_storage<T>(t));
        for (size_t i = 0; i < n; ++i) sum[i] = H(x[i] + t[i]);
        const std::vector<T> want_s = to_storage<T>(sum);
        std::vector<T> y(n), s(n);
        std::vector<H> ry(n), rsum(n);
        cpu::add_norm_forward<H>(x.data(), r.data(), biased ? rb.data() : nullptr, w.data(), rms ? nullptr : b.data(),
                                 ry.data(), rsum.data(), rows, C, 1e-5, rms);
        cuda::add_norm_forward<T>(xs.data(), rs.data(), biased ? rbs.data() : nullptr, ws.data(),
                                  rms ? nullptr : bs.data(), y.data(), s.data(), rows, C, 1e-5, rms, nullptr);
        check_against<T>(from_storage(y), ry);
        check_against<T>(from_storage(s), rsum);
        CHECK(std::memcmp(want_s.data(), s.data(), n * sizeof(T)) == 0);
        // y is the plain norm of s as stored (for bf16 the rounded sum), bit for bit: the unfused
        // add + norm's result, which activation checkpointing (no fusion) gives.
        std::vector<T> plain(n);
        if (rms) cuda::rmsnorm_forward<T>(s.data(), ws.data(), plain.data(), nullptr, rows, C, 1e-5, nullptr);
        else cuda::layernorm_forward<T>(s.data(), ws.data(), bs.data(), plain.data(), nullptr, nullptr, rows, C, 1e-5, nullptr);
        CHECK(std::memcmp(plain.data(), y.data(), n * sizeof(T)) == 0);
      }
  }
}
