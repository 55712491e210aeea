// A Python child process that answers JSON lines: the PyTorch side of autosp-bench's alternated
// comparisons (scripts/bench_attention.py, scripts/bench_pytorch.py --serve). Keeping one process
// alive lets the two sides take turns (A B A B) without paying torch's import at every turn.
// Knows nothing of what the requests mean.
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

namespace autosp {

// The python of the PyTorch 2.x venv (.venv-bench/ under source_dir), created on first use by
// scripts/pytorch-venv.sh (plain `pip install torch` from PyPI); a RuntimeFailure if that fails.
// `script` names another venv script of scripts/ (hf-venv.sh: Debian's torch with transformers and
// tokenizers, for autosp-sample's tokenizer).
std::string venv_python(const std::string& source_dir, const std::string& script = "pytorch-venv.sh");

class PyWorker {
 public:
  // Starts argv[0] with argv (its stdin and stdout are pipes to us, its stderr is ours).
  explicit PyWorker(const std::vector<std::string>& argv);
  ~PyWorker();  // closes its stdin and waits for it
  PyWorker(const PyWorker&) = delete;
  PyWorker& operator=(const PyWorker&) = delete;

  // Sends one line and returns the next line it prints that is a JSON object (other lines are
  // skipped); a RuntimeFailure naming the command if it exits first or answers {"error": ...}.
  nlohmann::json request(const nlohmann::json& req);
  // Waits for the next JSON line without sending anything (a worker that announces itself).
  nlohmann::json read_reply();

 private:
  std::string what_;  // the command line, for errors
  pid_t pid_ = -1;
  int to_ = -1;       // its stdin
  FILE* from_ = nullptr;  // its stdout
};

}  // namespace autosp
