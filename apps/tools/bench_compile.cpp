// autosp-bench --mode compile (see the header).
#include "tools/bench_compile.h"

#include <algorithm>
#include <chrono>

#include "compiler/program.h"
#include "engine/memory_plan.h"
#include "tensor/check.h"
#include "tools/bench.h"

namespace autosp {

void run_compile_bench(const CompileBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit) {
  if (opt.iters < 1) throw UsageError(str("--iters ", opt.iters, ": expected at least 1"));
  double previous = 0;
  for (int64_t layers : opt.layers) {
    Config cfg = opt.config;
    cfg.model.num_hidden_layers = layers;
    const int64_t sp = cfg.sequence_parallel.autosp_size;
    const RankLayout layout = rank_layout(opt.world > 0 ? opt.world : sp, 0, sp, cfg.sequence_parallel.ring_size);
    const Bindings bindings{{"B", 1}, {"S", cfg.data.seq_len}};
    std::vector<double> model, plan, total;
    std::vector<std::vector<double>> run, verify;  // [pass][build]
    std::vector<std::string> names;
    size_t nodes = 0;
    for (int k = 0; k < opt.iters; ++k) {
      using Clock = std::chrono::steady_clock;
      const auto t0 = Clock::now();
      RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::joint, layout);
      const auto t1 = Clock::now();
      const MemoryPlan mp = plan_memory(*prog.graph, bindings, cfg.runtime.device);
      const auto t2 = Clock::now();
      (void)mp;
      nodes = prog.graph->size();
      model.push_back(prog.model_s);
      plan.push_back(std::chrono::duration<double>(t2 - t1).count());
      total.push_back(std::chrono::duration<double>(t2 - t0).count());
      run.resize(prog.pass_times.size());
      verify.resize(prog.pass_times.size());
      names.clear();
      for (size_t i = 0; i < prog.pass_times.size(); ++i) {
        names.emplace_back(prog.pass_times[i].name);
        run[i].push_back(prog.pass_times[i].run_s);
        verify[i].push_back(prog.pass_times[i].verify_s);
      }
    }
    nlohmann::json passes = nlohmann::json::array();
    for (size_t i = 0; i < names.size(); ++i)
      passes.push_back({{"name", names[i]}, {"run_s", median(run[i])}, {"verify_s", median(verify[i])}});
    nlohmann::json row = {{"layers", layers},       {"nodes", nodes},         {"model_s", median(model)},
                          {"passes", passes},       {"plan_s", median(plan)}, {"total_s", median(total)},
                          {"world", layout.world_size}, {"iters", opt.iters}};
    if (previous > 0) row["vs_previous"] = median(total) / previous;
    previous = median(total);
    emit(row);
  }
}

}  // namespace autosp
