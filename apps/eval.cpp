// autosp-eval: long-context evaluation of a model under sequence parallelism (train/evaluation.h).
//   autosp-eval (--checkpoint DIR | --model HF_DIR | --config FILE [--init-from W.safetensors])
//     [--set key.path=value]... [--seq-len S] [--data SHARDS] [--sequences N] [--out FILE.json]
//     (--perplexity-by-position [--bucket-width W] | --plan-memory
//      | --passkey [--passkey-lengths 1024,2048] [--passkey-depths 0,0.5,1] [--passkey-trials N]
//        [--tokenizer tokenizer.json])
// Launched like autosp-train (mpirun -np W for several ranks; sequence_parallel.* as in training):
// the rank's forward program (the AutoSP passes, no backward, no gradients, no optimizer state)
// runs over the evaluation data: --data (llm.c token shards), else data.val_path, else data.path,
// else the held-out synthetic stream. --perplexity-by-position writes rank 0's JSON (train/evaluation.h
// PositionLoss, plus the run's layout) to --out or stdout; scripts/plot_metrics.py draws it.
// --passkey writes the accuracy of passkey retrieval per (length, depth) cell (train/evaluation.h
// PasskeyResult, each answer also as text) the same way; the filler is the built-in text, or with
// --data the shards' first tokens; text goes through --tokenizer (or the tokenizer.json beside
// --data), or the model's bytes when it was trained on data.source "text".
// --plan-memory prints the evaluation program's memory plan (the JSON of autosp-graph
// --plan-memory) for this rank at data.seq_len and data.batch_size, and loads nothing.
#include <fstream>
#include <iostream>

#include <spdlog/spdlog.h>

#include "comm/communicator.h"
#include "comm/job_comms.h"
#include "models/family.h"
#include "models/lora.h"
#include "tools/cli.h"
#include "tools/model_flags.h"
#include "tools/options.h"
#include "tools/plan_summary.h"
#include "tools/progress.h"
#include "tools/text_codec.h"
#include "train/data.h"
#include "train/outputs.h"
#include "train/evaluation.h"
#include "train/run_device.h"
#include "tensor/check.h"

using namespace autosp;

namespace {

// The run's layout and precision beside the results.
nlohmann::json run_json(const Config& cfg, const RankLayout& layout, int world) {
  return {{"world", world},       {"sp", layout.sp},   {"ring", layout.ring}, {"dp", layout.dp},
          {"dtype", std::string(dtype_name(cfg.runtime.dtype))}, {"arch", std::string(arch_name(cfg.model.arch))},
          {"batch_size", cfg.data.batch_size}};
}

void write_json(const nlohmann::json& j, const std::string& path) {
  if (path.empty()) {  // text that is not UTF-8 (a byte model's answer) becomes U+FFFD
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    return;
  }
  std::ofstream f(path);
  if (!f) throw UsageError(str("--out ", path, ": cannot open for writing"));
  f << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!f.flush()) throw RuntimeFailure(str("--out ", path, ": write failed"));
}

// The filler tokens of --data: the first data.seq_len of the shards (repeated as a prompt needs).
std::vector<int64_t> shard_filler(const Config& cfg, const std::string& shards) {
  DataConfig d = cfg.data;
  d.source = DataSourceKind::tokens;
  d.path = d.val_path = shards;
  d.mix.clear();
  d.loss_mask_path = d.val_loss_mask_path = d.doc_ids_path = d.val_doc_ids_path = "";
  d.document_mask = false;
  const Tensor ids = make_val_source(d, cfg.model.vocab_size, 0)->read(0, 1).input_ids.contiguous();
  return {ids.data<int64_t>(), ids.data<int64_t>() + ids.numel()};
}

// The weights to evaluate. A config with a lora section (lora.from: a PEFT adapter directory) has its
// adapter folded into the base, W + scale·B·A, as autosp-sample and --merge-lora do: the programs
// are the plain model's (eval_config drops the section from the config they are built from).
ParamMap eval_params(const Config& with_adapter, const TrainArgs& weights) {
  ParamMap params = starting_params(with_adapter, weights, master_dtype(with_adapter.runtime.dtype));
  if (with_adapter.lora.enabled) params = merge_lora(with_adapter.model, params, with_adapter.lora.scale());
  return params;
}

