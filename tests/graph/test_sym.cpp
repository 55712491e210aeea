// Symbolic dims: normal form, printing, evaluation, substitution and assumption-driven simplification.
#include <catch2/catch.hpp>

#include "graph/sym.h"
#include "tensor/check.h"

using namespace autosp;

namespace {
const Dim B = Dim::sym("B"), S = Dim::sym("S");
}

TEST_CASE("dims print in the contract's string form", "[sym]") {
  CHECK(Dim(64).str() == "64");
  CHECK(S.str() == "S");
  CHECK((S / 4).str() == "S//4");
  CHECK((Dim(2) * (S / 4)).str() == "2*(S//4)");
  CHECK((B * S).str() == "B*S");
  CHECK((S + 1).str() == "S + 1");
  CHECK((S - 1).str() == "S - 1");
  CHECK(((S + 3) / 4).str() == "(S + 3)//4");
  CHECK(((S / 4) + 1).str() == "(S//4) + 1");
}

TEST_CASE("dims are kept in a normal form", "[sym]") {
  CHECK(S + S == Dim(2) * S);
  CHECK(S * B == B * S);
  CHECK((S + 1) - 1 == S);
  CHECK(S - S == Dim(0));
  CHECK((Dim(4) * S) / 4 == S);
  CHECK((S / 2) / 2 == S / 4);
  CHECK(Dim(7) / 2 == Dim(3));
  CHECK(Dim(-7) / 2 == Dim(-4));  // floor, like Python
  CHECK((S / 4) * 4 != S);        // not without an assumption
  CHECK(Dim(3) * (B + S) == Dim(3) * B + Dim(3) * S);
  CHECK((B * S * 64).is_const() == false);
  CHECK((S - S).is_const());
}

TEST_CASE("assumptions simplify exact floor divisions", "[sym]") {
  std::vector<Divisibility> as{{S, 4}};
  CHECK(simplify((S / 4) * 4, as) == S);
  CHECK(simplify((S / 4) * 8, as) == Dim(2) * S);
  CHECK(simplify(B * (S / 4) * 4, as) == B * S);
  CHECK(simplify((S / 2) * 2, as) == S);       // S % 4 == 0 implies S % 2 == 0
  CHECK(simplify((S / 8) * 8, as) == (S / 8) * 8);  // not implied
  CHECK(simplify(Dim(2) * (S / 4), as) == Dim(2) * (S / 4));
}

TEST_CASE("dims evaluate with bound symbols", "[sym]") {
  Bindings b{{"B", 2}, {"S", 10}};
  CHECK((S / 4).eval(b) == 2);
  CHECK((Dim(2) * (S / 4)).eval(b) == 4);
  CHECK((B * S + 3).eval(b) == 23);
  CHECK(((S + 3) / 4).eval(b) == 3);
  CHECK_THROWS_AS(Dim::sym("N").eval(b), UsageError);
}

TEST_CASE("substitution reaches inside floor divisions", "[sym]") {
  Dim d = Dim(2) * ((S + 1) / 4) + S;
  Dim r = d.substitute("S", S / 2);
  CHECK(r.eval({{"S", 20}}) == 2 * ((10 + 1) / 4) + 10);
  CHECK(d.contains("S"));
  CHECK_FALSE(d.contains("B"));
  std::vector<std::string> syms;
  (B * S / 4).symbols(syms);
  CHECK(syms.size() == 2);
}
