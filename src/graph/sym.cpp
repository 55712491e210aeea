// Normal-form arithmetic on symbolic dims.
#include "graph/sym.h"

#include <algorithm>
#include <cctype>

#include "tensor/check.h"

namespace autosp {
namespace {

std::string monomial_key(const std::vector<std::shared_ptr<const Atom>>& atoms) {
  std::string k;
  for (const auto& a : atoms) k += (k.empty() ? "" : "*") + a->key;
  return k;
}

// Merge like terms, drop zeros, order terms: non-constant by key, constant last.
std::vector<Dim::Term> normalize(std::vector<Dim::Term> terms) {
  for (auto& t : terms)
    std::sort(t.atoms.begin(), t.atoms.end(), [](const auto& a, const auto& b) { return a->key < b->key; });
  std::map<std::string, Dim::Term> merged;
  for (auto& t : terms) {
    auto key = monomial_key(t.atoms);
    auto it = merged.find(key);
    if (it == merged.end())
      merged.emplace(key, t);
    else
      it->second.coeff += t.coeff;
  }
  std::vector<Dim::Term> out;
  Dim::Term constant{0, {}};
  for (auto& [key, t] : merged) {
    if (t.coeff == 0) continue;
    if (key.empty())
      constant = t;
    else
      out.push_back(t);
  }
  // Higher-degree terms first reads naturally: "B*S + 1".
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.atoms.size() > b.atoms.size(); });
  if (constant.coeff != 0) out.push_back(constant);
  return out;
}

