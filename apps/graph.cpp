// autosp-graph: print the model's graph at a stage of the pipeline, for one rank of a world.
//   autosp-graph --config F --world P --rank R [--stage forward|autosp|joint|PASS] [--format text|json|dot]
#include <algorithm>
#include <cstdio>
#include <iostream>

#include <spdlog/spdlog.h>

#include "graph/printer.h"
#include "config/config.h"
#include "models/model.h"
#include "tools/cli.h"
#include "tools/options.h"
#include "compiler/program.h"
#include "tools/layout_search.h"
#include "tools/plan_summary.h"

using namespace autosp;

namespace {

// "S=16384,B=1" → {S: 16384, B: 1}; B defaults to 1.
Bindings parse_bindings(const std::string& text) {
  Bindings b{{"B", 1}};
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError(str("--plan-memory '", text, "': expected SYMBOL=SIZE,..."));
    int64_t v = parse_int_flag("plan-memory " + item.substr(0, eq), item.substr(eq + 1));
    if (v < 1) throw UsageError(str("--plan-memory ", item, ": sizes must be >= 1"));
    b[item.substr(0, eq)] = v;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (!b.count("S")) throw UsageError(str("--plan-memory '", text, "': S is required"));
  return b;
}

// The program is not torn down: the process ends right after it is printed, and the system takes
// back its pages at once, where freeing ~500k nodes one by one (names, attributes, shapes, use
// lists) took a fifth of planning a 48-layer MoE under ZeRO-3 (decision 205). A static pointer
// keeps it reachable to the end, so a leak checker sees no leak.
void keep_until_exit(RankProgram&& prog) {
  static const RankProgram* const kept = new RankProgram(std::move(prog));
  (void)kept;
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-graph", [&] {
    cxxopts::Options opts("autosp-graph", "Print the model graph at a stage of the AutoSP pipeline");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value)", cxxopts::value<std::vector<std::string>>())(
        "world", "world size", cxxopts::value<std::string>()->default_value("1"))(
        "rank", "rank to show", cxxopts::value<std::string>()->default_value("0"))(
        "stage", "forward|autosp (or rank_forward)|joint, or the name of a pass to stop after (default: forward; "
        "joint with --plan-memory)",
        cxxopts::value<std::string>())(
        "format", "text|json|dot", cxxopts::value<std::string>()->default_value("text"))(
        "plan-memory", "instead of the graph, print the memory plan of the training program (or of --stage) for "
        "sizes like S=16384,B=1 (JSON)",
        cxxopts::value<std::string>())("h,help", "show help");
    const auto parsed = parse_flags(opts, argc, argv);
    if (!parsed) return 0;  // --help
    const cxxopts::ParseResult& args = *parsed;
    if (!args.count("config")) throw UsageError("--config is required");
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    Config cfg = load_config(args["config"].as<std::string>(), sets);
    const int64_t world = parse_int_flag("world", args["world"].as<std::string>());
    const int64_t rank = parse_int_flag("rank", args["rank"].as<std::string>());
    if (world < 1 || world > 65536) throw UsageError(str("--world ", world, ": expected 1..65536"));
    if (rank < 0 || rank >= world) throw UsageError(str("--rank ", rank, ": expected 0 <= rank < ", world));
    // A memory plan is of the training step (forward and backward) unless a stage is asked for.
    const std::string stage = args.count("stage")         ? args["stage"].as<std::string>()
                              : args.count("plan-memory") ? "joint"
                                                          : "forward";
    const std::string format = args["format"].as<std::string>();
    if (format != "text" && format != "json" && format != "dot")
      throw UsageError(str("--format '", format, "': expected text, json or dot"));

    // A plan for a length the model cannot take (learned positions) is refused before anything is
    // built; one past RoPE's trained positions is made, with a warning.
    Bindings b;
    if (args.count("plan-memory")) {
      b = parse_bindings(args["plan-memory"].as<std::string>());
      const PositionsCheck pos = check_positions(cfg.model, b.at("S"), str("--plan-memory S=", b.at("S")));
      if (!pos.refused.empty()) throw UsageError(pos.refused);
      if (!pos.warning.empty()) spdlog::warn("{}", pos.warning);
    }
    if (!cfg.auto_keys.empty()) cfg = resolve_auto(cfg, world, run_cluster(cfg, world));  // "auto" layout keys, as autosp-train resolves them
    const RankLayout layout =
        rank_layout(world, rank, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size);
    RankProgram prog = build_program(cfg, cfg.runtime.dtype, stage, layout);  // a stage or a pass name
    const Graph* g = prog.graph.get();  // verified (graph/passes/pass.h: after each pass, or once in Release)
    if (args.count("plan-memory"))
      std::cout << plan_summary(prog, b, cfg, static_cast<int>(world), cfg.runtime.device).dump() << "\n";
    else if (format == "text")
      std::cout << to_text(*g);
    else if (format == "json")
      std::cout << to_json(*g).dump(1) << "\n";
    else
      std::cout << to_dot(*g);
    keep_until_exit(std::move(prog));
    return 0;
  });
}
