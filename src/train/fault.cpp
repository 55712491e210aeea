// Fault injection (AUTOSP_FAULT).
#include "train/fault.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

#include <spdlog/spdlog.h>

#include "tensor/check.h"

namespace autosp {
namespace {

constexpr const char* kFaultVar = "AUTOSP_FAULT";
constexpr const char* kFaultSyntax = "expected rank:R,step:K,kind:exit|abort|crash|hang|nan[,where:step|checkpoint]";
constexpr int kExitRuntime = 3;  // apps/tools/cli.h's code for a runtime failure

int64_t parse_nonneg(const std::string& field, const std::string& text, const std::string& whole) {
  const bool digits = !text.empty() && text.size() <= 18 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits)
    throw UsageError(str(kFaultVar, "='", whole, "': ", field, " '", text, "' is not a non-negative integer (",
                         kFaultSyntax, ")"));
  return std::stoll(text);
}

// Also to the run's log file (apps/train.cpp registers it as "train.log") before the process ends.
void log_to_file(const std::string& message) {
  if (auto file = spdlog::get("train.log")) {
    file->error("{}", message);
    file->flush();
  }
}

[[noreturn]] void fire(const Fault& f, int64_t step, Communicator& world) {
  const char* where = f.where == FaultWhere::checkpoint ? " while writing its checkpoint" : "";
  const std::string what = str("AUTOSP_FAULT: rank ", f.rank, " injected ");
  switch (f.kind) {
    case FaultKind::exit: {
      const std::string msg = str(what, "exit(3) at step ", step, where);
      log_to_file(msg);
      std::fprintf(stderr, "error: %s\n", msg.c_str());
      std::fflush(stderr);
      std::exit(kExitRuntime);
    }
    case FaultKind::abort: {
      const std::string msg = str(what, "abort at step ", step, where);
      log_to_file(msg);
      world.abort(msg, kExitRuntime);
      std::_Exit(kExitRuntime);  // not reached
    }
    case FaultKind::crash: {
      const std::string msg = str(what, "SIGSEGV at step ", step, where);
      log_to_file(msg);
      std::fprintf(stderr, "%s\n", msg.c_str());
      std::fflush(stderr);
      // A real crash: the default action (not a sanitizer's handler), no core file, no cleanup.
      struct rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      std::signal(SIGSEGV, SIG_DFL);
      std::raise(SIGSEGV);
      std::_Exit(128 + SIGSEGV);
    }
    case FaultKind::hang: {
      const std::string msg = str(what, "hang at step ", step, where);
      log_to_file(msg);
      std::fprintf(stderr, "%s\n", msg.c_str());
      std::fflush(stderr);
      for (;;) ::pause();  // outside any collective: this rank's watchdog is not armed
    }
    case FaultKind::nan:  // inject_nan's, never fired here
      break;
  }
  std::abort();
}

}  // namespace

std::optional<Fault> parse_fault(const std::string& text) {
  if (text.empty()) return std::nullopt;
  auto bad = [&](const std::string& what) -> UsageError {
    return UsageError(str(kFaultVar, "='", text, "': ", what, " (", kFaultSyntax, ")"));
  };
  std::map<std::string, std::string> fields;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw bad(str("'", item, "' is not key:value"));
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    if (key != "rank" && key != "step" && key != "kind" && key != "where") throw bad(str("unknown field '", key, "'"));
    if (!fields.emplace(key, value).second) throw bad(str("field '", key, "' given twice"));
  }
  if (text.back() == ',') throw bad("trailing ','");
  for (const char* k : {"rank", "step", "kind"})
    if (!fields.count(k)) throw bad(str("missing field '", k, "'"));
  Fault f;
  const int64_t rank = parse_nonneg("rank", fields["rank"], text);
  if (rank > 1 << 24) throw bad(str("rank ", rank, " is out of range"));
  f.rank = static_cast<int>(rank);
  f.step = parse_nonneg("step", fields["step"], text);
  if (f.step < 1) throw bad("step must be ≥ 1 (steps are numbered from 1)");
  const std::string& kind = fields["kind"];
  if (kind == "exit") f.kind = FaultKind::exit;
  else if (kind == "abort") f.kind = FaultKind::abort;
  else if (kind == "crash") f.kind = FaultKind::crash;
  else if (kind == "hang") f.kind = FaultKind::hang;
  else if (kind == "nan") f.kind = FaultKind::nan;
  else throw bad(str("unknown kind '", kind, "'"));
  if (fields.count("where")) {
    const std::string& where = fields["where"];
    if (where == "step") f.where = FaultWhere::step;
    else if (where == "checkpoint") f.where = FaultWhere::checkpoint;
    else throw bad(str("unknown where '", where, "'"));
  }
  if (f.kind == FaultKind::nan && f.where == FaultWhere::checkpoint)
    throw bad("kind:nan happens in a step, not a checkpoint");
  return f;
}

std::optional<Fault> fault_from_env(int world_size) {
  const char* v = std::getenv(kFaultVar);
  std::optional<Fault> f = parse_fault(v ? v : "");
  if (!f) return f;
  if (f->rank >= world_size)
    throw UsageError(str(kFaultVar, "='", v, "': rank ", f->rank, " does not exist in a job of ", world_size,
                         world_size == 1 ? " rank" : " ranks"));
  if (f->kind == FaultKind::hang && world_size == 1)
    throw UsageError(
        str(kFaultVar, "='", v, "': kind:hang needs at least 2 ranks (another rank's watchdog ends the job)"));
  if (f->where == FaultWhere::checkpoint && f->rank != 0)
    throw UsageError(str(kFaultVar, "='", v, "': where:checkpoint needs rank:0 (only rank 0 writes checkpoints)"));
  return f;
}

void inject_fault(const std::optional<Fault>& fault, FaultWhere where, int rank, int64_t step, Communicator& world) {
  if (fault && fault->kind != FaultKind::nan && fault->where == where && fault->rank == rank && fault->step == step)
    fire(*fault, step, world);
}

void inject_nan(const std::optional<Fault>& fault, int rank, int64_t step, std::vector<Tensor>& grads) {
  if (!fault || fault->kind != FaultKind::nan || fault->rank != rank || fault->step != step) return;
  std::fprintf(stderr, "AUTOSP_FAULT: rank %d injected NaN gradients at step %lld\n", rank,
               static_cast<long long>(step));
  for (Tensor& g : grads) {
    if (g.dtype() == DType::f32) std::fill_n(g.data<float>(), g.numel(), std::numeric_limits<float>::quiet_NaN());
    if (g.dtype() == DType::f64) std::fill_n(g.data<double>(), g.numel(), std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace autosp
