// autosp-bench --mode ring (see the header).
#include "tools/bench_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>

#include "comm/communicator.h"
#include "comm/counting.h"
#include "engine/executor.h"
#include "graph/builder.h"
#include "kernels/cpu/matmul.h"
#include "tensor/check.h"
#include "tools/bench.h"

namespace autosp {
namespace {

// Ring rank `rank` of `size`, alone: send_recv_async hands the message straight back (the data is
// not what the other rank would send, but which chunks meet, and so the work, depends only on the
// ranks; a windowed exchange's message in may be shorter or longer than the one out: the rest is
// zeros). The other collectives are not used by ring attention.
class StandInRing final : public Communicator {
 public:
  StandInRing(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "stand-in ring"; }
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int, Tensor& recv, int) override {
    std::memset(recv.raw(), 0, recv.nbytes());
    std::memcpy(recv.raw(), send.raw(), std::min(send.nbytes(), recv.nbytes()));
    return finished_collective();
  }
  void all_reduce_sum(Tensor&) override { unused("all_reduce_sum"); }
  void broadcast(Tensor&, int) override { unused("broadcast"); }
  void all_to_all(const Tensor&, Tensor&) override { unused("all_to_all"); }
  void all_gather(const Tensor&, Tensor&) override { unused("all_gather"); }
  void reduce_scatter_sum(const Tensor&, Tensor&) override { unused("reduce_scatter_sum"); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { unused("split"); }
  [[noreturn]] void abort(const std::string& message, int) override { throw RuntimeFailure(message); }

 private:
  [[noreturn]] void unused(const char* what) const { throw RuntimeFailure(str("stand-in ring: no ", what)); }
  int rank_, size_;
};

// Ring attention's forward and backward over q, k, v, dout [B, H, L, D] (f32) in `layout`, with a
// sliding window when window > 0.
Graph ring_graph(int64_t B, int64_t N, int64_t Nkv, int64_t L, int64_t D, int64_t R, const std::string& layout,
                 int64_t window) {
  Graph g;
  Builder b(g);
  Node* q = b.input("q", DType::f32, {B, N, L, D}, Role::none);
  Node* k = b.input("k", DType::f32, {B, Nkv, L, D}, Role::none);
  Node* v = b.input("v", DType::f32, {B, Nkv, L, D}, Role::none);
  Node* dout = b.input("dout", DType::f32, {B, N, L, D}, Role::none);
  const double scale = 1.0 / std::sqrt(double(D));
  Node* o = b.ring_attention(q, k, v, true, scale, "ring", R, "o");
  o->attrs().set("layout", layout);
  Node* dq = b.ring_attention_backward(q, k, v, o, b.output(o, 1, "lse"), dout, true, scale, "ring", R, "dq");
  dq->attrs().set("layout", layout);
  if (window > 0)
    for (Node* n : {o, dq}) set_attention_attrs(n, {.window = window});
  for (Node* out : {dq, b.output(dq, 1, "dk"), b.output(dq, 2, "dv")}) g.add_output(out);
  return g;
}

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  return Tensor::from_vector<float>(shape, random_normal(static_cast<size_t>(shape_numel(shape)), seed));
}

}  // namespace

void run_ring_bench(const RingBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit) {
  if (opt.iters < 1 || opt.pairs < 1 || opt.warmup < 0)
    throw UsageError(str("--mode ring: --iters ", opt.iters, ", --pairs ", opt.pairs, ", --warmup ", opt.warmup,
                         ": expected iters, pairs ≥ 1 and warmup ≥ 0"));
  if (opt.hidden % opt.dim != 0 || (opt.hidden / opt.dim) % opt.group != 0)
    throw UsageError(str("--mode ring: hidden ", opt.hidden, " is not heads × head dim ", opt.dim,
                         " with heads a multiple of the group ", opt.group));
  cpu::set_num_threads(opt.threads);
  const int64_t B = opt.batch, D = opt.dim, N = opt.hidden / opt.dim, Nkv = N / opt.group;
  if (opt.window < 0) throw UsageError(str("--attn-window ", opt.window, ": expected a window of at least 1 key"));
  // The two alternated turns: (layout, window).
  const std::vector<std::pair<std::string, int64_t>> layouts =
      opt.window > 0 ? std::vector<std::pair<std::string, int64_t>>{{"zigzag", 0}, {"zigzag", opt.window}}
                     : std::vector<std::pair<std::string, int64_t>>{{"zigzag", 0}, {"contiguous", 0}};
  for (int64_t S : opt.seqs)
    for (int64_t R : opt.rings) {
      if (R < 2 || S % (2 * R) != 0)
        throw UsageError(str("--mode ring: ring size ", R, " and S ", S, ": expected R ≥ 2 and S a multiple of 2R"));
      const int64_t L = S / R;
      const TensorMap feeds{{"q", random_tensor({B, N, L, D}, 1)},
                            {"k", random_tensor({B, Nkv, L, D}, 2)},
                            {"v", random_tensor({B, Nkv, L, D}, 3)},
                            {"dout", random_tensor({B, N, L, D}, 4)}};
      // times[layout][rank]: one median per turn
      std::vector<std::vector<std::vector<double>>> times(layouts.size(), std::vector<std::vector<double>>(size_t(R)));
      std::vector<Graph> graphs;
      for (const auto& [layout, window] : layouts) graphs.push_back(ring_graph(B, N, Nkv, L, D, R, layout, window));
      std::vector<std::vector<int64_t>> bytes(layouts.size(), std::vector<int64_t>(size_t(R)));
      for (int turn = 0; turn < opt.pairs; ++turn)
        for (size_t l = 0; l < layouts.size(); ++l) {
          const Executor ex(graphs[l]);
          for (int64_t r = 0; r < R; ++r) {
            StandInRing stand_in{int(r), int(R)};
            CountingCommunicator ring(stand_in);
            const CommGroups groups{{"ring", &ring}};
            std::vector<double> ms;
            for (int i = 0; i < opt.warmup + opt.iters; ++i) {
              ring.reset_stats();
              const auto t0 = std::chrono::steady_clock::now();
              (void)ex.run(feeds, groups);
              const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
              if (i >= opt.warmup) ms.push_back(t);
            }
            bytes[l][size_t(r)] = ring.stats().send_recv.bytes;
            times[l][size_t(r)].push_back(median(ms));
          }
        }
      double zigzag_max = 0;
      for (size_t l = 0; l < layouts.size(); ++l) {
        std::vector<double> rank_ms;
        for (const auto& turns : times[l]) rank_ms.push_back(median(turns));
        const double mx = *std::max_element(rank_ms.begin(), rank_ms.end());
        const double mn = *std::min_element(rank_ms.begin(), rank_ms.end());
        const double mean = std::accumulate(rank_ms.begin(), rank_ms.end(), 0.0) / double(rank_ms.size());
        nlohmann::json row = {{"layout", layouts[l].first}, {"window", layouts[l].second}, {"seq", S}, {"ring", R},
                              {"batch", B},           {"heads", N},       {"kv_heads", Nkv},
                              {"head_dim", D},        {"threads", opt.threads}, {"rank_ms", rank_ms},
                              {"max_ms", mx},         {"mean_ms", mean},  {"max_over_mean", mx / mean},
                              {"max_over_min", mx / mn}, {"pairs", opt.pairs}, {"iters", opt.iters},
                              {"bytes_per_rank", bytes[l]}};
        if (l == 0) zigzag_max = mx;
        else row["slowest_vs_zigzag"] = mx / zigzag_max;
        emit(row);
      }
    }
}

}  // namespace autosp
