// The bf16 GEMMs (kernels/cpu/matmul.h: gemm_bf16_batched) against a float64 loop over the same
// bf16 values, on every path the CPU has (a path it lacks says SKIPPED): all four transposition
// cases, odd K (the last pair half empty), odd sizes and offsets (the word-at-a-time packing),
// stride-0 broadcasts, alpha/beta, K across k-blocks and sizes that split over threads. Accumulation
// is f32, so the f32 tolerance applies, scaled by Σ|a·b|. And that the dispatch picks the best
// path the CPU offers, judged from /proc/cpuinfo's flags (not the code's own cpuid test), and
// that every lower path it has runs when asked for.
#include <catch2/catch.hpp>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/bf16_test.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"

namespace {

using namespace autosp;

// The CPU flags of /proc/cpuinfo's first processor (empty where there is no such file).
std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

struct Bf16Case {
  bool ta, tb;
  int64_t batch, M, N, K;
  bool bcast_a, bcast_b;  // stride 0 over the batch
  int64_t offset;         // elements before A's and B's first (odd: operands not 4-byte aligned)
  double alpha, beta;
};

const Bf16Case kCases[] = {
    {false, false, 1, 1, 1, 1, false, false, 0, 1.0, 0.0},
    {false, true, 1, 14, 32, 512, false, false, 0, 1.0, 0.0},     // one micro-tile, one k-block of pairs
    {false, true, 1, 15, 33, 514, false, false, 0, -0.5, 1.0},     // one past each edge
    {true, false, 1, 15, 33, 513, false, false, 0, 1.0, 0.5},      // odd K
    {false, false, 2, 29, 65, 301, false, false, 0, 2.0, 0.0},
    {true, true, 2, 43, 97, 1027, false, false, 0, 1.0, 0.0},      // three k-blocks, odd K
    {false, true, 1, 37, 40, 64, false, false, 1, 1.0, 0.0},       // misaligned: word at a time
    {true, false, 1, 37, 40, 64, false, false, 1, 1.0, -1.0},
    {false, true, 3, 200, 96, 64, false, true, 0, 1.0, 0.0},       // shared B (a weight), mid-sized: over the batch
    {true, true, 3, 9, 11, 13, true, false, 0, 1.0, 1.0},          // shared A, accumulate
    {false, false, 1, 337, 70, 40, false, false, 0, 1.0, 0.0},     // past an A block, split by rows
    {false, true, 1, 3, 2100, 20, false, false, 0, 1.0, 0.0},      // past a B block, split by columns
    {true, false, 1, 64, 96, 1024, false, false, 0, 1.0, 1.0},     // a weight gradient's shape
    {true, false, 2, 6, 10, 0, false, false, 0, 1.0, 0.5},         // K = 0: C = beta · C
    {false, true, 1, 40, 70, 4101, false, false, 0, 1.0, 0.0},     // three of AMX's k-blocks (1024 pairs)
};

void run_case(cpu::Bf16Gemm path, const Bf16Case& g, uint32_t seed) {
  INFO("ta " << g.ta << " tb " << g.tb << " batch " << g.batch << " M "
               << g.M << " N " << g.N << " K " << g.K << " bcast " << g.bcast_a << g.bcast_b << " offset " << g.offset
               << " alpha " << g.alpha << " beta " << g.beta);
  const int64_t sa = g.bcast_a ? 0 : g.M * g.K, sb = g.bcast_b ? 0 : g.K * g.N, sc = g.M * g.N;
  const auto a = test::to_bf16(naive::random_normal(g.offset + (g.bcast_a ? g.M * g.K : g.batch * sa), seed));
  const auto b = test::to_bf16(naive::random_normal(g.offset + (g.bcast_b ? g.K * g.N : g.batch * sb), seed + 1));
  auto c = test::cast<float>(naive::random_normal(g.batch * sc, seed + 2));
  if (g.beta == 0) std::fill(c.begin(), c.end(), std::nanf(""));  // must be overwritten, not read
  const naive::Vec c0 = test::widen(c);
  cpu::gemm_bf16_batched(path, g.ta, g.tb, g.batch, g.M, g.N, g.K, float(g.alpha), a.data() + g.offset, sa,
                         b.data() + g.offset, sb, float(g.beta), c.data(), sc);
  naive::Vec ref, mag;  // mag: the same GEMM on absolute values, the scale of its rounding error
  const auto widen = [](const std::vector<uint16_t>& x, int64_t at, int64_t n, bool abs) {
    naive::Vec w;
    for (int64_t i = at; i < at + n; ++i) w.push_back(abs ? std::abs(cpu::bf16_to_f32(x[i])) : cpu::bf16_to_f32(x[i]));
    return w;
  };
  for (int64_t p = 0; p < g.batch; ++p) {
    naive::Vec cp(c0.begin() + p * sc, c0.begin() + (p + 1) * sc), cabs = cp;
    if (g.beta == 0) std::fill(cp.begin(), cp.end(), 0.0), std::fill(cabs.begin(), cabs.end(), 0.0);
    for (double& v : cabs) v = std::abs(v);
    const auto gemm = [&](bool abs, const naive::Vec& c_in) {
      return naive::gemm(g.ta, g.tb, g.M, g.N, g.K, abs ? std::abs(g.alpha) : g.alpha,
                         widen(a, g.offset + p * sa, g.M * g.K, abs), widen(b, g.offset + p * sb, g.K * g.N, abs),
                         abs ? std::abs(g.beta) : g.beta, c_in);
    };
    const naive::Vec r = gemm(false, cp), m = gemm(true, cabs);
    ref.insert(ref.end(), r.begin(), r.end());
    mag.insert(mag.end(), m.begin(), m.end());
  }
  test::check_close(c, ref, test::tol<float>(), &mag);
}

}  // namespace

