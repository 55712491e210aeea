// The AutoSP pipeline: golden IR after each pass (tests/golden/autosp/, AUTOSP_UPDATE_GOLDEN=1 to
// rewrite after a deliberate change), rank-dependent slice bounds, the composite-attention
// rewrite (numerically equal), and one test per clear early error.
#include <catch2/catch.hpp>


#include "graph/builder.h"
#include "graph/passes/autosp/autosp.h"
#include "common/golden.h"
#include "graph/printer.h"
#include "graph/verify.h"
#include "models/model.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "tensor/check.h"

using namespace autosp;
using autosp::testing::check_golden;

namespace {

const Dim B = Dim::sym("B"), S = Dim::sym("S");


ModelConfig tiny_llama(int64_t heads, int64_t kv_heads) {
  ModelConfig m;
  m.arch = Arch::llama;
  m.vocab_size = 64;
  m.hidden_size = 8 * heads;
  m.num_hidden_layers = 1;
  m.num_attention_heads = heads;
  m.num_key_value_heads = kv_heads;
  m.intermediate_size = 48;
  m.tie_word_embeddings = false;
  m.norm_eps = 1e-6;
  return m;
}

PassContext ctx_of(int64_t p, int64_t r, int64_t world = 0, int64_t ring = 1) {
  PassContext c;
  c.sp_size = p;
  c.sp_rank = r;
  c.world_size = world ? world : p;
  c.ring_size = ring;
  return c;
}

std::string run_prefix(const ModelConfig& m, const PassContext& ctx, size_t passes, bool documents = false) {
  auto g = build_forward(m, DType::f32, ForwardMode::train, {.document_mask = documents});
  std::vector<Pass> prefix(autosp_pipeline().begin(), autosp_pipeline().begin() + static_cast<std::ptrdiff_t>(passes));
  run_pipeline(*g, prefix, ctx);
  return to_text(*g);
}

}  // namespace

TEST_CASE("each AutoSP pass matches its golden IR (Llama GQA, P = 4, rank 1)", "[autosp][golden]") {
  const auto& pipeline = autosp_pipeline();
  for (size_t k = 1; k <= pipeline.size(); ++k) {
    const std::string name = (k < 10 ? "0" : "") + std::to_string(k) + "-" + std::string(pipeline[k - 1].name) + ".txt";
    DYNAMIC_SECTION(name) { check_golden("autosp/p4r1-" + name, run_prefix(tiny_llama(4, 2), ctx_of(4, 1), k)); }
  }
}

TEST_CASE("the full pipeline matches golden IR for other ranks and models", "[autosp][golden]") {
  const size_t all = autosp_pipeline().size();
  check_golden("autosp/llama-p2r0.txt", run_prefix(tiny_llama(4, 2), ctx_of(2, 0), all));  // K/V all-to-all'd
  ModelConfig gpt2;
  gpt2.vocab_size = 64;
  gpt2.hidden_size = 32;
  gpt2.num_hidden_layers = 1;
  gpt2.num_attention_heads = 4;
  gpt2.num_key_value_heads = 4;
  gpt2.max_position_embeddings = 128;
  check_golden("autosp/gpt2-p2r1.txt", run_prefix(gpt2, ctx_of(2, 1), all));
  check_golden("autosp/llama-dp2-p1.txt", run_prefix(tiny_llama(4, 2), ctx_of(1, 0, 2), all));  // data parallel only
  // Packed documents: doc_start sliced like position_ids, then gathered once for every attention.
  check_golden("autosp/llama-documents-p2r1.txt", run_prefix(tiny_llama(4, 2), ctx_of(2, 1), all, true));
  // Ulysses 2 x ring 2 (rank 1: ring rank 0, Ulysses rank 1, zigzag units 6..8 of S//8), with packed
  // documents: all-to-alls over "ulysses", ring_attention over "ring"; and a pure ring of 3 on a
  // rank whose units straddle nothing (rank 2: units 2..4 of S//6).
  check_golden("autosp/llama-documents-p4r1-ring2.txt", run_prefix(tiny_llama(4, 2), ctx_of(4, 1, 0, 2), all, true));
  check_golden("autosp/llama-p3r2-ring3.txt", run_prefix(tiny_llama(4, 2), ctx_of(3, 2, 0, 3), all));
}

