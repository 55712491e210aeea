// Generation (src/train/generate.h): the KV-cache decode program's logits equal a full recompute
// of the whole sequence at every new token (float64, GPT-2 and a GQA Llama), greedy picks the
// argmax, seeded sampling is reproducible and stays inside the top k, and bad prompts are usage
// errors. Greedy tokens against Hugging Face transformers' generate: tests/ref/hf_generate.py.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "config/config.h"
#include "models/model.h"
#include "tensor/check.h"
#include "train/generate.h"

using namespace autosp;

namespace {

ModelConfig model(const char* arch) {
  nlohmann::json m = {{"arch", arch}, {"vocab_size", 61}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"max_position_embeddings", 64}};
  if (std::string(arch) == "llama") m["num_key_value_heads"] = 2, m["intermediate_size"] = 48;
  return parse_config({{"model", m}, {"data", {{"seq_len", 16}}}}).model;
}

// Parameters large enough (std 0.3) that the logits differ clearly between tokens.
ParamMap params(const ModelConfig& m) {
  ParamMap p = init_params(m, 5, DType::f64);
  for (auto& [name, t] : p) {
    if (t.rank() < 2) continue;
    double* x = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) x[i] *= 15;
  }
  return p;
}

}  // namespace

TEST_CASE("generate: KV-cache decode logits equal the full recompute at every token", "[generate]") {
  for (const char* arch : {"gpt2", "llama"}) {
    INFO(arch);
    const ModelConfig m = model(arch);
    const Generator gen(m, DType::f64, params(m));
    SampleOptions o;
    o.max_new_tokens = 20;
    const std::vector<int64_t> prompt = {3, 14, 15, 9, 26, 5};
    o.kv_cache = true;
    const Generated cached = gen.generate(prompt, o);
    o.kv_cache = false;
    const Generated full = gen.generate(prompt, o);
    REQUIRE(cached.tokens.size() == 20);
    CHECK(cached.tokens == full.tokens);
    REQUIRE(cached.logits.size() == full.logits.size());
    double worst = 0, scale = 0;
    for (size_t t = 0; t < full.logits.size(); ++t)
      for (size_t v = 0; v < full.logits[t].size(); ++v) {
        worst = std::max(worst, std::abs(cached.logits[t][v] - full.logits[t][v]));
        scale = std::max(scale, std::abs(full.logits[t][v]));
      }
    INFO("max |cached - full| " << worst << " of max |logit| " << scale);
    CHECK(scale > 1);
    CHECK(worst <= 1e-10 * scale);
    // Greedy is the argmax of the logits it was drawn from; the tokens are not all the same.
    for (size_t t = 0; t < full.logits.size(); ++t)
      CHECK(cached.tokens[t] == std::max_element(full.logits[t].begin(), full.logits[t].end()) - full.logits[t].begin());
    CHECK(std::count(cached.tokens.begin(), cached.tokens.end(), cached.tokens[0]) < 20);
  }
}

TEST_CASE("generate: seeded sampling is reproducible and stays in the top k; eos stops", "[generate]") {
  const ModelConfig m = model("llama");
  const Generator gen(m, DType::f64, params(m));
  SampleOptions o;
  o.max_new_tokens = 30;
  o.temperature = 2.0;
  o.top_k = 3;
  o.seed = 11;
  const Generated a = gen.generate({1, 2}, o), b = gen.generate({1, 2}, o);
  CHECK(a.tokens == b.tokens);
  o.seed = 12;
  CHECK(gen.generate({1, 2}, o).tokens != a.tokens);
  for (size_t t = 0; t < a.tokens.size(); ++t) {
    std::vector<double> l = a.logits[t];
    std::sort(l.begin(), l.end(), std::greater<double>());
    CHECK(a.logits[t][static_cast<size_t>(a.tokens[t])] >= l[2]);  // one of the 3 largest
  }
  o.eos_token_id = a.tokens[4];
  o.seed = 11;
  const Generated stopped = gen.generate({1, 2}, o);
  const auto first = std::find(a.tokens.begin(), a.tokens.end(), a.tokens[4]) - a.tokens.begin();
  CHECK(stopped.tokens.size() == static_cast<size_t>(first + 1));
}

