// The layout search and its cost model (see the header; docs/scaling.md, "Choosing a layout").
#include "tools/layout_search.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "compiler/program.h"
#include "device/cuda/device.h"
#include "models/family.h"
#include "models/flops.h"
#include "tensor/check.h"
#include "tools/plan_summary.h"

namespace autosp {

std::vector<std::string> ParallelLayout::sets() const {
  return {str("sequence_parallel.autosp_size=", sp), str("sequence_parallel.ring_size=", ring),
          str("zero_optimization.stage=", zero_stage), str("runtime.activation_checkpointing=", checkpointing ? "true" : "false"),
          str("runtime.tiled_mlp=", tiled_mlp ? "true" : "false"), str("runtime.tiled_loss=", tiled_loss ? "true" : "false"),
          str("data.batch_size=", micro_batch), str("train.gradient_accumulation_steps=", accumulation),
          str("moe.expert_parallel_size=", ep)};
}

Config ParallelLayout::apply(Config c) const {
  c.sequence_parallel.autosp_size = sp;
  c.sequence_parallel.ring_size = ring;
  c.sequence_parallel.ring_auto = false;
  c.zero_optimization.stage = zero_stage;
  c.runtime.activation_checkpointing = checkpointing;
  c.runtime.tiled_mlp = tiled_mlp;
  c.runtime.tiled_loss = tiled_loss;
  c.data.batch_size = micro_batch;
  c.train.gradient_accumulation_steps = accumulation;
  c.moe.expert_parallel_size = ep;
  c.auto_keys.clear();  // every layout key now has a value
  return c;
}

int64_t padded_seq(const ParallelLayout& l, int64_t seq) {
  const int64_t m = l.ring > 1 ? 2 * l.sp : l.sp;
  return (seq + m - 1) / m * m;
}

// ---- the cost model ----------------------------------------------------------------------------

namespace {

// One collective step of `bytes` per rank over a link.
double on_link(const Link& l, double bytes) { return bytes > 0 ? l.alpha_s + bytes / l.bytes_per_s : 0; }

// The layers with a mixture of experts.
double moe_layers(const ModelConfig& m) {
  double layers = 0;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) layers += m.sparse_layer(l);
  return layers;
}

// The experts' parameters: every MoE layer's E gate, up and down projections of [I, C].
double expert_params(const ModelConfig& m) {
  return moe_layers(m) * static_cast<double>(m.num_experts * 3 * m.expert_width() * m.hidden_size);
}

}  // namespace

double expert_exchange_s(const Config& cfg, const ParallelLayout& l, int64_t seq, const Cluster& c) {
  const ModelConfig& m = cfg.model;
  if (l.ep <= 1) return 0;
  const Link& link = l.ep <= c.ranks_per_node ? c.intra : c.inter;
  const double E = static_cast<double>(l.ep), act = static_cast<double>(dtype_size(cfg.runtime.dtype));
  // rows · k · C elements of this rank's tokens, (E − 1)/E of them for another rank's experts
  const double rows = static_cast<double>(l.micro_batch * padded_seq(l, seq) / l.sp);
  const double payload = rows * static_cast<double>(m.num_experts_per_tok * m.hidden_size) * act * (E - 1) / E;
  const double counts = on_link(link, E * static_cast<double>(m.num_experts) * 8);  // [E, experts] int64
  // forward: x out, the experts' outputs back; backward: [x | dy] out, dx back (the routing weights
  // and their gradients, R·k scalars, ride in the same messages: engine/expert_parallel.cpp and its
  // CUDA twin send one message each way)
  const double forward = counts + 2 * on_link(link, payload),
               backward = counts + on_link(link, 2 * payload) + on_link(link, payload);
  const double per_layer = (l.checkpointing ? 2 : 1) * forward + backward;
  return static_cast<double>(l.accumulation) * moe_layers(m) * per_layer;
}

