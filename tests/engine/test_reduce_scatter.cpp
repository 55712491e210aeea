// ZeRO-3's reduce_scatter in pieces (engine/dispatch.h launch::ScatterPieces, decision 102): ranks
// as threads (comm/threads.h) each reduce-scatter their own tensor, through the executor (the
// staging planned in the arena; in the background when one piece does it) and through the CPU
// launcher alone (its own staging, blocking), and every rank's shard equals a naive float64 sum
// over the ranks of the tensor's elements [r·c, (r+1)·c) (zeros past its end). The cases make the
// pieces small (AUTOSP_RS_PIECE_BYTES): numel not divisible by P (padding), pieces that do not
// divide the shard, one element per piece, bf16 summed in f32 (sum_dtype), bf16 out (the sum
// received apart, then rounded), f32 padded, and the direct path (no staging).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "comm/threads.h"
#include "common/env_var.h"
#include "common/naive.h"
#include "engine/dispatch.h"
#include "engine/executor.h"
#include "engine/memory_plan.h"
#include "graph/builder.h"
#include "graph/ops.h"

using namespace autosp;

namespace {

struct Case {
  std::string name;
  int P;
  int64_t n;
  DType in;
  bool sum_f32;            // sum_dtype = f32 on the node
  size_t piece_bytes;      // AUTOSP_RS_PIECE_BYTES (0: unset, the default)
  int64_t want_m, want_count;  // the geometry the case is meant to exercise (m = 0: not staged)
};

// Rank r's tensor: values exactly representable in `dt` (the reference sees what the kernel sees).
std::vector<double> tensor_of(int r, int64_t n, DType dt) {
  std::vector<double> v = naive::random_normal(n, 1000 + static_cast<uint32_t>(r));
  return Tensor::from_vector({n}, v).to(dt).to_doubles();
}

// The naive sum: element t of rank r's shard is Σ_q tensor_q[r·c + t], 0 past n.
std::vector<double> reference_shard(int r, int P, int64_t n, DType dt) {
  const int64_t c = (n + P - 1) / P;
  std::vector<double> out(static_cast<size_t>(c), 0.0);
  for (int q = 0; q < P; ++q) {
    const std::vector<double> v = tensor_of(q, n, dt);
    for (int64_t t = 0; t < c; ++t)
      if (r * c + t < n) out[static_cast<size_t>(t)] += v[static_cast<size_t>(r * c + t)];
  }
  return out;
}

void check_shard(const Tensor& got, int r, const Case& k, DType out) {
  const std::vector<double> want = reference_shard(r, k.P, k.n, k.in);
  const std::vector<double> have = got.to_doubles();
  REQUIRE(have.size() == want.size());
  // Sums of P values in f32: a few f32 roundings; bf16 out: one bf16 rounding of that.
  const double tol = out == DType::bf16 ? 1.0 / 128 : 1e-6;
  for (size_t t = 0; t < want.size(); ++t) {
    INFO(k.name << ": rank " << r << " element " << t << ": " << have[t] << " vs " << want[t]);
    CHECK(std::abs(have[t] - want[t]) <= tol * std::max(1.0, std::abs(want[t])));
  }
}

struct Program {
  Graph g;
  Node* rs = nullptr;
};

// g [n] → reduce_scatter (sum_dtype f32 when asked) → scaled by 1 (a reader, so the staging's
// life ends at a node of the graph, as in the backward).
std::unique_ptr<Program> program(const Case& k) {
  auto p = std::make_unique<Program>();
  Builder b(p->g);
  Node* x = b.input("g", k.in, {Dim(k.n)}, Role::none);
  p->rs = b.reduce_scatter(x, "world", k.P, "rs");
  if (k.sum_f32) {
    p->rs->attrs().set("sum_dtype", std::string("f32"));
    p->rs->set_type(infer_type(*p->rs, p->g.assumptions()));
  }
  p->g.add_output(p->rs);
  return p;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // c = 10, m = 3: pieces of 3, 3, 3, 1; 30 slots for 29 elements
      {"bf16 sum f32, numel 29 over 3, m 3", 3, 29, DType::bf16, true, 3 * 4 * 3, 3, 4},
      // c = 8, m = 3: pieces of 3, 3, 2; the last rank holds 6 real elements and 2 zeros
      {"bf16 sum f32, numel 30 over 4, m 3", 4, 30, DType::bf16, true, 4 * 4 * 3 + 5, 3, 3},
      {"bf16 sum f32, one element a piece", 2, 7, DType::bf16, true, 1, 1, 4},
      {"bf16 sum f32, one piece (background)", 4, 64, DType::bf16, true, 0, 16, 1},
      {"f32 padded, numel 7 over 2, m 2", 2, 7, DType::f32, false, 2 * 4 * 2, 2, 2},
      {"bf16 out (received apart), numel 13 over 3, m 3", 3, 13, DType::bf16, false, 3 * 4 * 3, 3, 2},
      {"f32 direct (not staged)", 2, 8, DType::f32, false, 1, 0, 1},
  };
  return all;
}

}  // namespace

