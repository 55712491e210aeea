// cxxopts, as every app includes it. A vector option's values are never split: cxxopts splits them
// at commas by default, which cut `--set 'data.mix=[{...},{...}]'` or `--set x=[1,2]` apart. An
// argument cannot hold the NUL delimiter, so each --set stays whole; repeat the flag for several.
// Every translation unit of a binary must see the same delimiter (cxxopts' parsers are inline), so
// the apps include this header, never <cxxopts.hpp> itself.
#pragma once

#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>
