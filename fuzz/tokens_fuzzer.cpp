// libFuzzer target: the llm.c token-shard reader (data.source "tokens") on a file holding the
// input, then a few batches read from it, in file order, shuffled, or as a mix. Any outcome but a data source or a UsageError is a bug;
// every token read must be < vocab_size and labels must be the inputs shifted by one.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "train/data.h"
#include "tensor/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/autosp-fuzz-" + std::to_string(::getpid()) + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) __builtin_trap();
  // Shape parameters from the header's unused ints 3..5, so the fuzzer can vary them too.
  auto byte = [&](size_t i) { return i < size ? data[i] : uint8_t{0}; };
  autosp::DataConfig cfg;
  cfg.source = autosp::DataSourceKind::tokens;
  cfg.path = path;
  cfg.seq_len = 1 + byte(12) % 64;
  cfg.batch_size = 1 + byte(16) % 4;
  const int64_t vocab = 1 + (int64_t{byte(20)} | int64_t{byte(21)} << 8 | int64_t{byte(22) % 2} << 16);
  // The read order too: shuffled epochs, and a mix of the file with itself (data_order.h).
  cfg.shuffle = byte(26) & 1;
  cfg.seed = byte(27);
  if (byte(26) & 2) {
    cfg.mix = {{path, 1.0}, {path, 1.0 + byte(28)}};
    cfg.path.clear();
  }
  try {
    auto src = autosp::make_data_source(cfg, vocab, 0);
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{byte(24)}, int64_t{1} << 40}) {
      autosp::Batch b = src->get(step, byte(25) % 2, 2);
      const int64_t* in = b.input_ids.data<int64_t>();
      const int64_t* lab = b.labels.data<int64_t>();
      for (int64_t i = 0; i < b.input_ids.numel(); ++i) {
        if (in[i] < 0 || in[i] >= vocab || lab[i] < 0 || lab[i] >= vocab) __builtin_trap();
        if (i % cfg.seq_len != cfg.seq_len - 1 && lab[i] != in[i + 1]) __builtin_trap();
      }
    }
  } catch (const autosp::UsageError&) {
  }
  std::remove(path.c_str());
  return 0;
}
