// The op-case table: one row per op (at least), each a tiny graph over symbolic B and S, its input
// specs, and an independent reference in double from tests/common/naive.h. It drives the forward
// op tests against that reference (tests/engine/test_op_cases.cpp, which also checks every op has
// a case), the float64 finite-difference gradient checks (tests/graph/test_gradcheck.cpp) and the
// CPU-vs-CUDA comparisons (tests/cuda/test_dispatch.cpp). A new op adds one case here.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/naive.h"
#include "graph/builder.h"
#include "engine/executor.h"

namespace autosp::testing {

using naive::Vec;

struct InputSpec {
  SymShape shape;
  bool ids = false;      // integer input (i64) with values in [0, hi)
  int64_t hi = 0;
  bool ignore = false;   // some ids are set to -100 (labels)
  int64_t lo = 0;        // integer inputs' values are in [lo, hi)
};

struct OpCase {
  std::string name;
  Op op;  // the op the case is about (for the completeness check)
  std::vector<InputSpec> inputs;
  std::function<Node*(Builder&, const std::vector<Node*>&)> build;
  // in: the input values (ids as doubles), shapes: their concrete shapes.
  std::function<Vec(const std::vector<Vec>& in, const std::vector<naive::Shape>& shapes)> ref;
  // CUDA against the CPU in bf16 (tests/cuda/test_dispatch.cpp): 0 = the default for one rounding
  // per result (tests/cuda/dispatch_test.h tolerance_for). Only a composite op whose CUDA kernel
  // rounds intermediates to bf16 takes more.
  double bf16_tolerance = 0;
};

inline const Bindings& op_case_bindings() {
  static const Bindings b{{"B", 2}, {"S", 5}};
  return b;
}

// The op cases' collectives run over groups of one.
inline const CommGroups& single_groups() {
  static auto comm = make_single_process_communicator();
  static const CommGroups groups{{"sp", comm.get()}, {"world", comm.get()}, {"ring", comm.get()}, {"ep", comm.get()}};
  return groups;
}

inline std::vector<int64_t> as_ids(const Vec& v) { return std::vector<int64_t>(v.begin(), v.end()); }

// dpo_loss over `policy` [B, 2, 3] with the reference 0.25, 3 completion tokens per sequence and
// norms (4, 5) as constants.
inline Node* dpo_case(Builder& b, Node* policy, const DpoLoss& spec) {
  const SymShape s = policy->shape();
  return b.dpo_loss(policy, b.full(s, 0.25, policy->dtype(), "ref"), b.full(s, 3, policy->dtype(), "tokens"),
                    b.graph().add(Op::concat, {b.full({1}, 4, policy->dtype(), "pairs"),
                                               b.full({1}, 5, policy->dtype(), "chosen")},
                                  {{"dim", int64_t{0}}}, "norms"),
                    spec);
}

// Part p of x + b, x [B, S, 3, N = 2, D = 3], as [B, N, S, D] (the qkv_heads cases).
inline Vec naive_qkv_head(const std::vector<Vec>& in, const std::vector<naive::Shape>& sh, int64_t p) {
  const int64_t B = sh[0][0], S = sh[0][1], N = 2, D = 3, C = N * D;
  Vec out(static_cast<size_t>(B * N * S * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t c = p * C + n * D + d;
          out[size_t(((b * N + n) * S + s) * D + d)] = in[0][size_t((b * S + s) * 3 * C + c)] + in[1][size_t(c)];
        }
  return out;
}

inline const std::vector<OpCase>& op_cases() {
  using naive::Shape;
  static const Dim B = Dim::sym("B"), S = Dim::sym("S");
  auto unary = [](std::string name, Op op, std::function<double(double)> f) {
    return OpCase{name, op, {{{B, S, 6}}},
                  [op](Builder& b, const std::vector<Node*>& x) { return b.graph().add(op, {x[0]}, {}, "y"); },
                  [f](const std::vector<Vec>& in, const std::vector<Shape>&) { return naive::map(in[0], f); }};
  };
  auto binary = [](std::string name, Op op, SymShape sa, SymShape sb, std::function<double(double, double)> f) {
    return OpCase{name, op, {{sa}, {sb}},
                  [op](Builder& b, const std::vector<Node*>& x) { return b.graph().add(op, {x[0], x[1]}, {}, "y"); },
                  [f](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
                    return naive::broadcast_binary(in[0], sh[0], in[1], sh[1], f);
                  }};
  };
  // x [B, S, 6], probs [B, S, 4], then 4 gates, 4 ups [5, 6] and 4 downs [6, 5]; the reference
  // stacks them.
  // With `ep`, the expert-parallel op over an expert group of one (every expert local; its
  // exchange runs, through a single-process communicator; tests/comm/test_thread_ep.cpp has G > 1).
  auto moe_case = [](std::string name, bool norm, bool ep = false) {
    std::vector<InputSpec> in{{{B, S, 6}}, {{B, S, 4}}};
    for (int i = 0; i < 12; ++i) in.push_back({i < 8 ? SymShape{5, 6} : SymShape{6, 5}});
    return OpCase{name, ep ? Op::moe_experts_ep : Op::moe_experts, in,
                  [norm, ep](Builder& b, const std::vector<Node*>& x) {
                    const std::vector<Node*> g(x.begin() + 2, x.begin() + 6), u(x.begin() + 6, x.begin() + 10),
                        d(x.begin() + 10, x.end());
                    if (ep) return b.moe_experts_ep(x[0], x[1], {x.begin() + 2, x.end()}, 2, norm, "ep", 1);
                    return b.moe_experts(x[0], x[1], g, u, d, 2, norm);
                  },
                  [norm](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
                    Vec w[3];
                    for (int i = 0; i < 12; ++i) w[i / 4].insert(w[i / 4].end(), in[2 + i].begin(), in[2 + i].end());
                    return naive::moe_experts(in[0], in[1], w[0], w[1], w[2], naive::numel(sh[0]) / 6, 6, 4, 5, 2, norm);
                  },
                  // The CUDA kernel runs swiglu_mlp's bf16 chunks per expert (6e-2 there, measured) and
                  // rounds y to bf16 after each expert's scatter; not yet run on a GPU.
                  6e-2};
  };
  // gpt-oss's experts: moe_case's with 4 gate, 4 up [5] and 4 down [6] biases after the weights
  // and the clamped SwiGLU at limit 1.5 (crossed by these N(0, 1) data; tests/kernels/
  // test_moe_gptoss.cpp has the ties at the limit). With `ep`, the expert-parallel op over a group
  // of one, with the same attributes (as graph/passes/expert_parallel makes it).
  auto gpt_oss_case = [](std::string name, bool ep) {
    std::vector<InputSpec> in{{{B, S, 6}}, {{B, S, 4}}};
    for (int i = 0; i < 24; ++i)
      in.push_back({i < 8 ? SymShape{5, 6} : i < 12 ? SymShape{6, 5} : i < 20 ? SymShape{5} : SymShape{6}});
    return OpCase{name, ep ? Op::moe_experts_ep : Op::moe_experts, in,
                  [ep](Builder& b, const std::vector<Node*>& x) {
                    auto part = [&](int i) { return std::vector<Node*>(x.begin() + 2 + 4 * i, x.begin() + 6 + 4 * i); };
                    const MoeExpertOptions opt{part(3), part(4), part(5), MoeActivation::clamped_swiglu, 1.702, 1.5};
                    Node* y = b.moe_experts(x[0], x[1], part(0), part(1), part(2), 2, true, "moe", opt);
                    if (!ep) return y;
                    Attrs a = y->attrs();
                    a.set("group", std::string("ep"));
                    a.set("group_size", int64_t{1});
                    Node* y_ep = b.graph().add(Op::moe_experts_ep, y->inputs(), a, "moe_ep");
                    b.graph().erase(y);
                    return y_ep;
                  },
                  [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
                    Vec w[6];
                    for (int i = 0; i < 24; ++i) w[i / 4].insert(w[i / 4].end(), in[2 + i].begin(), in[2 + i].end());
                    return naive::gpt_oss_experts(in[0], in[1], w[0], w[1], w[2], w[3], w[4], w[5],
                                                  naive::numel(sh[0]) / 6, 6, 4, 5, 2, true, 1.702, 1.5);
                  }};
  };
  auto gemm_case = [](std::string name, SymShape sa, SymShape sb, bool ta, bool tb) {
    return OpCase{name, Op::matmul, {{sa}, {sb}},
                  [ta, tb](Builder& b, const std::vector<Node*>& x) { return b.matmul(x[0], x[1], ta, tb); },
                  [ta, tb](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
                    const auto& a = sh[0];
                    const auto& bs = sh[1];
                    const int64_t r = static_cast<int64_t>(a.size());
                    const int64_t M = ta ? a[r - 1] : a[r - 2], K = ta ? a[r - 2] : a[r - 1];
                    const int64_t N = tb ? bs[bs.size() - 2] : bs[bs.size() - 1];
                    const int64_t batch = naive::numel(a) / (M * K);
                    const bool shared = bs.size() == 2;
                    Vec out;
                    for (int64_t i = 0; i < batch; ++i) {
                      Vec ai(in[0].begin() + i * M * K, in[0].begin() + (i + 1) * M * K);
                      Vec bi = shared ? in[1] : Vec(in[1].begin() + i * K * N, in[1].begin() + (i + 1) * K * N);
                      Vec c = naive::gemm(ta, tb, M, N, K, 1.0, ai, bi, 0.0, {});
                      out.insert(out.end(), c.begin(), c.end());
                    }
                    return out;
                  }};
  };
  static const std::vector<OpCase> cases = {
      {"embedding", Op::embedding, {{{11, 4}}, {{B, S}, true, 11}},
       [](Builder& b, const std::vector<Node*>& x) { return b.embedding(x[0], x[1]); },
       [](const std::vector<Vec>& in, const std::vector<Shape>&) { return naive::embedding(in[0], as_ids(in[1]), 4); }},
      gemm_case("matmul", {B, S, 6}, {6, 3}, false, false),
      gemm_case("matmul_trans_b", {B, S, 6}, {3, 6}, false, true),
      gemm_case("matmul_batched_trans_a", {B, 4, 6, S}, {B, 4, 6, 3}, true, false),
      gemm_case("matmul_batched_trans_b", {B, 3, S, 4}, {B, 3, S, 4}, false, true),
      binary("add", Op::add, {B, S, 6}, {6}, [](double a, double b) { return a + b; }),
      binary("add_mid_broadcast", Op::add, {B, 1, S, 3}, {4, 1, 3}, [](double a, double b) { return a + b; }),
      binary("sub", Op::sub, {B, S, 6}, {B, S, 6}, [](double a, double b) { return a - b; }),
      binary("mul", Op::mul, {B, S, 1}, {S, 6}, [](double a, double b) { return a * b; }),
      binary("div", Op::div, {B, S, 6}, {B, 1, 1}, [](double a, double b) { return a / b; }),
      OpCase{"scale", Op::scale, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.scale(x[0], -0.375); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               return naive::map(in[0], [](double v) { return -0.375 * v; });
             }},
      unary("neg", Op::neg, [](double v) { return -v; }),
      unary("exp", Op::exp, [](double v) { return std::exp(v); }),
      unary("tanh", Op::tanh, [](double v) { return std::tanh(v); }),
      unary("gelu_tanh", Op::gelu_tanh, naive::gelu_tanh),
      unary("silu", Op::silu, naive::silu),
      // token indices in [0, 1000): some elements of x [B, S, 6] dropped, the rest scaled by 1/(1-p)
      OpCase{"dropout", Op::dropout, {{{B, S, 6}}, {{B, S}, true, 1000}},
             [](Builder& b, const std::vector<Node*>& x) { return b.dropout(x[0], x[1], 0.375, 77); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               return naive::dropout(in[0], as_ids(in[1]), 6, 0.375, 77);
             }},
      OpCase{"reshape", Op::reshape, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.reshape(x[0], {B * S, 2, 3}); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      OpCase{"transpose", Op::transpose, {{{B, S, 3, 4}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.transpose(x[0], 1, 2); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) { return naive::permute(in[0], sh[0], {0, 2, 1, 3}); }},
      OpCase{"permute", Op::permute, {{{B, S, 3, 4}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.permute(x[0], {3, 0, 2, 1}); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) { return naive::permute(in[0], sh[0], {3, 0, 2, 1}); }},
      OpCase{"slice", Op::slice, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.slice(x[0], 1, S / 2, S); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               Vec out;
               const int64_t s = sh[0][1], c = sh[0][2];
               for (int64_t i = 0; i < sh[0][0]; ++i)
                 for (int64_t t = s / 2; t < s; ++t)
                   for (int64_t k = 0; k < c; ++k) out.push_back(in[0][(i * s + t) * c + k]);
               return out;
             }},
      OpCase{"concat", Op::concat, {{{B, S, 2}}, {{B, S, 3}}, {{B, S, 1}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.concat({x[0], x[1], x[2]}, 2); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               Vec out;
               const int64_t rows = sh[0][0] * sh[0][1];
               for (int64_t r = 0; r < rows; ++r)
                 for (size_t j = 0; j < in.size(); ++j) {
                   const int64_t w = sh[j][2];
                   out.insert(out.end(), in[j].begin() + r * w, in[j].begin() + (r + 1) * w);
                 }
               return out;
             }},
      OpCase{"layernorm", Op::layernorm, {{{B, S, 8}}, {{8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.layernorm(x[0], x[1], x[2], 1e-5); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::layernorm(in[0], in[1], in[2], naive::numel(sh[0]) / 8, 8, 1e-5);
             }},
      OpCase{"rmsnorm", Op::rmsnorm, {{{B, S, 8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.rmsnorm(x[0], x[1], 1e-6); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::rmsnorm(in[0], in[1], naive::numel(sh[0]) / 8, 8, 1e-6);
             }},
      OpCase{"softmax", Op::softmax, {{{B, S, 7}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.softmax(x[0]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::softmax(in[0], naive::numel(sh[0]) / 7, 7);
             }},
      OpCase{"rope", Op::rope, {{{B, 3, S, 8}}, {{B, S}, true, 40}},
             [](Builder& b, const std::vector<Node*>& x) { return b.rope(x[0], x[1], 10000.0); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::rope(in[0], as_ids(in[1]), sh[0][0], 3, sh[0][2], 8, 10000.0);
             }},
      // YaRN (rope_type "yarn", as models/model.cpp with_rope_scaling writes it): a ramp over the
      // head dim that blends interpolated and kept frequencies, and cos, sin times mscale's ratio.
      OpCase{"rope_yarn", Op::rope, {{{B, 2, S, 16}}, {{B, S}, true, 40}},
             [](Builder& b, const std::vector<Node*>& x) {
               Node* y = b.rope(x[0], x[1], 100.0);
               for (auto [k, v] : {std::pair<const char*, double>{"factor", 4.0}, {"original_max_position_embeddings", 4096},
                                   {"beta_fast", 32}, {"beta_slow", 1}, {"attention_factor", 0}, {"mscale", 1.0},
                                   {"mscale_all_dim", 0.5}, {"truncate", 0}})
                 y->attrs().set(k, v);
               y->attrs().set("rope_type", std::string("yarn"));
               return y;
             },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::rope_freqs(in[0], as_ids(in[1]), sh[0][0], 2, sh[0][2], 16,
                                        naive::yarn_inv_freq(16, 100.0, 4.0, 4096, 32, 1, false),
                                        naive::yarn_attention_factor(4.0, 1.0, 0.5));
             }},
      OpCase{"sdpa_causal_gqa", Op::sdpa, {{{B, 4, S, 8}}, {{B, 2, S, 8}}, {{B, 2, S, 8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.sdpa(x[0], x[1], x[2], true, 0.3); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 4, 2, sh[0][2], sh[1][2], 8, 0.3, true);
             }},
      // Document starts drawn in [0, S): rows whose start lies past them see no key at all.
      OpCase{"sdpa_documents_gqa", Op::sdpa, {{{B, 4, S, 8}}, {{B, 2, S, 8}}, {{B, 2, S, 8}}, {{B, S}, true, 5}},
             [](Builder& b, const std::vector<Node*>& x) { return b.sdpa(x[0], x[1], x[2], true, 0.3, "attn", x[3]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const std::vector<int64_t> starts = as_ids(in[3]);
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 4, 2, sh[0][2], sh[1][2], 8, 0.3, true, nullptr, &starts);
             }},
      OpCase{"sdpa_full", Op::sdpa, {{{B, 2, S, 4}}, {{B, 2, S + 2, 4}}, {{B, 2, S + 2, 4}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.sdpa(x[0], x[1], x[2], false, 0.5); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 2, 2, sh[0][2], sh[1][2], 4, 0.5, false);
             }},
      // Ring attention over a ring of one: the local sequence (6: even) is two zigzag
      // chunks, met chunk pair by chunk pair (two diagonals, one full block) and merged by lse.
      OpCase{"ring_attention_causal_gqa", Op::ring_attention, {{{B, 4, 6, 8}}, {{B, 2, 6, 8}}, {{B, 2, 6, 8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.ring_attention(x[0], x[1], x[2], true, 0.3, "ring", 1); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 4, 2, sh[0][2], sh[1][2], 8, 0.3, true);
             }},
      OpCase{"ring_attention_documents_gqa", Op::ring_attention,
             {{{B, 4, 6, 8}}, {{B, 2, 6, 8}}, {{B, 2, 6, 8}}, {{B, 6}, true, 6}},
             [](Builder& b, const std::vector<Node*>& x) {
               return b.ring_attention(x[0], x[1], x[2], true, 0.3, "ring", 1, "ring_attn", x[3]);
             },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const std::vector<int64_t> starts = as_ids(in[3]);
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 4, 2, sh[0][2], sh[1][2], 8, 0.3, true, nullptr, &starts);
             }},
      OpCase{"ring_attention_full", Op::ring_attention, {{{B, 2, 6, 4}}, {{B, 2, 6, 4}}, {{B, 2, 6, 4}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.ring_attention(x[0], x[1], x[2], false, 0.5, "ring", 1); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::sdpa(in[0], in[1], in[2], sh[0][0], 2, 2, sh[0][2], sh[1][2], 4, 0.5, false);
             }},
      OpCase{"cross_entropy_sum", Op::cross_entropy_sum, {{{B, S, 9}}, {{B, S}, true, 9, true}},
             [](Builder& b, const std::vector<Node*>& x) { return b.cross_entropy_sum(x[0], x[1]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return Vec{naive::cross_entropy(in[0], as_ids(in[1]), naive::numel(sh[1]), 9)};
             }},
      OpCase{"causal_mask", Op::causal_mask, {{{B, 3, S, S + 2}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.causal_mask(x[0], -7.0); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               Vec out = in[0];
               const int64_t sq = sh[0][2], skv = sh[0][3];
               for (size_t e = 0; e < out.size(); ++e) {
                 const int64_t j = static_cast<int64_t>(e) % skv, i = static_cast<int64_t>(e) / skv % sq;
                 if (j > i + (skv - sq)) out[e] = -7.0;
               }
               return out;
             }},
      // Collectives over a group of one (the multi-rank cases run under mpirun in tests/mpi).
      OpCase{"all_to_all", Op::all_to_all, {{{B, 4, S, 3}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.all_to_all(x[0], 1, 2, "sp", 1); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      OpCase{"all_reduce", Op::all_reduce, {{{B, S}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.all_reduce(x[0], "world"); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      // ZeRO-3's parameter collectives over a group of one: the shard is the whole flattened tensor.
      OpCase{"all_gather", Op::all_gather, {{{6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.all_gather(x[0], "world", 1, {2, 3}); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      OpCase{"reduce_scatter", Op::reduce_scatter, {{{2, 3}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.reduce_scatter(x[0], "world", 1); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      OpCase{"full", Op::full, {},
             [](Builder& b, const std::vector<Node*>&) { return b.full({2, 3}, -1.25, DType::f64); },
             [](const std::vector<Vec>&, const std::vector<Shape>&) { return Vec(6, -1.25); }},
      // Conversions (the input has the run's dtype): to f64 is exact, to f32 and bf16 round to
      // nearest even; bf16 → f32/f64 is exact.
      OpCase{"cast_to_f64", Op::cast, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.cast(x[0], DType::f64); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return in[0]; }},
      OpCase{"cast_to_f32", Op::cast, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.cast(x[0], DType::f32); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return naive::map(in[0], naive::round_f32); }},
      OpCase{"cast_to_bf16", Op::cast, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.cast(x[0], DType::bf16); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return naive::map(in[0], naive::round_bf16); }},
      OpCase{"cast_from_bf16", Op::cast, {{{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.cast(b.cast(x[0], DType::bf16), x[0]->dtype()); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) { return naive::map(in[0], naive::round_bf16); }},
      // Fused ops (passes/fuse_elementwise): y = norm(x + r) and the sum s = x + r (extra output 1),
      // gelu_tanh(x + b); the references add first, then apply the plain naive op.
      OpCase{"add_layernorm", Op::add_layernorm, {{{B, S, 8}}, {{B, S, 8}}, {{8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.add_layernorm(x[0], x[1], x[2], x[3], 1e-5); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const Vec s = naive::broadcast_binary(in[0], sh[0], in[1], sh[1], std::plus<double>());
               return naive::layernorm(s, in[2], in[3], naive::numel(sh[0]) / 8, 8, 1e-5);
             }},
      OpCase{"add_layernorm_sum", Op::add_layernorm, {{{B, S, 8}}, {{B, S, 8}}, {{8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) {
               return b.output(b.add_layernorm(x[0], x[1], x[2], x[3], 1e-5), 1, "s");
             },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::broadcast_binary(in[0], sh[0], in[1], sh[1], std::plus<double>());
             }},
      OpCase{"add_rmsnorm", Op::add_rmsnorm, {{{B, S, 8}}, {{B, S, 8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.add_rmsnorm(x[0], x[1], x[2], 1e-6); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const Vec s = naive::broadcast_binary(in[0], sh[0], in[1], sh[1], std::plus<double>());
               return naive::rmsnorm(s, in[2], naive::numel(sh[0]) / 8, 8, 1e-6);
             }},
      OpCase{"add_rmsnorm_sum", Op::add_rmsnorm, {{{B, S, 8}}, {{B, S, 8}}, {{8}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.output(b.add_rmsnorm(x[0], x[1], x[2], 1e-6), 1, "s"); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::broadcast_binary(in[0], sh[0], in[1], sh[1], std::plus<double>());
             }},
      OpCase{"bias_gelu_tanh", Op::bias_gelu_tanh, {{{B, S, 6}}, {{6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.bias_gelu_tanh(x[0], x[1]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::map(naive::broadcast_binary(in[0], sh[0], in[1], sh[1], std::plus<double>()),
                                 naive::gelu_tanh);
             }},
      // GPT-2's qkv into heads, x [B, S, 3·N·D] with N = 2, D = 3, and the bias: part p of x + b as
      // [B, N, S, D] (q the node itself, k and v its extra outputs 1, 2).
      OpCase{"qkv_heads", Op::qkv_heads, {{{B, S, 18}}, {{18}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.qkv_heads(x[0], x[1], 2); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) { return naive_qkv_head(in, sh, 0); }},
      OpCase{"qkv_heads_k", Op::qkv_heads, {{{B, S, 18}}, {{18}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.output(b.qkv_heads(x[0], x[1], 2), 1, "k"); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) { return naive_qkv_head(in, sh, 1); }},
      OpCase{"qkv_heads_v", Op::qkv_heads, {{{B, S, 18}}, {{18}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.output(b.qkv_heads(x[0], x[1], 2), 2, "v"); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) { return naive_qkv_head(in, sh, 2); }},
      OpCase{"swiglu", Op::swiglu, {{{B, S, 6}}, {{B, S, 6}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.swiglu(x[0], x[1]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               Vec h(in[0].size());
               for (size_t i = 0; i < h.size(); ++i) h[i] = naive::silu(in[0][i]) * in[1][i];
               return h;
             }},
      // Llama's MLP, x [B, S, C = 6], I = 10 (one chunk of rows here; tests/kernels/test_mlp.cpp
      // crosses chunk boundaries).
      OpCase{"swiglu_mlp", Op::swiglu_mlp, {{{B, S, 6}}, {{10, 6}}, {{10, 6}}, {{6, 10}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.swiglu_mlp(x[0], x[1], x[2], x[3]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::swiglu_mlp(in[0], in[1], in[2], in[3], naive::numel(sh[0]) / 6, 6, 10);
             },
             // The CUDA kernel keeps its chunk's g, u, h (and backward dh, dg, du) in bf16, as the
             // unfused bf16 graph rounds each op's output; the CPU emulates the whole op in f32 with
             // one rounding per result. On an H200 (2026-12-04) the two differed by up to 4.9e-2
             // (a weight gradient's sum over rows, with cancellation); a wrong product is O(1) off.
             6e-2},
      // The tiled head + loss, x [B, S, C = 6], w [V = 9, C] (one chunk of rows here;
      // tests/kernels/test_loss.cpp crosses chunk boundaries).
      OpCase{"linear_cross_entropy_sum", Op::linear_cross_entropy_sum, {{{B, S, 6}}, {{9, 6}}, {{B, S}, true, 9, true}},
             [](Builder& b, const std::vector<Node*>& x) { return b.linear_cross_entropy_sum(x[0], x[1], x[2]); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const int64_t rows = naive::numel(sh[2]);
               const Vec logits = naive::gemm(false, true, rows, 9, 6, 1.0, in[0], in[1], 0.0, {});
               return Vec{naive::cross_entropy(logits, as_ids(in[2]), rows, 9)};
             }},
      // A mixture-of-experts layer's experts, x [B, S, C = 6], probs [B, S, E = 4], I = 5, top 2;
      // Mixtral's renormalised weights and Qwen's raw ones (tests/kernels/test_moe.cpp: softmax
      // probabilities, more experts, gradients against a per-token loop).
      moe_case("moe_experts_norm", true),
      moe_case("moe_experts", false),
      moe_case("moe_experts_ep_norm", true, true),
      gpt_oss_case("moe_experts_gptoss", false),
      gpt_oss_case("moe_experts_ep_gptoss", true),
      // Preference training: slots in [-2, 2] (K = 2; 0 is no sequence), some labels ignored.
      OpCase{"sequence_logps", Op::sequence_logps, {{{B, S, 7}}, {{B, S}, true, 7, true}, {{B, S}, true, 3, false, -2}},
             [](Builder& b, const std::vector<Node*>& x) { return b.sequence_logps(x[0], x[1], x[2], 2); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::sequence_logps(in[0], as_ids(in[1]), as_ids(in[2]), sh[1][0], sh[1][1], 7, 2);
             }},
      // policy [B, 2, K = 3]; the reference, completion tokens and norms are data (constants here).
      OpCase{"dpo_loss_sigmoid", Op::dpo_loss, {{{B, 2, 3}}},
             [](Builder& b, const std::vector<Node*>& x) { return dpo_case(b, x[0], {0.5, "sigmoid", 0.2, 0}); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               return Vec{naive::dpo_loss(in[0], 0.25, 3, {4, 5}, {0.5, false, 0.2, 0})};
             }},
      OpCase{"dpo_loss_ipo_rpo", Op::dpo_loss, {{{B, 2, 3}}},
             [](Builder& b, const std::vector<Node*>& x) { return dpo_case(b, x[0], {0.5, "ipo", 0, 0.7}); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               return Vec{naive::dpo_loss(in[0], 0.25, 3, {4, 5}, {0.5, true, 0, 0.7})};
             }},
      // The load-balancing loss: router statistics of x [B, S, 5] (top-2; the counts have no
      // gradient, which finite differences agree with away from ties), and transformers'
      // formula over two layers' probabilities x and y through their statistics (any values:
      // the formula needs no softmax, and so bf16 rounds only the inputs).
      OpCase{"moe_router_stats", Op::moe_router_stats, {{{B, S, 5}}},
             [](Builder& b, const std::vector<Node*>& x) { return b.moe_router_stats(x[0], 2); },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               return naive::moe_router_stats(in[0], sh[0][0] * sh[0][1], 5, 2);
             }},
      OpCase{"moe_aux_loss", Op::moe_aux_loss, {{{B, S, 4}}, {{B, S, 4}}},
             [](Builder& b, const std::vector<Node*>& x) {
               auto layer = [&](Node* probs) { return b.reshape(b.moe_router_stats(probs, 2), {1, 2, 4}); };
               Node* first = layer(x[0]);
               Node* second = layer(x[1]);
               return b.moe_aux_loss(b.concat({first, second}, 0), 2);
             },
             [](const std::vector<Vec>& in, const std::vector<Shape>& sh) {
               const int64_t R = sh[0][0] * sh[0][1];
               return Vec{naive::load_balancing_loss({in[0], in[1]}, R, 4, 2)};
             }},
      OpCase{"count_valid", Op::count_valid, {{{B, S}, true, 9, true}},
             [](Builder& b, const std::vector<Node*>& x) { return b.count_valid(x[0], DType::f32); },
             [](const std::vector<Vec>& in, const std::vector<Shape>&) {
               double n = 0;
               for (double v : in[0]) n += v != -100;
               return Vec{n};
             }},
  };
  return cases;
}

}  // namespace autosp::testing
