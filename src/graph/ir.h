// The IR: a Graph owns Nodes in topological (= execution) order. A node has an op, inputs, typed
// attributes, an output type (dtype + symbolic shape), a unique name and a role tag. Users lists and
// order are maintained by the Graph API (add, insert_after, replace_all_uses_with, erase); passes never
// edit them by hand. Knows nothing of kernels, tensors' data or devices.
//
// Cost (docs/decisions.md 95): every edit is O(1) amortized (plus the name index's log), so a pass
// that makes a few edits per node is linear in the graph. The order is a linked list whose nodes
// carry order labels (Bender et al.'s list labelling), so `before`, `next` and `prev` are O(1) at any
// time. The execution-order vector (`nodes()`, `position()`, `Node::id()`) is rebuilt, O(n), on the
// first such call after an edit anywhere but the end: a pass that edits in the middle while it
// walks the graph snapshots the nodes first and asks `before`/`next`/`prev`, not `position`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "graph/name_index.h"
#include "graph/ops.h"
#include "graph/sym.h"
#include "tensor/dtype.h"

namespace autosp {

enum class Role : uint8_t {
  none, input_ids, labels, position_ids, parameter, logits, loss, gradient,
  doc_start,  // packed documents: where each token's document begins (sdpa's document mask)
  frozen,     // a parameter that is fed but not trained: no gradient, no optimizer state (LoRA's base)
  token_index,  // each token's index in the run's read order, i64 [B, S] (the dropout mask's counter)
  pair_ids,   // preference training: each target's pair slot (sharded with the labels)
};
std::string_view role_name(Role r);

struct TensorType {
  DType dtype = DType::f32;
  SymShape shape;
  int rank() const { return static_cast<int>(shape.size()); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  std::string str() const;  // "f32[B, S, 64]"
};

using AttrValue = std::variant<int64_t, double, bool, std::string, Dim, std::vector<Dim>, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : map_(init) {}
  bool has(const std::string& k) const { return map_.count(k) != 0; }
  void set(const std::string& k, AttrValue v) { map_[k] = std::move(v); }
  // Typed getters throw UsageError naming the attribute when missing or of another type.
  int64_t i(const std::string& k) const;
  double f(const std::string& k) const;
  bool b(const std::string& k) const;
  const std::string& s(const std::string& k) const;
  const Dim& dim(const std::string& k) const;
  const std::vector<Dim>& dims(const std::string& k) const;
  const std::vector<int64_t>& ints(const std::string& k) const;
  const std::map<std::string, AttrValue>& map() const { return map_; }
  std::map<std::string, AttrValue>& map() { return map_; }

 private:
  template <class T>
  const T& get(const std::string& k, const char* type) const;
  std::map<std::string, AttrValue> map_;
};
std::string attr_str(const AttrValue& v);

class Graph;

class Node {
 public:
  int id() const { return id_; }  // its position; valid once the graph's order is read (nodes())
  Op op() const { return op_; }
  std::string_view op_name() const;
  const std::string& name() const { return name_; }
  Role role() const { return role_; }
  void set_role(Role r) { role_ = r; }
  const std::vector<Node*>& inputs() const { return inputs_; }
  Node* input(size_t i) const { return inputs_.at(i); }
  const std::vector<Node*>& users() const { return users_; }
  const Attrs& attrs() const { return attrs_; }
  Attrs& attrs() {  // editing attributes keeps the use lists valid
    type_checked_ = false;
    return attrs_;
  }
  const TensorType& type() const { return type_; }
  void set_type(TensorType t) {
    type_ = std::move(t);
    type_checked_ = false;
  }
  // Whether the type is known to equal what the op's shape rule infers from the inputs' types and
  // the attributes: set when the node is made (its type is inferred then) and by a full verify;
  // cleared by set_type, the mutable attrs() and a replaced input. verify re-infers only the nodes
  // not known so, or whose inputs are not (graph/verify.cpp).
  bool type_checked() const { return type_checked_; }
  // Whether a verify has looked this node up by its name since it was made. Names never change,
  // so each node's entry in the name index is checked once (graph/verify.cpp).
  bool name_checked() const { return name_checked_; }
  const SymShape& shape() const { return type_.shape; }
  DType dtype() const { return type_.dtype; }

