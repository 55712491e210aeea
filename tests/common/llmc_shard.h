// An llm.c token shard of random tokens (magic 20240520, version 1, uint16 tokens: the format
// train/data.h reads), shared by the tests that train or validate on token files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

namespace autosp::testing {

// Writes n tokens drawn uniformly from [0, vocab) with `seed` to `path`; returns them.
inline std::vector<uint16_t> write_llmc_shard(const std::filesystem::path& path, int64_t n, int64_t vocab,
                                              uint64_t seed) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<int32_t>(n);
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  std::mt19937_64 rng(seed);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % static_cast<uint64_t>(vocab));
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(n * 2));
  return tokens;
}

}  // namespace autosp::testing
