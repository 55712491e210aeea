// Whole small models in float64: autograd's parameter gradients against central finite
// differences of the loss, for GPT-2, Llama (GQA, untied head) and Qwen3 (one layer: q/k norms,
// biases, a head_dim apart from hidden / heads, yarn rope), on a spread sample of entries of every
// parameter.
#include <catch2/catch.hpp>

#include <random>

#include "graph/autograd.h"
#include "models/model.h"
#include "engine/executor.h"

using namespace autosp;

TEST_CASE("whole-model gradients match float64 finite differences", "[autograd][model]") {
  std::vector<ModelConfig> models(3);
  models[0].vocab_size = 24;
  models[0].hidden_size = 16;
  models[0].num_hidden_layers = 2;
  models[0].num_attention_heads = 2;
  models[0].num_key_value_heads = 2;
  models[0].max_position_embeddings = 16;
  models[1] = models[0];
  models[1].arch = Arch::llama;
  models[1].num_attention_heads = 4;
  models[1].num_key_value_heads = 2;
  models[1].intermediate_size = 20;
  models[1].tie_word_embeddings = false;
  models[1].norm_eps = 1e-6;
  models[2] = models[1];
  models[2].arch = Arch::qwen3;
  models[2].num_hidden_layers = 1;
  models[2].head_dim_config = 6;
  models[2].attention_bias = true;
  models[2].rope_scaling.rope_type = "yarn";
  models[2].rope_scaling.factor = 4;
  models[2].rope_scaling.original_max_position_embeddings = 4096;
  models[2].rope_theta = 100;
  for (const auto& m : models) {
    DYNAMIC_SECTION(arch_name(m.arch)) {
      auto g = build_forward(m, DType::f64);
      std::vector<Node*> params = g->with_role(Role::parameter);
      std::vector<Node*> grads = build_backward(*g, g->find("loss"), params);
      TensorMap feeds = init_params(m, 3, DType::f64);
      // Larger weights than the 0.02 init, so every path carries signal.
      std::mt19937_64 rng(5);
      std::normal_distribution<double> nd(0, 0.3);
      for (auto& [name, t] : feeds)
        for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] += nd(rng);
      const int64_t B = 2, S = 7;
      std::vector<int64_t> ids, labels, pos;
      for (int64_t i = 0; i < B * S; ++i) {
        ids.push_back(static_cast<int64_t>(rng() % m.vocab_size));
        labels.push_back(i % 5 == 2 ? -100 : static_cast<int64_t>(rng() % m.vocab_size));
        pos.push_back(i % S);
      }
      feeds["input_ids"] = Tensor::from_vector({B, S}, ids);
      feeds["labels"] = Tensor::from_vector({B, S}, labels);
      feeds["position_ids"] = Tensor::from_vector({B, S}, pos);
      Executor ex(*g);
      RunResult r = ex.run(feeds);
      auto loss_at = [&](const TensorMap& f) { return ex.run(f).outputs.at("loss").to_doubles()[0]; };
      for (size_t p = 0; p < params.size(); ++p) {
        const std::string& name = params[p]->name();
        const auto analytic = r.outputs.at(grads[p]->name()).to_doubles();
        const int64_t n = feeds.at(name).numel();
        double err = 0, scale = 1e-12;
        for (int64_t j = 0; j < n; j += std::max<int64_t>(1, n / 11)) {
          const double h = 1e-5;
          TensorMap plus = feeds, minus = feeds;
          plus[name] = feeds.at(name).clone();
          minus[name] = feeds.at(name).clone();
          plus[name].data<double>()[j] += h;
          minus[name].data<double>()[j] -= h;
          const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * h);
          err = std::max(err, std::abs(numeric - analytic[j]));
          scale = std::max(scale, std::abs(numeric));
        }
        INFO(arch_name(m.arch) << " " << name << ": max abs error " << err << ", scale " << scale);
        CHECK(err / scale < 1e-6);
      }
    }
  }
}
