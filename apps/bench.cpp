// autosp-bench: time a model step on this machine, optionally against PyTorch (2.x eager and
// torch.compile, Debian's 1.13), alternated; time the CPU attention kernel against PyTorch's SDPA;
// sweep models × P × seq_len (multi-rank points under mpirun); project the scaling model.
//   autosp-bench --config F [--set k=v]... [--mode forward|step] [--warmup W] [--iters I]
//                [--compare-pytorch [--pytorch-compile] [--pytorch-debian] [--pairs K]]
//   autosp-bench --config F --sweep-seq 1024,2048 --sweep-ranks 1,2,4 [--models a.json,b.json]
//                [--out results.csv|.jsonl] [--mode step] [--compare-pytorch]
//   autosp-bench --project [--project-config P.json] [--compute-tflops X | --compute-from results.jsonl]
//   autosp-bench --mode attention [--attn-seq 1024,4096] [--attn-dims 16,64,128] [--attn-hidden C] [--attn-group G]
//                [--attn-full] [--attn-doc-len L] [--attn-window W] [--threads T] [--pairs K] [--compare-pytorch] [--no-check]
//                (tools/bench_attention.h)
//   autosp-bench --mode ring [--attn-seq 4096,16384] [--ring-sizes 4] [--attn-dims 64] [--attn-hidden C]
//                [--attn-group G] [--attn-window W] [--threads T] [--pairs K]   (tools/bench_ring.h: each
//                ring rank's attention time, zigzag against contiguous chunks, or without against
//                with a window, and the bytes each rank sends)
//   autosp-bench --mode gemm [--threads T] [--pairs K] [--iters I] [--warmup W]   (tools/bench_gemm.h)
//   autosp-bench --mode compile --config F [--set k=v]... [--compile-layers 32,64,128] [--compile-world W]
//                [--iters I]   (tools/bench_compile.h: each pass's time as the model deepens)
//   autosp-bench --point ...   (internal: one sweep point on the mpirun world; rank 0 prints the row)
#include <filesystem>
#include <iostream>
#include <sstream>

#include "tools/bench.h"
#include "tools/bench_attention.h"
#include "tools/bench_compile.h"
#include "tools/bench_gemm.h"
#include "tools/bench_ring.h"
#include "tools/cli.h"
#include "tools/options.h"
#include "tools/py_worker.h"
#include "tools/scaling.h"
#include "tensor/check.h"

using namespace autosp;

namespace {

// "1024,2048" → {1024, 2048}; every item a positive integer, else a UsageError naming the flag.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int64_t v = parse_int_flag(flag, item);
    if (v < 1) throw UsageError(str("--", flag, " ", v, ": expected positive integers"));
    out.push_back(v);
  }
  if (out.empty() || text.back() == ',') throw UsageError(str("--", flag, " '", text, "': expected a comma-separated list of integers"));
  return out;
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw UsageError(str("--", flag, " '", text, "': empty item"));
    out.push_back(item);
  }
  if (out.empty()) throw UsageError(str("--", flag, ": expected a comma-separated list"));
  return out;
}

