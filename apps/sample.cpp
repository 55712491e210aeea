// autosp-sample: generate tokens from a trained model with a KV cache (train/generate.h).
//   autosp-sample --checkpoint DIR [--set key.path=value]...        a step_N directory or a root (newest step)
//   autosp-sample --config FILE [--set ...] [--init-from W.safetensors | --checkpoint DIR]
//   autosp-sample --model HF_DIR [--set ...]        a Hugging Face model directory ("model.from")
//     [--prompt-ids 1,2,3 | --prompt TEXT [--tokenizer tokenizer.json]] [--max-new-tokens N]
//     [--temperature T] [--top-k K] [--seed S] [--eos-token-id ID] [--dtype float32|float64]
//     [--no-kv-cache] [--json]
// The model is loaded as autosp-train loads it (the config, then train/trainer.h starting_params);
// a checkpoint without --config brings its own run config (meta.json). A text prompt goes through
// the tokenizer.json that scripts/prepare_data.py saved beside the shards (Hugging Face
// `tokenizers`, in a Python helper under scripts/hf-venv.sh's venv), or, for a model trained on
// data.source "text", through its bytes. Prints the prompt and new token ids and their text
// (--json: one JSON object with them; bytes that are not UTF-8 become U+FFFD there).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tools/cli.h"
#include "tools/options.h"
#include "tools/text_codec.h"
#include "models/lora.h"
#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/trainer.h"
#include "tensor/check.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

// "1,2, 3" → {1, 2, 3}; anything else is a UsageError naming the flag. Every comma separates two
// items, so an empty one anywhere ("1,,2", a trailing "1,2,", a leading ",1") is refused alike
// (std::getline would drop a trailing one).
std::vector<int64_t> parse_ids(const std::string& text) {
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw UsageError("--prompt-ids: no ids (expected ids like 1,2,3)");
  std::vector<int64_t> ids;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) throw UsageError(str("--prompt-ids '", text, "': an empty item (expected ids like 1,2,3)"));
    ids.push_back(parse_int_flag("prompt-ids", item.substr(a, b - a + 1)));
    if (comma == std::string::npos) return ids;
    start = comma + 1;
  }
}

// --temperature's value. strtod, not std::stod: stod throws on the ERANGE that a subnormal such as
// 1e-310 sets, which is a valid (greedy-like, train/generate.h) temperature. What overflows to inf
// (1e400), and inf itself, is out of range; a sign is left to Generator's check.
double parse_temperature(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double t = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || std::isnan(t))
    throw UsageError(str("--temperature '", text, "': expected a number ≥ 0"));
  if (std::isinf(t))
    throw UsageError(str("--temperature '", text, "': out of range (expected a finite number ≥ 0)"));
  return t;  // an underflow to 0 (1e-400) is greedy, as the tiny value it stood for would be
}

// The checkpoint directory `path` names: itself when it holds meta.json, else its newest step_N.
std::string step_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw UsageError(str("--checkpoint ", path, ": not a directory"));
  if (fs::exists(fs::path(path) / "meta.json", ec)) return path;
  const int64_t step = newest_step(path);
  if (step < 0) throw UsageError(str("--checkpoint ", path, ": neither a checkpoint (no meta.json) nor a root with step_* directories"));
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return (fs::path(path) / name).string();
}

