// Packed documents (data.document_mask): the loader's marking on hand-written sequences (restarted
// positions, document starts, ignored EOS targets), the config's rejections, and the equivalence
// that defines the feature: a packed batch gives every document the logits and the loss it gets
// when it runs alone, for GPT-2 and a GQA Llama.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "engine/executor.h"
#include "models/model.h"
#include "tensor/check.h"
#include "train/data.h"

namespace {

using namespace autosp;
using nlohmann::json;

std::vector<int64_t> values(const Tensor& t) {
  std::vector<int64_t> v;
  for (double x : t.to_doubles()) v.push_back(static_cast<int64_t>(x));
  return v;
}

Batch batch_of(const std::vector<int64_t>& stream, int64_t S) {  // one row: input = stream[0, S), labels shifted
  std::vector<int64_t> in(stream.begin(), stream.begin() + S), lab(stream.begin() + 1, stream.begin() + S + 1), pos(static_cast<size_t>(S));
  for (int64_t t = 0; t < S; ++t) pos[size_t(t)] = t;
  return {Tensor::from_vector<int64_t>({1, S}, in), Tensor::from_vector<int64_t>({1, S}, lab),
          Tensor::from_vector<int64_t>({1, S}, pos), Tensor()};
}

}  // namespace

TEST_CASE("mark_documents restarts positions after each EOS and ignores the EOS targets", "[data][documents]") {
  // EOS = 2. Documents: [5 6 2] [7 2] [2] [8 9 …
  Batch b = batch_of({5, 6, 2, 7, 2, 2, 8, 9, 4}, 8);
  mark_documents(b, 2);
  CHECK(values(b.position_ids) == std::vector<int64_t>{0, 1, 2, 0, 1, 0, 0, 1});
  CHECK(values(b.doc_start) == std::vector<int64_t>{0, 0, 0, 3, 3, 5, 6, 6});
  CHECK(values(b.labels) == std::vector<int64_t>{6, 2, -100, 2, -100, -100, 9, 4});
  CHECK(values(b.input_ids) == std::vector<int64_t>{5, 6, 2, 7, 2, 2, 8, 9});
}

TEST_CASE("mark_documents: a row that starts right after an EOS, and rows marked independently", "[data][documents]") {
  std::vector<int64_t> in = {2, 4, 4, 2, 4, 4, 4, 4}, lab = {4, 4, 2, 4, 4, 4, 4, 4};
  Batch b{Tensor::from_vector<int64_t>({2, 4}, in), Tensor::from_vector<int64_t>({2, 4}, lab),
          Tensor::from_vector<int64_t>({2, 4}, std::vector<int64_t>(8, 0)), Tensor()};
  mark_documents(b, 2);
  // Row 0: [2] [4 4 2]; row 1: one document [4 4 4 4] (row 0's last EOS does not reach it).
  CHECK(values(b.doc_start) == std::vector<int64_t>{0, 1, 1, 1, 0, 0, 0, 0});
  CHECK(values(b.position_ids) == std::vector<int64_t>{0, 0, 1, 2, 0, 1, 2, 3});
  CHECK(values(b.labels) == std::vector<int64_t>{-100, 4, 2, -100, 4, 4, 4, 4});
}

// The contract the CUDA attention backward relies on (attention.cuh): starts rise along each row.
// mark_documents' and pad_to_multiple's starts keep it; a falling start, a start past its token or
// a negative one is a UsageError naming the row and position.
TEST_CASE("check_doc_start accepts packed documents and refuses starts that fall or lie ahead", "[data][documents]") {
  Batch b = batch_of({5, 6, 2, 7, 2, 2, 8, 9, 4}, 8);
  mark_documents(b, 2);
  CHECK_NOTHROW(check_doc_start(b.doc_start));
  CHECK_NOTHROW(check_doc_start(pad_to_multiple(b, 3).doc_start));
  const auto starts = [](std::vector<int64_t> v) { return Tensor::from_vector<int64_t>({2, 4}, v); };
  CHECK_THROWS_WITH(check_doc_start(starts({0, 0, 2, 2, 0, 1, 1, 0})),
                    "doc_start of row 1 falls from 1 to 0 at position 3: document starts never decrease along the "
                    "sequence");
  CHECK_THROWS_AS(check_doc_start(starts({0, 0, 2, 2, 0, 1, 1, 0})), UsageError);
  CHECK_THROWS_WITH(check_doc_start(starts({0, 2, 2, 2, 0, 0, 0, 0})),
                    "doc_start of row 0 at position 1 is 2: a document starts at or before its token, at 0 or later");
  CHECK_THROWS_WITH(check_doc_start(starts({0, 0, 0, 0, -1, 0, 0, 0})), Catch::Contains("row 1 at position 0 is -1"));
}