StepCost estimate_step(const Config& cfg, const ParallelLayout& l, int64_t seq, const Cluster& c) {
  const ModelConfig& m = cfg.model;
  const ModelDims d = model_dims(m);
  const int64_t S = padded_seq(l, seq), P = l.sp, U = l.sp / l.ring, R = l.ring, W = l.sp * l.dp;
  const double b = static_cast<double>(l.micro_batch), k = static_cast<double>(l.accumulation);
  const double L = static_cast<double>(d.L), Sd = static_cast<double>(S), tokens = b * Sd / static_cast<double>(P);
  const double act = static_cast<double>(dtype_size(cfg.runtime.dtype));  // activations (all-to-all payload)
  const double rate = c.achieved_flops();
  StepCost s;

  // Compute of one micro-batch on one rank: step_flops over the SP group, plus what is computed
  // again: checkpointing the layers' forward (a third of their step FLOPs), the tiled MLP the gate
  // and up projections (2·2·C·M a token and layer), the tiled loss the logits (2·C·V a token).
  double pairs = 0;  // every layer's query-key pairs (a windowed layer's band: models/flops.h)
  for (int64_t layer = 0; layer < d.L; ++layer) pairs += attention_pairs(m, layer, Sd);
  const double attention = 12.0 * pairs * static_cast<double>(d.N * d.D) * b;
  const double head = 6.0 * static_cast<double>(d.V * d.C) * b * Sd;
  double flops = step_flops(m, l.micro_batch, S);
  if (l.checkpointing) flops += (flops - head) / 3.0;
  if (l.tiled_mlp) flops += 4.0 * static_cast<double>(d.C * d.M) * L * b * Sd;
  if (l.tiled_loss) flops += 2.0 * static_cast<double>(d.V * d.C) * b * Sd;
  const double compute = flops / static_cast<double>(P) / rate;
  s.compute_s = compute * k;

  // Ulysses: per layer q, k, v, o forward and their gradients backward (and the forward's four again
  // where checkpointing recomputes it), each sending (U−1)/U of a local [b, heads, S/P, D] tensor;
  // U consecutive ranks share a node while U ≤ ranks_per_node.
  if (U > 1) {
    const Link& link = U <= c.ranks_per_node ? c.intra : c.inter;
    const double calls = l.checkpointing ? 3.0 : 2.0;  // forward, backward (, recompute)
    for (int64_t heads : {d.N, std::max(d.Nkv, U)}) {
      const double local = tokens * static_cast<double>(heads * d.D) * act;
      s.all_to_all_s += 2.0 * calls * L * on_link(link, local * static_cast<double>(U - 1) / static_cast<double>(U));
    }
    s.all_to_all_s *= k;
  }
  // Ring: per layer (3R − 2) K/V blocks of 2·b·Nkv_local·(S/R)·D between neighbours U ranks apart
  // (R − 1 more where checkpointing recomputes the forward), overlapped with the attention of the
  // ring steps; only what outlasts that attention is charged. A windowed layer (decision 135) moves
  // only the w keys before each of a rank's two zigzag chunks instead: K/V tails forward, again in
  // the backward, and their dK/dV back (and once more where checkpointing recomputes), each of
  // 2·b·Nkv_local·w·D, and never more than the full ring.
  if (R > 1) {
    const Link& link = P <= c.ranks_per_node ? c.intra : c.inter;
    const double kv_local = static_cast<double>(d.Nkv >= U ? d.Nkv / U : 1);
    const double per_key = 2.0 * b * kv_local * static_cast<double>(d.D) * act;
    const double block = per_key * Sd / static_cast<double>(R);
    const double blocks = 3.0 * static_cast<double>(R) - 2.0 + (l.checkpointing ? static_cast<double>(R) - 1.0 : 0.0);
    const double full = blocks * on_link(link, block), tails = 2.0 * (l.checkpointing ? 4.0 : 3.0);
    double transfers = 0;
    for (int64_t layer = 0; layer < d.L; ++layer) {
      const double w = std::min(static_cast<double>(m.layer_window(layer)), Sd);
      transfers += w > 0 ? std::min(full, tails * on_link(link, per_key * w)) : full;
    }
    const double attention_s = attention * (l.checkpointing ? 4.0 / 3.0 : 1.0) / static_cast<double>(P) / rate;
    s.ring_s = k * std::max(0.0, transfers - attention_s);
  }
  // ZeRO: stages 0–2 move the gradients once a step (an all-reduce, or a reduce-scatter and an
  // all-gather: the same bytes), 2·(W−1)/W of them, while the backward of the last micro-batch runs
  // (two thirds of its compute); stage 3 gathers the parameters for the forward and the backward
  // (and the recompute) and reduce-scatters each gradient, every micro-batch, in the background.
  // Under expert parallelism a rank's 1/E of the experts is summed (and sharded, gathered) over the
  // W / E ranks holding the same experts (decision 185), the rest over the world: `params` is the
  // dense count plus the experts' 1/E weighted by their group's share over the world's, so that
  // share · params is what a rank moves.
  if (W > 1) {
    const Link& link = W <= c.ranks_per_node ? c.intra : c.inter;
    const double w = static_cast<double>(W), E = static_cast<double>(l.ep), we = w / E;
    const double experts = l.ep > 1 ? expert_params(m) : 0.0, share = (w - 1.0) / w;
    const double params = static_cast<double>(param_count(m)) - experts + experts / E * ((we - 1.0) / we) / share;
    const double grads = params * 4.0;
    if (l.zero_stage < 3) {
      const double t = 2.0 * share * grads / link.bytes_per_s + 2.0 * (w - 1.0) * link.alpha_s;
      s.zero_s = std::max(0.0, t - 2.0 / 3.0 * compute);
    } else {
      const double gathers = l.checkpointing ? 3.0 : 2.0;
      const double t = (gathers * share * params * act + share * grads) / link.bytes_per_s +
                       (gathers + 1.0) * L * link.alpha_s;
      s.zero_s = k * std::max(0.0, t - compute);
    }
  }
  s.expert_s = expert_exchange_s(cfg, l, seq, c);
  s.step_s = s.compute_s + s.all_to_all_s + s.ring_s + s.zero_s + s.expert_s;
  s.tokens_per_s = static_cast<double>(l.dp) * b * k * static_cast<double>(seq) / s.step_s;
  return s;
}

