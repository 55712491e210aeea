// The memory planner: the same results as a naive interpreter that gives every value its own
// allocation (bit for bit), a planned arena close to the liveness lower bound, and a measured
// allocator high-water mark that the plan accounts for.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "common/op_cases.h"
#include "graph/autograd.h"
#include "graph/builder.h"
#include "models/model.h"
#include "engine/dispatch.h"
#include "engine/executor.h"
#include "engine/memory_plan.h"

using namespace autosp;

namespace {

TensorMap model_feeds(const ModelConfig& m, int64_t B, int64_t S) {
  TensorMap feeds = init_params(m, 9, DType::f32);
  std::vector<int64_t> ids, labels, pos;
  for (int64_t i = 0; i < B * S; ++i) {
    ids.push_back((i * 7 + 3) % m.vocab_size);
    labels.push_back(i % 9 == 4 ? -100 : (i * 5 + 1) % m.vocab_size);
    pos.push_back(i % S);
  }
  feeds["input_ids"] = Tensor::from_vector({B, S}, ids);
  feeds["labels"] = Tensor::from_vector({B, S}, labels);
  feeds["position_ids"] = Tensor::from_vector({B, S}, pos);
  return feeds;
}

ModelConfig small_llama() {
  ModelConfig m;
  m.arch = Arch::llama;
  m.vocab_size = 64;
  m.hidden_size = 64;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.intermediate_size = 128;
  m.tie_word_embeddings = false;
  return m;
}

// The reference: every node dispatched in order with fresh outputs (no plan, no in-place), each
// value freed after its last use, so its peak is what allocating each value on its own costs.
struct Unplanned {
  TensorMap outputs;
  size_t peak_bytes = 0;
};
Unplanned run_unplanned(const Graph& g, const TensorMap& feeds) {
  const Bindings b = Executor(g).bind(feeds);
  std::vector<size_t> last(g.size());
  for (const auto& n : g.nodes()) {
    last[g.position(n.get())] = g.position(n.get());
    for (const Node* i : n->inputs()) last[g.position(i)] = g.position(n.get());
  }
  std::vector<Tensor> values(g.size());
  std::vector<std::vector<Tensor>> extras(g.size());
  cpu_allocator().reset_peak();
  for (const auto& up : g.nodes()) {
    const Node& n = *up;
    const size_t at = g.position(&n);
    if (n.op() == Op::input || n.op() == Op::parameter) {
      values[at] = feeds.at(n.name());
    } else if (n.op() == Op::output) {
      values[at] = extras[g.position(n.input(0))].at(n.attrs().i("index") - 1);
    } else {
      std::vector<Tensor> args;
      for (const Node* i : n.inputs()) args.push_back(values[g.position(i)]);
      const Shape shape = eval_shape(n.shape(), b);
      values[at] = dispatch(KernelCall{n, args, shape, b, cpu_allocator(), extras[at], nullptr, {}, {}}, DeviceKind::cpu);
    }
    for (const Node* i : n.inputs())
      if (last[g.position(i)] == at && !g.is_output(i)) values[g.position(i)] = Tensor(), extras[g.position(i)].clear();
  }
  Unplanned u;
  for (const Node* o : g.outputs()) u.outputs[o->name()] = values[g.position(o)];
  u.peak_bytes = cpu_allocator().peak_bytes();
  return u;
}

}  // namespace

TEST_CASE("a planned run gives the same bits as a naive unplanned interpreter", "[memory]") {
  for (const std::string arch : {"gpt2", "llama"}) {
    ModelConfig m = small_llama();
    if (arch == "gpt2") {
      m.arch = Arch::gpt2;
      m.num_key_value_heads = 4;
      m.tie_word_embeddings = true;
    }
    auto g = build_forward(m, DType::f32);
    std::vector<Node*> params = g->with_role(Role::parameter);
    build_backward(*g, g->find("loss"), params);
    TensorMap feeds = model_feeds(m, 2, 33);
    RunResult planned = Executor(*g).run(feeds);
    Unplanned dynamic = run_unplanned(*g, feeds);
    CHECK(planned.planned_bytes > 0);
    REQUIRE(planned.outputs.size() == dynamic.outputs.size());
    for (const auto& [name, t] : dynamic.outputs) {
      INFO(arch << " output " << name);
      CHECK(planned.outputs.at(name).to_doubles() == t.to_doubles());
    }
  }
}

TEST_CASE("the planned arena is close to the liveness lower bound", "[memory]") {
  ModelConfig m = small_llama();
  auto g = build_forward(m, DType::f32);
  build_backward(*g, g->find("loss"), g->with_role(Role::parameter));
  for (int64_t S : {64, 256, 1024}) {
    MemoryPlan plan = plan_memory(*g, {{"B", 2}, {"S", S}});
    INFO("S = " << S << ": arena " << plan.arena_bytes << ", max live " << plan.max_live_bytes);
    CHECK(plan.arena_bytes >= plan.max_live_bytes);
    CHECK(plan.arena_bytes <= plan.max_live_bytes * 5 / 4);  // best fit wastes under 25%
    CHECK(plan.in_place > 0);                                 // residual adds, activations
  }
}

