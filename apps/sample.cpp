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
// (--json: one JSON object with them; bytes that are not UTF-8 become U+FFFD there). It runs on the
// CPU only: runtime.device "cuda" gets a warning that it is not used.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "tools/cli.h"
#include "tools/model_flags.h"
#include "tools/options.h"
#include "tools/text_codec.h"
#include "models/lora.h"
#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/trainer.h"
#include "tensor/check.h"

using namespace autosp;

namespace {

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

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += str(s.empty() ? "" : ",", id);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return run_app("autosp-sample", [&] {
    cxxopts::Options opts("autosp-sample", "Generate tokens from a trained model (KV cache; greedy, top-k, temperature)");
    add_model_flags(opts);
    opts.add_options()("prompt-ids", "the prompt as token ids: 1,2,3", cxxopts::value<std::string>())(
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
    const auto parsed = parse_flags(opts, argc, argv);
    if (!parsed) return 0;  // --help
    const cxxopts::ParseResult& args = *parsed;
    auto opt = [&](const char* k) { return flag_text(args, k); };
    std::vector<std::string> sets;
    if (args.count("set")) sets = args["set"].as<std::vector<std::string>>();
    const ModelFlags model = model_from_flags(args, sets);
    if (args.count("prompt") == args.count("prompt-ids"))
      throw UsageError("give the prompt as one of --prompt-ids 1,2,3 or --prompt TEXT");
    const Config& cfg = model.cfg;
    const TrainArgs& ta = model.args;
    // Generation runs on the CPU in every build (train/generate.h: one process, host tensors). A
    // device asked for is said to be unused rather than refused: a checkpoint trained on a GPU
    // records runtime.device "cuda", and sampling from it elsewhere is the common case.
    if (cfg.runtime.device == DeviceKind::cuda) {
      const bool set = std::any_of(sets.begin(), sets.end(), [](const std::string& s) { return s.rfind("runtime.device=", 0) == 0; });
      spdlog::warn("runtime.device \"cuda\" ({}) is not used: autosp-sample generates on the CPU only",
                   set ? "--set" : args.count("config") ? "the config" : "the checkpoint's run config");
    }
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
    const std::vector<int64_t> prompt = args.count("prompt-ids") ? parse_int_list("prompt-ids", opt("prompt-ids"), "ids like 1,2,3") : codec.encode(opt("prompt"));
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