double parse_positive(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && v > 0 && v < 1e9) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(str("--", flag, " '", text, "': expected a positive number"));
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-bench", [&] {
    cxxopts::Options opts("autosp-bench", "Benchmark a model step (and PyTorch eager with --compare-pytorch)");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value)", cxxopts::value<std::vector<std::string>>())(
        "mode", "forward or step (sweeps: step); attention or gemm: kernel benchmarks; ring: ring attention's "
        "work per ring rank; compile: the compiler's passes", cxxopts::value<std::string>())(
        "warmup", "untimed iterations", cxxopts::value<std::string>()->default_value("1"))(
        "iters", "timed iterations (the median is reported)", cxxopts::value<std::string>()->default_value("5"))(
        "compare-pytorch", "also run the same model in PyTorch 2.x eager (the .venv-bench venv, made on first use by "
        "scripts/pytorch-venv.sh), alternated; with runtime.dtype=bfloat16 PyTorch runs under "
        "torch.autocast bfloat16 (column pytorch_precision); sweeps: P = 1 points, not alternated")(
        "pytorch-compile", "--compare-pytorch: also PyTorch 2.x under torch.compile")(
        "pytorch-debian", "--compare-pytorch: also Debian's PyTorch 1.13 (/usr/bin/python3)")(
        "sweep-seq", "sweep these sequence lengths (comma-separated)", cxxopts::value<std::string>())(
        "sweep-ranks", "sweep these SP degrees P (comma-separated; P > 1 runs under mpirun -np P)",
        cxxopts::value<std::string>())(
        "models", "sweep these config files (comma-separated) instead of --config", cxxopts::value<std::string>())(
        "out", "write the sweep's rows to this .csv or .jsonl file", cxxopts::value<std::string>())(
        "project", "print the scaling projection (docs/scaling.md)")(
        "project-config", "projection parameters (JSON; default: built-in Llama-3-8B on H200s)",
        cxxopts::value<std::string>())(
        "compute-tflops", "projection: achieved TFLOP/s per GPU", cxxopts::value<std::string>())(
        "compute-from", "projection: take the achieved TFLOP/s from a sweep's .jsonl (P = 1, longest seq)",
        cxxopts::value<std::string>())(
        "peak-tflops", "device peak TFLOP/s for the MFU column (CUDA runs)", cxxopts::value<std::string>())(
        "point", "internal: run one sweep point on the mpirun world")("h,help", "show help");
    opts.add_options("attention")("attn-seq", "--mode attention: sequence lengths", cxxopts::value<std::string>())(
        "attn-dims", "--mode attention: head dims", cxxopts::value<std::string>())(
        "attn-hidden", "--mode attention: N·D (heads = hidden / D)", cxxopts::value<std::string>())(
        "attn-group", "--mode attention: query heads per kv head (GQA)", cxxopts::value<std::string>())(
        "attn-full", "--mode attention: no causal mask")(
        "attn-doc-len", "--mode attention: also time packed documents of this mean length (document mask)",
        cxxopts::value<std::string>())(
        "attn-window",
        "--mode attention: also time a sliding window of this many keys (and PyTorch's flex attention); "
        "--mode ring: the ring without and with this window, and the bytes each rank sends",
        cxxopts::value<std::string>())(
        "threads", "--mode attention, gemm, ring: threads (default: all cores; ring: 1)", cxxopts::value<std::string>())(
        "ring-sizes", "--mode ring: ring sizes R (default 4)", cxxopts::value<std::string>())(
        "pairs", "alternated turns of each side", cxxopts::value<std::string>())(
        "no-check", "--mode attention: skip the check of our outputs against PyTorch's");
    opts.add_options("compile")("compile-layers", "--mode compile: layer counts (default 32,64,128)",
                                cxxopts::value<std::string>())(
        "compile-world", "--mode compile: the world (rank 0 of it; default sequence_parallel.autosp_size)",
        cxxopts::value<std::string>());
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      std::cout << opts.help() << std::endl;
      return 0;
    }
    if (!args.unmatched().empty()) throw UsageError(str("unexpected argument '", args.unmatched()[0], "'"));
    const bool project = args.count("project") > 0, point = args.count("point") > 0;
    const bool sweep = args.count("sweep-seq") || args.count("sweep-ranks") || args.count("models") || args.count("out");
    for (const char* f : {"project-config", "compute-tflops", "compute-from"})
      if (args.count(f) && !project) throw UsageError(str("--", f, " needs --project"));
    if (project + point + sweep > 1) throw UsageError("--project, --point and the sweep flags exclude each other");

    if (project) {
      if (args.count("config") || args.count("set"))
        throw UsageError("--project takes its model from --project-config (docs/scaling.md), not --config/--set");
      if (args.count("compute-tflops") && args.count("compute-from"))
        throw UsageError("--compute-tflops and --compute-from exclude each other");
      ProjectionConfig pc = args.count("project-config") ? load_projection_config(args["project-config"].as<std::string>())
                                                         : parse_projection_config(nlohmann::json::object(), "built-in defaults");
      if (args.count("compute-tflops")) pc.achieved_tflops = parse_positive("compute-tflops", args["compute-tflops"].as<std::string>());
      if (args.count("compute-from")) {
        const std::string from = args["compute-from"].as<std::string>();
        pc.achieved_tflops = measured_tflops(from);
        pc.source += ", compute measured in " + from;
      }
      std::cout << projection_report(pc);
      return 0;
    }

    if (args.count("mode") && args["mode"].as<std::string>() == "attention") {
      if (sweep || point || args.count("config")) throw UsageError("--mode attention takes no --config or sweep flags");
      AttentionBenchOptions ao;
      if (args.count("attn-seq")) ao.seqs = parse_int_list("attn-seq", args["attn-seq"].as<std::string>());
      if (args.count("attn-dims")) ao.dims = parse_int_list("attn-dims", args["attn-dims"].as<std::string>());
      if (args.count("attn-hidden")) ao.hidden = parse_int_list("attn-hidden", args["attn-hidden"].as<std::string>()).at(0);
      if (args.count("attn-group")) ao.group = parse_int_list("attn-group", args["attn-group"].as<std::string>()).at(0);
      if (args.count("threads")) ao.threads = int(parse_int_list("threads", args["threads"].as<std::string>()).at(0));
      if (args.count("pairs")) ao.pairs = int(parse_int_list("pairs", args["pairs"].as<std::string>()).at(0));
      ao.warmup = int(parse_int_flag("warmup", args["warmup"].as<std::string>()));
      if (ao.warmup < 0 || ao.warmup > 1000) throw UsageError(str("--warmup ", ao.warmup, ": expected 0..1000"));
      if (args.count("iters")) ao.iters = int(parse_int_list("iters", args["iters"].as<std::string>()).at(0));
      ao.causal = args.count("attn-full") == 0;
      if (args.count("attn-doc-len")) {
        ao.doc_len = parse_int_list("attn-doc-len", args["attn-doc-len"].as<std::string>()).at(0);
        if (!ao.causal) throw UsageError("--attn-doc-len: the document mask is causal; drop --attn-full");
      }
      if (args.count("attn-window")) {
        ao.window = parse_int_list("attn-window", args["attn-window"].as<std::string>()).at(0);
        if (ao.window <= 0) throw UsageError(str("--attn-window ", ao.window, ": expected a window of at least 1 key"));
        if (!ao.causal) throw UsageError("--attn-window: the sliding window is causal; drop --attn-full");
      }
      ao.compare_pytorch = args.count("compare-pytorch") > 0;
      ao.check = args.count("no-check") == 0;
      ao.source_dir = AUTOSP_SOURCE_DIR;
      run_attention_bench(ao, [](const nlohmann::json& row) { std::cout << row.dump() << std::endl; });
      return 0;
    }

    if (args.count("mode") && args["mode"].as<std::string>() == "ring") {
      if (sweep || point || args.count("config") || args.count("compare-pytorch"))
        throw UsageError("--mode ring takes no --config, sweep or PyTorch flags");
      for (const char* f : {"attn-full", "attn-doc-len", "no-check"})
        if (args.count(f)) throw UsageError(str("--", f, " is not a --mode ring flag"));
      RingBenchOptions ro;
      if (args.count("attn-seq")) ro.seqs = parse_int_list("attn-seq", args["attn-seq"].as<std::string>());
      if (args.count("ring-sizes")) ro.rings = parse_int_list("ring-sizes", args["ring-sizes"].as<std::string>());
      if (args.count("attn-dims")) ro.dim = parse_int_list("attn-dims", args["attn-dims"].as<std::string>()).at(0);
      if (args.count("attn-hidden")) ro.hidden = parse_int_list("attn-hidden", args["attn-hidden"].as<std::string>()).at(0);
      if (args.count("attn-group")) ro.group = parse_int_list("attn-group", args["attn-group"].as<std::string>()).at(0);
      if (args.count("threads")) ro.threads = int(parse_int_list("threads", args["threads"].as<std::string>()).at(0));
      if (args.count("pairs")) ro.pairs = int(parse_int_list("pairs", args["pairs"].as<std::string>()).at(0));
      if (args.count("attn-window")) {
        ro.window = parse_int_list("attn-window", args["attn-window"].as<std::string>()).at(0);
        if (ro.window <= 0) throw UsageError(str("--attn-window ", ro.window, ": expected a window of at least 1 key"));
      }
      ro.warmup = int(parse_int_flag("warmup", args["warmup"].as<std::string>()));
      if (args.count("iters")) ro.iters = int(parse_int_list("iters", args["iters"].as<std::string>()).at(0));
      run_ring_bench(ro, [](const nlohmann::json& row) { std::cout << row.dump() << std::endl; });
      return 0;
    }

    if (args.count("mode") && args["mode"].as<std::string>() == "gemm") {
      if (sweep || point || args.count("config") || args.count("compare-pytorch"))
        throw UsageError("--mode gemm takes no --config, sweep or PyTorch flags (it compares with OpenBLAS)");
      GemmBenchOptions go;
      if (args.count("threads")) go.threads = int(parse_int_list("threads", args["threads"].as<std::string>()).at(0));
      if (args.count("pairs")) go.pairs = int(parse_int_list("pairs", args["pairs"].as<std::string>()).at(0));
      go.warmup = int(parse_int_flag("warmup", args["warmup"].as<std::string>()));
      if (go.warmup < 0 || go.warmup > 1000) throw UsageError(str("--warmup ", go.warmup, ": expected 0..1000"));
      if (args.count("iters")) go.iters = int(parse_int_list("iters", args["iters"].as<std::string>()).at(0));
      run_gemm_bench(go, [](const nlohmann::json& row) { std::cout << row.dump() << std::endl; });
      return 0;
    }

    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    if (args.count("mode") && args["mode"].as<std::string>() == "compile") {
      if (sweep || point || args.count("compare-pytorch")) throw UsageError("--mode compile takes no sweep or PyTorch flags");
      if (!args.count("config")) throw UsageError("--config is required");
      CompileBenchOptions co;
      co.config = load_config(args["config"].as<std::string>(), sets);
      if (args.count("compile-layers")) co.layers = parse_int_list("compile-layers", args["compile-layers"].as<std::string>());
      if (args.count("compile-world"))
        co.world = int(parse_int_list("compile-world", args["compile-world"].as<std::string>()).at(0));
      if (args.count("iters")) co.iters = int(parse_int_list("iters", args["iters"].as<std::string>()).at(0));
      run_compile_bench(co, [](const nlohmann::json& row) { std::cout << row.dump() << std::endl; });
      return 0;
    }
    BenchOptions opt;
    opt.mode = args.count("mode") ? args["mode"].as<std::string>() : (sweep || point ? "step" : "forward");
    const int64_t warmup = parse_int_flag("warmup", args["warmup"].as<std::string>());
    const int64_t iters = parse_int_flag("iters", args["iters"].as<std::string>());
    if (warmup < 0 || warmup > 100000) throw UsageError(str("--warmup ", warmup, ": expected 0..100000"));
    if (iters < 1 || iters > 100000) throw UsageError(str("--iters ", iters, ": expected 1..100000"));
    if (opt.mode != "forward" && opt.mode != "step")
      throw UsageError(str("--mode '", opt.mode, "': expected forward, step, attention, ring, gemm or compile"));
    opt.warmup = static_cast<int>(warmup);
    opt.iters = static_cast<int>(iters);
    opt.compare_pytorch = args.count("compare-pytorch") > 0;
    opt.pytorch_compile = args.count("pytorch-compile") > 0;
    opt.pytorch_debian = args.count("pytorch-debian") > 0;
    if ((opt.pytorch_compile || opt.pytorch_debian) && !opt.compare_pytorch)
      throw UsageError("--pytorch-compile and --pytorch-debian need --compare-pytorch");
    if (args.count("pairs")) opt.pairs = int(parse_int_list("pairs", args["pairs"].as<std::string>()).at(0));
    opt.source_dir = AUTOSP_SOURCE_DIR;
    if (args.count("peak-tflops")) opt.peak_tflops = parse_positive("peak-tflops", args["peak-tflops"].as<std::string>());

    if (sweep) {
      if (opt.compare_pytorch) opt.pytorch_python = venv_python(opt.source_dir);
      SweepOptions so;
      so.bench = opt;
      so.overrides = sets;
      if (args.count("models")) so.configs = parse_list("models", args["models"].as<std::string>());
      else if (args.count("config")) so.configs = {args["config"].as<std::string>()};
      else throw UsageError("--config or --models is required");
      if (args.count("models") && args.count("config"))
        throw UsageError("--models replaces --config: give one of them");
      so.ranks = args.count("sweep-ranks") ? parse_int_list("sweep-ranks", args["sweep-ranks"].as<std::string>())
                                           : std::vector<int64_t>{1};
      if (args.count("sweep-seq")) {
        so.seqs = parse_int_list("sweep-seq", args["sweep-seq"].as<std::string>());
      } else {
        so.seqs = {load_config(so.configs.front(), sets).data.seq_len};
      }
      if (args.count("out")) so.out = args["out"].as<std::string>();
      so.self = std::filesystem::read_symlink("/proc/self/exe").string();
      const int failed = run_sweep(so, [](const nlohmann::json& row) { std::cout << row.dump() << std::endl; });
      if (failed) {
        std::cerr << "error: " << failed << " sweep point(s) failed (rows with an \"error\" field)\n";
        return kExitRuntime;
      }
      return 0;
    }

    if (!args.count("config")) throw UsageError("--config is required");
    Config cfg = load_config(args["config"].as<std::string>(), sets);
    if (opt.compare_pytorch) {
      check_comparable(cfg);  // before the venv is made
      opt.pytorch_python = venv_python(opt.source_dir);
    }
    for (const auto& w : cfg.warnings) std::cerr << "warning: " << w << "\n";
    if (point) {
      auto world = make_world_communicator();
      nlohmann::json row = run_point(cfg, opt, *world);
      if (world->rank() == 0) std::cout << row.dump() << std::endl;
      return 0;
    }
    std::cout << run_bench(cfg, opt).dump() << std::endl;
    return 0;
  });
}
