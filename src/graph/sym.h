// Symbolic dimensions: small integer expressions over named symbols (B, S) with constants, +, *
// and floor division by a positive constant. A Dim is kept in a normal form (a sum of
// coefficient × product-of-atoms terms, where an atom is a symbol or `expr // c`), so structural
// equality is semantic equality for the expressions the passes build. Assumptions such as
// `S % 4 == 0` simplify `(S//4)*4 → S` and are checked when real sizes are bound.
// Knows nothing of nodes, kernels or devices.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace autosp {

using Bindings = std::map<std::string, int64_t>;
struct Atom;

class Dim {
 public:
  Dim() : Dim(int64_t{0}) {}
  Dim(int64_t c);  // NOLINT: a constant converts implicitly
  Dim(int c) : Dim(int64_t{c}) {}  // NOLINT
  static Dim sym(const std::string& name);  // an identifier: [A-Za-z_][A-Za-z0-9_]*

  bool is_const() const;
  int64_t value() const;  // requires is_const()
  bool is_symbol() const;  // exactly one bare symbol, e.g. "S"
  const std::string& symbol_name() const;  // requires is_symbol()

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  Dim floordiv(int64_t c) const;  // c > 0
  friend Dim operator/(const Dim& a, int64_t c) { return a.floordiv(c); }

  // Equal normal forms, compared term by term (no printing: the verifier compares every dim of
  // every node). Symbols are identifiers, so this is also equality of the printed forms.
  bool operator==(const Dim& o) const { return same_terms(o); }
  bool operator!=(const Dim& o) const { return !(*this == o); }

  std::string str() const;  // "S//4", "2*(S//4)", "B*S", "64"
  // Evaluate with real sizes; an unbound symbol throws UsageError naming it.
  int64_t eval(const Bindings& b) const;
  // Replace every occurrence of symbol `name` (also inside floordivs) by `by`.
  Dim substitute(const std::string& name, const Dim& by) const;
  bool contains(const std::string& name) const;
  void symbols(std::vector<std::string>& out) const;

  struct Term {
    int64_t coeff;
    std::vector<std::shared_ptr<const Atom>> atoms;  // sorted by key; empty = constant term
  };
  const std::vector<Term>& terms() const { return terms_; }
  static Dim from_terms(std::vector<Term> terms);

 private:
  bool same_terms(const Dim& o) const;
  std::vector<Term> terms_;  // sorted by monomial key, no zero coefficients
};

// A symbol, or floor(num / den).
struct Atom {
  std::string name;  // set for a symbol
  Dim num;           // set for a floordiv
  int64_t den = 0;   // 0 for a symbol
  std::string key;   // canonical text
};

// `expr % modulus == 0`, recorded on a graph.
struct Divisibility {
  Dim expr;
  int64_t modulus;
  std::string str() const { return expr.str() + " % " + std::to_string(modulus) + " == 0"; }
};

// Rewrite `(e // c) * k·c` as `e * k` where an assumption says e % c == 0.
Dim simplify(const Dim& d, const std::vector<Divisibility>& assumptions);

using SymShape = std::vector<Dim>;
std::string sym_shape_str(const SymShape& s);  // "[B, S//4, 64]"

}  // namespace autosp
