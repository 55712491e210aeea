// Graph and Node: creation, editing through the use-list-maintaining API, roles and attributes.
#include "graph/ir.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "tensor/check.h"

namespace autosp {

namespace {
constexpr std::array<std::string_view, 12> kRoleNames{"none",     "input_ids", "labels",   "position_ids",
                                                      "parameter", "logits",   "loss",     "gradient",
                                                      "doc_start", "frozen",   "token_index", "pair_ids"};
static_assert(kRoleNames.size() == static_cast<size_t>(Role::pair_ids) + 1, "every role needs a name");
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

// n->name_ becomes base, or the first free "<base>.<i>" (i >= 1; next_suffix_ remembers where the
// taken ones end), and is entered in the name index: one lookup per candidate, which enters it
// when it is free.
void Graph::name_uniquely(Node* n, std::string base) {
  n->name_ = base.empty() ? "v" : std::move(base);
  if (by_name_.insert(n)) return;
  base = n->name_;
  auto hint = next_suffix_.find(base);
  for (int i = hint == next_suffix_.end() ? 1 : hint->second;; ++i) {
    n->name_ = base + "." + std::to_string(i);
    if (by_name_.insert(n)) {
      if (hint != next_suffix_.end())
        hint->second = i + 1;
      else
        next_suffix_.emplace(std::move(base), i + 1);
      return;
    }
  }
}

// "<base>.<k>" is free again: name_uniquely's search for base starts at k at the latest.
void Graph::name_freed(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot + 1 == name.size() || name.size() - dot - 1 > 9 ||
      name.find_first_not_of("0123456789", dot + 1) != std::string::npos)
    return;
  auto hint = next_suffix_.find(std::string_view(name).substr(0, dot));
  if (hint != next_suffix_.end()) hint->second = std::min(hint->second, std::stoi(name.substr(dot + 1)));
}

// ---- order: a linked list with order labels ------------------------------------------------------
//
// Labels are integers below 2^62, strictly increasing along the list. An append takes the last
// label plus 2^32; an insertion the midpoint of its neighbours' labels. Where they are adjacent,
// relabel_around spreads out the smallest aligned label range around the place whose density is
// low enough (Bender, Cole, Demaine, Farach-Colton, Zito, "Two simplified algorithms for
// maintaining order in a list", 2002): O(log n) amortized per insertion.

namespace {
constexpr int kLabelBits = 62;
constexpr uint64_t kLabelEnd = uint64_t{1} << kLabelBits;
constexpr uint64_t kAppendGap = uint64_t{1} << 32;
}  // namespace

void Graph::link(Node* n, Node* after) {
  Node* next = after ? after->next_ : head_;
  n->prev_ = after;
  n->next_ = next;
  (after ? after->next_ : head_) = n;
  (next ? next->prev_ : tail_) = n;
  const uint64_t lo = after ? after->label_ : 0, hi = next ? next->label_ : kLabelEnd;
  if (!next && hi - lo > kAppendGap)
    n->label_ = lo + kAppendGap;
  else if (hi - lo >= 2)
    n->label_ = lo + (hi - lo) / 2;
  else
    relabel_around(n);
}

// n is linked between two nodes with adjacent labels (or at an end with no room): find the
// smallest range [base, base + 2^i) around the place that holds few enough nodes (with n,
// count <= (4/3)^i, density threshold T = 1.5) and give its nodes evenly spaced labels.
void Graph::relabel_around(Node* n) {
  const uint64_t anchor = n->prev_ ? n->prev_->label_ : n->next_ ? n->next_->label_ : kAppendGap;
  Node *first = n, *last = n;
  size_t count = 1;
  double limit = 1.0;
  for (int i = 1; i <= kLabelBits; ++i) {
    limit *= 4.0 / 3.0;
    const uint64_t size = uint64_t{1} << i, base = anchor & ~(size - 1);
    while (first->prev_ && first->prev_->label_ >= base) first = first->prev_, ++count;
    while (last->next_ && last->next_->label_ >= base && last->next_->label_ - base < size) last = last->next_, ++count;
    if (static_cast<double>(count) > limit || count + 1 > size) continue;
    const uint64_t gap = size / (count + 1);
    uint64_t label = base;
    for (Node* m = first;; m = m->next_) {
      m->label_ = label += gap;
      if (m == last) break;
    }
    return;
  }
  throw UsageError(str("graph: too many nodes to keep in order (", count_, ")"));
}

void Graph::unlink(Node* n) {
  (n->prev_ ? n->prev_->next_ : head_) = n->next_;
  (n->next_ ? n->next_->prev_ : tail_) = n->prev_;
  n->prev_ = n->next_ = nullptr;
}

// The list's nodes, in order, become the storage. Ownership passes from the old slots to the new
// ones in two sweeps (the old slots let go in storage order, the list takes its nodes back): a
// node's old slot, somewhere in the storage, is not read per node (a cache miss each, 500k nodes).
void Graph::materialize() const {
  if (!unordered_) return;
  std::vector<std::unique_ptr<Node>> order;
  order.reserve(count_);  // before any slot lets go: the one step here that may throw
  for (auto& slot : nodes_) (void)slot.release();  // each live one is in the list
  for (Node* n = head_; n; n = n->next_) {
    n->id_ = static_cast<int>(order.size());
    order.emplace_back(n);
  }
  nodes_ = std::move(order);
  unordered_ = false;
}

const std::vector<std::unique_ptr<Node>>& Graph::nodes() const {
  materialize();
  return nodes_;
}

void Graph::check_member(const Node* n) const {
  AUTOSP_ASSERT(n != nullptr, "null node");
  const size_t i = static_cast<size_t>(n->id_);
  AUTOSP_ASSERT(i < nodes_.size() && nodes_[i].get() == n, "node ", n->name(), " is not in this graph");
}

bool Graph::before(const Node* a, const Node* b) const {
  check_member(a);
  check_member(b);
  return a->label_ < b->label_;
}
Node* Graph::next(const Node* n) const {
  check_member(n);
  return n->next_;
}
Node* Graph::prev(const Node* n) const {
  check_member(n);
  return n->prev_;
}

size_t Graph::position(const Node* n) const {
  check_member(n);
  materialize();
  return static_cast<size_t>(n->id_);
}

// ---- editing -----------------------------------------------------------------------------------

Node* Graph::make(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                  std::optional<TensorType> type, Node* after) {
  for (Node* i : inputs) {
    if (i) check_member(i);
    AUTOSP_ASSERT(i && after && (i == after || i->label_ < after->label_), "input of new node ", name,
                  " is not before it");
  }
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->op_ = op;
  name_uniquely(n, std::move(name));
  n->role_ = role;
  n->inputs_ = std::move(inputs);
  n->attrs_ = std::move(attrs);
  if (type) n->type_ = *type;
  try {
    n->type_ = infer_type(*n, assumptions_);
  } catch (...) {
    name_freed(n->name_);
    by_name_.erase(n);
    throw;
  }
  n->type_checked_ = true;  // inferred just now
  unordered_ = unordered_ || after != tail_;  // an append keeps the order vector current
  link(n, after);
  for (Node* i : n->inputs_) i->users_.push_back(n);
  n->id_ = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(node));
  ++count_;
  return n;
}

