#!/usr/bin/env python3
"""The layer rules of docs/architecture.md ("What may include what"), checked on the includes.

Usage: check_layers.py [ROOT]   (ROOT: the repository, default the current directory)

Scans every `#include "..."` line of the C++ and CUDA files under ROOT/src and ROOT/apps. Each file
belongs to a folder (its top-level folder under src/, with kernels/ split into its neutral headers,
kernels/cpu and kernels/cuda; apps/tools; apps); each included path names the folder it lives in.
A folder may include its own files and those of the folders RULES lists for it, nothing else.
Also rejects `#if…AUTOSP_WITH_CUDA` in src/comm: comm reaches devices only through device/.

Prints `file:line: includes X (folder A may not include B)` for each violation and exits 1, or
exits 0 with a one-line summary. Python 3 standard library only.
"""

import os
import re
import sys

# What each folder may include besides itself. The table is acyclic (checked below): each folder
# knows nothing of those above it. "kernels" is the neutral kernel headers (kernels/*.h: the
# kernel-kind enums both backends take, the attention backend); kernels/cpu and kernels/cuda are
# the two backends, and neither may include the other.
RULES = {
    "tensor": [],
    "graph": ["tensor"],
    "kernels": ["tensor"],
    "kernels/cpu": ["kernels", "tensor"],
    "kernels/cuda": ["kernels", "tensor"],
    # device: the host and CUDA runtimes run either backend's kernels on tensors (device/optim.h).
    "device": ["kernels", "kernels/cpu", "kernels/cuda", "tensor"],
    "comm": ["device", "tensor"],
    "models": ["graph", "tensor"],
    # config: the neutral kernel headers for the attention backend it parses (runtime.attention).
    "config": ["models", "kernels", "tensor"],
    # engine: the executor, the dispatch table and its launchers join graphs to kernels and devices.
    "engine": ["graph", "kernels", "kernels/cpu", "kernels/cuda", "device", "comm", "tensor"],
    # compiler: the program builder (model → passes); comm only for the rank layout (comm/mesh.h).
    "compiler": ["config", "models", "graph", "comm", "tensor"],
    "train": ["compiler", "engine", "comm", "device", "config", "models", "graph", "tensor"],
    # The apps and what they share may use any layer (they turn flags into library calls; the
    # benchmarks time kernels directly).
    "apps/tools": ["train", "compiler", "engine", "comm", "device", "config", "models", "graph", "kernels",
                   "kernels/cpu", "kernels/cuda", "tensor"],
    "apps": ["apps/tools", "train", "compiler", "engine", "comm", "device", "config", "models", "graph", "kernels",
             "kernels/cpu", "kernels/cuda", "tensor"],
}

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CUDA_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b.*\bAUTOSP_WITH_CUDA\b")


def folder_of_file(rel):
    """The folder a file (path relative to the root, '/'-separated) belongs to, or None."""
    parts = rel.split("/")
    if parts[0] == "apps":
        return "apps/tools" if len(parts) > 2 and parts[1] == "tools" else "apps"
    if parts[0] != "src" or len(parts) < 3:
        return None
    if parts[1] == "kernels":
        return "kernels/" + parts[2] if len(parts) > 3 else "kernels"
    return parts[1]


def folder_of_include(path):
    """The folder an included path (as written, relative to src/ or apps/) lives in, or None."""
    parts = path.split("/")
    if len(parts) < 2:
        return None  # a header beside the file: its own folder
    if parts[0] == "tools":
        return "apps/tools"
    if parts[0] == "kernels":
        return "kernels/" + parts[1] if len(parts) > 2 else "kernels"
    return parts[0] if parts[0] in RULES else None


def check_acyclic():
    state = {}

    def visit(f, trail):
        if state.get(f) == "done":
            return
        if state.get(f) == "open":
            raise SystemExit("check_layers.py: the rule table has a cycle: " + " -> ".join(trail + [f]))
        state[f] = "open"
        for g in RULES[f]:
            visit(g, trail + [f])
        state[f] = "done"

    for f in RULES:
        visit(f, [])


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    check_acyclic()
    violations = []
    files = includes = 0
    for top in ("src", "apps"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXTS):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                a = folder_of_file(rel)
                if a is None:
                    continue
                files += 1
                with open(full, encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
                for n, line in enumerate(lines, 1):
                    if a == "comm" and CUDA_CONDITIONAL.match(line):
                        violations.append(f"{rel}:{n}: #if on AUTOSP_WITH_CUDA (comm reaches devices only "
                                          "through device/)")
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    includes += 1
                    inc = m.group(1)
                    b = folder_of_include(inc)
                    if b is None or b == a or b in RULES[a]:
                        continue
                    violations.append(f"{rel}:{n}: includes {inc} (folder {a} may not include {b})")
    for v in violations:
        print(v)
    if violations:
        print(f"check_layers: {len(violations)} violation(s) of the layer rules (.ci/check_layers.py, "
              "docs/architecture.md)")
        return 1
    print(f"check_layers: {files} files, {includes} includes, {len(RULES)} folders: every include follows the rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
