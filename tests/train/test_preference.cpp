// Preference pairs in the data and the DPO feeds (train/data.h, train/preference.h; issue 44): the
// loader's pair ids, documents, positions and ignored boundary targets, and the trainer's pair
// slots and completion counts, against expectations written here by hand for one small window.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/loss_mask_files.h"
#include "common/temp_dir.h"
#include "train/data.h"
#include "train/preference.h"

using namespace autosp;

namespace {

std::vector<int64_t> values(const Tensor& t) {
  const Tensor c = t.contiguous();
  return {c.data<int64_t>(), c.data<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("pair ids delimit the documents of a window, and ride on it like the labels", "[data][dpo]") {
  test::TempDir tmp("pairs");
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 17; ++i) tokens.push_back(i);
  test::write_shard(tmp.path("t.bin"), tokens);
  // Window 0 is tokens 0..8: pair 1's chosen (0..2) and rejected (3, 4), a pad (5), pair 2's chosen
  // (6, 7) and its rejected from token 8 on.
  test::write_bytes(tmp.path("p.npy"), test::npy_i32({1, 1, 1, -1, -1, 0, 2, 2, -2, -2, -2, 0, 0, 0, 0, 0, 0}));
  DataConfig cfg;
  cfg.source = DataSourceKind::tokens;
  cfg.path = tmp.path("t.bin");
  cfg.pairs_path = tmp.path("p.npy");
  cfg.seq_len = 8;
  cfg.batch_size = 1;
  const Batch b = make_data_source(cfg, 32, 1)->read(0, 1);
  CHECK(values(b.input_ids) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(values(b.pair_ids) == std::vector<int64_t>{1, 1, -1, -1, 0, 2, 2, -2});  // token t + 1's
  CHECK(values(b.doc_start) == std::vector<int64_t>{0, 0, 0, 3, 3, 5, 6, 6});
  CHECK(values(b.position_ids) == std::vector<int64_t>{0, 1, 2, 0, 1, 0, 0, 1});
  // A sequence's last target (the next one's first token) and the pad's are ignored.
  CHECK(values(b.labels) == std::vector<int64_t>{1, 2, -100, 4, -100, -100, 7, -100});
  // Pair 2's rejected side has no target in this window: its pair is cut, named as such.
  CHECK_THROWS_WITH(dpo_feeds(b, 4, DType::f64),
                    Catch::Contains("pair id 2 in sequence 0 of the batch has completion targets on its chosen side only"));
  cfg.pairs_path = tmp.path("t.bin");  // a token shard is no pair-id file
  CHECK_THROWS_WITH(make_data_source(cfg, 32, 1), Catch::Contains("not a .npy file"));
}

TEST_CASE("DPO feeds: each row's pairs get slots by first scored target, and their completion counts",
          "[dpo]") {
  // Two rows of 6 targets: row 0 holds pair 3 (2 chosen targets, 2 rejected; a prompt target is
  // ignored), row 1 pairs 7 and 4 (slots 0 and 1 by first appearance).
  Batch b;
  b.labels = Tensor::from_vector<int64_t>({2, 6}, {5, 5, -100, 5, 5, -100, 5, 5, 5, 5, 5, 5});
  b.pair_ids = Tensor::from_vector<int64_t>({2, 6}, {3, 3, -3, -3, -3, 0, 7, -7, -7, 4, 4, -4});
  const auto f = dpo_feeds(b, 3, DType::f64);
  CHECK(values(f.at("pair_slots")) == std::vector<int64_t>{1, 1, 0, -1, -1, 0, 1, -1, -1, 2, 2, -2});
  CHECK(f.at("seq_tokens").to_doubles() == std::vector<double>{2, 0, 0, 2, 0, 0, 1, 2, 0, 2, 1, 0});
  CHECK_THROWS_WITH(dpo_feeds(b, 1, DType::f64), Catch::Contains("holds more than 1 pairs"));
}
