// autosp-train: train a model from a JSON config (see DESIGN.md "Contracts").
//   autosp-train --config FILE [--deepspeed DS.json] [--set key.path=value]... [--steps N] [--init-from W.safetensors]
//                [--resume DIR] [--start-over] [--metrics FILE.jsonl] [--dump-grads FILE.safetensors] [--quiet] [--print-config]
//                [--thread-ranks P]
// --thread-ranks runs P ranks as threads of this process (comm/threads.h) instead of under mpirun:
// SP and DP on one node without MPI, and several ranks on one GPU, where NCCL refuses them.
// --deepspeed applies a DeepSpeed config file onto ours (config/deepspeed.h); its batch rule needs
// the world size, so it is applied once the world is known.
// Rank 0 echoes the resolved config, logs progress and a final summary to stderr and, when
// train.checkpoint_dir is set, to <checkpoint_dir>/train.log as well (appended, every run).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "comm/communicator.h"
#include "comm/threads.h"
#include "config/deepspeed.h"
#include "kernels/cpu/matmul.h"
#include "tools/cli.h"
#include "tools/layout_search.h"
#include "tools/options.h"
#include "tools/text_codec.h"
#include "compiler/program.h"
#include "train/adapter.h"
#include "train/preempt.h"
#include "train/trainer.h"
#include "tensor/check.h"

using namespace autosp;

namespace {

// One line of text: control characters escaped, bytes that are not valid UTF-8 (a byte model's
// guesses need not be) as '?', at most about `max` bytes.
std::string one_line(const std::string& text, size_t max = 160) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (out.size() >= max) return out + "…";
    const unsigned char c = p[i];
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (!ok) {
      out += '?';
      ++i;
    } else if (len > 1) {
      out.append(text, i, len);
      i += len;
    } else {
      if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20 || c == 0x7F) out += '?';
      else out += static_cast<char>(c);
      ++i;
    }
  }
  return out;
}

std::string ids_text(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += str(s.empty() ? "" : " ", id);
  return s;
}

// The end-of-run example of a validation sequence. The synthetic task's line as format_example
// writes it; on real data a short teacher-forced continuation: the last 16 scored positions'
// next-token predictions against the data, after the 32 tokens before them, decoded as bytes
// (data.source text) or with the tokenizer.json beside the shards when there is one and
// scripts/hf-venv.sh's venv already exists (the example never installs anything); else ids.
std::string example_line(const Config& cfg, const ValExample& ex) {
  if (cfg.data.source == DataSourceKind::synthetic) return ex.formatted;
  std::vector<size_t> scored;
  for (size_t t = 0; t < ex.labels.size(); ++t)
    if (ex.labels[t] != -100) scored.push_back(t);
  if (scored.empty()) return "no scored position";
  const size_t first = scored[scored.size() > 16 ? scored.size() - 16 : 0];
  std::vector<int64_t> context(ex.input.begin() + static_cast<std::ptrdiff_t>(first > 31 ? first - 31 : 0),
                               ex.input.begin() + static_cast<std::ptrdiff_t>(first + 1));
  std::vector<int64_t> model, data;
  for (size_t t : scored)
    if (t >= first) model.push_back(ex.predicted[t]), data.push_back(ex.labels[t]);
  const std::string tokenizer = cfg.data.source == DataSourceKind::tokens
                                    ? tokenizer_beside(cfg.data.val_path.empty() ? cfg.data.path : cfg.data.val_path)
                                    : "";
  const bool venv = std::filesystem::exists(std::string(AUTOSP_SOURCE_DIR) + "/.venv-hf/bin/python");
  if (cfg.data.source == DataSourceKind::text || (!tokenizer.empty() && venv)) {
    try {
      TextCodec codec(AUTOSP_SOURCE_DIR, tokenizer, cfg.data.source == DataSourceKind::text);
      return fmt::format("\"{}\" → model \"{}\" | data \"{}\"", one_line(codec.decode(context)),
                         one_line(codec.decode(model)), one_line(codec.decode(data)));
    } catch (const std::exception&) {  // the example is a courtesy: ids below
    }
  }
  return fmt::format("next-token ids: model [{}] | data [{}] (no tokenizer.json beside the data to decode them)",
                     ids_text(model), ids_text(data));
}

constexpr const char* kEnvHelp = R"(
Environment:
  AUTOSP_COLLECTIVE_TIMEOUT  seconds one rank may wait in a collective before it aborts the job
                             (default 600)
  AUTOSP_FAULT               fault injection for tests: rank:R,step:K,kind:exit|abort|crash|hang|nan
                             [,where:step|checkpoint] (docs/reliability.md)
  AUTOSP_RS_PIECE_BYTES      ZeRO-3: bytes of f32 staging a gradient's reduce-scatter casts into at
                             once (default 1073741824, 1 GiB; docs/decisions.md 102)

Signals: SIGTERM, SIGINT or SIGUSR1 finish the current step, save a checkpoint (rank 0, when
train.checkpoint_dir is set) and exit 4 within train.save_timeout seconds; a second signal exits at once.

