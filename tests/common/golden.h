// Golden-file comparison for IR text (set AUTOSP_UPDATE_GOLDEN=1 to rewrite after a deliberate
// change, then review the diff).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace autosp::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Compares `text` with tests/golden/<name>.
inline void check_golden(const std::string& name, const std::string& text) {
  const std::string path = std::string(AUTOSP_SOURCE_DIR) + "/tests/golden/" + name;
  if (std::getenv("AUTOSP_UPDATE_GOLDEN")) std::ofstream(path) << text;
  INFO("golden file " << path);
  CHECK(text == read_file(path));
}

}  // namespace autosp::testing
