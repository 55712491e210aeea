// Document ids (data.doc_ids_path, written by scripts/prepare_data.py --chat and --completion): under
// data.document_mask a document is a run of one id, so an EOS inside an example (a chat template
// that ends each turn with EOS: Llama 2, Mistral, Zephyr) does not split it, as EOS marking would.
// Expectations are written here by hand for small windows; the config's rules and malformed id
// files are named errors.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/loss_mask_files.h"
#include "common/temp_dir.h"
#include "config/config.h"
#include "train/data.h"

using namespace autosp;
using nlohmann::json;

namespace {

std::vector<int64_t> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  return {c.data<int64_t>(), c.data<int64_t>() + c.numel()};
}

// EOS = 2. Example 1 is a two-turn chat [5 2 | 6 7 2] whose first turn ends with EOS, example 2
// is [8 2], then one pad (2) and the next window's example 3 [9 10 11 2 ...].
const std::vector<int64_t> kTokens = {5, 2, 6, 7, 2, 8, 2, 2, 9, 10, 11, 2, 12, 13, 14, 2, 2};
const std::vector<int32_t> kIds = {1, 1, 1, 1, 1, 2, 2, 0, 3, 3, 3, 3, 4, 4, 4, 4, 0};

DataConfig doc_config(const test::TempDir& tmp) {
  test::write_shard(tmp.path("t.bin"), kTokens);
  test::write_bytes(tmp.path("d.npy"), test::npy_i32(kIds));
  DataConfig cfg;
  cfg.source = DataSourceKind::tokens;
  cfg.path = tmp.path("t.bin");
  cfg.doc_ids_path = tmp.path("d.npy");
  cfg.seq_len = 8;
  cfg.batch_size = 1;
  cfg.eos_token_id = 2;
  cfg.document_mask = true;
  return cfg;
}

}  // namespace

TEST_CASE("document ids delimit the documents: an EOS inside an example does not end it", "[data][documents]") {
  test::TempDir tmp("doc-ids");
  DataConfig cfg = doc_config(tmp);
  const Batch b = make_data_source(cfg, 32, 1)->read(0, 1);
  CHECK(values(b.input_ids) == std::vector<int64_t>{5, 2, 6, 7, 2, 8, 2, 2});
  CHECK(values(b.doc_start) == std::vector<int64_t>{0, 0, 0, 0, 0, 5, 5, 7});
  CHECK(values(b.position_ids) == std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 0});
  // The turn's EOS keeps its target (6); each example's last target and the pad's are ignored.
  CHECK(values(b.labels) == std::vector<int64_t>{2, 6, 7, 2, -100, 2, -100, -100});
  CHECK_FALSE(b.pair_ids.defined());  // document ids are no DPO pairs

  // EOS marking (no ids) splits the chat after its first turn: the difference the ids make.
  cfg.doc_ids_path.clear();
  const Batch e = make_data_source(cfg, 32, 1)->read(0, 1);
  CHECK(values(e.doc_start) == std::vector<int64_t>{0, 0, 2, 2, 2, 5, 5, 7});
  CHECK(values(e.labels)[1] == -100);

  // Without data.document_mask the ids are not read: one causal window, positions 0..7.
  cfg = doc_config(tmp);
  cfg.document_mask = false;
  const Batch n = make_data_source(cfg, 32, 1)->read(0, 1);
  CHECK_FALSE(n.doc_start.defined());
  CHECK(values(n.position_ids) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("document ids: validation data and every dataset of a mix read their own", "[data][documents]") {
  test::TempDir tmp("doc-ids-mix");
  DataConfig cfg = doc_config(tmp);
  cfg.val_path = cfg.path;
  cfg.val_doc_ids_path = cfg.doc_ids_path;
  CHECK(values(make_val_source(cfg, 32, 1)->read(0, 1).doc_start) == std::vector<int64_t>{0, 0, 0, 0, 0, 5, 5, 7});
  // A mix of the ids' stream and the same tokens marked by EOS: each sequence as its own stream reads it.
  cfg.mix = {{cfg.path, 1.0, "", cfg.doc_ids_path}, {cfg.path, 1.0, "", ""}};
  cfg.path.clear();
  cfg.doc_ids_path.clear();
  const Batch m = make_data_source(cfg, 32, 1)->read(0, 4);
  std::vector<int64_t> starts = values(m.doc_start), pos = values(m.position_ids);
  bool by_ids = false, by_eos = false;
  for (int64_t r = 0; r < 4; ++r) {
    const std::vector<int64_t> row(starts.begin() + r * 8, starts.begin() + r * 8 + 8);
    const std::vector<int64_t> row_pos(pos.begin() + r * 8, pos.begin() + r * 8 + 8);
    if (row == std::vector<int64_t>{0, 0, 0, 0, 0, 5, 5, 7}) {
      by_ids = true;
      CHECK(row_pos == std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 0});
    }
    by_eos = by_eos || row == std::vector<int64_t>{0, 0, 2, 2, 2, 5, 5, 7};
  }
  CHECK(by_ids);
  CHECK(by_eos);
}