Exit codes: 0 success, 2 bad usage, config or input, 3 runtime failure, 4 stopped by a signal after
saving a checkpoint (continue with --resume).
)";

// Rank 0's log also goes to <dir>/train.log: the default logger gets a second sink, and the same
// sink is registered as the logger "train.log" for lines meant only for the file (progress under
// --quiet, the error that ends the run).
void open_run_log(const std::string& dir, int argc, char** argv, int world_size) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError(str("train.checkpoint_dir '", dir, "': cannot create: ", ec.message()));
  const std::string path = (std::filesystem::path(dir) / "train.log").string();
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  } catch (const spdlog::spdlog_ex& e) {
    throw UsageError(str(path, ": cannot open the run log: ", e.what()));
  }
  auto file = std::make_shared<spdlog::logger>("train.log", sink);
  file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [autosp] [%l] %v");  // the default logger's, under its name
  file->flush_on(spdlog::level::info);  // a crash loses nothing already logged
  spdlog::register_logger(file);
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::default_logger()->flush_on(spdlog::level::info);
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += str(i ? " " : "", argv[i]);
  file->info("---- {} ({} rank{})", cmd, world_size, world_size == 1 ? "" : "s");
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-train", [&] {
    cxxopts::Options opts("autosp-train", "Train a GPT-2, Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE, Gemma 2/3 or gpt-oss model (launch under mpirun for several ranks)");
    opts.add_options()("config", "config JSON file", cxxopts::value<std::string>())(
        "deepspeed", "a DeepSpeed config JSON applied onto the config (its batch, optimizer, scheduler, bf16, ZeRO keys)",
        cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value), repeatable", cxxopts::value<std::vector<std::string>>())(
        "steps", "number of steps (overrides train.steps)", cxxopts::value<std::string>())(
        "init-from", "start from these safetensors weights (Hugging Face names)", cxxopts::value<std::string>())(
        "resume", "continue from a checkpoint directory (or the newest under a root)", cxxopts::value<std::string>())(
        "metrics", "append one JSON object per logged step to this file", cxxopts::value<std::string>())(
        "dump-grads", "write the first step's gradients (after all-reduce, before clipping)",
        cxxopts::value<std::string>())("start-over",
                                       "train.checkpoint_dir holds an earlier run: move its checkpoints aside and start again")(
        "quiet", "no per-step log lines on stderr (train.log keeps them)")(
        "thread-ranks", "run P ranks as threads of this process (no mpirun; several ranks may share one GPU)",
        cxxopts::value<std::string>())(
        "print-config", "print the resolved config (every key, with its default where not given) as JSON and exit")(
        "merge-lora", "write the base with the LoRA adapter folded in (W + scale·B·A: lora.from, or --resume's) as a "
        "Hugging Face model directory and exit", cxxopts::value<std::string>())(
        "h,help", "show this help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      std::cout << opts.help() << kEnvHelp << std::flush;
      return 0;
    }
    if (!args.unmatched().empty()) throw UsageError(str("unexpected argument '", args.unmatched()[0], "'"));
    if (!args.count("config")) throw UsageError("--config is required");
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    // --steps is train.steps, the one place that holds the run's step count, set after every --set so
    // that each rule that reads it (the schedule's) sees the steps the run will take.
    if (args.count("steps")) {
      const int64_t steps = parse_int_flag("steps", args["steps"].as<std::string>());
      if (auto problem = config_value_problem("train.steps", steps))
        throw UsageError(str("--steps ", steps, ": ", *problem));
      sets.push_back(str("train.steps=", steps));
    }
    // With --deepspeed the cross-key rules wait for the DeepSpeed file (which may, say, set the lr).
    Config cfg = load_config(args["config"].as<std::string>(), sets, !args.count("deepspeed"));

    TrainArgs ta;
    auto opt = [&](const char* k) { return args.count(k) ? args[k].as<std::string>() : std::string(); };
    ta.init_from = opt("init-from");
    ta.resume = opt("resume");
    ta.metrics = opt("metrics");
    ta.dump_grads = opt("dump-grads");
    ta.quiet = args.count("quiet") > 0;
    ta.start_over = args.count("start-over") > 0;
    ta.config_path = args["config"].as<std::string>();

    int thread_ranks = 0;
    if (args.count("thread-ranks")) {
      // Each rank is a thread with its own program and training state: far past the cores, and
      // past what a process can start, is a mistake to refuse before anything is built.
      constexpr int64_t kMaxThreadRanks = 1024;
      const int64_t n = parse_int_flag("thread-ranks", args["thread-ranks"].as<std::string>());
      if (n < 1 || n > kMaxThreadRanks)
        throw UsageError(str("--thread-ranks ", n, ": expected 1..", kMaxThreadRanks, " (each rank is a thread of this process)"));
      thread_ranks = static_cast<int>(n);
    }

    // One rank: rank 0 also opens the run log, echoes the config and prints the summary.
    auto run_rank = [&](Communicator& world) -> int {
      const bool lead = world.rank() == 0;
      if (lead && !cfg.train.checkpoint_dir.empty())
        open_run_log(cfg.train.checkpoint_dir, argc, argv, world.size());
      try {
        if (lead) {
          for (const auto& w : cfg.warnings) spdlog::warn("{}", w);
          for (const auto& n : cfg.notes) spdlog::info("{}", n);
          spdlog::info("config: {}", cfg.resolved.dump());
          spdlog::info("{}", recipe_text(cfg, world.size()));
        }
        const auto t0 = std::chrono::steady_clock::now();
        TrainResult r = train(cfg, ta, world);
        if (lead && !r.steps.empty()) {
          const auto& last = r.steps.back();
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          // The loss from the first to the last step that trained (a skipped step has none).
          const StepRecord *first = nullptr, *trained = nullptr;
          for (const StepRecord& s : r.steps)
            if (!s.skipped) first = first ? first : &s, trained = &s;
          const int64_t skipped = std::count_if(r.steps.begin(), r.steps.end(), [](const StepRecord& s) { return s.skipped; });
          spdlog::info("done: {} steps (to step {}) in {:.1f} s, {}{}{}", r.steps.size(), last.step, secs,
                       first ? fmt::format("loss {:.4f} -> {:.4f}", first->loss, trained->loss) : "no step had targets",
                       skipped > 0 && first ? fmt::format(" ({} skipped: no targets)", skipped) : "",
                       last.accuracy >= 0 ? fmt::format(", accuracy {:.3f}", last.accuracy) : "");
          if (last.evaluated && last.val_targets == 0)
            spdlog::info("validation after step {}: no targets (the validation masks remove every one)", last.step);
          else if (last.evaluated && !last.val_objective_metrics.empty()) {  // DPO: TRL's eval_ metrics
            std::string metrics;
            for (const auto& [name, v] : last.val_objective_metrics) metrics += fmt::format(", {} {:.4f}", name, v);
            spdlog::info("validation after step {}: loss {:.4f}{}", last.step, last.val_loss, metrics);
          } else if (last.evaluated)
            spdlog::info("validation after step {}: loss {:.4f}, accuracy {:.3f}; example: {}", last.step,
                         last.val_loss, last.val_accuracy, example_line(cfg, r.val_example));
        }
        if (r.preempted) {
          if (lead) spdlog::warn("stopped by a signal after step {}: continue with --resume {}",
                                 r.steps.empty() ? 0 : r.steps.back().step, cfg.train.checkpoint_dir);
          return kExitPreempted;
        }
      } catch (const std::exception& e) {
        if (auto file = spdlog::get("train.log")) file->error("{}", e.what());  // stderr gets it from run_app
        throw;
      }
      return 0;
    };

    auto world = make_world_communicator();
    if (args.count("deepspeed"))
      cfg = load_deepspeed(cfg, args["deepspeed"].as<std::string>(), thread_ranks > 0 ? thread_ranks : world->size(),
                           ta.config_path);
    // "auto" layout keys: the same search on every rank (the same inputs, so the same answer).
    const int64_t ranks = thread_ranks > 0 ? thread_ranks : world->size();
    if (!cfg.auto_keys.empty()) cfg = resolve_auto(cfg, ranks, run_cluster(cfg, ranks));
    if (args.count("print-config")) {
      if (world->rank() == 0) std::cout << cfg.resolved.dump(2) << std::endl;
      return 0;
    }
    if (args.count("merge-lora")) {
      if (!cfg.lora.enabled) throw UsageError("--merge-lora needs a lora section (lora.from, or --resume, names the adapter)");
      if (world->rank() == 0) {
        write_merged_model(opt("merge-lora"), cfg, starting_params(cfg, ta, master_dtype(cfg.runtime.dtype)));
        spdlog::info("wrote {}: the base with the adapter merged (lora scale {})", opt("merge-lora"), cfg.lora.scale());
      }
      return 0;
    }
    if (thread_ranks == 0) return run_rank(*world);
    // Under mpirun every process would run its own job of thread ranks: the same steps twice in
    // the metrics, and two writers of one checkpoint directory.
    if (world->size() > 1)
      throw UsageError(str("--thread-ranks ", thread_ranks, " under a launcher of ", world->size(),
                           " processes: each would run its own job; use --thread-ranks in one process, or mpirun "
                           "without it"));
    // Each rank thread gets its share of the cores unless runtime.threads says otherwise (an
    // OpenMP thread count is per calling thread); every rank returns the same code (preemption
    // is agreed), rank 0's is the process's.
    const int cores = cpu::num_threads();
    std::vector<int> codes(static_cast<size_t>(thread_ranks), 0);
    run_thread_ranks(thread_ranks, [&](ThreadCommunicator& world) {
      if (cfg.runtime.threads <= 0) cpu::set_num_threads(std::max(1, cores / thread_ranks));
      codes[static_cast<size_t>(world.rank())] = run_rank(world);
    });
    return codes[0];
  });
}
