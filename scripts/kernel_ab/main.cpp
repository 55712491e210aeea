// The driver of scripts/kernel_ab.sh: the old and the new version of a CPU kernel in one process,
// alternated call by call, best time of each over the rounds. On a noisy shared machine the host's
// phases hit both sides alike, which separate processes (each its own phase) do not.
//   kernel_ab gemm ROUNDS [cold]   GPT-2 tiny's 15 GEMM shapes, weighted by their calls per step;
//                                  cold: each call on its own A, B and C of 24 sets (288 MiB),
//                                  fresh from memory as in a step, not the last call's in cache
//   kernel_ab attention ROUNDS S D causal attention, B 4, 8 heads, forward and backward
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
void run_old_gemm(bool, bool, long, long, long, const float*, const float*, float*);
void run_new_gemm(bool, bool, long, long, long, const float*, const float*, float*);
void run_old_attention(int, const float*, const float*, const float*, float*, float*, const float*, float*, float*,
                       float*, long, long, long, long);
void run_new_attention(int, const float*, const float*, const float*, float*, float*, const float*, float*, float*,
                       float*, long, long, long, long);
}

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<float> normal(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& e : v) e = nd(g);
  return v;
}

int gemm(int rounds, bool cold) {
  struct Shape {
    long M, N, K;
    bool ta, tb;
    int calls;
  };
  const std::vector<Shape> shapes = {
      {1024, 768, 256, 0, 0, 4},   {1024, 256, 768, 0, 1, 4},  {256, 768, 1024, 1, 0, 4},  {1024, 256, 256, 0, 0, 4},
      {1024, 256, 256, 0, 1, 4},   {256, 256, 1024, 1, 0, 4},  {1024, 1024, 256, 0, 0, 4}, {1024, 256, 1024, 0, 1, 4},
      {256, 1024, 1024, 1, 0, 4},  {1024, 256, 1024, 0, 0, 4}, {1024, 1024, 256, 0, 1, 4}, {1024, 256, 1024, 1, 0, 4},
      {1024, 512, 256, 0, 1, 1},   {1024, 256, 512, 0, 0, 1},  {512, 256, 1024, 1, 0, 1}};
  const size_t set = size_t(1) << 20, sets = cold ? 24 : 1;  // floats per operand, operand sets
  const auto a = normal(set * sets, 1), b = normal(set * sets, 2);
  std::vector<float> c(set * sets);
  size_t next = 0;  // the set the next call uses
  std::vector<double> best[2] = {std::vector<double>(shapes.size(), 1e9), std::vector<double>(shapes.size(), 1e9)};
  for (int r = 0; r < rounds; ++r)
    for (size_t s = 0; s < shapes.size(); ++s)
      for (int side = 0; side < 2; ++side) {
        const int first = r % 2;  // alternate which side goes first
        const int which = side ^ first;
        const auto f = which ? run_new_gemm : run_old_gemm;
        const Shape& x = shapes[s];
        const double t0 = now();
        for (int it = 0; it < 5; ++it, next = (next + 1) % sets)
          f(x.ta, x.tb, x.M, x.N, x.K, a.data() + next * set, b.data() + next * set, c.data() + next * set);
        best[which][s] = std::min(best[which][s], (now() - t0) / 5);
      }
  double total[2] = {0, 0};
  for (size_t s = 0; s < shapes.size(); ++s) {
    const Shape& x = shapes[s];
    const double gf = 2e-9 * double(x.M) * double(x.N) * double(x.K);
    for (int side = 0; side < 2; ++side) total[side] += best[side][s] * x.calls;
    std::printf("%5ld x %5ld x %5ld t%d%d: old %6.1f new %6.1f GFLOP/s\n", x.M, x.N, x.K, int(x.ta), int(x.tb),
                gf / best[0][s], gf / best[1][s]);
  }
  std::printf("the step's GEMMs%s, best of %d: old %.2f ms, new %.2f ms: %.3fx\n", cold ? " (cold operands)" : "",
              rounds, total[0] * 1e3, total[1] * 1e3, total[0] / total[1]);
  return 0;
}

int attention(int rounds, long S, long D) {
  const long B = 4, N = 8;
  const size_t n = size_t(B * N * S * D);
  const auto q = normal(n, 1), k = normal(n, 2), v = normal(n, 3), dout = normal(n, 4);
  std::vector<float> o(n), lse(size_t(B * N * S)), dq(n), dk(n), dv(n);
  double best[2][2] = {{1e9, 1e9}, {1e9, 1e9}};  // [side][forward, backward]
  for (int r = 0; r < rounds; ++r)
    for (int side = 0; side < 2; ++side) {
      const int which = side ^ (r % 2);
      const auto f = which ? run_new_attention : run_old_attention;
      for (int it = 0; it < 3; ++it) {
        const double t0 = now();
        f(0, q.data(), k.data(), v.data(), o.data(), lse.data(), nullptr, nullptr, nullptr, nullptr, B, N, S, D);
        const double t1 = now();
        f(1, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), B, N,
          S, D);
        const double t2 = now();
        best[which][0] = std::min(best[which][0], t1 - t0);
        best[which][1] = std::min(best[which][1], t2 - t1);
      }
    }
  std::printf("attention B %ld N %ld S %ld D %ld, best of %d: forward old %.3f new %.3f ms (%.3fx), backward old %.3f "
              "new %.3f ms (%.3fx)\n",
              B, N, S, D, rounds, best[0][0] * 1e3, best[1][0] * 1e3, best[0][0] / best[1][0], best[0][1] * 1e3,
              best[1][1] * 1e3, best[0][1] / best[1][1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "gemm") == 0)
    return gemm(std::atoi(argv[2]), argc >= 4 && std::strcmp(argv[3], "cold") == 0);
  if (argc >= 5 && std::strcmp(argv[1], "attention") == 0)
    return attention(std::atoi(argv[2]), std::atol(argv[3]), std::atol(argv[4]));
  std::fprintf(stderr, "usage: kernel_ab gemm ROUNDS [cold] | kernel_ab attention ROUNDS S D\n");
  return 2;
}
