// libFuzzer target: the config parser. Input = JSON text, then optionally a NUL byte followed by
// '\n'-separated --set overrides. Any outcome but a valid Config or a UsageError is a bug (an
// escaping exception aborts the fuzzer), and a valid Config must satisfy the schema's rules.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "tensor/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string text = in.substr(0, nul);
  std::vector<std::string> sets;
  if (nul != std::string::npos) {
    size_t at = nul + 1;
    while (at <= in.size()) {
      const size_t nl = in.find('\n', at);
      sets.push_back(in.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
  }
  try {
    autosp::Config c = autosp::parse_config(autosp::parse_json(text, "fuzz.json"), sets, "fuzz.json");
    (void)c.resolved.dump();  // the echo and checkpoints print it
    const auto& m = c.model;
    // min_lr above lr is a problem only for a schedule that reads it (another one warns that it
    // is unused: decision 111).
    const auto reads = autosp::schedule_reads(c.train.lr_schedule);
    const bool reads_min_lr = std::find(reads.begin(), reads.end(), "train.min_lr") != reads.end();
    if (m.hidden_size % m.num_attention_heads != 0 || m.num_attention_heads % m.num_key_value_heads != 0 ||
        m.vocab_size < 2 || c.data.seq_len < 1 || c.data.batch_size < 1 || c.train.log_every < 1 ||
        c.train.keep_checkpoints < 0 || (reads_min_lr && c.train.min_lr > c.train.lr))
      __builtin_trap();
  } catch (const autosp::UsageError&) {
  }
  return 0;
}