TEST_CASE("slice bounds depend on the rank", "[autosp]") {
  const size_t all = autosp_pipeline().size();
  const std::vector<std::pair<int, std::string>> want = {
      {0, "start=0"}, {1, "end=2*(S//4), start=S//4"}, {2, "end=3*(S//4), start=2*(S//4)"}, {3, "end=4*(S//4), start=3*(S//4)"}};
  for (const auto& [r, bounds] : want) {
    std::string text = run_prefix(tiny_llama(4, 2), ctx_of(4, r), all);
    INFO("rank " << r);
    CHECK_THAT(text, Catch::Contains("%input_ids.r = slice(%input_ids, dim=1, ") && Catch::Contains(bounds));
    CHECK_THAT(text, Catch::Contains("%labels.r = slice(%labels") && Catch::Contains("%position_ids.r = slice("));
  }
}

TEST_CASE("the seed's example reads at a glance", "[autosp]") {
  // Q [B, N, S//P, D] → all_to_all → [B, N//P, S, D] → sdpa → all_to_all → [B, N, S//P, D]
  std::string text = run_prefix(tiny_llama(4, 4), ctx_of(4, 1), autosp_pipeline().size());
  CHECK_THAT(text, Catch::Contains("%l0.q = transpose(%l0.q.view, dim0=1, dim1=2)") && Catch::Contains("f32[B, 4, S//4, 8]"));
  CHECK_THAT(text, Catch::Contains("%l0.q_rope.a2a = all_to_all(%l0.q_rope, gather_dim=2, group=\"sp\", group_size=4, scatter_dim=1)"));
  CHECK_THAT(text, Catch::Contains("f32[B, 1, S, 8]"));
  CHECK_THAT(text, Catch::Contains("%l0.attn.a2a = all_to_all(%l0.attn, gather_dim=1, group=\"sp\", group_size=4, scatter_dim=2)"));
  CHECK_THAT(text, Catch::Contains("%x = embedding(%model.embed_tokens.weight, %input_ids.r)"));
}

TEST_CASE("composite attention is rewritten to sdpa with the same numbers", "[autosp]") {
  // q, k, v [B, 2, S, 4]: matmul(q, kᵀ) → scale → causal_mask(-inf) → softmax → matmul(·, v)
  auto make = [](Graph& g) {
    Builder b(g);
    Node* q = b.input("q", DType::f64, {B, 2, S, 4}, Role::none);
    Node* k = b.input("k", DType::f64, {B, 2, S, 4}, Role::none);
    Node* v = b.input("v", DType::f64, {B, 2, S, 4}, Role::none);
    Node* s = b.scale(b.matmul(q, k, false, true, "scores"), 0.5, "scaled");
    Node* p = b.softmax(b.causal_mask(s, -std::numeric_limits<double>::infinity()), "probs");
    g.add_output(b.matmul(p, v, false, false, "o"));
  };
  Graph composite, rewritten;
  make(composite);
  make(rewritten);
  CHECK(passes::rewrite_composite_attention(rewritten, ctx_of(1, 0)).changed);
  verify(rewritten);
  bool has_sdpa = false, has_softmax = false;
  for (const auto& n : rewritten.nodes()) {
    has_sdpa |= n->op() == Op::sdpa;
    has_softmax |= n->op() == Op::softmax;
  }
  CHECK(has_sdpa);
  CHECK_FALSE(has_softmax);  // the S×S chain is gone
  TensorMap feeds;
  for (const char* name : {"q", "k", "v"}) {
    std::vector<double> x(2 * 2 * 7 * 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i) * (name[0] - 'a' + 1) * 0.37);
    feeds[name] = Tensor::from_vector({2, 2, 7, 4}, x);
  }
  auto a = Executor(composite).run(feeds).outputs.begin()->second.to_doubles();
  auto b = Executor(rewritten).run(feeds).outputs.begin()->second.to_doubles();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) < 1e-12);
}