 private:
  friend class Graph;
  int id_ = 0;             // execution position when the order is current; always its slot in storage
  uint64_t label_ = 0;     // order label: a before b iff a.label_ < b.label_
  Node* prev_ = nullptr;   // execution order, as a list
  Node* next_ = nullptr;
  int output_ = -1;  // its index in the graph's outputs (the first, should it be there twice); -1: none
  Op op_ = Op::input;
  Role role_ = Role::none;  // beside next_: with_role walks the list reading only these
  std::string name_;
  std::vector<Node*> inputs_;
  std::vector<Node*> users_;
  Attrs attrs_;
  TensorType type_;
  mutable bool type_checked_ = false;
  mutable bool name_checked_ = false;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;
  std::unique_ptr<Graph> clone() const;

  // Create a node at the end (builders) or right after or before `pos` (passes). The type is
  // inferred with the op's shape rule unless given. `name` is made unique with a numeric suffix.
  Node* add(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role = Role::none,
            std::optional<TensorType> type = std::nullopt);
  Node* insert_after(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name,
                     Role role = Role::none, std::optional<TensorType> type = std::nullopt);
  Node* insert_before(Node* pos, Op op, std::vector<Node*> inputs, Attrs attrs, std::string name,
                      Role role = Role::none, std::optional<TensorType> type = std::nullopt);
  // Every use of `from` becomes a use of `to`, except in `except` (typically `to` itself).
  void replace_all_uses_with(Node* from, Node* to, const Node* except = nullptr);
  void replace_input(Node* user, size_t index, Node* to);
  void erase(Node* n);  // n must have no users and not be an output
  // Moves `n` to just before `pos`: n's inputs must come before that place and its users after it.
  void move_before(Node* n, Node* pos);

  // In execution order. After an edit in the middle, the first call rebuilds the order (O(n)).
  const std::vector<std::unique_ptr<Node>>& nodes() const;
  size_t size() const { return count_; }
  Node* find(std::string_view name) const;
  std::vector<Node*> with_role(Role r) const;
  size_t position(const Node* n) const;  // index in execution order (may rebuild it, like nodes())
  // O(1) at any time, edits or not: whether a runs before b; the node after / before n (null at the ends).
  bool before(const Node* a, const Node* b) const;
  Node* next(const Node* n) const;
  Node* prev(const Node* n) const;

  // Graph outputs (loss, logits, gradients): kept alive by DCE and fetched by the executor.
  const std::vector<Node*>& outputs() const { return outputs_; }
  void add_output(Node* n);
  bool is_output(const Node* n) const { return n->output_ >= 0; }

  const std::vector<Divisibility>& assumptions() const { return assumptions_; }
  void assume(Divisibility d);

  // The verifier's record (graph/verify.cpp): every node's name checked, and with `types` every
  // node's type, under the assumptions as they are now. A new assumption may change what a shape
  // rule infers, so until the next full verify every node's type counts as unchecked.
  void mark_checked(bool types) const;
  size_t name_index_size() const { return by_name_.size(); }
  bool types_checked_under_assumptions() const { return checked_assumptions_ == assumptions_.size(); }

 private:
  Node* make(Op op, std::vector<Node*> inputs, Attrs attrs, std::string name, Role role,
             std::optional<TensorType> type, Node* after);
  void name_uniquely(Node* n, std::string base);
  void name_freed(const std::string& name);
  void check_member(const Node* n) const;
  void link(Node* n, Node* after);  // into the list after `after` (null: at the head), labelled
  void unlink(Node* n);
  void relabel_around(Node* n);
  void materialize() const;

  // Storage: every live node, indexed by Node::id_. In execution order unless `unordered_` (an
  // edit in the middle since the last read); then erased slots are null and materialize() rebuilds
  // it from the list.
  mutable std::vector<std::unique_ptr<Node>> nodes_;
  mutable bool unordered_ = false;
  Node* head_ = nullptr;
  Node* tail_ = nullptr;
  size_t count_ = 0;
  std::vector<Node*> outputs_;
  // Whether no node is in outputs_ twice (replace_all_uses_with onto an output makes it so): then a
  // node's output_ is its only index there.
  bool outputs_unique_ = true;
  std::vector<Divisibility> assumptions_;
  mutable size_t checked_assumptions_ = SIZE_MAX;  // assumptions_.size() at the last full verify
  // Hashed by name: an ordered map compares long common prefixes ("l12.mlp.…") at every level. Its
  // key is each node's own name_ (a node never moves and its name never changes), so it holds no
  // second copy of every name (decisions 206, 207).
  NameIndex by_name_;
  // name_uniquely: for a base, a suffix below which every "<base>.<i>" is taken (a lower bound that
  // erase lowers again), so that uniquing many values of one base does not probe from 1 each time.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int, NameHash, std::equal_to<>> next_suffix_;
};

}  // namespace autosp
