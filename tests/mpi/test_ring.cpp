// Ring attention over MPI (MPI_Isend / MPI_Irecv, comm/mpi.cpp): at np 4 Ulysses 2 × ring 2 with
// 2 heads, at np 2 a pure ring of 2, each with packed documents; and a windowed Mistral as a pure
// ring of np (the windowed exchange, decision 135: messages of different sizes, and empty ones);
// the loss and every world-summed gradient equal the unsharded float64 P = 1 program (bars 1e-10);
// and gpt-oss's attention sinks on the windowed Mistral. The same cases over thread
// ranks, and the rest of the ring's contract, are tests/comm/test_thread_ring.cpp.
#include <catch2/catch.hpp>

#include "common/sp_case.h"
#include "mpi/mpi_test.h"

namespace autosp::test {
namespace {

constexpr int64_t kEos = 3;

// Documents of 1 to 9 tokens, marked as the loader marks them.
Batch marked_documents(int64_t B, int64_t S, uint64_t seed) {
  Batch out = documents_batch(B, S, 64, kEos, 9, seed);
  mark_documents(out, kEos);
  return out;
}

// `model` on sp ranks with ring_size `ring`, float64, packed documents of length-S rows.
Config documents_config(const json& model, int64_t S, int64_t sp, int64_t ring) {
  return parse_config({{"model", model},
                       {"data", {{"source", "tokens"}, {"path", "unused.bin"}, {"seq_len", S}, {"batch_size", 2},
                                 {"eos_token_id", kEos}, {"document_mask", true}}},
                       {"runtime", {{"dtype", "float64"}, {"threads", 1}}},
                       {"sequence_parallel", {{"autosp_size", sp}, {"ring_size", ring}}}});
}

// The loss and every gradient of `got` against the P = 1 run (bars 1e-10).
void check_against(const LossAndGrads& got, const LossAndGrads& ref, int64_t P) {
  INFO("P = " << P << ": loss " << got.loss << " vs " << ref.loss);
  CHECK(std::abs(got.loss - ref.loss) <= 1e-10 * std::abs(ref.loss));
  for (const auto& [name, want] : ref.grads) {
    INFO("gradient of " << name);
    CHECK(rel_err(got.grads.at(name), want) < 1e-10);
  }
}

}  // namespace

TEST_CASE("ring over MPI: loss and gradients equal the float64 P = 1 run", "[autosp][ring]") {
  Communicator& w = test_world();
  const int64_t P = w.size();
  if (P < 2) return;
  const json model = {{"arch", "llama"},        {"vocab_size", 64},         {"hidden_size", 16},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                      {"intermediate_size", 32}};
  const Config cfg1 = documents_config(model, 30, 1, 1), cfg = documents_config(model, 30, P, 2);
  // np 4: U 2 x R 2; np 2: a pure ring of 2
  const ParamMap params = init_params(cfg1.model, 41, DType::f64);
  const Batch batch = marked_documents(2, 30, 42);  // 30: padded to a multiple of 2P
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
  check_against(run_sp_on(w, cfg, pad_to_multiple(batch, 2 * P), params, DType::f64), ref, P);
}

TEST_CASE("ring over MPI: a sliding window's exchange equals the float64 P = 1 run", "[autosp][ring]") {
  Communicator& w = test_world();
  const int64_t P = w.size();
  if (P < 2) return;
  // w = 5 on chunks of 32 / 2P tokens (4 at np 4, 8 at np 2): it crosses the shard boundaries and cuts.
  const json model = {{"arch", "mistral"},      {"vocab_size", 64},         {"hidden_size", 16},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                      {"intermediate_size", 32}, {"sliding_window", 5}};
  const Config cfg1 = documents_config(model, 32, 1, 1), cfg = documents_config(model, 32, P, P);
  const ParamMap params = init_params(cfg1.model, 43, DType::f64);
  const Batch batch = marked_documents(2, 32, 44);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
  check_against(run_sp_on(w, cfg, batch, params, DType::f64), ref, P);
}

// gpt-oss's attention sinks (decision 175) through MPI: the windowed Mistral above with sinks, at
// np 4 as Ulysses 2 x ring 2 (each rank's heads' slice of the sinks, the sink joining on its
// own chunk's pair), at np 2 as a pure ring of 2.
TEST_CASE("ring over MPI: attention sinks equal the float64 P = 1 run", "[autosp][ring]") {
  Communicator& w = test_world();
  const int64_t P = w.size();
  if (P < 2) return;
  const json model = {{"arch", "mistral"},      {"vocab_size", 64},          {"hidden_size", 16},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 4},  {"num_key_value_heads", 2},
                      {"intermediate_size", 32}, {"sliding_window", 5},      {"attention_sinks", true}};
  const Config cfg1 = documents_config(model, 32, 1, 1);
  ParamMap params = init_params(cfg1.model, 45, DType::f64);
  for (int l = 0; l < 2; ++l)
    for (int64_t h = 0; h < 4; ++h)
      params.at(str("model.layers.", l, ".self_attn.sinks")).data<double>()[h] = 1.0 + 0.5 * double(h - 2 * l);
  const Batch batch = marked_documents(2, 32, 46);
  const LossAndGrads ref = run_reference(cfg1, batch, params, DType::f64);
  REQUIRE(ref.grads.count("model.layers.1.self_attn.sinks"));
  check_against(run_sp_on(w, documents_config(model, 32, P, 2), batch, params, DType::f64), ref, P);
}

}  // namespace autosp::test
