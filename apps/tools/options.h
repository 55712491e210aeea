// cxxopts, as every app includes it, and the flag parsing autosp-sample and autosp-eval share. A
// vector option's values are never split: cxxopts splits them at commas by default, which cut
// `--set 'data.mix=[{...},{...}]'` or `--set x=[1,2]` apart. An argument cannot hold the NUL
// delimiter, so each --set stays whole; repeat the flag for several.
// Every translation unit of a binary must see the same delimiter (cxxopts' parsers are inline), so
// the apps include this header, never <cxxopts.hpp> itself.
#pragma once

#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>

#include <iostream>
#include <optional>
#include <string>

#include "tensor/check.h"

namespace autosp {

// opts.parse(argc, argv) as the apps take flags: with --help the options are printed and nullopt
// returned (exit 0); an argument no option takes is a UsageError.
inline std::optional<cxxopts::ParseResult> parse_flags(cxxopts::Options& opts, int argc, char** argv) {
  auto args = opts.parse(argc, argv);
  if (args.count("help")) {
    std::cout << opts.help() << std::flush;
    return std::nullopt;
  }
  if (!args.unmatched().empty()) throw UsageError(str("unexpected argument '", args.unmatched()[0], "'"));
  return args;
}

// A string flag's value, "" when it is not given.
inline std::string flag_text(const cxxopts::ParseResult& args, const char* name) {
  return args.count(name) ? args[name].as<std::string>() : std::string();
}

}  // namespace autosp
