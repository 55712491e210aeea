// autosp-plan: the parallel layout and memory savers to run a model at a sequence length on a
// cluster, found by tools/layout_search.h (the real memory planner per layout, a cost model for the
// step time). Prints the fastest few that fit, with the --set lines that run each.
//   autosp-plan --config F [--set k=v]... --ranks N (--seq-len S | --longest) (--device NAME | --memory BYTES)
//               [--tflops T] [--intra-gbps G] [--inter-gbps G] [--ranks-per-node K] [--global-batch G]
//               [--top K] [--multiple M] [--max-seq S] [--only-config] [--write-config F] [--format text|json]
// Exit codes: 0 a layout fits; 1 none fits (the closest is printed, with how far it misses); 2 bad
// usage, config or input.
#include <chrono>
#include <fstream>
#include <cmath>
#include <iostream>

#include <spdlog/spdlog.h>

#include "config/config.h"
#include "tensor/check.h"
#include "tools/cli.h"
#include "tools/cluster.h"
#include "tools/layout_search.h"
#include "tools/options.h"

using namespace autosp;

namespace {

constexpr int kExitNoFit = 1;

// The number `text` starts with, and in `used` how many characters it took (0: none).
double leading_number(const std::string& text, size_t& used) {
  used = 0;
  try {
    return std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
    return 0;
  }
}

// "80GiB", "141e9", "64GB", "1048576": bytes (GB = 10^9, GiB = 2^30, likewise MB, MiB, TB, TiB).
double parse_bytes(const std::string& flag, const std::string& text) {
  size_t used = 0;
  const double v = leading_number(text, used);
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "KiB") scale = 1024.0;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "TiB") scale = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || scale == 0 || !std::isfinite(v) || v <= 0)
    throw UsageError(str("--", flag, " '", text, "': expected a positive size in bytes (e.g. 80GiB, 141e9)"));
  return v * scale;
}