TEST_CASE("the bf16 GEMM dispatch picks the best path the CPU offers", "[kernels][matmul][bf16]") {
  const std::set<std::string> flags = cpu_flags();
  if (flags.empty()) {
    WARN("SKIPPED: no /proc/cpuinfo flags to judge the CPU by");
    return;
  }
  const bool avx512 = flags.count("avx512bw") && flags.count("avx512vl");
  const bool dp = flags.count("avx512_bf16") && avx512;
  // AMX needs the CPU's tiles and Linux's leave to use their state (asked here directly).
  const bool amx = flags.count("amx_bf16") && flags.count("amx_tile") && avx512 &&
                   syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  if (!amx) WARN("this CPU (or its kernel) has no AMX bf16 tiles: the AMX path is checked absent only");
  const cpu::Bf16Gemm best = amx ? cpu::Bf16Gemm::amx : dp ? cpu::Bf16Gemm::avx512_bf16 : cpu::Bf16Gemm::f32;
  CHECK(cpu::bf16_gemm_best() == best);
  CHECK(cpu::bf16_gemm_available(cpu::Bf16Gemm::amx) == amx);
  CHECK(cpu::bf16_gemm_available(cpu::Bf16Gemm::avx512_bf16) == dp);
  CHECK(cpu::bf16_gemm_available(cpu::Bf16Gemm::f32));
  CHECK(cpu::bf16_gemm_available(cpu::Bf16Gemm::amx_emulated) == avx512);  // a test tool, never the best
  // The log's names for the three.
  CHECK(std::string(cpu::bf16_gemm_name(cpu::Bf16Gemm::amx)).rfind("AMX", 0) == 0);
  CHECK(std::string(cpu::bf16_gemm_name(cpu::Bf16Gemm::avx512_bf16)).rfind("AVX512-BF16", 0) == 0);
  CHECK(std::string(cpu::bf16_gemm_name(cpu::Bf16Gemm::f32)).rfind("emulated", 0) == 0);
  // The attention's tile products need AVX512-BF16 (its packing; pair words: an even head dim) and
  // run on AMX where the GEMM does.
  CHECK(cpu::sdpa_bf16_native(64) == dp);
  CHECK_FALSE(cpu::sdpa_bf16_native(63));
  if (dp) CHECK(cpu::sdpa_bf16_path() == (amx ? cpu::Bf16Gemm::amx : cpu::Bf16Gemm::avx512_bf16));
}

// AUTOSP_BF16_GEMM caps the dispatch (a way round a path that misbehaves on some machine, as
// oneDNN's ONEDNN_MAX_CPU_ISA): f32 always gives the emulated path, avx512_bf16 leaves AMX out, empty
// is no cap, and anything else is refused by name.
TEST_CASE("AUTOSP_BF16_GEMM caps the bf16 GEMM path, and garbage is refused", "[kernels][matmul][bf16]") {
  const bool dp = cpu::bf16_gemm_available(cpu::Bf16Gemm::avx512_bf16);
  ::setenv("AUTOSP_BF16_GEMM", "f32", 1);
  CHECK(cpu::bf16_gemm_best() == cpu::Bf16Gemm::f32);
  ::setenv("AUTOSP_BF16_GEMM", "avx512_bf16", 1);
  CHECK(cpu::bf16_gemm_best() == (dp ? cpu::Bf16Gemm::avx512_bf16 : cpu::Bf16Gemm::f32));
  ::setenv("AUTOSP_BF16_GEMM", "", 1);  // `AUTOSP_BF16_GEMM= cmd` is no cap, as unset
  CHECK(cpu::bf16_gemm_best() == (cpu::bf16_gemm_available(cpu::Bf16Gemm::amx) ? cpu::Bf16Gemm::amx
                                  : dp ? cpu::Bf16Gemm::avx512_bf16 : cpu::Bf16Gemm::f32));
  ::setenv("AUTOSP_BF16_GEMM", "sse2", 1);
  CHECK_THROWS_WITH(cpu::bf16_gemm_best(), Catch::Contains("AUTOSP_BF16_GEMM=sse2"));
  ::unsetenv("AUTOSP_BF16_GEMM");
  CHECK(cpu::bf16_gemm_best() != cpu::Bf16Gemm::amx_emulated);
}