TEST_CASE("the allocator's high-water mark is what the plan predicts", "[memory]") {
  ModelConfig m = small_llama();
  auto g = build_forward(m, DType::f32);
  build_backward(*g, g->find("loss"), g->with_role(Role::parameter));
  TensorMap feeds = model_feeds(m, 2, 256);
  Executor ex(*g);
  ex.run(feeds);  // plans and allocates the arena
  const size_t before = cpu_allocator().live_bytes();  // feeds + arena
  RunResult r = ex.run(feeds);
  size_t outputs = 0;
  for (const auto& [name, t] : r.outputs) outputs += t.nbytes();
  // Beyond what was live before the run, the step only allocates graph outputs (plus small
  // temporaries such as a contiguous copy or a collective's buffers).
  INFO("peak " << r.peak_bytes << ", live before " << before << ", arena " << r.planned_bytes << ", outputs "
               << outputs);
  CHECK(r.peak_bytes >= before + outputs);
  CHECK(r.peak_bytes <= before + outputs + outputs / 4 + (64 << 10));
  // And the planned run needs less memory than allocating each value on its own.
  Unplanned dynamic = run_unplanned(*g, feeds);
  CHECK(r.planned_bytes < dynamic.peak_bytes);
}

TEST_CASE("the plan names what is live at its peak", "[memory]") {
  // x → a = exp(x), b = neg(x), c = a + b (in place over a, which dies there), d = exp(c) (in
  // place over c), e = d · b: a and b are live together, then c (a's place) and b, then d and b.
  // The first time two [S, 8] buffers are live is at b; nothing later holds more.
  Graph g;
  Builder b(g);
  const SymShape shape{Dim::sym("S"), Dim(8)};
  Node* x = b.input("x", DType::f32, shape, Role::none);
  Node* ea = b.exp(x, "a");
  Node* nb = b.neg(x, "b");
  Node* c = b.add(ea, nb, "c");
  Node* d = b.exp(c, "d");
  g.add_output(b.mul(d, nb, "e"));
  const int64_t S = 100;
  const MemoryPlan plan = plan_memory(g, {{"S", S}});
  const size_t bytes = S * 8 * sizeof(float);  // 3200: a multiple of the planner's alignment
  CHECK(plan.max_live_bytes == 2 * bytes);
  CHECK(g.nodes()[plan.peak_position]->name() == "b");
  std::vector<std::string> live;
  for (const auto& l : plan.live_at_peak) {
    live.push_back(g.nodes()[l.position]->name());
    CHECK(l.bytes == bytes);
    CHECK(l.output == 0);
  }
  std::sort(live.begin(), live.end());
  CHECK(live == std::vector<std::string>{"a", "b"});
}

TEST_CASE("the plan places the CPU attention backward's workspace in the arena, for its node only", "[memory]") {
  // The one op with a CPU workspace (engine/dispatch.cpp): sdpa_backward's partial dK, dV, whose
  // size kernels/cpu/attention.h gives; CUDA plans none.
  ModelConfig m = small_llama();
  auto g = build_forward(m, DType::f32);
  build_backward(*g, g->find("loss"), g->with_role(Role::parameter));
  const Bindings b{{"B", 1}, {"S", 256}};
  const MemoryPlan cpu_plan = plan_memory(*g, b, DeviceKind::cpu);
  const MemoryPlan cuda_plan = plan_memory(*g, b, DeviceKind::cuda);
  // B = 1, Nkv = 2, S = 256 (4 query blocks, 4 chunks), causal, D = 16, f32: 64 + 128 + 192 rows.
  const size_t expected = 2 * 1 * 2 * (64 + 128 + 192) * 16 * sizeof(float);
  int backward_nodes = 0;
  for (size_t i = 0; i < g->size(); ++i) {
    const Node& n = *g->nodes()[i];
    INFO(n.name());
    if (n.op() == Op::sdpa_backward) {
      ++backward_nodes;
      CHECK(cpu_plan.workspace_bytes[i] == expected);
      CHECK(cpu_plan.workspace_offset[i] != MemoryPlan::kHeap);
    } else {
      CHECK(cpu_plan.workspace_bytes[i] == 0);
    }
    CHECK(cuda_plan.workspace_bytes[i] == 0);
  }
  CHECK(backward_nodes == m.num_hidden_layers);
  CHECK(cpu_plan.arena_bytes >= cuda_plan.arena_bytes);
  // A CPU run plans for the CPU (the arena holds the workspaces).
  Executor ex(*g);
  CHECK(ex.run(model_feeds(m, 1, 256)).planned_bytes == cpu_plan.arena_bytes);
}

TEST_CASE("a background reduce_scatter ends at the next collective of any kind, or its first reader", "[memory]") {
  // background_until reads the op table's `collective` column: each collective op after the
  // reduce_scatter ends its background run there.
  for (const bool ring : {false, true}) {
    Graph g;
    Builder b(g);
    Node* grad = b.input("grad", DType::f32, {Dim(8)}, Role::none);
    Node* x = b.input("x", DType::f32, {Dim(1), Dim(2), Dim(4), Dim(8)}, Role::none);
    Node* shard = b.reduce_scatter(grad, "world", 2);
    Node* y = b.neg(x);
    Node* next = ring ? b.ring_attention(y, y, y, true, 0.5, "ring", 2) : b.all_reduce(y, "world");
    Node* z = b.neg(shard);
    g.add_output(next);
    g.add_output(z);
    INFO(next->op_name());
    const std::vector<size_t> until = background_until(g);
    CHECK(until[g.position(shard)] == g.position(next));
    CHECK(until[g.position(y)] == g.position(y));
  }
  // With no collective after it, its first reader.
  Graph g;
  Builder b(g);
  Node* shard = b.reduce_scatter(b.input("grad", DType::f32, {Dim(8)}, Role::none), "world", 2);
  Node* z = b.neg(b.neg(shard));
  g.add_output(z);
  CHECK(background_until(g)[g.position(shard)] == g.position(z->input(0)));
}
