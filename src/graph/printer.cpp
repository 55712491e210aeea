// Graph printers. The text form is one node per line:
//   %name = op(%a, %b, attr=value, ...)  dtype[shape]  role=...
// with the type column aligned, so a rewritten graph reads at a glance.
#include "graph/printer.h"

#include <algorithm>

namespace autosp {

namespace {
std::string call_str(const Node& n) {
  std::string s = "%" + n.name() + " = " + std::string(n.op_name()) + "(";
  bool first = true;
  for (const Node* i : n.inputs()) {
    s += (first ? "%" : ", %") + i->name();
    first = false;
  }
  for (const auto& [k, v] : n.attrs().map()) {
    s += (first ? "" : ", ") + k + "=" + attr_str(v);
    first = false;
  }
  return s + ")";
}

nlohmann::json attr_json(const AttrValue& v) {
  struct Visitor {
    nlohmann::json operator()(int64_t x) const { return x; }
    nlohmann::json operator()(double x) const { return x; }
    nlohmann::json operator()(bool x) const { return x; }
    nlohmann::json operator()(const std::string& x) const { return x; }
    nlohmann::json operator()(const Dim& x) const { return x.str(); }
    nlohmann::json operator()(const std::vector<Dim>& x) const {
      auto a = nlohmann::json::array();
      for (const auto& d : x) a.push_back(d.str());
      return a;
    }
    nlohmann::json operator()(const std::vector<int64_t>& x) const { return x; }
  };
  return std::visit(Visitor{}, v);
}

std::string dot_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
}  // namespace

std::string to_text(const Graph& g) {
  std::vector<std::string> calls;
  size_t width = 0;
  for (const auto& n : g.nodes()) {
    calls.push_back(call_str(*n));
    width = std::max(width, calls.back().size());
  }
  width = std::min<size_t>(width, 72);
  std::string out;
  for (const auto& a : g.assumptions()) out += "assume " + a.str() + "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    const Node& n = *g.nodes()[i];
    std::string line = calls[i];
    line += std::string(line.size() < width ? width - line.size() : 0, ' ') + "  " + n.type().str();
    if (n.role() != Role::none) line += "  role=" + std::string(role_name(n.role()));
    out += line + "\n";
  }
  if (!g.outputs().empty()) {
    out += "outputs:";
    for (const Node* o : g.outputs()) out += " %" + o->name();
    out += "\n";
  }
  return out;
}

nlohmann::json to_json(const Graph& g) {
  auto nodes = nlohmann::json::array();
  for (const auto& up : g.nodes()) {
    const Node& n = *up;
    nlohmann::json j;
    j["id"] = n.id();
    j["name"] = n.name();
    j["op"] = std::string(n.op_name());
    auto ins = nlohmann::json::array();
    for (const Node* i : n.inputs()) ins.push_back(i->id());
    j["inputs"] = ins;
    j["dtype"] = std::string(dtype_name(n.dtype()));
    auto shape = nlohmann::json::array();
    for (const auto& d : n.shape()) shape.push_back(d.str());
    j["shape"] = shape;
    j["role"] = n.role() == Role::none ? nlohmann::json(nullptr) : nlohmann::json(std::string(role_name(n.role())));
    auto attrs = nlohmann::json::object();
    for (const auto& [k, v] : n.attrs().map()) attrs[k] = attr_json(v);
    j["attrs"] = attrs;
    nodes.push_back(j);
  }
  nlohmann::json out;
  out["nodes"] = nodes;
  auto outs = nlohmann::json::array();
  for (const Node* o : g.outputs()) outs.push_back(o->id());
  out["outputs"] = outs;
  auto as = nlohmann::json::array();
  for (const auto& a : g.assumptions()) as.push_back(a.str());
  out["assumptions"] = as;
  return out;
}

std::string to_dot(const Graph& g) {
  std::string s = "digraph autosp {\n  node [shape=box, fontname=\"monospace\"];\n";
  for (const auto& up : g.nodes()) {
    const Node& n = *up;
    std::string label = dot_escape(n.name()) + "\\n" + dot_escape(std::string(n.op_name()) + "  " + n.type().str());
    std::string style = n.role() == Role::parameter ? ", style=filled, fillcolor=\"#eeeeee\""
                        : n.role() != Role::none   ? ", style=filled, fillcolor=\"#cce5ff\""
                                                   : "";
    s += "  n" + std::to_string(n.id()) + " [label=\"" + label + "\"" + style + "];\n";
    for (const Node* i : n.inputs()) s += "  n" + std::to_string(i->id()) + " -> n" + std::to_string(n.id()) + ";\n";
  }
  return s + "}\n";
}

}  // namespace autosp
