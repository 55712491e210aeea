// Output paths (train/outputs.h): --metrics and --dump-grads may not overwrite an input or land in a
// checkpoint. Each case builds the files it names in a temporary directory.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "tensor/check.h"
#include "train/outputs.h"

using namespace autosp;
namespace fs = std::filesystem;

TEST_CASE("outputs may not overwrite an input or land in a checkpoint", "[outputs]") {
  const test::TempDir tmp("outputs");
  const fs::path& d = tmp.dir;
  fs::create_directories(d / "ck" / "step_00000004");
  fs::create_directories(d / "data");
  std::ofstream(d / "config.json") << "{}";
  std::ofstream(d / "ck" / "step_00000004" / "meta.json") << "{}";
  std::ofstream(d / "data" / "a.bin") << "x";
  std::ofstream(d / "weights.safetensors") << "x";
  fs::create_hard_link(d / "config.json", d / "alias.json");
  const RunFiles run{{(d / "config.json").string(), (d / "data" / "*.bin").string(),
                      (d / "weights.safetensors").string()},
                     (d / "ck").string()};

  auto refused = [&](const fs::path& p, const std::string& why) {
    INFO(p.string());
    CHECK_THROWS_AS(check_output_path("--metrics", p.string(), run), UsageError);
    CHECK_THROWS_WITH(check_output_path("--metrics", p.string(), run),
                      Catch::StartsWith("--metrics " + p.string()) && Catch::Contains(why));
  };
  refused(d / "config.json", "which this run reads");
  refused(d / "data" / ".." / "config.json", "which this run reads");  // the same file spelled otherwise
  refused(d / "alias.json", "which this run reads");                    // a hard link to it
  refused(d / "data" / "a.bin", "which this run reads");                // a glob's match
  refused(d / "weights.safetensors", "which this run reads");
  refused(d / "ck" / "step_00000004" / "model.safetensors", "inside the checkpoint");
  refused(d / "ck" / "step_00000009" / "m.jsonl", "inside the checkpoint");  // a step not yet written
  refused(d / "ck" / "train.log", "train.log");
  refused(d / "ck" / ".lock", ".lock");
  refused(d / "ck", "directory");
  refused(d / "nowhere" / "m.jsonl", (d / "nowhere").string() + " is not a directory");  // checked before the run

  // A file written by rename may not replace a device (once /dev/full became a regular file).
  CHECK_THROWS_WITH(check_output_path("--dump-grads", "/dev/null", run, OutputKind::replaced),
                    Catch::Contains("is not a regular file"));
  CHECK_NOTHROW(check_output_path("--metrics", "/dev/null", run));  // appended: fine
  CHECK_NOTHROW(check_output_path("--metrics", (d / "metrics.jsonl").string(), run));
  CHECK_NOTHROW(check_output_path("--metrics", (d / "ck" / "metrics.jsonl").string(), run));  // beside, not in
  CHECK_NOTHROW(check_output_path("--dump-grads", (d / "data" / "grads.safetensors").string(), run));
}
