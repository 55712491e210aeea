// AutoSP's equivalence check, shared by the multi-rank tests (tests/mpi/test_autosp.cpp, ranks
// under mpirun) and the thread-rank tests (tests/comm/test_thread_sp.cpp, ranks as threads): tiny
// models, random batches, the joint program of one rank run on its batch with the gradients
// summed over the world, the unsharded P = 1 program in one process as the reference, and the
// comparisons (CHECK-based: call them on the thread that runs Catch).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "comm/mesh.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "models/model.h"
#include "train/data.h"
#include "train/grad_sync.h"
#include "train/trainer.h"

namespace autosp::test {

using nlohmann::json;

inline constexpr double kTol = 1e-5;

inline const json kGpt2 = {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 4}, {"max_position_embeddings", 128}};
// num_key_value_heads 2: all-to-all'd K/V at P = 2, replicated up to P at P = 4.
inline const json kLlamaGqa = {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}};
// num_key_value_heads 4: all-to-all'd K/V at P = 2 and P = 4.
inline const json kLlamaKv4 = {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 4}, {"intermediate_size", 48}};

inline std::string model_name(const json& m) {
  std::string s = m["arch"].get<std::string>();
  if (m.contains("num_key_value_heads")) s += " kv" + std::to_string(m["num_key_value_heads"].get<int64_t>());
  return s;
}

inline Config make_config(const json& model, int64_t sp, json data = {{"seq_len", 32}, {"batch_size", 2}},
                   json train = json::object()) {
  return parse_config({{"model", model},
                       {"data", std::move(data)},
                       {"train", std::move(train)},
                       {"runtime", {{"dtype", "float32"}, {"threads", 1}}},
                       {"sequence_parallel", {{"autosp_size", sp}}}});
}

// B sequences of S + 1 random tokens (the same on every rank for a seed): input = the first S,
// labels = the last S (shifted like the data loader) with about a quarter set to -100.
inline Batch random_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(B * S)), labels(ids.size()), pos(ids.size());
  std::vector<int64_t> seq(static_cast<size_t>(S + 1));
  for (int64_t b = 0; b < B; ++b) {
    for (auto& t : seq) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = static_cast<size_t>(b * S + t);
      ids[i] = seq[static_cast<size_t>(t)];
      labels[i] = rng() % 4 == 0 ? -100 : seq[static_cast<size_t>(t + 1)];
      pos[i] = t;
    }
  }
  return {Tensor::from_vector<int64_t>({B, S}, ids), Tensor::from_vector<int64_t>({B, S}, labels),
          Tensor::from_vector<int64_t>({B, S}, pos)};
}

// B rows of S + 1 tokens in documents of 1 to max_doc tokens, each ended by `eos` (the last one cut
// by the row's end; other tokens from 4 to vocab - 1): input = the first S, labels = the last S,
// as the loader reads a stream. Not marked: mark_documents(batch, eos) does that, as the loader.
inline Batch documents_batch(int64_t B, int64_t S, int64_t vocab, int64_t eos, int64_t max_doc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(B * S)), labels(ids.size()), pos(ids.size());
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> seq(static_cast<size_t>(S + 1));
    int64_t left = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_doc));
    for (auto& t : seq) {
      t = left-- == 0 ? eos : 4 + static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab - 4));
      if (t == eos) left = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_doc));
    }
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = static_cast<size_t>(b * S + t);
      ids[i] = seq[static_cast<size_t>(t)];
      labels[i] = seq[static_cast<size_t>(t + 1)];
      pos[i] = t;
    }
  }
  return {Tensor::from_vector<int64_t>({B, S}, ids), Tensor::from_vector<int64_t>({B, S}, labels),
          Tensor::from_vector<int64_t>({B, S}, pos)};
}

struct LossAndGrads {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // by parameter name
};

// Build `cfg`'s joint program for the rank `layout` places, run it on `batch`, then sum the gradients over `sum_over`
// (the world for an SP run; a group of one for the reference).
inline LossAndGrads run_joint(const Config& cfg, const RankLayout& layout, const Batch& batch, const ParamMap& params,
                       const CommGroups& groups, Communicator& sum_over, DType dt) {
  RankProgram prog = build_program(cfg, dt, Stage::joint, layout);
  Executor ex(*prog.graph);
  TensorMap feeds = batch_feeds(batch);
  for (const auto& [name, p] : params) feeds[name] = p;
  RunResult r = ex.run(feeds, groups);
  std::vector<Tensor> grads;
  for (const auto& name : prog.grad_names) grads.push_back(r.outputs.at(name));
  all_reduce_bucketed(sum_over, grads);
  LossAndGrads out;
  out.loss = r.outputs.at(prog.loss).to_doubles().at(0);
  for (size_t i = 0; i < prog.param_names.size(); ++i) out.grads[prog.param_names[i]] = grads[i];
  return out;
}