int run_passkey(const Config& cfg, const Config& with_adapter, const TrainArgs& weights,
                const cxxopts::ParseResult& args, Communicator& world) {
  auto opt = [&](const char* k) { return flag_text(args, k); };
  PasskeyOptions o;
  const int64_t S = cfg.data.seq_len;
  o.lengths = args.count("passkey-lengths") ? parse_int_list("passkey-lengths", opt("passkey-lengths"), "lengths like 1024,2048")
                                            : std::vector<int64_t>{S / 4, S / 2, 3 * S / 4, S};
  o.depths = args.count("passkey-depths") ? parse_number_list("passkey-depths", opt("passkey-depths"), "depths like 0,0.5,1")
                                          : std::vector<double>{0, 0.25, 0.5, 0.75, 1};
  if (args.count("passkey-trials")) o.trials = parse_int_flag("passkey-trials", opt("passkey-trials"));
  o.seed = static_cast<uint64_t>(cfg.train.seed);
  const std::string tokenizer = args.count("tokenizer") ? opt("tokenizer") : args.count("data") ? tokenizer_beside(opt("data")) : "";
  const bool bytes = tokenizer.empty() && cfg.data.source == DataSourceKind::text;
  if (tokenizer.empty() && !bytes)
    throw UsageError("--passkey needs the model's tokenizer: --tokenizer tokenizer.json (or a model trained on "
                     "data.source \"text\", whose tokens are bytes)");
  TextCodec codec(AUTOSP_SOURCE_DIR, tokenizer, bytes);
  o.encode = [&](const std::string& text) { return codec.encode(text); };
  if (args.count("data")) o.filler = shard_filler(cfg, opt("data"));
  check_passkey(cfg, o);  // before the weights load
  const Device dev = pick_device(cfg);
  const std::unique_ptr<JobComms> comms =
      make_job_comms(world, dev, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size,
                     cfg.moe.expert_parallel_size);
  ParamMap params = eval_params(with_adapter, weights);
  to_run_device(params, dev);
  const bool lead = world.rank() == 0;
  Progress progress("passkey", "prompts", lead && !args.count("quiet"));
  o.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
  const PasskeyResult r = passkey(cfg, params, *comms, dev, o);
  progress.finish();
  nlohmann::json j = r.to_json();
  for (auto& cell : j["cells"])
    for (auto& a : cell["answers"]) a["said"] = codec.decode(a["said_ids"].get<std::vector<int64_t>>());
  j["run"] = run_json(cfg, comms->mesh, world.size());
  j["filler"] = args.count("data") ? opt("data") : "built-in";
  if (lead) write_json(j, opt("out"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-eval", [&] {
    cxxopts::Options opts("autosp-eval", "Evaluate a model at long context under sequence parallelism (launch under "
                                         "mpirun for several ranks)");
    add_model_flags(opts);
    opts.add_options()("perplexity-by-position", "the loss of the targets per bucket of positions (JSON)")(
        "bucket-width", "positions per bucket (default 1024)", cxxopts::value<std::string>())(
        "seq-len", "the sequence length S evaluated (overrides data.seq_len)", cxxopts::value<std::string>())(
        "data", "llm.c token shards to evaluate on, a file or glob (default: data.val_path, else data.path, else "
        "held-out synthetic data); with --passkey, its filler",
        cxxopts::value<std::string>())(
        "sequences", "sequences to evaluate (default: every window of the data; synthetic: train.eval_batches × "
        "data.batch_size)", cxxopts::value<std::string>())(
        "out", "write the JSON here (default: stdout)", cxxopts::value<std::string>())(
        "passkey", "passkey retrieval over a grid of prompt lengths × key depths (JSON)")(
        "passkey-lengths", "prompt lengths in tokens (default: data.seq_len / 4, / 2, 3/4, whole)",
        cxxopts::value<std::string>())(
        "passkey-depths", "key depths in [0, 1] (default 0,0.25,0.5,0.75,1)", cxxopts::value<std::string>())(
        "passkey-trials", "keys per cell (default 5)", cxxopts::value<std::string>())(
        "tokenizer", "the tokenizer.json (or a model directory holding one) for --passkey's text",
        cxxopts::value<std::string>())(
        "plan-memory", "print the evaluation program's memory plan for this rank (JSON) and exit")(
        "quiet", "no progress on stderr")("h,help", "show this help");
    const auto parsed = parse_flags(opts, argc, argv);
    if (!parsed) return 0;  // --help
    const cxxopts::ParseResult& args = *parsed;
    auto opt = [&](const char* k) { return flag_text(args, k); };
    const bool pass = args.count("passkey") > 0;
    if (args.count("perplexity-by-position") + args.count("plan-memory") + args.count("passkey") != 1)
      throw UsageError("give one task: --perplexity-by-position, --passkey or --plan-memory");
    // The flags are config keys, set after every --set (as autosp-train's --steps).
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    if (args.count("seq-len")) {
      const int64_t S = parse_int_flag("seq-len", opt("seq-len"));
      if (auto problem = config_value_problem("data.seq_len", S)) throw UsageError(str("--seq-len ", S, ": ", *problem));
      sets.push_back(str("data.seq_len=", S));
    }
    if (args.count("data") && !pass) {  // --passkey reads --data as its filler
      // The config's own evaluation data and masks are for other files.
      for (const char* key : {"data.val_path=", "data.loss_mask_path=", "data.val_loss_mask_path=", "data.doc_ids_path=",
                              "data.val_doc_ids_path="})
        sets.push_back(key);
      sets.push_back(str("data.path=", opt("data")));
      sets.push_back("data.source=tokens");
    }
    const ModelFlags model = model_from_flags(args, sets);
    const Config with_adapter = eval_config(model.cfg);
    if (with_adapter.lora.enabled && with_adapter.model_from.empty() && model.args.init_from.empty())
      throw UsageError("a LoRA adapter needs its base model: give --model BASE_DIR --set lora.from=ADAPTER_DIR, or "
                       "--config with model.from and lora.from");
    Config cfg = with_adapter;
    cfg.lora = LoraConfig{};  // the adapter is folded into the weights (eval_params)
    // --out may not overwrite what the evaluation reads (checked before anything runs).
    if (args.count("out")) {
      RunFiles reads{{opt("config"), opt("init-from"), model.args.resume, opt("model"), opt("data"), opt("tokenizer")}, ""};
      for (const std::string& p : data_input_paths(cfg.data)) reads.inputs.push_back(p);
      check_output_path("--out", opt("out"), reads);  // (its directory too)
    }
    PositionLossOptions po;
    if (args.count("bucket-width")) po.bucket_width = parse_int_flag("bucket-width", opt("bucket-width"));
    if (args.count("sequences")) {  // (0 is the library's "every window": leaving the flag out says that)
      po.sequences = parse_int_flag("sequences", opt("sequences"));
      if (po.sequences < 1)
        throw UsageError(str("--sequences ", po.sequences, ": expected ≥ 1 (leave it out to evaluate every window)"));
    }

    auto world = make_world_communicator();
    const bool lead = world->rank() == 0;
    if (lead)  // (autosp-eval reads data.val_path without train.eval_every: that warning is training's)
      for (const auto& w : cfg.warnings)
        if (w.rfind("data.val_path is set but train.eval_every is 0", 0) != 0) spdlog::warn("{}", w);
    if (args.count("plan-memory")) {
      const RankLayout layout = rank_layout(world->size(), world->rank(), cfg.sequence_parallel.autosp_size,
                                            cfg.sequence_parallel.ring_size);
      const int64_t m = layout.seq_multiple(), S = (cfg.data.seq_len + m - 1) / m * m;
      const RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::rank_forward, layout);
      nlohmann::json j = plan_summary(prog, {{"B", cfg.data.batch_size}, {"S", S}}, cfg, world->size(), cfg.runtime.device);
      j["run"] = run_json(cfg, layout, world->size());
      if (lead) write_json(j, opt("out"));
      return 0;
    }
    if (pass) return run_passkey(cfg, with_adapter, model.args, args, *world);
    // Everything the flags and data can get wrong is refused before the weights load.
    const int64_t N = eval_sequences(cfg, po);
    const Device dev = pick_device(cfg);
    const std::unique_ptr<JobComms> comms =
        make_job_comms(*world, dev, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size,
                       cfg.moe.expert_parallel_size);
    ParamMap params = eval_params(with_adapter, model.args);
    to_run_device(params, dev);
    Progress progress("perplexity by position", "sequences", lead && !args.count("quiet"));
    po.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
    if (lead && !args.count("quiet"))
      spdlog::info("evaluating {} sequences of {} tokens on {} rank{}", N, cfg.data.seq_len, world->size(),
                   world->size() == 1 ? "" : "s");
    const PositionLoss r = perplexity_by_position(cfg, params, *comms, dev, po);
    progress.finish();
    nlohmann::json j = r.to_json();
    j["task"] = "perplexity_by_position";
    j["run"] = run_json(cfg, comms->mesh, world->size());
    if (lead) write_json(j, opt("out"));
    return 0;
  });
}