// ---- memory ------------------------------------------------------------------------------------

struct MemoryOracle::Built {
  RankProgram prog;
};

const MemoryOracle::Built& MemoryOracle::program(const ParallelLayout& l, int64_t layers) {
  // Stages 0-2 run one graph (only stage 3 shards the parameters in it): one program for the three.
  const bool sharded = l.zero_stage == 3 && ranks_ > 1;
  const auto key = std::make_tuple(l.sp, l.ring, int64_t{sharded}, int(l.checkpointing), int(l.tiled_mlp), int(l.tiled_loss),
                                   int64_t{l.accumulation > 1}, layers, l.ep);
  auto& slot = programs_[key];
  if (!slot) {
    Config c = l.apply(cfg_);
    c.zero_optimization.stage = sharded ? 3 : 0;
    c.model.num_hidden_layers = layers;
    const RankLayout at = rank_layout(ranks_, 0, l.sp, l.ring, l.ep);
    slot = std::make_shared<Built>(Built{build_program(c, c.runtime.dtype, Stage::joint, at)});
    ++built_;
  }
  return *slot;
}

namespace {

// What a step holds beyond the memory plan, measured on this machine (docs/scaling.md, "Choosing a
// layout", and decision 122): added to the planned peak as if it met the peak of the rest (an
// upper bound).
//  - ring attention: the scratch ring_attention_backward allocates while it runs (engine/
//    launchers.inc.h: copies of q, o and dout in halves, the dq sum and block, a dK/dV pair block,
//    the K/V block with its spare and three gradient buffers). On the CPU the kernels run bf16 in
//    f32 and sum in the operands' type; on CUDA they sum in f32.
//  - ZeRO-2: gradient buckets whose reduce-scatter has not finished (one in flight, the next
//    filling: at most two buckets of runtime.grad_bucket_mb, or all the gradients if fewer).
//  - the tiled loss under sequence parallelism: two hidden-sized f32 vectors per local token
//    (measured, 700–1,700 B per token on the tiny Llama; not found in the plan).
double unplanned_bytes(const Config& cfg, const ParallelLayout& l, int64_t seq, DeviceKind device) {
  const ModelDims d = model_dims(cfg.model);
  const double B = static_cast<double>(l.micro_batch), local = B * static_cast<double>(padded_seq(l, seq) / l.sp);
  double bytes = 0;
  if (l.ring > 1) {
    const int64_t U = l.sp / l.ring;
    const double Ld = static_cast<double>(padded_seq(l, seq) / l.ring), D = static_cast<double>(d.D);
    const double n = static_cast<double>(d.N / U), nkv = static_cast<double>(d.Nkv >= U ? d.Nkv / U : 1);
    const double t = device == DeviceKind::cpu ? std::max<double>(4, static_cast<double>(dtype_size(cfg.runtime.dtype)))
                                               : static_cast<double>(dtype_size(cfg.runtime.dtype));
    const double a = device == DeviceKind::cpu ? t : 4;
    const double q = B * n * Ld * D, kv = B * nkv * Ld * D, lse = B * n * Ld;
    bytes += 3 * q * t + lse * a + q * a + q / 2 * t + kv * t + 2 * (2 * kv * t) + 3 * (2 * kv * a);
    if (a != t) bytes += std::max(q / 2, kv) * a;
  }
  if (l.zero_stage == 2 && l.sp * l.dp > 1) {
    const double grads = static_cast<double>(param_count(cfg.model) * dtype_size(master_dtype(cfg.runtime.dtype)));
    bytes += std::min(grads, 2 * cfg.runtime.grad_bucket_mb * 1024 * 1024);
  }
  if (l.tiled_loss && l.sp > 1) bytes += 2.0 * static_cast<double>(d.C) * 4 * local;
  return bytes;
}

}  // namespace