TEST_CASE("generate: a tiny positive temperature picks greedy's tokens", "[generate]") {
  // Once logits/T overflowed to inf and inf − inf = NaN sent every pick to token 0.
  for (const char* arch : {"gpt2", "llama"}) {
    INFO(arch);
    const ModelConfig m = model(arch);
    const Generator gen(m, DType::f64, params(m));
    SampleOptions o;
    o.max_new_tokens = 12;
    const Generated greedy = gen.generate({3, 14, 15}, o);
    CHECK(std::count(greedy.tokens.begin(), greedy.tokens.end(), 0) < 12);
    for (double t : {3e-308, std::numeric_limits<double>::min(), 1e-310, std::numeric_limits<double>::denorm_min()})
      for (int64_t k : {0, 5}) {
        INFO("temperature " << t << ", top-k " << k);
        o.temperature = t;
        o.top_k = k;
        CHECK(gen.generate({3, 14, 15}, o).tokens == greedy.tokens);
      }
  }
}

TEST_CASE("generate: non-finite logits are a runtime failure, not token 0", "[generate]") {
  const ModelConfig m = model("gpt2");
  for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO("a weight of " << bad);
    ParamMap p = params(m);
    for (auto& [name, t] : p)  // the last layer norm's weight: every logit becomes non-finite
      if (name.find("ln_f.weight") != std::string::npos) t.data<double>()[0] = bad;
    const Generator gen(m, DType::f64, p);
    for (const double temperature : {0.0, 1.0}) {
      SampleOptions o;
      o.temperature = temperature;
      CHECK_THROWS_AS(gen.generate({3, 14, 15}, o), RuntimeFailure);
      CHECK_THROWS_WITH(gen.generate({3, 14, 15}, o), Catch::Contains("are not finite"));
    }
  }
}

TEST_CASE("generate: bad prompts and options are usage errors", "[generate]") {
  const ModelConfig m = model("gpt2");
  const Generator gen(m, DType::f64, params(m));
  SampleOptions o;
  CHECK_THROWS_WITH(gen.generate({}, o), Catch::Contains("the prompt is empty"));
  CHECK_THROWS_WITH(gen.generate({1, 61}, o), Catch::Contains("prompt token 61 at index 1 is outside [0, 61)"));
  CHECK_THROWS_WITH(gen.generate({-1}, o), Catch::Contains("prompt token -1"));
  o.max_new_tokens = 60;
  CHECK_THROWS_WITH(gen.generate({1, 2, 3, 4, 5}, o), Catch::Contains("exceed gpt2's position table"));
  // A huge max_new_tokens once overflowed prompt + max_new_tokens past the check, generated, and
  // failed in the embedding at position 64.
  for (int64_t n : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 2,
                    std::numeric_limits<int64_t>::max() - 5}) {
    o.max_new_tokens = n;
    CHECK_THROWS_WITH(gen.generate({1, 2, 3, 4, 5}, o), Catch::Contains("max-new-tokens " + std::to_string(n)));
  }
  const ModelConfig llama = model("llama");
  const Generator lgen(llama, DType::f64, params(llama));
  o.max_new_tokens = std::numeric_limits<int64_t>::max() - 2;
  CHECK_THROWS_WITH(lgen.generate({1, 2, 3}, o), Catch::Contains("positions overflow int64"));
  o.max_new_tokens = 4;
  o.temperature = -1;
  CHECK_THROWS_WITH(gen.generate({1}, o), Catch::Contains("temperature -1"));
  o.temperature = 1;
  o.top_k = -2;
  CHECK_THROWS_WITH(gen.generate({1}, o), Catch::Contains("top-k -2"));
  o.top_k = 0;
  // The stop id is an id like the prompt's: outside the vocabulary it could never fire (issue 48).
  for (int64_t eos : {int64_t{61}, int64_t{-2}, std::numeric_limits<int64_t>::max()}) {
    o.eos_token_id = eos;
    CHECK_THROWS_WITH(gen.generate({1}, o), Catch::Contains(str("eos-token-id ", eos, " is outside [0, 61)")));
    CHECK_THROWS_WITH(check_generation(m, {1}, o), Catch::Contains(str("eos-token-id ", eos)));
  }
  for (int64_t eos : {int64_t{-1}, int64_t{0}, int64_t{60}}) {
    o.eos_token_id = eos;
    CHECK_NOTHROW(check_generation(m, {1}, o));
  }
  CHECK_THROWS_AS(Generator(m, DType::bf16, params(m)), UsageError);
}
