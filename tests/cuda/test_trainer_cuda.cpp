// The trainer on the GPU (runtime.device "cuda"): a few AdamW steps of tiny Llama (GQA) and GPT-2
// against the same run on the CPU — losses, gradient norms and the final parameters — and the
// checkpoint a CUDA run writes, resumed on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "common/temp_dir.h"
#include "common/tiny_models.h"
#include "cuda/dispatch_test.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace autosp;
using namespace autosp::cudatest;
namespace fs = std::filesystem;

namespace {

Config tiny(const std::string& arch, const std::string& device, const std::string& dtype = "float32") {
  nlohmann::json model = testing::tiny_model(arch, 64, 2, 96);
  return parse_config({{"model", model},
                       {"data", {{"seq_len", 32}, {"batch_size", 2}}},
                       {"train", {{"steps", 4}, {"lr", 1e-3}, {"min_lr", 1e-3}, {"warmup_steps", 1}, {"grad_clip", 1.0}}},
                       {"runtime", {{"device", device}, {"dtype", dtype}}}});
}

TrainResult run(const Config& cfg, const TrainArgs& args = {}) {
  auto world = make_single_process_communicator();
  TrainArgs a = args;
  a.quiet = true;
  return train(cfg, a, *world);
}

}  // namespace

TEST_CASE("training steps on CUDA match the CPU", "[trainer]") {
  for (const std::string arch : {"llama", "gpt2"}) {
    DYNAMIC_SECTION(arch) {
      const TrainResult cpu = run(tiny(arch, "cpu"));
      const TrainResult gpu = run(tiny(arch, "cuda"));
      REQUIRE(gpu.steps.size() == cpu.steps.size());
      for (size_t i = 0; i < cpu.steps.size(); ++i) {
        INFO("step " << i + 1 << ": loss cpu " << cpu.steps[i].loss << " cuda " << gpu.steps[i].loss << ", grad norm cpu "
                     << cpu.steps[i].grad_norm << " cuda " << gpu.steps[i].grad_norm);
        CHECK(std::abs(gpu.steps[i].loss - cpu.steps[i].loss) <= 1e-4 * std::abs(cpu.steps[i].loss));
        CHECK(std::abs(gpu.steps[i].grad_norm - cpu.steps[i].grad_norm) <= 1e-4 * cpu.steps[i].grad_norm);
        CHECK(gpu.steps[i].peak_bytes > 0);
      }
      // The returned parameters are host copies. After 4 AdamW steps they agree closely, but not
      // elementwise: AdamW's first steps move an element by about ±lr whatever its gradient's size,
      // so a near-zero gradient whose sign differs in the last bits moves it the other way. Hence a
      // relative L2 bound per parameter (‖Δ‖ / ‖p_cpu − p_start‖ would be stricter still).
      for (const auto& [name, p] : cpu.params) {
        const Tensor& q = gpu.params.at(name);
        REQUIRE(q.device() == Device{});
        const auto a = q.to_doubles(), b = p.to_doubles();
        double num = 0, den = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          num += (a[i] - b[i]) * (a[i] - b[i]);
          den += b[i] * b[i];
        }
        INFO("parameter " << name << ": relative L2 difference " << std::sqrt(num / std::max(den, 1e-30)));
        CHECK(std::sqrt(num / std::max(den, 1e-30)) <= 1e-3);
      }
    }
  }
}

TEST_CASE("bf16 mixed precision trains on CUDA", "[trainer][bf16]") {
  const TrainResult cpu = run(tiny("llama", "cpu", "bfloat16"));
  const TrainResult gpu = run(tiny("llama", "cuda", "bfloat16"));
  REQUIRE(gpu.steps.size() == cpu.steps.size());
  for (size_t i = 0; i < cpu.steps.size(); ++i) {
    INFO("step " << i + 1 << ": loss cpu " << cpu.steps[i].loss << " cuda " << gpu.steps[i].loss);
    CHECK(std::isfinite(gpu.steps[i].loss));
    CHECK(std::abs(gpu.steps[i].loss - cpu.steps[i].loss) <= 2e-2 * std::abs(cpu.steps[i].loss));
  }
}

TEST_CASE("a CUDA run's checkpoint resumes on the CPU", "[trainer]") {
  const test::TempDir tmp("cuda-ckpt");
  const fs::path& dir = tmp.dir;
  Config gpu_cfg = tiny("llama", "cuda");
  gpu_cfg.train.checkpoint_dir = dir.string();
  gpu_cfg.train.checkpoint_every = 2;
  const TrainResult first = run(with_steps(gpu_cfg, 2));
  REQUIRE(fs::exists(dir));
  // Steps 3..4 on the CPU from the CUDA checkpoint, against 4 uninterrupted CPU steps (a constant
  // learning rate after the first step, so stopping at 2 changes no schedule).
  TrainArgs resume;
  resume.resume = dir.string();
  const TrainResult resumed = run(tiny("llama", "cpu"), resume);
  const TrainResult straight = run(tiny("llama", "cpu"));
  REQUIRE(resumed.steps.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("step " << i + 3 << ": resumed " << resumed.steps[i].loss << ", uninterrupted " << straight.steps[i + 2].loss);
    CHECK(std::abs(resumed.steps[i].loss - straight.steps[i + 2].loss) <= 1e-4 * std::abs(straight.steps[i + 2].loss));
  }
}
