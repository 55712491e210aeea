// Printers for graphs: text (for people and golden tests), json (the contract in DESIGN.md) and
// dot (Graphviz). Knows nothing of kernels or devices.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "graph/ir.h"

namespace autosp {

std::string to_text(const Graph& g);
nlohmann::json to_json(const Graph& g);
std::string to_dot(const Graph& g);

}  // namespace autosp
