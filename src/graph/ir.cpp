// Graph and Node: creation, editing through the use-list-maintaining API, roles and attributes.
#include "graph/ir.h"

#include <algorithm>
#include <array>

#include "tensor/check.h"

namespace autosp {

namespace {
constexpr std::array<std::string_view, 9> kRoleNames{"none",      "input_ids", "labels",   "position_ids", "parameter",
                                                     "logits",    "loss",      "gradient", "doc_start"};
static_assert(kRoleNames.size() == static_cast<size_t>(Role::doc_start) + 1, "every role needs a name");
}  // namespace

std::string_view role_name(Role r) { return kRoleNames.at(static_cast<size_t>(r)); }
std::string TensorType::str() const { return std::string(dtype_name(dtype)) + sym_shape_str(shape); }

// ---- attributes --------------------------------------------------------------------------------

template <class T>
const T& Attrs::get(const std::string& k, const char* type) const {
  auto it = map_.find(k);
  if (it == map_.end()) throw UsageError(str("missing attribute '", k, "'"));
  const T* v = std::get_if<T>(&it->second);
  if (!v) throw UsageError(str("attribute '", k, "' is not ", type));
  return *v;
}
int64_t Attrs::i(const std::string& k) const { return get<int64_t>(k, "an integer"); }
double Attrs::f(const std::string& k) const { return get<double>(k, "a number"); }
bool Attrs::b(const std::string& k) const { return get<bool>(k, "a bool"); }
const std::string& Attrs::s(const std::string& k) const { return get<std::string>(k, "a string"); }
const Dim& Attrs::dim(const std::string& k) const { return get<Dim>(k, "a dim"); }
const std::vector<Dim>& Attrs::dims(const std::string& k) const { return get<std::vector<Dim>>(k, "a list of dims"); }
const std::vector<int64_t>& Attrs::ints(const std::string& k) const {
  return get<std::vector<int64_t>>(k, "a list of integers");
}

std::string attr_str(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      std::string s = str(x);
      return s;
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return "\"" + x + "\""; }
    std::string operator()(const Dim& x) const { return x.str(); }
    std::string operator()(const std::vector<Dim>& x) const { return sym_shape_str(x); }
    std::string operator()(const std::vector<int64_t>& x) const {
      std::string s = "[";
      for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + std::to_string(x[i]);
      return s + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

// ---- nodes and graphs --------------------------------------------------------------------------

std::string_view Node::op_name() const { return autosp::op_name(op_); }

std::string Graph::unique_name(std::string base) {
  if (base.empty()) base = "v";
  if (!by_name_.count(base)) return base;
  for (int i = 1;; ++i) {
    std::string s = base + "." + std::to_string(i);
    if (!by_name_.count(s)) return s;
  }
}

Node* Graph::make(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                  std::optional<TensorType> type, size_t at) {
  for (Node* i : inputs) AUTOSP_ASSERT(i && position(i) < at, "input of new node ", name, " is not before it");
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->op_ = op;
  n->name_ = unique_name(std::move(name));
  n->role_ = role;
  n->inputs_ = std::move(inputs);
  n->attrs_ = std::move(attrs);
  if (type) n->type_ = *type;
  n->type_ = infer_type(*n, assumptions_);
  for (Node* i : n->inputs_) i->users_.push_back(n);
  by_name_[n->name_] = n;
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(at), std::move(node));
  renumber();
  return n;
}

Node* Graph::add(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                 std::optional<TensorType> type) {
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), nodes_.size());
}

Node* Graph::insert_after(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                          std::optional<TensorType> type) {
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), position(pos) + 1);
}

Node* Graph::insert_before(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                           std::optional<TensorType> type) {
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), position(pos));
}

void Graph::renumber() {
  for (size_t i = 0; i < nodes_.size(); ++i) nodes_[i]->id_ = static_cast<int>(i);
}

size_t Graph::position(const Node* n) const {
  AUTOSP_ASSERT(n != nullptr, "null node");
  size_t i = static_cast<size_t>(n->id_);
  AUTOSP_ASSERT(i < nodes_.size() && nodes_[i].get() == n, "node ", n->name(), " is not in this graph");
  return i;
}

void Graph::replace_input(Node* user, size_t index, Node* to) {
  Node* from = user->inputs_.at(index);
  AUTOSP_ASSERT(position(to) < position(user), "replacement ", to->name(), " does not come before ", user->name());
  user->inputs_[index] = to;
  auto& fu = from->users_;
  fu.erase(std::find(fu.begin(), fu.end(), user));
  to->users_.push_back(user);
}

void Graph::replace_all_uses_with(Node* from, Node* to, const Node* except) {
  std::vector<Node*> users = from->users_;
  for (Node* u : users) {
    if (u == except) continue;
    for (size_t i = 0; i < u->inputs_.size(); ++i)
      if (u->inputs_[i] == from) replace_input(u, i, to);
  }
  for (auto& o : outputs_)
    if (o == from) o = to;
}

void Graph::erase(Node* n) {
  AUTOSP_ASSERT(n->users_.empty(), "erase of ", n->name(), " which still has users");
  AUTOSP_ASSERT(!is_output(n), "erase of graph output ", n->name());
  size_t at = position(n);
  for (Node* i : n->inputs_) {
    auto& iu = i->users_;
    iu.erase(std::find(iu.begin(), iu.end(), n));
  }
  by_name_.erase(n->name_);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(at));
  renumber();
}

void Graph::move_before(Node* n, Node* pos) {
  const size_t from = position(n);
  size_t to = position(pos);
  if (to > from) --to;  // the place once n has left
  std::unique_ptr<Node> up = std::move(nodes_[from]);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(from));
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(to), std::move(up));
  renumber();
  for (Node* i : n->inputs_) AUTOSP_ASSERT(position(i) < to, "move of ", n->name(), " before its input ", i->name());
  for (Node* u : n->users_) AUTOSP_ASSERT(position(u) > to, "move of ", n->name(), " past its user ", u->name());
}

Node* Graph::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<Node*> Graph::with_role(Role r) const {
  std::vector<Node*> out;
  for (const auto& n : nodes_)
    if (n->role_ == r) out.push_back(n.get());
  return out;
}

void Graph::add_output(Node* n) {
  position(n);
  if (!is_output(n)) outputs_.push_back(n);
}
bool Graph::is_output(const Node* n) const { return std::find(outputs_.begin(), outputs_.end(), n) != outputs_.end(); }

void Graph::assume(Divisibility d) {
  for (const auto& a : assumptions_)
    if (a.expr == d.expr && a.modulus == d.modulus) return;
  assumptions_.push_back(std::move(d));
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  g->assumptions_ = assumptions_;
  std::map<const Node*, Node*> map;
  for (const auto& n : nodes_) {
    std::vector<Node*> ins;
    for (Node* i : n->inputs_) ins.push_back(map.at(i));
    map[n.get()] = g->add(n->op_, ins, n->attrs_, n->name_, n->role_, n->type_);
  }
  for (Node* o : outputs_) g->outputs_.push_back(map.at(o));
  return g;
}

}  // namespace autosp