// A number in (lo, hi] (lo_open) or [lo, hi].
double parse_number(const std::string& flag, const std::string& text, double lo, double hi, bool lo_open) {
  size_t used = 0;
  const double v = leading_number(text, used);
  if (used == 0 || used != text.size() || !std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo))
    throw UsageError(str("--", flag, " '", text, "': expected a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  return v;
}

double parse_positive(const std::string& flag, const std::string& text) { return parse_number(flag, text, 0, 1e9, true); }

// Bytes in GB (10^9), or MB below one GB, to two decimals.
std::string gb(double bytes) {
  const bool small = std::abs(bytes) < 1e9;
  return str(std::round(bytes / (small ? 1e4 : 1e7)) / 100, small ? " MB" : " GB");
}

std::string describe(const ParallelLayout& l) {
  std::string sp = l.ring > 1 ? str("sp ", l.sp, " = Ulysses ", l.sp / l.ring, " x ring ", l.ring) : str("sp ", l.sp);
  if (l.ep > 1) sp += str(" (experts over ", l.ep, " ranks)");
  return str(sp, ", dp ", l.dp, " | ZeRO ", l.zero_stage, ", checkpointing ", l.checkpointing ? "on" : "off",
             ", tiled MLP ", l.tiled_mlp ? "on" : "off", ", tiled loss ", l.tiled_loss ? "on" : "off", " | micro-batch ",
             l.micro_batch, " x accumulation ", l.accumulation);
}

nlohmann::json to_json(const Candidate& c, int64_t seq, const std::vector<std::string>& sets) {
  const ParallelLayout& l = c.layout;
  return {{"sp", l.sp}, {"ulysses", l.sp / l.ring}, {"ring", l.ring}, {"dp", l.dp}, {"expert_parallel_size", l.ep},
          {"zero_stage", l.zero_stage},
          {"activation_checkpointing", l.checkpointing}, {"tiled_mlp", l.tiled_mlp}, {"tiled_loss", l.tiled_loss},
          {"micro_batch", l.micro_batch}, {"accumulation", l.accumulation}, {"seq_len", seq},
          {"padded_seq_len", padded_seq(l, seq)}, {"peak_bytes", c.peak_bytes}, {"full_plan", c.full_plan},
          {"step_s", c.cost.step_s}, {"compute_s", c.cost.compute_s}, {"all_to_all_s", c.cost.all_to_all_s},
          {"ring_s", c.cost.ring_s}, {"expert_s", c.cost.expert_s}, {"zero_s", c.cost.zero_s}, {"tokens_per_s", c.cost.tokens_per_s}, {"set", sets}};
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-plan", [&] {
    cxxopts::Options opts("autosp-plan", "Choose the parallel layout and memory savers for a model, a length and a cluster");
    opts.add_options()("config", "config JSON file (the model; what is searched is overridden)",
                       cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value)", cxxopts::value<std::vector<std::string>>())(
        "seq-len", "sequence length S to plan for", cxxopts::value<std::string>())(
        "longest", "find the longest S that fits instead, and its layout")(
        "ranks", "number of ranks (GPUs, or processes on a CPU)", cxxopts::value<std::string>())(
        "device", "device of every rank: " + known_device_names(), cxxopts::value<std::string>())(
        "memory", "bytes per rank (e.g. 80GiB, 141e9; with --device: instead of its memory)",
        cxxopts::value<std::string>())(
        "reserve", "fraction of the memory kept free for what the plan does not hold (default 0.1)",
        cxxopts::value<std::string>())(
        "tflops", "achieved TFLOP/s per rank (default: the device's peak x 0.4)", cxxopts::value<std::string>())(
        "intra-gbps", "bandwidth inside a node, GB/s per rank (default: the device's)", cxxopts::value<std::string>())(
        "inter-gbps", "bandwidth between nodes, GB/s per rank (default: the device's)", cxxopts::value<std::string>())(
        "ranks-per-node", "ranks per node (default: 8 for GPUs)", cxxopts::value<std::string>())(
        "global-batch", "sequences per optimizer step: searches micro-batch x accumulation x dp",
        cxxopts::value<std::string>())(
        "top", "how many layouts to print", cxxopts::value<std::string>()->default_value("5"))(
        "multiple", "--longest: S is a multiple of this", cxxopts::value<std::string>()->default_value("1024"))(
        "max-seq", "--longest: the longest S to consider", cxxopts::value<std::string>())(
        "only-config", "search nothing: the config's own layout, its planned peak and estimated step")(
        "write-config", "also write the first layout's whole config (resolved, JSON) to this file",
        cxxopts::value<std::string>())(
        "format", "text|json", cxxopts::value<std::string>()->default_value("text"))("h,help", "show help");
    const auto parsed = parse_flags(opts, argc, argv);
    if (!parsed) return 0;  // --help
    const cxxopts::ParseResult& args = *parsed;
    if (!args.count("config")) throw UsageError("--config is required");
    if (!args.count("ranks")) throw UsageError("--ranks is required");
    const bool longest = args.count("longest") > 0;
    if (longest == (args.count("seq-len") > 0)) throw UsageError("give one of --seq-len S and --longest");
    if (!args.count("device") && !args.count("memory"))
      throw UsageError(str("--device or --memory is required (known devices: ", known_device_names(), ")"));
    const std::string format = args["format"].as<std::string>();
    if (format != "text" && format != "json") throw UsageError(str("--format '", format, "': expected text or json"));

    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    SearchRequest r;
    r.config = load_config(args["config"].as<std::string>(), sets);
    r.ranks = parse_int_flag("ranks", args["ranks"].as<std::string>());
    if (r.ranks < 1 || r.ranks > 65536) throw UsageError(str("--ranks ", r.ranks, ": expected 1..65536"));
    if (!longest) {
      r.seq_len = parse_int_flag("seq-len", args["seq-len"].as<std::string>());
      constexpr int64_t kMaxSeq = int64_t{1} << 26;  // data.seq_len's range (config/config.cpp)
      if (r.seq_len < 1 || r.seq_len > kMaxSeq)
        throw UsageError(str("--seq-len ", r.seq_len, ": expected 1..", kMaxSeq, " (data.seq_len's range)"));
    }
    Cluster c = for_ranks(args.count("device") ? find_device(args["device"].as<std::string>()) : find_device("cpu"), r.ranks);
    if (args.count("memory")) c.memory_bytes = parse_bytes("memory", args["memory"].as<std::string>());
    if (args.count("reserve")) c.reserve_fraction = parse_number("reserve", args["reserve"].as<std::string>(), 0, 0.9, false);
    if (args.count("tflops")) {
      c.peak_tflops = parse_positive("tflops", args["tflops"].as<std::string>());
      c.achieved_fraction = 1;
    }
    if (args.count("intra-gbps")) c.intra.bytes_per_s = parse_positive("intra-gbps", args["intra-gbps"].as<std::string>()) * 1e9;
    if (args.count("inter-gbps")) c.inter.bytes_per_s = parse_positive("inter-gbps", args["inter-gbps"].as<std::string>()) * 1e9;
    if (args.count("ranks-per-node")) {
      c.ranks_per_node = parse_int_flag("ranks-per-node", args["ranks-per-node"].as<std::string>());
      if (c.ranks_per_node < 1) throw UsageError(str("--ranks-per-node ", c.ranks_per_node, ": expected at least 1"));
      if (c.ranks_per_node < r.ranks && r.ranks % c.ranks_per_node != 0)
        throw UsageError(str("--ranks-per-node ", c.ranks_per_node, " does not divide --ranks ", r.ranks,
                             " (every node holds the same number of ranks)"));
    }
    r.cluster = c;
    if (args.count("global-batch")) {
      r.global_batch = parse_int_flag("global-batch", args["global-batch"].as<std::string>());
      if (r.global_batch < 1) throw UsageError(str("--global-batch ", r.global_batch, ": expected at least 1"));
    }
    const int64_t top = parse_int_flag("top", args["top"].as<std::string>());
    if (top < 1 || top > 100) throw UsageError(str("--top ", top, ": expected 1..100"));
    r.top = static_cast<int>(top);
    if (args.count("only-config")) {
      if (args.count("global-batch")) throw UsageError("--only-config takes the batch from the config, not --global-batch");
      r.vary_sp = r.vary_ring = r.vary_zero = r.vary_checkpointing = r.vary_tiled_mlp = r.vary_tiled_loss = r.vary_ep =
          false;
    }

    const auto t0 = std::chrono::steady_clock::now();
    SearchResult res;
    if (longest) {
      const int64_t multiple = parse_int_flag("multiple", args["multiple"].as<std::string>());
      if (multiple < 1) throw UsageError(str("--multiple ", multiple, ": expected at least 1"));
      int64_t max_seq = int64_t{1} << 26;
      if (args.count("max-seq")) max_seq = parse_int_flag("max-seq", args["max-seq"].as<std::string>());
      const PositionsCheck pos = check_positions(r.config.model, max_seq, "--max-seq");
      if (!pos.refused.empty()) max_seq = r.config.model.max_position_embeddings;  // learned positions end there
      if (max_seq < multiple) throw UsageError(str("--max-seq ", max_seq, ": expected at least --multiple ", multiple));
      const LongestResult l = search_longest(r, multiple, max_seq);
      r.seq_len = l.seq > 0 ? l.seq : multiple;
      res = l.at;
    } else {
      const PositionsCheck pos = check_positions(r.config.model, r.seq_len, str("--seq-len ", r.seq_len));
      if (!pos.refused.empty()) throw UsageError(pos.refused);
      if (!pos.warning.empty()) spdlog::warn("{}", pos.warning);
      res = search_layouts(r);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const std::string config_path = args["config"].as<std::string>();
    auto run_line = [&](const Candidate& cand) {
      std::vector<std::string> s = sets;
      if (c.device != "cpu" && r.config.runtime.device != DeviceKind::cuda) s.push_back("runtime.device=cuda");
      s.push_back(str("data.seq_len=", r.seq_len));
      for (const std::string& x : cand.layout.sets()) s.push_back(x);
      return s;
    };
    // The first layout as a whole config: the user's config with its --set lines, parsed as
    // autosp-train parses them (so the file is exactly what runs), written out resolved.
    if (args.count("write-config") && !res.best.empty()) {
      const std::string path = args["write-config"].as<std::string>();
      const Config chosen = parse_config(r.config.resolved, run_line(res.best.front()), path);
      std::ofstream f(path);
      if (!(f << chosen.resolved.dump(2) << "\n"))
        throw UsageError(str("--write-config ", path, ": cannot write"));
    }
    const double usable = c.usable_bytes();
    if (format == "json") {
      nlohmann::json j = {{"seq_len", r.seq_len}, {"ranks", r.ranks}, {"usable_bytes", usable},
                          {"layouts", res.layouts}, {"programs_planned", res.planned}, {"seconds", seconds},
                          {"notes", res.notes}, {"best", nlohmann::json::array()}};
      for (const Candidate& cand : res.best) j["best"].push_back(to_json(cand, r.seq_len, run_line(cand)));
      if (res.best.empty() && res.closest) {
        j["closest"] = to_json(*res.closest, r.seq_len, run_line(*res.closest));
        j["closest"]["over_bytes"] = res.closest->peak_bytes - usable;
      }
      std::cout << j.dump(1) << "\n";
    } else {
      const ModelConfig& m = r.config.model;
      std::cout << "model: " << m.num_hidden_layers << " layers, hidden " << m.hidden_size << ", "
                << m.num_attention_heads << " heads, " << m.num_key_value_heads << " KV heads; S = " << r.seq_len
                << (longest ? " (the longest that fits)" : "") << "\n"
                << "cluster: " << r.ranks << " ranks" << (c.device.empty() ? "" : " of " + c.device) << ", "
                << gb(usable) << " usable each, " << c.achieved_flops() / 1e12 << " TFLOP/s achieved each, "
                << c.intra.bytes_per_s / 1e9 << " GB/s inside a node"
                << (c.ranks_per_node >= r.ranks ? std::string(" (all on one)")
                                                : str(" (", c.ranks_per_node, " ranks), ", c.inter.bytes_per_s / 1e9,
                                                      " GB/s between nodes"))
                << "\n"
                << "searched " << res.layouts << " layouts, planned " << res.planned << " programs in "
                << std::round(seconds * 100) / 100 << " s\n";
      for (const std::string& n : res.notes) std::cout << "note: " << n << "\n";
      int i = 0;
      for (const Candidate& cand : res.best) {
        std::cout << "\n" << ++i << ". " << describe(cand.layout) << "\n   peak " << gb(cand.peak_bytes)
                  << " per rank (planned) | step " << cand.cost.step_s << " s (compute " << cand.cost.compute_s
                  << ", all-to-all " << cand.cost.all_to_all_s << ", ring " << cand.cost.ring_s
                  << (cand.layout.ep > 1 ? str(", experts ", cand.cost.expert_s) : std::string()) << ", ZeRO "
                  << cand.cost.zero_s << ") | " << std::llround(cand.cost.tokens_per_s) << " tokens/s\n   "
                  << (r.ranks > 1 ? str("mpirun -np ", r.ranks, " ") : std::string()) << "build/bin/autosp-train --config "
                  << config_path;
        for (const std::string& s : run_line(cand)) std::cout << " --set " << s;
        std::cout << "\n";
      }
      if (res.best.empty()) {
        std::cout << "\nnothing fits in " << gb(usable) << " per rank";
        if (res.closest)
          std::cout << ": the closest is " << describe(res.closest->layout) << ", planned at "
                    << gb(res.closest->peak_bytes) << " per rank, " << gb(res.closest->peak_bytes - usable) << " ("
                    << std::round((res.closest->peak_bytes / usable - 1) * 1000) / 10 << "%) over";
        else
          std::cout << ": no layout of " << r.ranks << " ranks is valid for this model";
        std::cout << "\n";
      }
    }
    return res.best.empty() ? kExitNoFit : 0;
  });
}
