// libFuzzer target: the .npy loss-mask reader (data.loss_mask_path) on a file holding the input,
// beside a fixed valid token shard of 64 tokens (token i = i), then a few batches read from it, in
// file order and shuffled. Any outcome but a data source or a UsageError is a bug; every label must
// be the next token or -100, and the inputs must be the tokens, whatever the mask.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tensor/check.h"
#include "train/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string stem = "/tmp/autosp-fuzz-mask-" + std::to_string(::getpid());
  const std::string shard = stem + ".bin", mask = stem + ".npy";
  static bool written = false;
  if (!written) {  // 256 × int32 header (magic 20240520, version 1, 64 tokens), then uint16 tokens 0..63
    std::vector<uint8_t> b(1024, 0);
    const uint32_t head[3] = {20240520, 1, 64};
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 4; ++i) b[size_t(4 * k + i)] = uint8_t(head[k] >> (8 * i));
    for (int t = 0; t < 64; ++t) b.push_back(uint8_t(t)), b.push_back(0);
    std::FILE* f = std::fopen(shard.c_str(), "wb");
    if (!f || std::fwrite(b.data(), 1, b.size(), f) != b.size() || std::fclose(f) != 0) __builtin_trap();
    written = true;
  }
  std::FILE* f = std::fopen(mask.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) __builtin_trap();
  autosp::DataConfig cfg;
  cfg.source = autosp::DataSourceKind::tokens;
  cfg.path = shard;
  cfg.loss_mask_path = mask;
  cfg.seq_len = 7;
  cfg.batch_size = 3;
  cfg.shuffle = size % 2 == 1;
  try {
    auto src = autosp::make_data_source(cfg, 64, 0);
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{5}}) {
      autosp::Batch b = src->get(step, 0, 1);
      const int64_t* in = b.input_ids.data<int64_t>();
      const int64_t* lab = b.labels.data<int64_t>();
      for (int64_t i = 0; i < b.input_ids.numel(); ++i) {
        if (in[i] < 0 || in[i] >= 64) __builtin_trap();
        if (lab[i] != -100 && lab[i] != in[i] + 1) __builtin_trap();  // token t is t: the next is t + 1
      }
    }
  } catch (const autosp::UsageError&) {
  }
  std::remove(mask.c_str());
  return 0;
}
