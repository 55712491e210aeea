// autosp-graph: print the model's graph at a stage of the pipeline, for one rank of a world.
//   autosp-graph --config F --world P --rank R [--stage forward] [--format text|json|dot]
#include <cstdio>
#include <cxxopts.hpp>
#include <iostream>

#include "graph/printer.h"
#include "graph/verify.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/cli.h"
#include "runtime/program.h"

using namespace autosp;

int main(int argc, char** argv) {
  return run_app("autosp-graph", [&] {
    cxxopts::Options opts("autosp-graph", "Print the model graph at a stage of the AutoSP pipeline");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value)", cxxopts::value<std::vector<std::string>>())(
        "world", "world size", cxxopts::value<std::string>()->default_value("1"))(
        "rank", "rank to show", cxxopts::value<std::string>()->default_value("0"))(
        "stage", "forward|autosp|joint", cxxopts::value<std::string>()->default_value("forward"))(
        "format", "text|json|dot", cxxopts::value<std::string>()->default_value("text"))("h,help", "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      std::cout << opts.help() << std::endl;
      return 0;
    }
    if (!args.unmatched().empty()) throw UsageError(str("unexpected argument '", args.unmatched()[0], "'"));
    if (!args.count("config")) throw UsageError("--config is required");
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    Config cfg = load_config(args["config"].as<std::string>(), sets);
    const int64_t world = parse_int_flag("world", args["world"].as<std::string>());
    const int64_t rank = parse_int_flag("rank", args["rank"].as<std::string>());
    if (world < 1 || world > 65536) throw UsageError(str("--world ", world, ": expected 1..65536"));
    if (rank < 0 || rank >= world) throw UsageError(str("--rank ", rank, ": expected 0 <= rank < ", world));
    const std::string stage = args["stage"].as<std::string>(), format = args["format"].as<std::string>();
    if (stage != "forward" && stage != "autosp" && stage != "joint")
      throw UsageError(str("--stage '", stage, "': expected forward, autosp or joint"));
    if (format != "text" && format != "json" && format != "dot")
      throw UsageError(str("--format '", format, "': expected text, json or dot"));

    const Stage st = stage == "forward" ? Stage::forward : stage == "autosp" ? Stage::autosp : Stage::joint;
    const PassContext ctx = pass_context(cfg, static_cast<int>(world), static_cast<int>(rank));
    RankProgram prog = build_program(cfg, cfg.runtime.dtype == "float64" ? DType::f64 : DType::f32, st, ctx);
    const Graph* g = prog.graph.get();
    verify(*g);
    if (format == "text")
      std::cout << to_text(*g);
    else if (format == "json")
      std::cout << to_json(*g).dump(1) << "\n";
    else
      std::cout << to_dot(*g);
    return 0;
  });
}