std::string term_str(const Dim::Term& t, bool alone) {
  if (t.atoms.empty()) return std::to_string(t.coeff);
  std::string s;
  bool product = t.atoms.size() > 1 || t.coeff != 1;
  if (t.coeff == -1)
    s = "-";
  else if (t.coeff != 1)
    s = std::to_string(t.coeff) + "*";
  for (size_t i = 0; i < t.atoms.size(); ++i) {
    const auto& a = *t.atoms[i];
    bool paren = a.den != 0 && (product || !alone);
    s += (i ? "*" : "") + (paren ? "(" + a.key + ")" : a.key);
  }
  return s;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

Dim::Dim(int64_t c) {
  if (c != 0) terms_.push_back({c, {}});
}

Dim Dim::sym(const std::string& name) {
  // Identifiers keep printing injective, so == may compare normal forms instead of strings.
  AUTOSP_ASSERT(!name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                    std::all_of(name.begin(), name.end(),
                                [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }),
                "symbol name '", name, "' is not an identifier");
  auto a = std::make_shared<Atom>();
  a->name = name;
  a->key = name;
  Dim d;
  d.terms_.push_back({1, {a}});
  return d;
}

Dim Dim::from_terms(std::vector<Term> terms) {
  Dim d;
  d.terms_ = normalize(std::move(terms));
  return d;
}

bool Dim::is_const() const { return terms_.empty() || (terms_.size() == 1 && terms_[0].atoms.empty()); }
int64_t Dim::value() const {
  AUTOSP_ASSERT(is_const(), "dim ", str(), " is not a constant");
  return terms_.empty() ? 0 : terms_[0].coeff;
}
bool Dim::is_symbol() const {
  return terms_.size() == 1 && terms_[0].coeff == 1 && terms_[0].atoms.size() == 1 && terms_[0].atoms[0]->den == 0;
}
const std::string& Dim::symbol_name() const {
  AUTOSP_ASSERT(is_symbol(), "dim ", str(), " is not a symbol");
  return terms_[0].atoms[0]->name;
}

// Constants take fast paths (the shape rules add and multiply constants all the time); the
// results are the normal forms the general path gives.
Dim operator+(const Dim& a, const Dim& b) {
  if (b.terms_.empty()) return a;
  if (a.terms_.empty()) return b;
  if (a.is_const() && b.is_const()) return Dim(a.value() + b.value());
  auto t = a.terms_;
  t.insert(t.end(), b.terms_.begin(), b.terms_.end());
  return Dim::from_terms(std::move(t));
}
Dim operator-(const Dim& a, const Dim& b) { return a + Dim(-1) * b; }
Dim operator*(const Dim& a, const Dim& b) {
  if (a.is_const() && b.is_const()) return Dim(a.value() * b.value());
  if (a.is_const() || b.is_const()) {  // c·e: e's terms scaled, in the same order
    const int64_t c = a.is_const() ? a.value() : b.value();
    if (c == 0) return Dim(0);
    Dim d = a.is_const() ? b : a;
    for (auto& x : d.terms_) x.coeff *= c;
    return d;
  }
  std::vector<Dim::Term> t;
  for (const auto& x : a.terms_)
    for (const auto& y : b.terms_) {
      Dim::Term p{x.coeff * y.coeff, x.atoms};
      p.atoms.insert(p.atoms.end(), y.atoms.begin(), y.atoms.end());
      t.push_back(std::move(p));
    }
  return Dim::from_terms(std::move(t));
}

Dim Dim::floordiv(int64_t c) const {
  AUTOSP_ASSERT(c > 0, "floordiv by ", c);
  if (c == 1) return *this;
  if (is_const()) return Dim(floor_div(value(), c));
  bool exact = std::all_of(terms_.begin(), terms_.end(), [&](const Term& t) { return t.coeff % c == 0; });
  if (exact) {
    auto t = terms_;
    for (auto& x : t) x.coeff /= c;
    return from_terms(std::move(t));
  }
  // (e // a) // c == e // (a·c)
  if (terms_.size() == 1 && terms_[0].coeff == 1 && terms_[0].atoms.size() == 1 && terms_[0].atoms[0]->den != 0)
    return terms_[0].atoms[0]->num.floordiv(terms_[0].atoms[0]->den * c);
  auto a = std::make_shared<Atom>();
  a->num = *this;
  a->den = c;
  a->key = (terms_.size() == 1 && terms_[0].atoms.size() == 1 && terms_[0].coeff == 1 ? str() : "(" + str() + ")") +
           "//" + std::to_string(c);
  Dim d;
  d.terms_.push_back({1, {a}});
  return d;
}

bool Dim::same_terms(const Dim& o) const {
  if (terms_.size() != o.terms_.size()) return false;
  for (size_t i = 0; i < terms_.size(); ++i) {
    const Term &a = terms_[i], &b = o.terms_[i];
    if (a.coeff != b.coeff || a.atoms.size() != b.atoms.size()) return false;
    for (size_t k = 0; k < a.atoms.size(); ++k)
      if (a.atoms[k] != b.atoms[k] && (a.atoms[k]->den != b.atoms[k]->den || a.atoms[k]->key != b.atoms[k]->key))
        return false;
  }
  return true;
}

std::string Dim::str() const {
  if (terms_.empty()) return "0";
  std::string s;
  for (size_t i = 0; i < terms_.size(); ++i) {
    std::string t = term_str(terms_[i], terms_.size() == 1);
    if (i == 0)
      s = t;
    else if (t[0] == '-')
      s += " - " + t.substr(1);
    else
      s += " + " + t;
  }
  return s;
}

int64_t Dim::eval(const Bindings& b) const {
  int64_t total = 0;
  for (const auto& t : terms_) {
    int64_t v = t.coeff;
    for (const auto& a : t.atoms) {
      if (a->den == 0) {
        auto it = b.find(a->name);
        if (it == b.end()) throw UsageError(autosp::str("symbol ", a->name, " is not bound (in ", this->str(), ")"));
        v *= it->second;
      } else {
        v *= floor_div(a->num.eval(b), a->den);
      }
    }
    total += v;
  }
  return total;
}

Dim Dim::substitute(const std::string& name, const Dim& by) const {
  Dim total;
  for (const auto& t : terms_) {
    Dim prod(t.coeff);
    for (const auto& a : t.atoms) {
      if (a->den == 0)
        prod = prod * (a->name == name ? by : Dim::sym(a->name));
      else
        prod = prod * a->num.substitute(name, by).floordiv(a->den);
    }
    total = total + prod;
  }
  return total;
}

bool Dim::contains(const std::string& name) const {
  for (const auto& t : terms_)
    for (const auto& a : t.atoms)
      if (a->den == 0 ? a->name == name : a->num.contains(name)) return true;
  return false;
}

void Dim::symbols(std::vector<std::string>& out) const {
  for (const auto& t : terms_)
    for (const auto& a : t.atoms) {
      if (a->den != 0)
        a->num.symbols(out);
      else if (std::find(out.begin(), out.end(), a->name) == out.end())
        out.push_back(a->name);
    }
}

Dim simplify(const Dim& d, const std::vector<Divisibility>& assumptions) {
  std::vector<Dim::Term> out;
  bool changed = false;
  for (const auto& t : d.terms()) {
    Dim::Term nt = t;
    for (size_t i = 0; i < nt.atoms.size(); ++i) {
      const Atom& a = *nt.atoms[i];
      if (a.den == 0 || nt.coeff % a.den != 0) continue;
      bool exact = std::any_of(assumptions.begin(), assumptions.end(), [&](const Divisibility& v) {
        return v.modulus % a.den == 0 && v.expr == a.num;
      });
      if (!exact) continue;
      // coeff·(e//c)·rest → (coeff/c)·e·rest
      Dim rest(nt.coeff / a.den);
      for (size_t j = 0; j < nt.atoms.size(); ++j)
        if (j != i) rest = rest * Dim::from_terms({{1, {nt.atoms[j]}}});
      Dim rewritten = simplify(rest * a.num, assumptions);
      out.insert(out.end(), rewritten.terms().begin(), rewritten.terms().end());
      changed = true;
      nt.coeff = 0;
      break;
    }
    if (nt.coeff != 0) out.push_back(nt);
  }
  return changed ? Dim::from_terms(std::move(out)) : d;
}

std::string sym_shape_str(const SymShape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + s[i].str();
  return r + "]";
}

}  // namespace autosp
