// What every app's main() shares: the exit-code contract (0 ok, 2 bad usage/config/input with one
// `error:` line on stderr, 3 runtime failure) and flag parsing errors mapped onto it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace autosp {

inline constexpr int kExitUsage = 2;
inline constexpr int kExitRuntime = 3;

// Runs `body`, mapping exceptions to the exit-code contract.
int run_app(const char* app, const std::function<int()>& body);

// The integer value of flag `name` given as text; anything else is a UsageError naming the flag.
int64_t parse_int_flag(const std::string& name, const std::string& text);

// "1,2, 3" → {1, 2, 3} for flag `name`; anything else is a UsageError naming the flag and saying
// what was `expected` ("ids like 1,2,3"). Every comma separates two items, so an empty one
// anywhere ("1,,2", a trailing "1,2,", a leading ",1") is refused alike.
std::vector<int64_t> parse_int_list(const std::string& name, const std::string& text, const std::string& expected);
// The same for numbers ("0,0.25,1"); NaN and infinities are refused.
std::vector<double> parse_number_list(const std::string& name, const std::string& text, const std::string& expected);

}  // namespace autosp
