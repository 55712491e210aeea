// autosp-train: train a model from a JSON config (see DESIGN.md "Contracts").
//   autosp-train --config FILE [--set key.path=value]... [--steps N] [--init-from W.safetensors]
//                [--resume DIR] [--metrics FILE.jsonl] [--dump-grads FILE.safetensors] [--quiet]
#include <cxxopts.hpp>
#include <iostream>

#include <spdlog/spdlog.h>

#include "comm/communicator.h"
#include "runtime/cli.h"
#include "runtime/trainer.h"
#include "tensor/check.h"

using namespace autosp;

int main(int argc, char** argv) {
  return run_app("autosp-train", [&] {
    cxxopts::Options opts("autosp-train", "Train a GPT-2 or Llama model (launch under mpirun for several ranks)");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value), repeatable", cxxopts::value<std::vector<std::string>>())(
        "steps", "number of steps (overrides train.steps)", cxxopts::value<std::string>())(
        "init-from", "start from these safetensors weights (Hugging Face names)", cxxopts::value<std::string>())(
        "resume", "continue from a checkpoint directory (or the newest under a root)", cxxopts::value<std::string>())(
        "metrics", "append one JSON object per logged step to this file", cxxopts::value<std::string>())(
        "dump-grads", "write the first step's gradients (after all-reduce, before clipping)",
        cxxopts::value<std::string>())("quiet", "no per-step log lines")("h,help", "show this help");
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

    TrainArgs ta;
    if (args.count("steps")) ta.steps = parse_int_flag("steps", args["steps"].as<std::string>());
    auto opt = [&](const char* k) { return args.count(k) ? args[k].as<std::string>() : std::string(); };
    ta.init_from = opt("init-from");
    ta.resume = opt("resume");
    ta.metrics = opt("metrics");
    ta.dump_grads = opt("dump-grads");
    ta.quiet = args.count("quiet") > 0;

    auto world = make_world_communicator();
    if (world->rank() == 0) {
      for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
      spdlog::info("config: {}", cfg.resolved.dump());
    }
    TrainResult r = train(cfg, ta, *world);
    if (world->rank() == 0 && !r.steps.empty()) {
      const auto& first = r.steps.front();
      const auto& last = r.steps.back();
      spdlog::info("done: {} steps, loss {:.4f} -> {:.4f}{}", r.steps.size(), first.loss, last.loss,
                   last.accuracy >= 0 ? fmt::format(", accuracy {:.3f}", last.accuracy) : "");
    }
    return 0;
  });
}
