// Tiny GPT-2 and tiny Llama (GQA: 4 query heads, 2 key/value heads) joint graphs (forward, loss,
// backward) on CUDA against the same programs on the CPU kernels: f32 loss and every parameter
// gradient within 1e-5, and the bf16 mixed-precision programs within bf16's tolerance (relative L2
// error of each gradient ≤ 3e-2, as tests/graph/test_mixed_precision.cpp explains).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "common/tiny_models.h"
#include "cuda/dispatch_test.h"
#include "config/config.h"
#include "models/model.h"
#include "compiler/program.h"

using namespace autosp;
using namespace autosp::cudatest;

namespace {

Config tiny(const std::string& arch) {
  nlohmann::json model = testing::tiny_model(arch, 64, 2, 96);
  return parse_config({{"model", model}, {"data", {{"seq_len", 24}, {"batch_size", 2}}}});
}

}  // namespace

TEST_CASE("tiny GPT-2 and Llama (GQA) forward and backward on CUDA match the CPU", "[models]") {
  for (const std::string arch : {"gpt2", "llama"}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      DYNAMIC_SECTION(arch << " " << dtype_name(dt)) {
        const Config cfg = tiny(arch);
        RankProgram prog = build_program(cfg, dt, Stage::joint);
        TensorMap feeds = testing::random_token_batch(2, 24, 64, 7);
        const DType master = dt == DType::bf16 ? DType::f32 : dt;  // f32 master weights for bf16
        for (const auto& [name, p] : init_params(cfg.model, 3, master)) feeds[name] = p;
        Executor ex(*prog.graph);
        const RunResult cpu = ex.run(feeds);
        const RunResult gpu = ex.run(upload(feeds));  // the same executor: plans and arena per device
        INFO(arch << " " << dtype_name(dt));
        const double loss_cpu = cpu.outputs.at(prog.loss).to_doubles()[0];
        const double loss_gpu = down(gpu.outputs.at(prog.loss)).to_doubles()[0];
        INFO("loss: cpu " << loss_cpu << ", cuda " << loss_gpu);
        CHECK(std::isfinite(loss_gpu));
        CHECK(std::abs(loss_gpu - loss_cpu) <= (dt == DType::f32 ? 1e-5 : 1e-2) * std::abs(loss_cpu));
        REQUIRE(prog.grad_names.size() == prog.param_names.size());
        for (size_t i = 0; i < prog.grad_names.size(); ++i) {
          const Tensor& g_cpu = cpu.outputs.at(prog.grad_names[i]);
          const Tensor& g_gpu = gpu.outputs.at(prog.grad_names[i]);
          if (dt == DType::f32) {
            check_tensor("gradient of " + prog.param_names[i], g_gpu, g_cpu, 1e-5);
          } else {
            const double e = testing::rel_l2(down(g_gpu), g_cpu);
            INFO("gradient of " << prog.param_names[i] << ": relative L2 error " << e);
            CHECK(e <= 3e-2);
          }
        }
        // Memory: the plan is the same on both devices, the peak comes from the CUDA allocator.
        CHECK(gpu.planned_bytes == cpu.planned_bytes);
        CHECK(gpu.peak_bytes >= gpu.planned_bytes);
        CHECK(gpu.peak_bytes <= cuda_allocator(0).reserved_bytes());
      }
    }
  }
}