TEST_CASE("document ids: malformed files and misplaced keys are named errors", "[data][documents][config]") {
  test::TempDir tmp("doc-ids-bad");
  DataConfig cfg = doc_config(tmp);
  test::write_bytes(tmp.path("u8.npy"), test::npy_mask({1, 1, 1, 1, 1, 2, 2, 0, 3, 3, 3, 3, 4, 4, 4, 4, 0}));
  cfg.doc_ids_path = tmp.path("u8.npy");
  CHECK_THROWS_WITH(make_data_source(cfg, 32, 1),
                    Catch::Contains("document ids are little-endian int32") && Catch::Contains("u8.npy"));
  test::write_bytes(tmp.path("short.npy"), test::npy_i32({1, 1, 1}));
  cfg.doc_ids_path = tmp.path("short.npy");
  CHECK_THROWS_WITH(make_data_source(cfg, 32, 1), Catch::Contains("the document-id file holds 3 values") &&
                                                      Catch::Contains("holds 17 tokens"));
  cfg.doc_ids_path = tmp.path("t.bin");
  CHECK_THROWS_WITH(make_data_source(cfg, 32, 1), Catch::Contains("not a .npy file (no \\x93NUMPY magic) (the document ids of"));

  auto problems = [&](json data, json train = json::object()) {
    json model = {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 1},
                  {"num_attention_heads", 2}};
    try {
      parse_config({{"model", model}, {"data", data}, {"train", train}});
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const json tokens = {{"source", "tokens"}, {"path", tmp.path("t.bin")}, {"seq_len", 8}, {"eos_token_id", 2},
                       {"document_mask", true}};
  json d = tokens;
  d["source"] = "synthetic";
  d.erase("path");
  d["document_mask"] = false;
  d["doc_ids_path"] = tmp.path("d.npy");
  CHECK_THAT(problems(d), Catch::Contains("data.doc_ids_path applies to data.source \"tokens\""));
  d = tokens;
  d["val_doc_ids_path"] = tmp.path("d.npy");
  CHECK_THAT(problems(d), Catch::Contains("data.val_doc_ids_path needs data.val_path"));
  d = tokens;
  d.erase("path");
  d["mix"] = {{{"path", tmp.path("t.bin")}, {"doc_ids_path", 7}}};
  CHECK_THAT(problems(d), Catch::Contains("data.mix[0].doc_ids_path = 7"));
  d["mix"] = {{{"path", tmp.path("t.bin")}}};
  d["doc_ids_path"] = tmp.path("d.npy");
  CHECK_THAT(problems(d), Catch::Contains("with data.mix give each entry its own \"doc_ids_path\""));
  d = tokens;
  d["doc_ids_path"] = tmp.path("d.npy");
  d["pairs_path"] = tmp.path("d.npy");
  d["loss_mask_path"] = tmp.path("d.npy");
  CHECK_THAT(problems(d, {{"objective", "dpo"}}), Catch::Contains("data.doc_ids_path does not apply to train.objective \"dpo\""));
  d = tokens;
  d["doc_ids_path"] = tmp.path("d.npy");
  CHECK(problems(d).empty());
  d["document_mask"] = false;
  const Config c = parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 16},
                                            {"num_hidden_layers", 1}, {"num_attention_heads", 2}}},
                                 {"data", d}});
  bool warned = false;
  for (const std::string& w : c.warnings) warned = warned || w.find("data.document_mask is false") != std::string::npos;
  CHECK(warned);
}
