// Packed documents under AutoSP (data.document_mask) against the independent float64 PyTorch
// reference tests/ref/model_ref.py --eos, which builds the block-diagonal causal mask, the
// restarted position ids and the ignored EOS targets by hand from the raw tokens. Our side runs the
// data loader's mark_documents, pads like the trainer, and runs the joint f32 program on P = 1, 2,
// 3 and 4 ranks (groups split from the world; P = 3 needs 4 ranks), GPT-2 and a Llama with one
// kv head (GQA, kv < P: replicated K/V) and a Qwen3-MoE (top 2 of 4 experts), at dp 2 × sp 2 (np 4),
// with S = 48 and S = 47 (which no P > 1 divides). Bars: loss within 1e-5 relative, every gradient
// within 1e-3.
//
// Rank 0 writes the case and runs the reference once per (model, S); every rank reads its output.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "common/sp_case.h"
#include "models/model.h"
#include "mpi/mpi_test.h"
#include "tensor/safetensors.h"
#include "train/data.h"

namespace autosp::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kEos = 3, kVocab = 64;
const json kDocGpt2 = {{"arch", "gpt2"}, {"vocab_size", kVocab}, {"hidden_size", 48}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 12}, {"max_position_embeddings", 64}};
const json kDocLlama = {{"arch", "llama"}, {"vocab_size", kVocab}, {"hidden_size", 48}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 12}, {"num_key_value_heads", 1}, {"intermediate_size", 64}};
// A mixture of experts: Qwen3-MoE's top 2 of 4 experts, renormalised, on every layer.
const json kDocQwen3Moe = {{"arch", "qwen3_moe"}, {"vocab_size", kVocab}, {"hidden_size", 48}, {"num_hidden_layers", 2},
                           {"num_attention_heads", 12}, {"num_key_value_heads", 1}, {"intermediate_size", 64},
                           {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
                           {"norm_topk_prob", true}};

Config doc_config(const json& model, int64_t sp, int64_t seq_len, int64_t batch) {
  return parse_config({{"model", model},
                       {"data", {{"source", "tokens"}, {"path", "unused.bin"}, {"seq_len", seq_len},
                                 {"batch_size", batch}, {"eos_token_id", kEos}, {"document_mask", true}}},
                       {"runtime", {{"dtype", "float32"}, {"threads", 1}}},
                       {"sequence_parallel", {{"autosp_size", sp}}}});
}

// Rows [r0, r0 + n) of a [B, S] tensor.
Tensor rows(const Tensor& t, int64_t r0, int64_t n) {
  const int64_t S = t.dim(1);
  const Tensor c = t.contiguous();
  std::vector<int64_t> v(c.data<int64_t>() + r0 * S, c.data<int64_t>() + (r0 + n) * S);
  return Tensor::from_vector<int64_t>({n, S}, v);
}

void check_against(const LossAndGrads& got, const SafetensorsFile& ref) {
  const double want = ref.tensors.at("loss").to_doubles().at(0);
  INFO("loss " << got.loss << " vs reference " << want);
  CHECK(std::abs(got.loss - want) / std::abs(want) < 1e-5);
  CHECK(!got.grads.empty());
  for (const auto& [name, g] : got.grads) {
    INFO("gradient of " << name);
    auto it = ref.tensors.find("grad." + name);
    CHECK(it != ref.tensors.end());
    if (it != ref.tensors.end()) CHECK(rel_err(g, it->second) < 1e-3);
  }
}

}  // namespace

TEST_CASE("documents: loss and gradients equal the hand-built float64 reference on every layout",
          "[autosp][documents]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  const TempDir tmp = shared_temp_dir(w, "documents");
  const fs::path& dir = tmp.dir;
  const int64_t B = 2;
  int case_id = 0;
  for (const json& model : {kDocGpt2, kDocLlama, kDocQwen3Moe}) {
    for (int64_t S : {int64_t{48}, int64_t{47}}) {
      const fs::path c = dir / std::to_string(case_id++);
      const Config cfg1 = doc_config(model, 1, S, B);
      const ParamMap params = init_params(cfg1.model, 21, DType::f32);
      const Batch raw = documents_batch(B, S, kVocab, kEos, 20, 100 + uint64_t(S));
      int ok = 1;
      if (w.rank() == 0) {  // the reference, from the raw tokens (it marks the documents itself)
        fs::create_directories(c);
        std::ofstream(c / "cfg.json") << json{{"model", model}}.dump();
        ParamMap f64;
        for (const auto& [n, t] : params) f64[n] = t.to(DType::f64);
        save_safetensors((c / "w.safetensors").string(), f64);
        save_safetensors((c / "batch.safetensors").string(), batch_feeds(raw));
        const std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + std::string(AUTOSP_SOURCE_DIR) +
                                "/tests/ref/model_ref.py --config " + (c / "cfg.json").string() + " --weights " +
                                (c / "w.safetensors").string() + " --batch " + (c / "batch.safetensors").string() +
                                " --dtype float64 --grads --eos " + std::to_string(kEos) + " --out " +
                                (c / "ref.safetensors").string();
        ok = std::system(cmd.c_str()) == 0;
      }
      Tensor flag = Tensor::from_vector<int64_t>({1}, {int64_t(ok)});
      w.broadcast(flag, 0);
      REQUIRE(flag.data<int64_t>()[0] == 1);  // the same verdict on every rank
      const SafetensorsFile ref = load_safetensors((c / "ref.safetensors").string());
      Batch marked = raw;
      mark_documents(marked, kEos);
      INFO(model["arch"].get<std::string>() << ", S = " << S);
      CHECK(rel_err(marked.position_ids, ref.tensors.at("position_ids")) == 0);  // the loader's restarts
      CHECK(rel_err(marked.labels, ref.tensors.at("labels")) == 0);              // and ignored EOS targets

      // Pure SP: P = 1 … W (P = 3 on ranks 0-2 of four); the other ranks wait at the split.
      for (int64_t P = 1; P <= W; ++P) {
        auto group = w.split(w.rank() < P ? 0 : 1, w.rank());
        if (w.rank() >= P) continue;
        INFO("sp " << P);
        check_against(run_sp_on(*group, doc_config(model, P, S, B), pad_to_multiple(marked, P), params), ref);
      }
      if (W == 4) {  // dp 2 × sp 2: dp rank d takes row d of the global batch
        INFO("dp 2 x sp 2");
        const int64_t d = w.rank() / 2;
        const Batch mine{rows(marked.input_ids, d, 1), rows(marked.labels, d, 1), rows(marked.position_ids, d, 1),
                         rows(marked.doc_start, d, 1)};
        check_against(run_sp_on(w, doc_config(model, 2, S, 1), pad_to_multiple(mine, 2), params), ref);
      }
      w.barrier();
    }
  }
  w.barrier();
}

}  // namespace autosp::test