Node* Graph::add(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                 std::optional<TensorType> type) {
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), tail_);
}

Node* Graph::insert_after(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                          std::optional<TensorType> type) {
  check_member(pos);
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), pos);
}

Node* Graph::insert_before(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
                           std::optional<TensorType> type) {
  check_member(pos);
  return make(op, std::move(inputs), std::move(attrs), std::move(name), role, std::move(type), pos->prev_);
}

void Graph::replace_input(Node* user, size_t index, Node* to) {
  Node* from = user->inputs_.at(index);
  AUTOSP_ASSERT(before(to, user), "replacement ", to->name(), " does not come before ", user->name());
  user->inputs_[index] = to;
  user->type_checked_ = false;
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
  if (from->output_ < 0) return;
  if (outputs_unique_ && to->output_ < 0) {
    outputs_[static_cast<size_t>(from->output_)] = to;  // O(1): a gradient per parameter is an output
    to->output_ = from->output_;
  } else {
    for (auto& o : outputs_)
      if (o == from) o = to;
    to->output_ = to->output_ < 0 ? from->output_ : std::min(to->output_, from->output_);
    outputs_unique_ = false;
  }
  from->output_ = -1;
}

void Graph::erase(Node* n) {
  check_member(n);
  AUTOSP_ASSERT(n->users_.empty(), "erase of ", n->name(), " which still has users");
  AUTOSP_ASSERT(!is_output(n), "erase of graph output ", n->name());
  for (Node* i : n->inputs_) {
    auto& iu = i->users_;
    iu.erase(std::find(iu.begin(), iu.end(), n));
  }
  name_freed(n->name_);
  by_name_.erase(n);
  const bool at_end = n == tail_ && !unordered_;
  unlink(n);
  --count_;
  if (at_end) {
    nodes_.pop_back();
  } else {
    nodes_[static_cast<size_t>(n->id_)].reset();
    unordered_ = true;
  }
}

void Graph::move_before(Node* n, Node* pos) {
  check_member(n);
  check_member(pos);
  if (n == pos) return;
  unlink(n);
  link(n, pos->prev_);
  unordered_ = true;
  for (Node* i : n->inputs_) AUTOSP_ASSERT(before(i, n), "move of ", n->name(), " before its input ", i->name());
  for (Node* u : n->users_) AUTOSP_ASSERT(before(n, u), "move of ", n->name(), " past its user ", u->name());
}

Node* Graph::find(std::string_view name) const { return by_name_.find(name); }

std::vector<Node*> Graph::with_role(Role r) const {
  std::vector<Node*> out;
  if (unordered_) {  // the list, rather than rebuilding the order for this
    for (Node* n = head_; n; n = n->next_)
      if (n->role_ == r) out.push_back(n);
    return out;
  }
  // The order vector: every node's address is known ahead, so the reads overlap; a walk of the list
  // waits for each node before it can read the next (11 % of planning a 48-layer MoE under ZeRO-3,
  // decision 189).
  for (const auto& n : nodes_)
    if (n->role_ == r) out.push_back(n.get());
  return out;
}

void Graph::add_output(Node* n) {
  check_member(n);
  if (n->output_ >= 0) return;
  n->output_ = static_cast<int>(outputs_.size());
  outputs_.push_back(n);
}

void Graph::assume(Divisibility d) {
  for (const auto& a : assumptions_)
    if (a.expr == d.expr && a.modulus == d.modulus) return;
  assumptions_.push_back(std::move(d));
}

void Graph::mark_checked(bool types) const {
  for (const auto& n : nodes()) {
    n->name_checked_ = true;
    n->type_checked_ = n->type_checked_ || types;
  }
  if (types) checked_assumptions_ = assumptions_.size();
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  g->assumptions_ = assumptions_;
  std::unordered_map<const Node*, Node*> map;
  for (const Node* n = head_; n; n = n->next_) {
    std::vector<Node*> ins;
    for (Node* i : n->inputs_) ins.push_back(map.at(i));
    map[n] = g->add(n->op_, ins, n->attrs_, n->name_, n->role_, n->type_);
  }
  for (Node* o : outputs_) g->add_output(map.at(o));
  return g;
}

}  // namespace autosp