TEST_CASE("AUTOSP_RS_PIECE_BYTES that is not a positive byte count is a named error", "[reduce_scatter]") {
  for (const char* bad : {"0", "-5", " 7", "lots", "12MB", "1.5", "99999999999999999999999"}) {
    INFO(bad);
    const testing::EnvVar env("AUTOSP_RS_PIECE_BYTES", bad);
    CHECK_THROWS_WITH(launch::reduce_scatter_piece_bytes(),
                      Catch::Contains("AUTOSP_RS_PIECE_BYTES='" + std::string(bad) + "': expected a positive byte count"));
  }
  const testing::EnvVar env("AUTOSP_RS_PIECE_BYTES", "4096");
  CHECK(launch::reduce_scatter_piece_bytes() == 4096);
}

TEST_CASE("reduce_scatter in pieces: the geometry the cases mean", "[reduce_scatter]") {
  for (const Case& k : cases()) {
    std::optional<testing::EnvVar> env;  // unset: the default
    if (k.piece_bytes > 0) env.emplace("AUTOSP_RS_PIECE_BYTES", std::to_string(k.piece_bytes).c_str());
    INFO(k.name);
    const int64_t c = (k.n + k.P - 1) / k.P;
    const DType out = k.sum_f32 ? DType::f32 : k.in;
    const launch::ScatterPieces p = launch::scatter_pieces({c, k.P, k.n}, k.in, out);
    CHECK(p.staged == (k.want_m > 0));
    if (!p.staged) continue;
    CHECK(p.m == k.want_m);
    CHECK(p.count == k.want_count);
    int64_t total = 0;
    for (int64_t j = 0; j < p.count; ++j) total += p.length(j);
    CHECK(total == c);
    // What the memory plan places for the node: the staging (and the received sum, apart).
    auto prog = program(k);
    const MemoryPlan plan = plan_memory(prog->g, {});
    const size_t pos = prog->g.position(prog->rs);
    CHECK(plan.workspace_bytes[pos] >= static_cast<size_t>((k.P + (out == DType::bf16 ? 1 : 0)) * p.m) * 4);
  }
}

TEST_CASE("reduce_scatter in pieces equals the float64 sum over the ranks", "[reduce_scatter]") {
  // Catch's assertions are not thread-safe: the ranks keep their shards, checked afterwards.
  for (const Case& k : cases()) {
    std::optional<testing::EnvVar> env;  // unset: the default
    if (k.piece_bytes > 0) env.emplace("AUTOSP_RS_PIECE_BYTES", std::to_string(k.piece_bytes).c_str());
    const DType out = k.sum_f32 ? DType::f32 : k.in;
    for (int how : {0, 1, 2}) {
      INFO(k.name << (how == 0   ? ", executor (background)"
                      : how == 1 ? ", executor (blocking)"
                                 : ", the CPU launcher alone (no plan, no handle)"));
      std::vector<Tensor> shards(static_cast<size_t>(k.P));
      run_thread_ranks(k.P, [&](ThreadCommunicator& w) {
        auto prog = program(k);
        const Tensor x = Tensor::from_vector({k.n}, tensor_of(w.rank(), k.n, DType::f64)).to(k.in);
        if (how < 2) {
          ExecOptions options;
          options.background_collectives = how == 0;
          Executor ex(prog->g, options);
          const CommGroups groups{{"world", &w}};
          shards[static_cast<size_t>(w.rank())] = ex.run({{"g", x}}, groups).outputs.at("rs");
          return;
        }
        const std::vector<Tensor> in{x};
        const Shape out_shape{(k.n + k.P - 1) / k.P};
        const Bindings b;
        std::vector<Tensor> extras;
        const KernelCall call{.node = *prog->rs, .in = in, .out_shape = out_shape, .bindings = b,
                              .alloc = cpu_allocator(), .extras = extras, .comm = &w};
        shards[static_cast<size_t>(w.rank())] = dispatch(call, DeviceKind::cpu);
      });
      for (int r = 0; r < k.P; ++r) {
        CHECK(shards[static_cast<size_t>(r)].dtype() == out);
        check_shard(shards[static_cast<size_t>(r)], r, k, out);
      }
    }
  }
}
