// Out-of-line failure path for AUTOSP_ASSERT; the problem list and the name hints of check.h.
#include "tensor/check.h"

#include <algorithm>

namespace autosp {

void Problems::add(std::string problem) { list_.push_back(std::move(problem)); }

void Problems::add(const std::string& key, const std::string& value, const std::string& why, const std::string& fix) {
  list_.push_back(str(key, " = ", value, ": ", why, fix.empty() ? "" : "; ", fix));
}

std::string Problems::message() const {
  if (list_.size() == 1) return str(origin_, ": ", list_[0]);
  std::string m = str(origin_, ": ", list_.size(), " problems:");
  for (const std::string& p : list_) m += str("\n  - ", p);
  return m;
}

void Problems::raise() const {
  if (!list_.empty()) throw UsageError(message());
}

std::string with_note(const std::string& message, const std::string& note) {
  const size_t eol = message.find('\n');
  if (eol == std::string::npos) return message + note;
  return message.substr(0, eol) + note + message.substr(eol);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& options) {
  std::string best;
  size_t best_d = std::max<size_t>(1, word.size() / 3) + 1;
  for (const auto& o : options) {
    if (word.size() > 64 || o.size() > 64) continue;  // names are short; a long key is no typo of one
    const size_t d = edit_distance(word, o);
    if (d < best_d) best_d = d, best = o;
  }
  return best;
}

}  // namespace autosp

namespace autosp::detail {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(cat("internal error at ", file, ":", line, ": check `", expr, "` failed",
                             msg.empty() ? "" : ": ", msg));
}

}  // namespace autosp::detail
