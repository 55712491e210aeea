// How autosp-sample and autosp-eval name the model they load: one of --checkpoint DIR (a step_N
// directory or a root: its newest step; the run config is its meta.json's), --model HF_DIR (a
// Hugging Face model directory, as model.from) or --config FILE (weights from --init-from,
// --checkpoint, model.from, or the seeded initialisation), each with --set overrides. Flags in,
// a Config and the TrainArgs that train/trainer.h starting_params reads out; nothing is loaded.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "tools/options.h"
#include "train/trainer.h"

namespace autosp {

// The flags above, added to an app's options.
void add_model_flags(cxxopts::Options& opts);

struct ModelFlags {
  Config cfg;
  TrainArgs args;  // init_from, resume: the weights starting_params loads
};

// The config and weights the parsed flags name; `sets` are the --set overrides (and any the app
// adds). Giving none or several of --checkpoint/--model/--config, or --checkpoint with
// --init-from, is a UsageError.
ModelFlags model_from_flags(const cxxopts::ParseResult& args, const std::vector<std::string>& sets);

// The checkpoint directory `path` names: itself when it holds meta.json, else its newest step_N.
std::string step_dir(const std::string& path);

// The run config a checkpoint was written with (its meta.json), with --set overrides. Its warnings
// name only keys of `sets` (the saved config holds every key; the user wrote none of them).
Config checkpoint_config(const std::string& dir, const std::vector<std::string>& sets);

}  // namespace autosp
