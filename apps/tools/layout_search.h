// autosp-plan's search (and "auto" in a config): given a model, a sequence length, a number of ranks
// and a cluster (tools/cluster.h), the parallel layouts that are valid (dp × sp = ranks, sp = U × R
// Ulysses × ring ranks that the heads allow, the micro-batch and accumulation of a target global
// batch, and for a mixture of experts the expert-parallel sizes E that divide the experts and the
// ranks) with each memory saver (ZeRO 0–3, activation checkpointing, tiled MLP, tiled loss), ranked by
// an estimated step time, with the planned peak bytes per rank of the real memory planner
// (tools/plan_summary.h over compiler/program.h's program). docs/scaling.md ("Choosing a layout")
// writes the cost model down.
//
// Speed: a program of L layers is planned from two short ones (the model at 3 and 4 layers: the
// bytes grow linearly with the layers from there, the layer inputs checkpointing keeps, the layers'
// parameters and state), and every layout that is printed or chosen is then planned at its full L.
// Candidates are visited fastest first, and a Ulysses × ring × micro-batch whose every saver on does
// not fit is skipped whole, so a search plans few programs.
// Knows nothing of kernels, communicators or the trainer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "tools/cluster.h"

namespace autosp {

// One way to run the job. sp = U × R ranks per sequence (ring R), dp = ranks / sp copies; E
// consecutive ranks share a mixture of experts' experts (moe.expert_parallel_size).
struct ParallelLayout {
  int64_t sp = 1, ring = 1, dp = 1, ep = 1;
  int64_t zero_stage = 0;
  bool checkpointing = false, tiled_mlp = false, tiled_loss = false;
  int64_t micro_batch = 1, accumulation = 1;  // data.batch_size, train.gradient_accumulation_steps
  // The --set lines that make `base` run this layout (every key the search chose).
  std::vector<std::string> sets() const;
  // `base` with this layout's keys.
  Config apply(Config base) const;
};

// The estimated time of one optimizer step (docs/scaling.md, "Choosing a layout").
struct StepCost {
  double compute_s = 0;     // FLOPs (step_flops, plus what checkpointing and tiling compute again) / rate
  double all_to_all_s = 0;  // Ulysses' all-to-alls (on the critical path)
  double ring_s = 0;        // the ring's exchanges beyond the attention they overlap
  double expert_s = 0;      // expert parallelism's exchanges (counts, then two all-to-alls each way)
  double zero_s = 0;        // gradient all-reduce / reduce-scatter + gather, ZeRO-3's gathers: exposed part
  double step_s = 0;
  double tokens_per_s = 0;  // of the whole job: global batch × S / step_s
};

struct Candidate {
  ParallelLayout layout;
  StepCost cost;
  double peak_bytes = 0;  // per rank, planned
  bool full_plan = false; // planned at the model's full depth (else from the two short programs)
};

// What is searched. `vary_*` false keeps the config's value (only "auto" keys vary at start-up).
struct SearchRequest {
  Config config;           // the user's config (model, dtype, data.batch_size, ...)
  int64_t seq_len = 0;     // S (the real tokens; padded as the trainer pads)
  int64_t ranks = 1;
  Cluster cluster;
  int64_t global_batch = 0;  // sequences per optimizer step; 0: data.batch_size × accumulation × dp
  int top = 5;               // how many distinct layouts (sp, ring, micro-batch, E) to return
  bool vary_sp = true, vary_ring = true, vary_zero = true, vary_checkpointing = true, vary_tiled_mlp = true,
       vary_tiled_loss = true, vary_ep = true;
};

struct SearchResult {
  std::vector<Candidate> best;  // fastest first, each fitting the usable memory; empty: none fits
  std::optional<Candidate> closest;  // with none fitting: the layout of least planned peak
  int64_t layouts = 0;   // valid layouts considered
  int64_t planned = 0;   // programs built and planned
  std::vector<std::string> notes;  // what the search could not use (a saver the model lacks, ...)
};

// The padded S a layout runs (a multiple of sp, or 2·sp with a ring).
int64_t padded_seq(const ParallelLayout& l, int64_t seq);
StepCost estimate_step(const Config& cfg, const ParallelLayout& l, int64_t seq, const Cluster& c);
// Expert parallelism's exchanges in one step (StepCost::expert_s; docs/scaling.md): per MoE layer and
// micro-batch, the counts' all-gather and two all-to-alls of rows·k·C elements each way forward (the
// tokens to their experts, the outputs back) and of rows·k·2C backward, (E − 1)/E of each leaving
// the rank (balanced routing), the forward twice where checkpointing recomputes it. 0 at E = 1.
double expert_exchange_s(const Config& cfg, const ParallelLayout& l, int64_t seq, const Cluster& c);

// Plans programs and keeps them: the search and --longest ask the same layout at many S.
class MemoryOracle {
 public:
  MemoryOracle(const Config& cfg, int64_t ranks, DeviceKind device) : cfg_(cfg), ranks_(ranks), device_(device) {}
  // Planned peak bytes per rank at S (padded inside), from the short programs, or `full` at the whole depth.
  double peak_bytes(const ParallelLayout& l, int64_t seq, bool full = false);
  int64_t programs_built() const { return built_; }

 private:
  struct Built;
  const Built& program(const ParallelLayout& l, int64_t layers);
  Config cfg_;
  int64_t ranks_;
  DeviceKind device_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t>, std::shared_ptr<Built>>
      programs_;
  int64_t built_ = 0;
};

SearchResult search_layouts(const SearchRequest& r);
// The same with a MemoryOracle the caller keeps (--longest asks many S of the same programs).
SearchResult search_layouts(const SearchRequest& r, MemoryOracle& oracle);

// --longest: the longest S (a multiple of `multiple`, at most `max_seq`) at which some layout fits,
// and the fastest layouts there. seq 0: nothing fits even at `multiple` tokens.
struct LongestResult {
  int64_t seq = 0;
  SearchResult at;
};
LongestResult search_longest(SearchRequest r, int64_t multiple, int64_t max_seq);

// "auto" layout keys (Config::auto_keys, decision 124): the fastest layout of `world` ranks that fits
// on `cluster` at data.seq_len, searched over the keys written "auto" only (moe.expert_parallel_size
// among them; sequence_parallel.ring_size
// too when it and autosp_size are both "auto"); the others keep their values. Returns the config
// with them set, auto_keys empty, the resolved config and a note saying what was chosen; none
// fitting is a UsageError naming the keys and the closest layout.
Config resolve_auto(Config cfg, int64_t world, const Cluster& cluster);
// The cluster a run resolves "auto" for: this machine's share for each of `world` CPU ranks, or the
// GPU's memory and peak (runtime.peak_tflops when set) with the H200's links.
Cluster run_cluster(const Config& cfg, int64_t world);

}  // namespace autosp