TEST_CASE("document_mask config errors name the key", "[config][documents]") {
  const json model = {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 1},
                      {"num_attention_heads", 2}, {"intermediate_size", 16}};
  auto parse = [&](json data, json runtime = json::object()) {
    return parse_config({{"model", model}, {"data", data}, {"runtime", runtime}});
  };
  const json tokens = {{"source", "tokens"}, {"path", "x.bin"}};
  json d = tokens;
  d["document_mask"] = true;
  CHECK_THROWS_WITH(parse(d), Catch::Contains("data.document_mask needs data.eos_token_id"));
  d["eos_token_id"] = 32;
  CHECK_THROWS_WITH(parse(d), Catch::Contains("data.eos_token_id 32 is outside the vocabulary"));
  d["eos_token_id"] = -1;
  CHECK_THROWS_AS(parse(d), UsageError);
  d["eos_token_id"] = "2";
  CHECK_THROWS_AS(parse(d), UsageError);
  d["eos_token_id"] = 2;
  CHECK_NOTHROW(parse(d));
  d["document_mask"] = "yes";
  CHECK_THROWS_AS(parse(d), UsageError);
  d["document_mask"] = true;
  CHECK_THROWS_WITH(parse(d, {{"device", "cuda"}, {"attention", "cudnn"}}),
                    Catch::Contains("cudnn") && Catch::Contains("document mask"));
  json synthetic = {{"source", "synthetic"}, {"eos_token_id", 2}, {"document_mask", true}};
  CHECK_THROWS_WITH(parse(synthetic), Catch::Contains("synthetic"));
}

TEST_CASE("a packed batch gives each document the logits and loss it has alone", "[model][documents]") {
  const int64_t eos = 3, V = 40;
  const std::vector<json> models = {
      {{"arch", "gpt2"}, {"vocab_size", V}, {"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
       {"max_position_embeddings", 64}},
      {{"arch", "llama"}, {"vocab_size", V}, {"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
       {"num_key_value_heads", 2}, {"intermediate_size", 48}}};
  // Documents of 9, 1, 17 and 13 tokens (each ending in EOS but the last, which the row cuts).
  std::vector<int64_t> stream;
  for (int64_t len : {9, 1, 17, 14}) {
    for (int64_t t = 0; t + 1 < len; ++t) stream.push_back(4 + (t * 7 + len) % (V - 4));
    stream.push_back(eos);
  }
  const int64_t S = int64_t(stream.size()) - 1;  // the last document's EOS is only a target
  for (const json& mj : models) {
    INFO(mj["arch"].get<std::string>());
    const Config cfg = parse_config({{"model", mj}, {"data", {{"seq_len", 64}}}});
    const ParamMap params = init_params(cfg.model, 5, DType::f64);
    auto run = [&](const Batch& b, bool documents) {
      auto g = build_forward(cfg.model, DType::f64, ForwardMode::train, {.document_mask = documents});
      TensorMap feeds = batch_feeds(b);  // doc_start only in the packed batch
      for (const auto& [n, p] : params) feeds[n] = p;
      return Executor(*g).run(feeds);
    };
    Batch packed = batch_of(stream, S);
    mark_documents(packed, eos);
    const RunResult all = run(packed, true);
    const auto logits = all.outputs.at("logits").to_doubles();  // [1, S, V]
    const auto labels = values(packed.labels);
    double packed_sum = 0;
    int64_t packed_count = 0, begin = 0;
    for (int64_t len : {9, 1, 17, 13}) {
      INFO("document at " << begin << " of " << len << " tokens");
      // Alone: the document's tokens from position 0, its EOS target ignored as the loader does.
      std::vector<int64_t> doc(stream.begin() + begin, stream.begin() + begin + len + 1);
      Batch alone = batch_of(doc, len);
      if (doc[size_t(len - 1)] == eos) alone.labels.data<int64_t>()[len - 1] = -100;
      const RunResult one = run(alone, false);
      const auto own = one.outputs.at("logits").to_doubles();
      double err = 0, scale = 0, sum = 0;
      int64_t count = 0;
      for (int64_t t = 0; t < len; ++t) {
        const double* row = logits.data() + (begin + t) * V;
        for (int64_t v = 0; v < V; ++v) {
          err = std::max(err, std::abs(row[v] - own[size_t(t * V + v)]));
          scale = std::max(scale, std::abs(own[size_t(t * V + v)]));
        }
        const int64_t y = labels[size_t(begin + t)];
        if (y == -100) continue;
        double mx = -INFINITY, z = 0;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
        for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
        sum += mx + std::log(z) - row[y];
        ++count;
      }
      CHECK(err / scale < 1e-12);
      if (count > 0) {
        const double alone_loss = one.outputs.at("loss").to_doubles().at(0);
        CHECK(std::abs(sum / double(count) - alone_loss) < 1e-12 * std::max(1.0, alone_loss));
      }
      packed_sum += sum;
      packed_count += count;
      begin += len;
    }
    CHECK(packed_count == 9 - 1 + 0 + 17 - 1 + 13);  // every EOS target ignored, the cut document's kept
    CHECK(std::abs(all.outputs.at("loss").to_doubles().at(0) - packed_sum / double(packed_count)) < 1e-12);
  }
}
