// PyWorker: fork/exec with two pipes; requests and replies are single JSON lines.
#include "tools/py_worker.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tensor/check.h"

namespace autosp {

std::string venv_python(const std::string& source_dir, const std::string& script_name) {
  const std::string script = source_dir + "/scripts/" + script_name;
  FILE* pipe = popen(("'" + script + "'").c_str(), "r");  // source_dir is the build's own path
  if (!pipe) throw RuntimeFailure("cannot start " + script);
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  const int rc = pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const std::string py = out.substr(out.find_last_of('\n') + 1);
  if (rc != 0 || py.empty() || !std::filesystem::exists(py))
    throw RuntimeFailure(str(script, " failed (exit ", rc, "): no venv"));
  return py;
}

PyWorker::PyWorker(const std::vector<std::string>& argv) {
  AUTOSP_ASSERT(!argv.empty(), "PyWorker needs a command");
  for (const auto& a : argv) what_ += (what_.empty() ? "" : " ") + a;
  int in[2], out[2];
  // Close-on-exec: a worker started later must not inherit these, or this one never sees EOF.
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
    throw RuntimeFailure("pipe: " + std::string(std::strerror(errno)));
  std::signal(SIGPIPE, SIG_IGN);  // a worker that dies makes write() fail instead of killing us
  std::fflush(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw RuntimeFailure("fork: " + std::string(std::strerror(errno)));
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "error: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_ = in[1];
  from_ = fdopen(out[0], "r");
}

PyWorker::~PyWorker() {
  if (to_ >= 0) close(to_);
  if (from_) std::fclose(from_);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

nlohmann::json PyWorker::read_reply() {
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, from_)) {
    line += buf;
    if (line.back() != '\n') continue;
    nlohmann::json j = line[0] == '{' ? nlohmann::json::parse(line, nullptr, false) : nlohmann::json();
    line.clear();
    if (!j.is_object()) continue;
    if (j.contains("error")) throw RuntimeFailure(str(what_, ": ", j["error"].dump()));
    return j;
  }
  throw RuntimeFailure(str(what_, " exited without an answer (see its messages above)"));
}

nlohmann::json PyWorker::request(const nlohmann::json& req) {
  const std::string line = req.dump() + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = write(to_, line.data() + done, line.size() - done);
    if (n <= 0) throw RuntimeFailure(str(what_, " is gone (write: ", std::strerror(errno), ")"));
    done += static_cast<size_t>(n);
  }
  return read_reply();
}

}  // namespace autosp