double MemoryOracle::peak_bytes(const ParallelLayout& l, int64_t seq, bool full) {
  const Bindings b{{"B", l.micro_batch}, {"S", padded_seq(l, seq)}};
  const int64_t L = cfg_.model.num_hidden_layers;
  // The planned total; of a short program, with the arena's lower bound (the most bytes live at
  // once) in place of the arena: where best-fit placement leaves gaps differs from one depth to
  // the next by whole layers' buffers, while the live bytes grow by the same each layer.
  auto at = [&](int64_t layers, bool short_program) {
    const ZeroMode mode = zero_mode(ZeroConfig{l.zero_stage}, static_cast<int>(ranks_));
    const PlannedBytes p = planned_bytes(program(l, layers).prog, b, static_cast<int>(ranks_), device_, mode);
    return static_cast<double>(p.total() - (short_program ? p.plan.arena_bytes - p.plan.max_live_bytes : 0));
  };
  const double beside = unplanned_bytes(cfg_, l, seq, device_);
  if (full || L <= 4) return at(L, false) + beside;
  const double p3 = at(3, true), p4 = at(4, true);
  return p4 + static_cast<double>(L - 4) * (p4 - p3) + beside;
}

// ---- the search --------------------------------------------------------------------------------

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// Whether the model takes a saver: the config's own rules, asked once.
bool accepts(const Config& cfg, const std::vector<std::string>& sets) {
  try {
    parse_config(cfg.resolved, sets, "autosp-plan");
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

// The short programs' estimate may miss the full plan by a few percent (ZeRO-3's gathered layers
// on a small model: 6% on the tiny Llama, tests/tools/test_layout_search.cpp); a layout is only
// ruled out by it when it exceeds the memory by more than this, and decided by the full plan.
constexpr double kShortPlanSlack = 1.1;

// Whether `a` saves no more memory than `b` of the same group: a ZeRO stage no higher, and every
// saver `a` uses used by `b` too.
bool saves_no_more(const ParallelLayout& a, const ParallelLayout& b) {
  return a.zero_stage <= b.zero_stage && a.checkpointing <= b.checkpointing && a.tiled_mlp <= b.tiled_mlp &&
         a.tiled_loss <= b.tiled_loss;
}

int savers(const ParallelLayout& l) { return (l.zero_stage > 0) + l.checkpointing + l.tiled_mlp + l.tiled_loss; }

// The values each knob may take: the config's, or every value the search may try (the last is the
// one that saves the most memory).
struct Knobs {
  std::vector<bool> checkpointing, tiled_mlp, tiled_loss;
  std::vector<int64_t> stages, eps;
  ParallelLayout least(ParallelLayout l) const {
    l.zero_stage = stages.back();
    l.checkpointing = checkpointing.back();
    l.tiled_mlp = tiled_mlp.back();
    l.tiled_loss = tiled_loss.back();
    return l;
  }
};

Knobs knobs(const SearchRequest& r, std::vector<std::string>& notes) {
  const Config& cfg = r.config;
  auto flags = [&](bool vary, bool value, const std::string& key) -> std::vector<bool> {
    if (!vary) return {value};
    if (accepts(cfg, {key + "=true"})) return {false, true};
    notes.push_back(str(key, ": not available for this model (", key, "=true is refused), left off"));
    return {false};
  };
  Knobs k;
  k.checkpointing = flags(r.vary_checkpointing, cfg.runtime.activation_checkpointing, "runtime.activation_checkpointing");
  k.tiled_mlp = flags(r.vary_tiled_mlp, cfg.runtime.tiled_mlp, "runtime.tiled_mlp");
  k.tiled_loss = flags(r.vary_tiled_loss, cfg.runtime.tiled_loss, "runtime.tiled_loss");
  k.stages = {cfg.zero_optimization.stage};
  if (r.vary_zero) k.stages = r.ranks > 1 ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0};
  // Expert parallelism: every E dividing the ranks that the config takes on the device the layouts
  // run on (a mixture of experts whose experts E divides; on a GPU cluster the run is "cuda", whose
  // exchange is decision 225's); a dense model keeps E = 1 without a note.
  k.eps = {cfg.moe.expert_parallel_size};
  if (r.vary_ep) {
    k.eps = {1};
    for (int64_t E : divisors(r.ranks)) {
      std::vector<std::string> sets{str("moe.expert_parallel_size=", E)};
      if (r.cluster.device != "cpu") sets.push_back("runtime.device=cuda");
      if (E > 1 && cfg.model.num_experts % E == 0 && accepts(cfg, sets)) k.eps.push_back(E);
    }
    if (k.eps.size() == 1 && family(cfg.model.arch).moe != Moe::none && r.ranks > 1)
      notes.push_back(str("moe.expert_parallel_size: left at 1 (no E > 1 divides both the ", cfg.model.num_experts,
                          " experts and the ", r.ranks, " ranks, or the config refuses it on the run's device)"));
  }
  return k;
}

// Every valid layout with its estimated cost, fastest first (ties: fewer savers).
std::vector<Candidate> enumerate(const SearchRequest& r, const Knobs& k) {
  const Config& cfg = r.config;
  if (r.ranks < 1) throw UsageError(str("--ranks ", r.ranks, ": expected at least 1"));
  if (r.seq_len < 1) throw UsageError(str("--seq-len ", r.seq_len, ": expected at least 1"));
  if (r.global_batch < 0) throw UsageError(str("--global-batch ", r.global_batch, ": expected at least 1"));
  const int64_t N = cfg.model.num_attention_heads, Nkv = model_dims(cfg.model).Nkv;
  std::vector<int64_t> sps = {cfg.sequence_parallel.autosp_size};
  if (r.vary_sp) sps = divisors(r.ranks);
  std::vector<Candidate> all;
  for (int64_t sp : sps) {
    if (r.ranks % sp != 0) continue;
    std::vector<int64_t> rings = {cfg.sequence_parallel.ring_size};
    if (r.vary_ring) rings = divisors(sp);
    for (int64_t ring : rings) {
      if (sp % ring != 0 || !ulysses_fits(sp / ring, N, Nkv)) continue;
      ParallelLayout base;
      base.sp = sp;
      base.ring = ring;
      base.dp = r.ranks / sp;
      std::vector<std::pair<int64_t, int64_t>> batches = {{cfg.data.batch_size, cfg.train.gradient_accumulation_steps}};
      if (r.global_batch > 0) {
        if (r.global_batch % base.dp != 0) continue;
        batches.clear();
        const int64_t per = r.global_batch / base.dp;
        for (int64_t mb : divisors(per)) batches.push_back({mb, per / mb});
      }
      for (auto [mb, acc] : batches)
        for (int64_t ep : k.eps)
          for (int64_t z : k.stages)
            for (bool ck : k.checkpointing)
              for (bool tm : k.tiled_mlp)
                for (bool tl : k.tiled_loss) {
                  ParallelLayout l = base;
                  l.micro_batch = mb;
                  l.accumulation = acc;
                  l.ep = ep;
                  l.zero_stage = z;
                  l.checkpointing = ck;
                  l.tiled_mlp = tm;
                  l.tiled_loss = tl;
                  all.push_back({l, estimate_step(cfg, l, r.seq_len, r.cluster)});
                }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.cost.tokens_per_s != b.cost.tokens_per_s) return a.cost.tokens_per_s > b.cost.tokens_per_s;
    return savers(a.layout) < savers(b.layout);
  });
  return all;
}

