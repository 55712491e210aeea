// Loss masks under AutoSP, data parallelism, gradient accumulation and ZeRO 0-3, through the whole
// training path: token shards and .npy masks on disk, autosp's loader, the trainer's first step
// (its loss, and its whole gradients by --dump-grads), against the independent float64 PyTorch
// reference tests/ref/model_ref.py --loss-mask, which applies the masks to the raw windows by
// Hugging Face's rule (labels -100 where mask = 0 over the unshifted window, then the shift). The
// cases: random masks with a masked span across every SP shard boundary; every target of the
// second half of each sequence masked (at P = 2 rank 1 scores nothing, at P = 4 ranks 2 and 3);
// packed documents (data.document_mask) at S = 47, which neither P divides. Layouts: sp = W at
// stages 0 and 1, and dp × sp with ZeRO-2 and ZeRO-3 and two micro-batches (dp 2 × sp 2 on 4 ranks,
// dp 2 on 2).
// A file whose every mask is 0 skips its steps without a NaN or an update. Bars: loss within
// 1e-5 relative, every gradient within 1e-3 (f32 against f64).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/loss_mask_files.h"
#include "common/sp_case.h"
#include "models/model.h"
#include "mpi/mpi_test.h"
#include "tensor/safetensors.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kEos = 3, kVocab = 64;

enum class MaskCase { spans, second_half, documents, everything };

// The stream of G windows of S (G·S + 1 tokens) and its mask for `c`.
void make_data(MaskCase c, int64_t G, int64_t S, uint64_t seed, std::vector<int64_t>& tokens, std::vector<int64_t>& mask) {
  std::mt19937_64 rng(seed);
  const int64_t n = G * S + 1;
  tokens.assign(size_t(n), 0);
  mask.assign(size_t(n), 1);
  int64_t left = int64_t(rng() % 12);
  for (int64_t i = 0; i < n; ++i) {
    tokens[size_t(i)] = 4 + int64_t(rng() % uint64_t(kVocab - 4));
    if (c == MaskCase::documents && left-- == 0) tokens[size_t(i)] = kEos, left = int64_t(rng() % 12);
    const int64_t t = i % S;  // token i is target t - 1 of window i / S (t ≥ 1), or the last of window i / S - 1
    switch (c) {
      case MaskCase::spans:  // random, plus a masked span over each quarter boundary of the window
        mask[size_t(i)] = rng() % 10 < 7;
        if (t % (S / 4) >= S / 4 - 3 || t % (S / 4) <= 2) mask[size_t(i)] = 0;
        break;
      case MaskCase::second_half:  // targets t - 1 ≥ S / 2 of every window: tokens S/2 + 1 .. S
        if (t == 0 ? i > 0 : t >= S / 2 + 1) mask[size_t(i)] = 0;
        break;
      case MaskCase::documents: mask[size_t(i)] = rng() % 10 < 6; break;
      case MaskCase::everything: mask[size_t(i)] = 0; break;
    }
  }
}

Config mask_config(const fs::path& dir, MaskCase c, int64_t S, int64_t sp, int64_t stage, int64_t micro, int64_t k) {
  json data = {{"source", "tokens"},       {"path", (dir / "t.bin").string()}, {"loss_mask_path", (dir / "t.npy").string()},
               {"seq_len", S},             {"batch_size", micro}};
  if (c == MaskCase::documents) data["eos_token_id"] = kEos, data["document_mask"] = true;
  return parse_config({{"model", kLlamaGqa},
                       {"data", data},
                       {"train", {{"steps", 1}, {"gradient_accumulation_steps", k}, {"log_every", 1000}}},
                       {"runtime", {{"dtype", "float32"}, {"threads", 1}}},
                       {"sequence_parallel", {{"autosp_size", sp}}},
                       {"zero_optimization", {{"stage", stage}}}});
}

bool all_ranks(Communicator& w, bool ok) {
  Tensor flag = Tensor::from_vector<int64_t>({1}, {int64_t(ok ? 0 : 1)});
  w.all_reduce_sum(flag);
  return flag.data<int64_t>()[0] == 0;
}

}  // namespace