TEST_CASE("every bf16 GEMM path matches a float64 loop", "[kernels][matmul][bf16]") {
  test::for_each_bf16_path([](cpu::Bf16Gemm path) {
    uint32_t seed = 500;
    for (const Bf16Case& g : kCases) run_case(path, g, seed += 3);
  });
}

// gemm_bf16_batched_rounded: each output is the f32 C of gemm_bf16_batched rounded once (the
// scalar f32_to_bf16 of tensor/convert.h, bit for bit, NaN and ±inf included), written straight
// into bf16 by the last k-block, and within a bf16 step of the float64 loop. The partial sums
// are asked for exactly where the depth takes several k-blocks (their scratch is filled with NaN
// first: only what the GEMM wrote may be read), and nothing outside Y is written.
TEST_CASE("a bf16 C from the bf16 GEMM is its f32 C rounded once, on every path", "[kernels][matmul][bf16]") {
  test::for_each_bf16_path([](cpu::Bf16Gemm path) {
    uint32_t seed = 900;
    for (const Bf16Case& g : kCases) {
      if (g.beta != 0.0 || (g.bcast_a && g.bcast_b)) continue;
      for (const bool specials : {false, true}) {
        INFO("ta " << g.ta << " tb " << g.tb << " batch " << g.batch << " M " << g.M << " N " << g.N << " K " << g.K
                   << " offset " << g.offset << " alpha " << g.alpha << " specials " << specials);
        const int64_t sa = g.bcast_a ? 0 : g.M * g.K, sb = g.bcast_b ? 0 : g.K * g.N, sc = g.M * g.N;
        auto a = test::to_bf16(naive::random_normal(g.offset + (g.bcast_a ? g.M * g.K : g.batch * sa), seed += 3));
        const auto b = test::to_bf16(naive::random_normal(g.offset + (g.bcast_b ? g.K * g.N : g.batch * sb), seed + 1));
        if (specials && g.K > 0) {  // a NaN, an inf and a huge value in three rows of A
          a[size_t(g.offset)] = 0x7fc0;                      // NaN
          a[a.size() - 1] = 0xff80;                          // -inf
          a[size_t(g.offset + (a.size() - g.offset) / 2)] = 0x7f7f;  // the largest bf16: sums may reach inf
        }
        std::vector<float> c(size_t(g.batch * sc));
        cpu::gemm_bf16_batched(path, g.ta, g.tb, g.batch, g.M, g.N, g.K, float(g.alpha), a.data() + g.offset, sa,
                               b.data() + g.offset, sb, 0.0f, c.data(), sc);
        const int64_t sums = cpu::gemm_bf16_partials(path, g.batch, g.M, g.N, g.K);
        const bool amx = path == cpu::Bf16Gemm::amx || path == cpu::Bf16Gemm::amx_emulated;
        const bool one_block = path != cpu::Bf16Gemm::f32 && g.K <= (amx ? 2048 : 512);  // 1024 or 256 pairs a k-block
        CHECK(sums == (g.K == 0 || one_block ? 0 : g.batch * sc));
        std::vector<float> partials(size_t(sums), std::nanf(""));
        constexpr int64_t kGuard = 5;
        std::vector<uint16_t> y(size_t(g.batch * sc + kGuard), 0x1234);
        cpu::gemm_bf16_batched_rounded(path, g.ta, g.tb, g.batch, g.M, g.N, g.K, float(g.alpha), a.data() + g.offset,
                                       sa, b.data() + g.offset, sb, y.data(), sc, sums > 0 ? partials.data() : nullptr);
        int64_t differ = 0;
        for (size_t i = 0; i < c.size(); ++i) differ += y[i] != cpu::f32_to_bf16(c[i]);
        CHECK(differ == 0);
        for (int64_t i = 0; i < kGuard; ++i) CHECK(y[size_t(g.batch * sc + i)] == 0x1234);
        if (specials) continue;
        naive::Vec ref, mag;
        for (int64_t p = 0; p < g.batch; ++p) {
          const auto widen = [](const std::vector<uint16_t>& x, int64_t at, int64_t n, bool abs) {
            naive::Vec w;
            for (int64_t i = at; i < at + n; ++i)
              w.push_back(abs ? std::abs(cpu::bf16_to_f32(x[i])) : cpu::bf16_to_f32(x[i]));
            return w;
          };
          const naive::Vec zero(size_t(sc), 0.0);
          const auto gemm = [&](bool abs) {
            return naive::gemm(g.ta, g.tb, g.M, g.N, g.K, abs ? std::abs(g.alpha) : g.alpha,
                               widen(a, g.offset + p * sa, g.M * g.K, abs), widen(b, g.offset + p * sb, g.K * g.N, abs),
                               0.0, zero);
          };
          const naive::Vec r = gemm(false), m = gemm(true);
          ref.insert(ref.end(), r.begin(), r.end());
          mag.insert(mag.end(), m.begin(), m.end());
        }
        std::vector<float> yf;
        for (size_t i = 0; i < c.size(); ++i) yf.push_back(cpu::bf16_to_f32(y[i]));
        test::check_close(yf, ref, 1.0 / 256, &mag);  // one rounding (≤ 2^-9) over the f32 sum's error
      }
    }
  });
}
