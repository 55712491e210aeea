// What every app's main() shares: the exit-code contract (0 ok, 2 bad usage/config/input with one
// `error:` line on stderr, 3 runtime failure) and flag parsing errors mapped onto it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace autosp {

inline constexpr int kExitUsage = 2;
inline constexpr int kExitRuntime = 3;

// Runs `body`, mapping exceptions to the exit-code contract.
int run_app(const char* app, const std::function<int()>& body);

// The integer value of flag `name` given as text; anything else is a UsageError naming the flag.
int64_t parse_int_flag(const std::string& name, const std::string& text);

}  // namespace autosp