TEST_CASE("loss masks: the first step's loss and gradients equal the float64 reference on every layout",
          "[autosp][mask]") {
  Communicator& w = test_world();
  const int64_t W = w.size();
  const TempDir tmp = shared_temp_dir(w, "loss-mask");
  const fs::path& dir = tmp.dir;
  int case_id = 0;
  for (MaskCase c : {MaskCase::spans, MaskCase::second_half, MaskCase::documents}) {
    const int64_t S = c == MaskCase::documents ? 47 : 48;
    // (sp, stage, micro-batch, k): SP over the world at stages 0 and 1; then dp × sp at ZeRO-2 and
    // ZeRO-3 with two micro-batches.
    const int64_t dp_sp = W == 4 ? 2 : 1;
    struct Layout { int64_t sp, stage, micro, k; };
    const Layout layouts[] = {{W, 0, 4, 1}, {W, 1, 4, 1}, {dp_sp, 2, 1, 2}, {dp_sp, 3, 1, 2}};
    const int64_t G = 4;  // each layout's first step reads sequences 0..3: micro · k · dp of them
    for (const Layout& l : layouts) REQUIRE(l.micro * l.k * (W / l.sp) == G);
    const fs::path cdir = dir / std::to_string(case_id++);
    std::vector<int64_t> tokens, mask;
    make_data(c, G, S, 40 + uint64_t(case_id), tokens, mask);
    const Config base = mask_config(cdir, c, S, 1, 0, 1, 1);
    // What train() starts from without --init-from (trainer.h starting_params).
    const ParamMap params = init_params(base.model, static_cast<uint64_t>(base.train.seed), DType::f32);
    if (w.rank() == 0) {
      fs::create_directories(cdir);
      write_shard((cdir / "t.bin").string(), tokens);
      write_bytes((cdir / "t.npy").string(), npy_mask(mask));
      std::ofstream(cdir / "cfg.json") << json{{"model", kLlamaGqa}}.dump();
      ParamMap f64;
      for (const auto& [n, t] : params) f64[n] = t.to(DType::f64);
      save_safetensors((cdir / "w.safetensors").string(), f64);
    }
    {
      const int64_t Gl = G;  // the first step's sequences 0..G-1: windows 0..G-1
      int ok = 1;
      if (w.rank() == 0) {  // the reference on the raw windows and their masks
        std::vector<int64_t> ids, labels, pos, m;
        for (int64_t g = 0; g < Gl; ++g)
          for (int64_t t = 0; t <= S; ++t) {
            if (t < S) ids.push_back(tokens[size_t(g * S + t)]), pos.push_back(t);
            if (t > 0) labels.push_back(tokens[size_t(g * S + t)]);
            m.push_back(mask[size_t(g * S + t)]);
          }
        save_safetensors((cdir / "batch.safetensors").string(),
                         {{"input_ids", Tensor::from_vector<int64_t>({Gl, S}, ids)},
                          {"labels", Tensor::from_vector<int64_t>({Gl, S}, labels)},
                          {"position_ids", Tensor::from_vector<int64_t>({Gl, S}, pos)},
                          {"loss_mask", Tensor::from_vector<int64_t>({Gl, S + 1}, m)}});
        const std::string cmd = "OMP_NUM_THREADS=1 /usr/bin/python3 " + std::string(AUTOSP_SOURCE_DIR) +
                                "/tests/ref/model_ref.py --config " + (cdir / "cfg.json").string() + " --weights " +
                                (cdir / "w.safetensors").string() + " --batch " +
                                (cdir / "batch.safetensors").string() + " --dtype float64 --grads --loss-mask" +
                                (c == MaskCase::documents ? " --eos " + std::to_string(kEos) : "") + " --out " +
                                (cdir / "ref.safetensors").string();
        ok = std::system(cmd.c_str()) == 0;
      }
      REQUIRE(all_ranks(w, ok));
    }
    for (const Layout& l : layouts) {
      TrainArgs args;
      args.quiet = true;
      args.accuracy = false;
      args.dump_grads = (cdir / "grads.safetensors").string();
      const TrainResult r = train(mask_config(cdir, c, S, l.sp, l.stage, l.micro, l.k), args, w);
      w.barrier();
      if (w.rank() == 0) {
        const SafetensorsFile ref = load_safetensors((cdir / "ref.safetensors").string());
        const SafetensorsFile got = load_safetensors(args.dump_grads);
        const double want = ref.tensors.at("loss").to_doubles().at(0);
        INFO("case " << int(c) << ", sp " << l.sp << " dp " << W / l.sp << " stage " << l.stage << " k " << l.k
                     << ": loss " << r.steps.at(0).loss << " vs " << want);
        CHECK(r.steps.at(0).targets == ref.tensors.at("valid_count").to_doubles().at(0));
        CHECK(std::abs(r.steps.at(0).loss - want) / std::abs(want) < 1e-5);
        CHECK(got.tensors.size() == params.size());
        for (const auto& [name, g] : got.tensors) {
          INFO("gradient of " << name);
          REQUIRE(ref.tensors.count("grad." + name) == 1);
          CHECK(rel_err(g, ref.tensors.at("grad." + name)) < 1e-3);
        }
      }
      w.barrier();
    }
  }
  // Every target masked: each step is skipped (no graph runs), nothing is NaN in the weights.
  {
    const fs::path cdir = dir / "all";
    std::vector<int64_t> tokens, mask;
    make_data(MaskCase::everything, 8, 16, 5, tokens, mask);
    if (w.rank() == 0) {
      fs::create_directories(cdir);
      write_shard((cdir / "t.bin").string(), tokens);
      write_bytes((cdir / "t.npy").string(), npy_mask(mask));
    }
    w.barrier();
    TrainArgs args;
    args.quiet = true;
    const Config cfg = with_steps(mask_config(cdir, MaskCase::everything, 16, W, 3, 1, 1), 2);
    const ParamMap start = init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), DType::f32);
    const TrainResult r = train(cfg, args, w);
    REQUIRE(r.steps.size() == 2);
    for (const StepRecord& s : r.steps) CHECK((s.skipped && s.targets == 0));
    for (const auto& [name, p] : start) CHECK(p.to_doubles() == r.params.at(name).to_doubles());
  }
  w.barrier();
}

}  // namespace autosp::test
