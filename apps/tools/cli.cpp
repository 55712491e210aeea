// Exception → exit code mapping for the apps.
#include "tools/cli.h"

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <new>
#include <nlohmann/json.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tools/options.h"
#include "tensor/check.h"

namespace autosp {

int run_app(const char* app, const std::function<int()>& body) {
  // Logs go to stderr; stdout is kept for what an app prints as data (graphs, benchmark rows).
  spdlog::set_default_logger(spdlog::stderr_color_mt("autosp"));
  // A closed pipe (`| head`, a dead log collector) is a failed write, reported where the app checks
  // its writes, not a silent death by SIGPIPE in the middle of a step or a checkpoint.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitUsage;
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "error: %s (see %s --help)\n", e.what(), app);
    return kExitUsage;
  } catch (const RuntimeFailure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitRuntime;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s: %s\n", app, e.what());
    return kExitRuntime;
  }
}

int64_t parse_int_flag(const std::string& name, const std::string& text) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(str("--", name, " '", text, "': expected an integer"));
}

namespace {

// The items of a comma-separated list, trimmed; an empty one is a UsageError.
std::vector<std::string> list_items(const std::string& name, const std::string& text, const std::string& expected) {
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw UsageError(str("--", name, ": no items (expected ", expected, ")"));
  std::vector<std::string> items;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) throw UsageError(str("--", name, " '", text, "': an empty item (expected ", expected, ")"));
    items.push_back(item.substr(a, b - a + 1));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

}  // namespace

std::vector<int64_t> parse_int_list(const std::string& name, const std::string& text, const std::string& expected) {
  std::vector<int64_t> out;
  for (const std::string& item : list_items(name, text, expected)) out.push_back(parse_int_flag(name, item));
  return out;
}

std::vector<double> parse_number_list(const std::string& name, const std::string& text, const std::string& expected) {
  std::vector<double> out;
  for (const std::string& item : list_items(name, text, expected)) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end != item.c_str() + item.size() || !std::isfinite(v))
      throw UsageError(str("--", name, " '", item, "': expected a number (", expected, ")"));
    out.push_back(v);
  }
  return out;
}

}  // namespace autosp