DeviceKind planned_device(const Cluster& c) { return c.device == "cpu" ? DeviceKind::cpu : DeviceKind::cuda; }

}  // namespace

SearchResult search_layouts(const SearchRequest& r) {
  MemoryOracle oracle(r.config, r.ranks, planned_device(r.cluster));
  return search_layouts(r, oracle);
}

SearchResult search_layouts(const SearchRequest& r, MemoryOracle& oracle) {
  SearchResult out;
  const Knobs k = knobs(r, out.notes);
  const std::vector<Candidate> all = enumerate(r, k);
  out.layouts = static_cast<int64_t>(all.size());

  // Fastest first. A group (sp, ring, micro-batch, E) is tried once with every saver it may use on:
  // the least memory it can take; a group that does not fit so is skipped whole.
  const double usable = r.cluster.usable_bytes();
  using Group = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  std::map<Group, bool> group_fits, group_done;
  std::map<Group, std::vector<ParallelLayout>> group_failed;
  for (const Candidate& cand : all) {
    if (static_cast<int>(out.best.size()) >= r.top) break;
    const ParallelLayout& l = cand.layout;
    const Group group{l.sp, l.ring, l.micro_batch, l.ep};
    if (group_done[group]) continue;
    if (!group_fits.count(group)) {
      const ParallelLayout least = k.least(l);
      Candidate c{least, estimate_step(r.config, least, r.seq_len, r.cluster), oracle.peak_bytes(least, r.seq_len)};
      group_fits[group] = c.peak_bytes <= usable * kShortPlanSlack;
      if (!out.closest || c.peak_bytes < out.closest->peak_bytes) out.closest = c;
    }
    if (!group_fits[group]) continue;
    // A layout saving no more than one that did not fit (each saver off there or here) cannot fit.
    std::vector<ParallelLayout>& failed = group_failed[group];
    if (std::any_of(failed.begin(), failed.end(), [&](const ParallelLayout& f) { return saves_no_more(l, f); })) continue;
    Candidate c = cand;
    c.peak_bytes = oracle.peak_bytes(l, r.seq_len);
    if (c.peak_bytes > usable * kShortPlanSlack) {
      failed.push_back(l);
      continue;
    }
    c.peak_bytes = oracle.peak_bytes(l, r.seq_len, /*full=*/true);
    c.full_plan = true;
    if (c.peak_bytes > usable) continue;
    out.best.push_back(c);
    group_done[group] = true;
  }
  if (out.best.empty() && out.closest) {
    out.closest->peak_bytes = oracle.peak_bytes(out.closest->layout, r.seq_len, /*full=*/true);
    out.closest->full_plan = true;
  }
  out.planned = oracle.programs_built();
  return out;
}