// The P = 1 program on the whole global batch, in a world of one.
inline LossAndGrads run_reference(const Config& cfg_p1, const Batch& batch, const ParamMap& params, DType dt = DType::f32) {
  auto single = make_single_process_communicator();
  const CommGroups groups{{"world", single.get()}, {"sp", single.get()}, {"dp", single.get()}};
  return run_joint(cfg_p1, RankLayout{}, batch, params, groups, *single, dt);
}

// The SP program of rank w.rank() of `w` (autosp_size = cfg's), on this rank's batch.
inline LossAndGrads run_sp_on(Communicator& w, const Config& cfg, const Batch& batch, const ParamMap& params,
                              DType dt = DType::f32) {
  ProcessMesh mesh = make_mesh(w, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size);
  const CommGroups groups = mesh.groups(w);
  return run_joint(cfg, mesh, batch, params, groups, w, dt);
}

inline double rel_err(const Tensor& got, const Tensor& want) {
  const auto g = got.to_doubles(), r = want.to_doubles();
  if (g.size() != r.size()) return INFINITY;
  double err = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err = std::max(err, std::abs(g[i] - r[i]));
    scale = std::max(scale, std::abs(r[i]));
  }
  return scale > 0 ? err / scale : (err > 0 ? INFINITY : 0.0);
}

// CHECKs loss and every gradient within kTol; returns the largest relative error seen.
inline double check_equal(const LossAndGrads& sp, const LossAndGrads& ref) {
  const double loss_err = std::abs(sp.loss - ref.loss) / std::abs(ref.loss);
  INFO("loss " << sp.loss << " vs P = 1 " << ref.loss);
  CHECK(std::isfinite(ref.loss));
  CHECK(loss_err < kTol);
  double worst = loss_err;
  CHECK(sp.grads.size() == ref.grads.size());
  for (const auto& [name, want] : ref.grads) {
    INFO("gradient of " << name);
    auto it = sp.grads.find(name);
    CHECK(it != sp.grads.end());  // CHECK, not REQUIRE: later cases run collectives on every rank
    if (it == sp.grads.end()) continue;
    CHECK(it->second.shape() == want.shape());
    const double e = rel_err(it->second, want);
    CHECK(e < kTol);
    worst = std::max(worst, e);
  }
  return worst;
}

// bf16 mixed precision under AutoSP against the P = 1 bf16 run: each rank rounds its partial
// weight gradients to bf16 before the f32 sum over ranks where P = 1 rounds the full sum once,
// about one bf16 rounding (2^-8 relative) per element. Bounds: loss 1e-3 relative, each gradient
// 1e-2 relative L2 (a few roundings' worth). A key projection's bias has an exact gradient of 0
// (a row's softmax does not move when every key gains the same vector), so what the runs hold
// there is rounding noise ~1e-3 of the other gradients': it is measured against its weight's
// gradient instead. Returns the largest gradient error.
inline double check_equal_bf16(const LossAndGrads& sp, const LossAndGrads& ref) {
  const double loss_err = std::abs(sp.loss - ref.loss) / std::abs(ref.loss);
  INFO("loss " << sp.loss << " vs P = 1 " << ref.loss);
  CHECK(loss_err < 1e-3);
  double worst = 0;
  REQUIRE(sp.grads.size() == ref.grads.size());
  for (const auto& [name, want] : ref.grads) {
    const Tensor& got = sp.grads.at(name);
    INFO("gradient of " << name);
    CHECK(got.dtype() == DType::f32);
    const auto g = got.to_doubles(), r = want.to_doubles();
    REQUIRE(g.size() == r.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (g[i] - r[i]) * (g[i] - r[i]);
      den += r[i] * r[i];
    }
    const std::string_view kBias = "k_proj.bias";
    if (name.ends_with(kBias)) {  // the scale: the weight's gradient
      den = 0;
      for (const double v : ref.grads.at(name.substr(0, name.size() - 4) + "weight").to_doubles()) den += v * v;
    }
    const double e = std::sqrt(num / std::max(den, 1e-300));
    CHECK(e < 1e-2);
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace autosp::test
