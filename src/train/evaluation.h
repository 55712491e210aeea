// Long-context evaluation behind autosp-eval: forward-only programs through the AutoSP passes (the
// rank's forward, train/validation.h's program: no backward, no gradients, no optimizer state),
// run over evaluation data read like validation data. Perplexity by position: each target's loss,
// from this rank's logits in double on the host, summed into buckets of positions over the world,
// so the buckets equal one process's at every P (the rank only scores the positions it holds).
// Passkey retrieval: a key hidden at a depth of filler, asked for at the end; the answer is scored
// by greedy decoding's exact match, checked in the same one SP forward over prompt + answer
// (docs/decisions.md 119: greedy decoding reproduces the key exactly iff the argmax at every answer
// position, given the key's earlier tokens, is the key's next token).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/job_comms.h"
#include "config/config.h"
#include "engine/executor.h"

namespace autosp {

// `cfg` as an evaluation program needs it: the evaluation data is data.val_path, else data.path
// (with its loss masks); whole parameters on every rank (ZeRO stage 0: there is
// no optimizer state to shard) and the logits kept (runtime.tiled_loss off: each target's loss is
// read from them).
Config eval_config(Config cfg);

struct PositionLossOptions {
  int64_t bucket_width = 1024;  // positions per bucket, ≥ 1
  // Sequences to evaluate: 0 = one epoch of the data (every window of the shards), or for
  // synthetic data train.eval_batches × data.batch_size.
  int64_t sequences = 0;
  // Called on rank 0 after each round of batches with (sequences done, total).
  std::function<void(int64_t, int64_t)> progress;
};

// One bucket: the targets predicted at positions [start, end) of the input (position t predicts
// token t + 1, with t + 1 tokens of context), their count and the sum of their losses (nats).
struct PositionBucket {
  int64_t start = 0, end = 0, tokens = 0;
  double loss_sum = 0;
};

struct PositionLoss {
  int64_t seq_len = 0, bucket_width = 0, sequences = 0;
  std::vector<PositionBucket> buckets;
  size_t peak_bytes = 0;  // this rank's measured peak of the program's memory (the executor's)
  // {"seq_len", "bucket_width", "sequences", "tokens", "loss", "perplexity", "peak_bytes",
  //  "buckets": [{"start", "end", "tokens", "loss", "perplexity"}]}; a bucket without targets has
  // null loss and perplexity.
  nlohmann::json to_json() const;
};

struct PasskeyOptions {
  std::vector<int64_t> lengths;  // prompt lengths in tokens (filler + key sentence + question)
  std::vector<double> depths;    // where the key sentence starts, as a fraction of the filler, in [0, 1]
  int64_t trials = 5;            // keys per cell
  uint64_t seed = 0;             // draws the keys (5-digit numbers)
  // Text → token ids (the model's tokenizer, or its bytes).
  std::function<std::vector<int64_t>(const std::string&)> encode;
  // The filler's tokens, repeated as needed; empty: the built-in text (kPasskeyFiller) encoded.
  std::vector<int64_t> filler;
  std::function<void(int64_t, int64_t)> progress;  // rank 0: (prompts done, total)
};

// The built-in filler (the passkey test of Mohtashami & Jaggi's landmark attention, as LongLoRA runs it).
inline constexpr const char* kPasskeyFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

struct PasskeyCell {
  int64_t length = 0;
  double depth = 0;
  int64_t correct = 0, trials = 0;
  // Per trial: the key, and the model's greedy answer up to and including its first wrong token.
  std::vector<std::pair<std::string, std::vector<int64_t>>> answers;
};

struct PasskeyResult {
  std::vector<PasskeyCell> cells;  // lengths × depths, length-major
  size_t peak_bytes = 0;
  // {"task": "passkey", "accuracy", "trials", "peak_bytes", "cells": [{"length", "depth", "accuracy",
  //  "correct", "trials", "answers": [{"key", "said_ids"}]}]}
  nlohmann::json to_json() const;
};

// The options' problems (no lengths or depths, a depth outside [0, 1], trials < 1, a length too
// short for the key and question or past what the model's positions take) as a UsageError, before
// anything is built or loaded; the longest sequence a prompt runs at.
int64_t check_passkey(const Config& cfg, const PasskeyOptions& o);

// Every rank: the passkey grid; each prompt one SP forward of the rank's program (dp ranks take
// prompts in turn).
PasskeyResult passkey(const Config& cfg, const ParamMap& params, JobComms& comms, Device dev, const PasskeyOptions& o);

// The sequences the options ask for, for a UsageError before anything is built or loaded.
int64_t eval_sequences(const Config& cfg, const PositionLossOptions& o);

// Every rank: the per-position losses of `params` (the graph's parameters, already on `dev`) on the
// validation data of an eval_config (data.val_path, else the held-out synthetic stream).
PositionLoss perplexity_by_position(const Config& cfg, const ParamMap& params, JobComms& comms, Device dev,
                                    const PositionLossOptions& o);

}  // namespace autosp