Config resolve_auto(Config cfg, int64_t world, const Cluster& cluster) {
  if (cfg.auto_keys.empty()) return cfg;
  const auto is_auto = [&](const char* key) { return cfg.auto_keys.count(key) > 0; };
  SearchRequest r;
  r.config = cfg;
  r.seq_len = cfg.data.seq_len;
  r.ranks = world;
  r.cluster = cluster;
  r.top = 1;
  r.vary_sp = is_auto("sequence_parallel.autosp_size");
  r.vary_ring = r.vary_sp && cfg.sequence_parallel.ring_auto;
  r.vary_zero = is_auto("zero_optimization.stage");
  r.vary_checkpointing = is_auto("runtime.activation_checkpointing");
  r.vary_tiled_mlp = is_auto("runtime.tiled_mlp");
  r.vary_tiled_loss = is_auto("runtime.tiled_loss");
  r.vary_ep = is_auto("moe.expert_parallel_size");
  std::string keys;
  for (const std::string& k : cfg.auto_keys) keys += (keys.empty() ? "" : ", ") + k;
  const SearchResult res = search_layouts(r);
  if (res.best.empty()) {
    std::string why = str("\"auto\" (", keys, "): no layout of ", world, " ranks fits data.seq_len ", cfg.data.seq_len,
                          " in ", cluster.usable_bytes() / 1e6, " MB per rank");
    if (res.closest)
      why += str("; the closest (sp ", res.closest->layout.sp, ", ring ", res.closest->layout.ring, ", ZeRO ",
                 res.closest->layout.zero_stage, ", every saver on) plans ", res.closest->peak_bytes / 1e6, " MB");
    throw UsageError(why);
  }
  const Candidate& c = res.best.front();
  const std::set<std::string> was = cfg.auto_keys;
  cfg = c.layout.apply(cfg);
  cfg.auto_keys.clear();
  const std::vector<std::string> sets = c.layout.sets();
  std::string chosen;
  for (const std::string& s : sets) {
    const std::string key = s.substr(0, s.find('='));
    if (!was.count(key) && !(key == "sequence_parallel.ring_size" && r.vary_ring)) continue;
    chosen += (chosen.empty() ? "" : ", ") + s;
    cfg.resolved[nlohmann::json::json_pointer("/" + key.substr(0, key.find('.')) + "/" + key.substr(key.find('.') + 1))] =
        nlohmann::json::parse(s.substr(s.find('=') + 1));
  }
  cfg.notes.push_back(str("\"auto\" resolved for ", world, " rank", world == 1 ? "" : "s", " at data.seq_len ",
                          cfg.data.seq_len, ": ", chosen, " (planned peak ", c.peak_bytes / 1e6, " MB of ",
                          cluster.usable_bytes() / 1e6, " MB usable per rank, estimated step ", c.cost.step_s,
                          " s; autosp-plan lists the alternatives)"));
  return cfg;
}