TEST_CASE("AutoSP stops early with a clear error", "[autosp][errors]") {
  SECTION("no attention node") {
    Graph g;
    Builder b(g);
    Node* ids = b.input("input_ids", DType::i64, {B, S}, Role::input_ids);
    Node* labels = b.input("labels", DType::i64, {B, S}, Role::labels);
    Node* w = b.parameter("w", DType::f32, {16, 8});
    Node* logits = b.matmul(b.embedding(w, ids), w, false, true, "logits");
    Node* loss = b.div(b.cross_entropy_sum(logits, labels), b.count_valid(labels, DType::f32), "loss");
    loss->set_role(Role::loss);
    g.add_output(loss);
    CHECK_THROWS_WITH(run_pipeline(g, autosp_pipeline(), ctx_of(2, 0)),
                      Catch::Contains("no attention node") && Catch::Contains("in pass insert_attention_all_to_all after ["));
  }
  SECTION("heads not divisible by P") {
    auto g = build_forward(tiny_llama(6, 6), DType::f32);
    CHECK_THROWS_WITH(run_pipeline(*g, autosp_pipeline(), ctx_of(4, 0)), Catch::Contains("%l0.attn") && Catch::Contains("6 attention heads"));
  }
  SECTION("key/value heads that neither P divides nor divide P") {
    auto g = build_forward(tiny_llama(6, 3), DType::f32);
    CHECK_THROWS_WITH(run_pipeline(*g, autosp_pipeline(), ctx_of(2, 0)), Catch::Contains("%l0.attn") && Catch::Contains("3 key/value heads"));
  }
  SECTION("a reduction over the sharded sequence dim outside attention") {
    Graph g;
    Builder b(g);
    Node* ids = b.input("input_ids", DType::i64, {B, S}, Role::input_ids);
    b.input("labels", DType::i64, {B, S}, Role::labels);
    Node* w = b.parameter("w", DType::f32, {16, 8});
    Node* x = b.transpose(b.embedding(w, ids), 1, 2, "xt");  // [B, 8, S]
    g.add_output(b.softmax(x, "over_seq"));
    CHECK_THROWS_WITH(run_pipeline(g, autosp_pipeline(), ctx_of(2, 0)),
                      Catch::Contains("%over_seq (softmax)") && Catch::Contains("sequence dimension") &&
                          Catch::Contains("in pass shard_seq_dim"));
  }
  SECTION("a matmul contracting the sequence") {
    Graph g;
    Builder b(g);
    Node* ids = b.input("input_ids", DType::i64, {B, S}, Role::input_ids);
    b.input("labels", DType::i64, {B, S}, Role::labels);
    Node* w = b.parameter("w", DType::f32, {16, 8});
    Node* x = b.embedding(w, ids);  // [B, S, 8]
    g.add_output(b.matmul(x, x, true, false, "gram"));  // xᵀx sums over S
    CHECK_THROWS_WITH(run_pipeline(g, autosp_pipeline(), ctx_of(2, 0)), Catch::Contains("%gram (matmul) contracts over"));
  }
  SECTION("a loss it cannot normalize") {
    auto g = build_forward(tiny_llama(4, 2), DType::f32);
    Node* loss = g->find("loss");
    loss->set_role(Role::none);
    g->find("loss_sum")->set_role(Role::loss);  // a summed loss: not a token mean
    CHECK_THROWS_WITH(run_pipeline(*g, autosp_pipeline(), ctx_of(2, 0)),
                      Catch::Contains("cannot normalize loss %loss_sum") && Catch::Contains("in pass normalize_loss"));
  }
  SECTION("a world the SP size does not divide") {
    Config cfg = parse_config(nlohmann::json::parse(R"({"sequence_parallel": {"autosp_size": 4}})"));
    CHECK_THROWS_WITH(rank_layout(6, 0, cfg.sequence_parallel.autosp_size),
                      Catch::Contains("autosp_size 4 does not divide the world size 6"));
  }
  SECTION("inputs without a symbolic sequence") {
    Graph g;
    Builder b(g);
    b.input("input_ids", DType::i64, {B, 128}, Role::input_ids);
    b.input("labels", DType::i64, {B, 128}, Role::labels);
    CHECK_THROWS_WITH(run_pipeline(g, autosp_pipeline(), ctx_of(2, 0)), Catch::Contains("%input_ids has sequence dim 128"));
  }
}
