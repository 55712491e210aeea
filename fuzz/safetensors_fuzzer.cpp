// libFuzzer target: the safetensors reader on a file holding the input. Any outcome but a loaded
// file or a UsageError is a bug; nothing loaded may be larger than the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tensor/check.h"
#include "tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/autosp-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) __builtin_trap();
  try {
    autosp::SafetensorsFile st = autosp::load_safetensors(path);
    size_t total = 0;
    for (const auto& [name, t] : st.tensors) total += t.nbytes();
    if (total > size) __builtin_trap();
  } catch (const autosp::UsageError&) {
  }
  std::remove(path.c_str());
  return 0;
}