Cluster run_cluster(const Config& cfg, int64_t world) {
  if (cfg.runtime.device == DeviceKind::cpu) return for_ranks(find_device("cpu"), world);
  if (cuda_device_count() < 1)  // sized by the device itself: without one there is nothing to size
    throw UsageError("runtime.device \"cuda\" with \"auto\" layout keys: no CUDA device to size the search for "
                     "(give the keys values, or plan with autosp-plan --device NAME)");
  Cluster c = find_device("H200");
  c.device = "cuda";
  c.memory_bytes = static_cast<double>(device_memory_bytes(0));
  c.peak_tflops = cfg.runtime.peak_tflops > 0 ? cfg.runtime.peak_tflops : dense_bf16_peak_tflops(0);
  if (c.peak_tflops <= 0) c.peak_tflops = 989;
  return c;
}

LongestResult search_longest(SearchRequest r, int64_t multiple, int64_t max_seq) {
  if (multiple < 1) throw UsageError(str("--multiple ", multiple, ": expected at least 1"));
  if (max_seq < multiple) throw UsageError(str("--max-seq ", max_seq, ": expected at least --multiple ", multiple));
  MemoryOracle oracle(r.config, r.ranks, planned_device(r.cluster));
  std::vector<std::string> notes;
  const Knobs k = knobs(r, notes);
  r.seq_len = multiple;
  // Every group's least-memory layout, once each.
  std::vector<ParallelLayout> leasts;
  for (const Candidate& c : enumerate(r, k)) {
    const ParallelLayout least = k.least(c.layout);
    const bool seen = std::any_of(leasts.begin(), leasts.end(), [&](const ParallelLayout& x) {
      return x.sp == least.sp && x.ring == least.ring && x.micro_batch == least.micro_batch && x.ep == least.ep;
    });
    if (!seen) leasts.push_back(least);
  }
  // The longest S each stretches to: doubling, then bisection between the last that fits and the
  // first that does not. A group that does not fit one multiple past the longest so far cannot beat it.
  const double usable = r.cluster.usable_bytes();
  auto round = [&](int64_t s) { return s / multiple * multiple; };
  auto fits = [&](const ParallelLayout& l, int64_t s) { return oracle.peak_bytes(l, s) <= usable; };
  const int64_t cap = round(max_seq);
  int64_t best = 0;
  std::optional<ParallelLayout> winner;
  for (const ParallelLayout& l : leasts) {
    int64_t lo = best + multiple, hi = 0;
    if (lo > cap || !fits(l, lo)) continue;
    while (true) {
      const int64_t next = std::min(cap, round(lo * 2));
      if (next == lo) {
        hi = lo + multiple;
        break;
      }
      if (!fits(l, next)) {
        hi = next;
        break;
      }
      lo = next;
    }
    while (hi - lo > multiple) {
      const int64_t mid = round((lo + hi) / 2);
      if (mid == lo) break;
      (fits(l, mid) ? lo : hi) = mid;
    }
    best = lo;
    winner = l;
  }
  // The short programs may miss the full plan by a few percent (kShortPlanSlack): where the
  // winner's full plan does not fit at `best`, the full plans bisect below it, to 1% of S.
  auto fits_full = [&](int64_t s) { return oracle.peak_bytes(*winner, s, true) <= usable; };
  if (winner && !fits_full(best)) {
    int64_t hi = best, lo = round(static_cast<int64_t>(static_cast<double>(best) * 0.95));
    while (lo >= multiple && !fits_full(lo)) {
      hi = lo;
      lo = round(static_cast<int64_t>(static_cast<double>(lo) * 0.9));
    }
    while (lo >= multiple && hi - lo > std::max(multiple, lo / 100)) {
      const int64_t mid = round((lo + hi) / 2);
      if (mid == lo) break;
      (fits_full(mid) ? lo : hi) = mid;
    }
    best = lo >= multiple ? lo : 0;
  }
  // The fastest layouts there (each planned at full depth).
  LongestResult out;
  r.seq_len = std::max(best, multiple);
  out.at = search_layouts(r, oracle);
  out.seq = out.at.best.empty() ? 0 : r.seq_len;
  return out;
}

}  // namespace autosp
