// autosp-bench: time a model step on this machine, optionally against PyTorch eager.
//   autosp-bench --config F [--set k=v]... [--mode forward] [--warmup W] [--iters I] [--compare-pytorch]
#include <cxxopts.hpp>
#include <iostream>

#include "runtime/bench.h"
#include "runtime/cli.h"
#include "tensor/check.h"

using namespace autosp;

int main(int argc, char** argv) {
  return run_app("autosp-bench", [&] {
    cxxopts::Options opts("autosp-bench", "Benchmark a model step (and PyTorch eager with --compare-pytorch)");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value)", cxxopts::value<std::vector<std::string>>())(
        "mode", "forward", cxxopts::value<std::string>()->default_value("forward"))(
        "warmup", "untimed iterations", cxxopts::value<std::string>()->default_value("1"))(
        "iters", "timed iterations (the median is reported)", cxxopts::value<std::string>()->default_value("5"))(
        "compare-pytorch", "also run the same model in PyTorch eager (/usr/bin/python3)")("h,help", "show help");
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
    for (const auto& w : cfg.warnings) std::cerr << "warning: " << w << "\n";
    BenchOptions opt;
    opt.mode = args["mode"].as<std::string>();
    const int64_t warmup = parse_int_flag("warmup", args["warmup"].as<std::string>());
    const int64_t iters = parse_int_flag("iters", args["iters"].as<std::string>());
    if (warmup < 0 || warmup > 100000) throw UsageError(str("--warmup ", warmup, ": expected 0..100000"));
    if (iters < 1 || iters > 100000) throw UsageError(str("--iters ", iters, ": expected 1..100000"));
    opt.warmup = static_cast<int>(warmup);
    opt.iters = static_cast<int>(iters);
    opt.compare_pytorch = args.count("compare-pytorch") > 0;
    opt.source_dir = AUTOSP_SOURCE_DIR;
    std::cout << run_bench(cfg, opt).dump() << std::endl;
    return 0;
  });
}
