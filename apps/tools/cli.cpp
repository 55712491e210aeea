// Exception → exit code mapping for the apps.
#include "tools/cli.h"

#include <csignal>
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

}  // namespace autosp