// The run config a checkpoint was written with (its meta.json), with --set overrides.
Config checkpoint_config(const std::string& dir, const std::vector<std::string>& sets) {
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  std::ifstream f(meta_path);
  if (!f) throw UsageError(str(meta_path, ": cannot open"));
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json meta = parse_json(ss.str(), meta_path);
  if (!meta.is_object() || !meta.contains("config") || !meta["config"].is_object())
    throw UsageError(str(meta_path, ": no 'config' object (not an autosp checkpoint?)"));
  return parse_config(meta["config"], sets, meta_path);
}

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += str(s.empty() ? "" : ",", id);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-sample", [&] {
    cxxopts::Options opts("autosp-sample", "Generate tokens from a trained model (KV cache; greedy, top-k, temperature)");
    opts.add_options()("checkpoint", "a checkpoint step_N directory, or a root (its newest step)",
                       cxxopts::value<std::string>())(
        "config", "run config JSON (default: the checkpoint's own)", cxxopts::value<std::string>())(
        "set", "override a config key (key.path=value), repeatable", cxxopts::value<std::vector<std::string>>())(
        "init-from", "safetensors weights (Hugging Face names) instead of a checkpoint", cxxopts::value<std::string>())(
        "model", "a Hugging Face model directory (its config.json and weights), as model.from",
        cxxopts::value<std::string>())(
        "prompt-ids", "the prompt as token ids: 1,2,3", cxxopts::value<std::string>())(
        "prompt", "the prompt as text (needs --tokenizer, or a model of data.source text)", cxxopts::value<std::string>())(
        "tokenizer", "the tokenizer.json the data was prepared with, or a model directory holding one", cxxopts::value<std::string>())(
        "max-new-tokens", "tokens to generate (default 32)", cxxopts::value<std::string>())(
        "temperature", "0 = greedy (default); > 0 samples", cxxopts::value<std::string>())(
        "top-k", "with --temperature: sample among the k most likely (0 = all)", cxxopts::value<std::string>())(
        "seed", "sampling seed (default 0)", cxxopts::value<std::string>())(
        "eos-token-id", "stop after generating this id", cxxopts::value<std::string>())(
        "dtype", "float32 (default) or float64", cxxopts::value<std::string>())(
        "no-kv-cache", "recompute the whole sequence for every token (the reference for the cache)")(
        "json", "print one JSON object instead of text")("h,help", "show this help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      std::cout << opts.help() << std::flush;
      return 0;
    }
    if (!args.unmatched().empty()) throw UsageError(str("unexpected argument '", args.unmatched()[0], "'"));
    auto opt = [&](const char* k) { return args.count(k) ? args[k].as<std::string>() : std::string(); };
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    if (args.count("checkpoint") + args.count("config") + args.count("model") != 1)
      throw UsageError("give one of --checkpoint DIR, --model HF_DIR, or --config FILE (with --init-from or "
                       "--checkpoint for the weights, or model.from)");
    if (args.count("checkpoint") && args.count("init-from")) throw UsageError("--checkpoint and --init-from exclude each other");
    if (args.count("prompt") == args.count("prompt-ids"))
      throw UsageError("give the prompt as one of --prompt-ids 1,2,3 or --prompt TEXT");

    TrainArgs ta;
    ta.init_from = opt("init-from");
    if (args.count("checkpoint")) ta.resume = step_dir(opt("checkpoint"));
    const Config cfg = args.count("config")  ? load_config(opt("config"), sets)
                       : args.count("model") ? parse_config(nlohmann::json{{"model", {{"from", opt("model")}}}}, sets)
                                             : checkpoint_config(ta.resume, sets);
    const std::string dtype_text = args.count("dtype") ? opt("dtype") : "float32";
    const auto dtype = dtype_from_name(dtype_text);
    if (!dtype || (*dtype != DType::f32 && *dtype != DType::f64))
      throw UsageError(str("--dtype '", dtype_text, "': expected float32 or float64"));

    SampleOptions so;
    if (args.count("max-new-tokens")) so.max_new_tokens = parse_int_flag("max-new-tokens", opt("max-new-tokens"));
    if (args.count("top-k")) so.top_k = parse_int_flag("top-k", opt("top-k"));
    if (args.count("seed")) {
      const int64_t seed = parse_int_flag("seed", opt("seed"));
      if (seed < 0) throw UsageError(str("--seed ", seed, ": expected ≥ 0"));
      so.seed = static_cast<uint64_t>(seed);
    }
    if (args.count("eos-token-id")) so.eos_token_id = parse_int_flag("eos-token-id", opt("eos-token-id"));
    if (args.count("temperature")) so.temperature = parse_temperature(opt("temperature"));
    so.kv_cache = !args.count("no-kv-cache");

    TextCodec codec(AUTOSP_SOURCE_DIR, opt("tokenizer"), cfg.data.source == DataSourceKind::text);
    const std::vector<int64_t> prompt = args.count("prompt-ids") ? parse_ids(opt("prompt-ids")) : codec.encode(opt("prompt"));
    // Everything generate() would refuse (ids, options, positions), before the weights load and the
    // programs are built: a bad flag costs nothing and is the one error reported.
    check_generation(cfg.model, prompt, so);
    if (cfg.lora.enabled && cfg.model_from.empty() && ta.init_from.empty())
      throw UsageError("a LoRA adapter needs its base model: give --model BASE_DIR --set lora.from=ADAPTER_DIR, or "
                       "--config with model.from and lora.from");
    ParamMap params = starting_params(cfg, ta, *dtype);
    if (cfg.lora.enabled) params = merge_lora(cfg.model, params, cfg.lora.scale());  // base + adapter
    Generator gen(cfg.model, *dtype, std::move(params));
    const Generated out = gen.generate(prompt, so);
    const std::string prompt_text = codec.decode(prompt), text = codec.decode(out.tokens);
    if (args.count("json")) {
      std::cout << nlohmann::json{{"prompt_ids", prompt}, {"ids", out.tokens}, {"prompt_text", prompt_text},
                                  {"text", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << std::endl;
    } else {
      std::cout << "prompt ids: " << join(prompt) << "\nids: " << join(out.tokens) << "\n";
      if (codec.can_encode() || !opt("tokenizer").empty()) std::cout << "prompt: " << prompt_text << "\ntext: " << text << "\n";
      std::cout << std::flush;
    }
    return 0;
  });
}
