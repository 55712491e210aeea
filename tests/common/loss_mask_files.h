// Token shards and loss masks written byte by byte for the loss-mask tests (tests/train and
// tests/mpi test_loss_mask.cpp), from the formats' descriptions, not by the reader's code: an
// llm.c uint16 shard (256 × int32 header: magic 20240520, version 1, count) and a NumPy .npy file
// (magic, version, little-endian header length, the dict padded with spaces to a multiple of 64
// and ended by '\n', then the data).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace autosp::test {

using Bytes = std::vector<unsigned char>;

inline void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_shard(const std::string& path, const std::vector<int64_t>& tokens) {
  Bytes b(1024, 0);
  const uint32_t head[3] = {20240520, 1, static_cast<uint32_t>(tokens.size())};
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 4; ++i) b[size_t(4 * k + i)] = static_cast<unsigned char>(head[k] >> (8 * i));
  for (int64_t t : tokens) b.push_back(static_cast<unsigned char>(t)), b.push_back(static_cast<unsigned char>(t >> 8));
  write_bytes(path, b);
}

// A .npy file of `descr` and `shape` (Python's text, "(6,)") holding `data`; format `major`.0.
inline Bytes npy(const std::string& descr, const std::string& shape, const Bytes& data, int major = 1) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  const size_t n = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) b.push_back(static_cast<unsigned char>(n >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// A one-dimensional mask of `m` (0/1 values) as NumPy's np.save(np.uint8 array) writes it.
inline Bytes npy_mask(const std::vector<int64_t>& m, const std::string& descr = "|u1", int major = 1) {
  Bytes data;
  for (int64_t v : m) data.push_back(static_cast<unsigned char>(v));
  return npy(descr, "(" + std::to_string(m.size()) + ",)", data, major);
}

// One-dimensional int32 ids (pair ids, document ids) as np.save of a '<i4' array writes them.
inline Bytes npy_i32(const std::vector<int32_t>& ids) {
  Bytes data;
  for (int32_t v : ids)
    for (int k = 0; k < 4; ++k) data.push_back(static_cast<unsigned char>(static_cast<uint32_t>(v) >> (8 * k)));
  return npy("<i4", "(" + std::to_string(ids.size()) + ",)", data);
}

}  // namespace autosp::test
