#!/usr/bin/env python3
"""The docs-commands check (docs/decisions.md 101): the pages cannot drift from the code.

  check_docs.py SOURCE_DIR static            links, directives and the performance log's flags
  check_docs.py SOURCE_DIR run PAGE BIN_DIR   runs PAGE's command blocks, as the directives say

Every ```sh / ```bash block in README.md and docs/*.md is a command block, and the line before it
(blank lines and other comments aside) is a directive that says how CI checks it:

  <!-- docs-check: run -->                       run as written
  <!-- docs-check: run | "A" -> "B" | ... -->    run with A replaced by B (a small size for a long run)
  <!-- docs-check: run | given book.txt x.jsonl | "A" -> "B" -->
                                                 and with those input files made first (text made from
                                                 this repository's own pages; .jsonl as {"text": ...} rows,
                                                 *pairs.jsonl as {"prompt", "chosen", "rejected"} rows)
  <!-- docs-check: by FILE [FILE...] -->         run by those scripts or tests; the file name of what
                                                 each command runs must appear in one of them
  <!-- docs-check: skip: REASON -->              cannot run here (a GPU, several nodes, SLURM); the page
                                                 must say so in its own words beside the block

A page's runnable blocks run in order in one bash (`set -euo pipefail`, so a failing line fails the
check), in a scratch directory where the repository's folders are symbolic links and `build` is
BIN_DIR's parent: what a command writes stays there. mpirun may oversubscribe. Blocks of a page that
needs the Hugging Face venv are skipped (exit 77) where .venv-hf is missing, as the ref.* tests are.

The logs (docs/performance.md, docs/decisions.md) record commands as they were run at a commit, so
their blocks need no directive; their flags are checked like every page's.

The static check also fails on a link that leaves the repository or names a file that does not
exist, and on a flag, in the performance log's and the pages' commands, that the binary's --help
does not list.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FENCE = re.compile(r"^```(\S*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*docs-check:\s*(.*?)\s*-->\s*$")
COMMAND_LANGS = {"sh", "bash"}
LOGS = ("performance.md", "decisions.md")  # records of what was run: their flags are checked, not run
BINARIES = ("autosp-train", "autosp-bench", "autosp-graph", "autosp-sample", "autosp-eval", "autosp-plan")


class Block:
    def __init__(self, page, line, lang, text, directive):
        self.page, self.line, self.lang, self.text, self.directive = page, line, lang, text, directive

    def where(self):
        return f"{self.page}:{self.line}"


def pages(src):
    return [src / "README.md"] + sorted((src / "docs").glob("*.md"))


def blocks_of(path, src):
    """Every fenced block of a page, with the directive before it (None where there is none)."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    rel = str(path.relative_to(src))
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        directive, k = None, start - 1
        while k >= 0 and (not lines[k].strip() or (lines[k].startswith("<!--") and not DIRECTIVE.match(lines[k]))):
            k -= 1
        if k >= 0 and DIRECTIVE.match(lines[k]):
            directive = DIRECTIVE.match(lines[k]).group(1)
        out.append(Block(rel, start + 1, lang, "\n".join(lines[start + 1:j]), directive))
        i = j + 1
    return out


def parse_directive(d):
    """(kind, replacements, given files, by-files, reason)."""
    parts = [p.strip() for p in d.split("|")]
    head = parts[0]
    if head.startswith("skip:"):
        reason = head[len("skip:"):].strip()
        if not reason:
            raise ValueError("skip needs a reason")
        return "skip", [], [], [], reason
    if head.startswith("by "):
        return "by", [], [], head[3:].split(), ""
    if head != "run":
        raise ValueError(f"unknown directive {head!r} (run, by FILE..., skip: REASON)")
    reps, given = [], []
    for p in parts[1:]:
        m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"\s*->\s*"((?:[^"\\]|\\.)*)"', p)
        if m:
            reps.append((m.group(1).replace('\\"', '"'), m.group(2).replace('\\"', '"')))
        elif p.startswith("given "):
            given += p[len("given "):].split()
        else:
            raise ValueError(f"cannot read {p!r} (\"A\" -> \"B\", given FILE...)")
    return "run", reps, given, [], ""


def command_lines(text):
    """The block's commands, one string each: continuation lines joined, comments and heredoc bodies
    left out."""
    out, cur, heredoc = [], "", None
    for raw in text.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() and not cur:
            continue
        cur += " " + line.strip().rstrip("\\")
        m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if m:
            heredoc = m.group(1)
        if not line.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def program_of(cmd):
    """What a command runs, by its file name: past VAR=value words and an interpreter or launcher."""
    for w in cmd.split():
        if re.fullmatch(r"\w+=\S*", w) or w in ("bash", "sh", "python3", "mpirun", "exec"):
            continue
        return os.path.basename(w)
    return cmd


def help_flags(bin_dir):
    flags = {}
    for b in BINARIES:
        exe = bin_dir / b
        if not exe.exists():
            continue
        text = subprocess.run([str(exe), "--help"], capture_output=True, text=True).stdout
        flags[b] = set(re.findall(r"--[a-z][a-z0-9-]*", text))
    return flags


def flag_errors(where, text, flags):
    """Flags given to our binaries in a block that their --help does not list."""
    errs = []
    aliases = {}
    for cmd in command_lines(text):
        m = re.match(r"^(\w+)=(?:\S*/)?(autosp-\w+)$", cmd)
        if m:
            aliases["$" + m.group(1)] = m.group(2)
            continue
        words = cmd.split()
        for i, w in enumerate(words):
            name = aliases.get(w) or next((b for b in BINARIES if w.endswith("/" + b) or w == b), None)
            if not name or name not in flags:
                continue
            for f in words[i + 1:]:
                if f in ("|", "&&", ";", ">", "2>&1") or f.startswith(">"):
                    break
                f = f.split("=")[0]
                if re.fullmatch(r"--[a-z][a-z0-9-]*", f) and f not in flags[name]:
                    errs.append(f"{where}: {name} has no flag {f} (its --help does not list it)")
    return errs


def static_check(src, bin_dir):
    errs = []
    flags = help_flags(bin_dir) if bin_dir else {}
    for page in pages(src):
        rel = page.relative_to(src)
        text = page.read_text()
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):
                continue
            resolved = (page.parent / target).resolve()
            if not str(resolved).startswith(str(src.resolve())):
                errs.append(f"{rel}: the link {target} leaves the repository")
            elif not resolved.exists():
                errs.append(f"{rel}: the link {target} names no file")
        if "../shared" in text:
            errs.append(f"{rel}: points to ../shared, outside the repository")
        for b in blocks_of(page, src):
            if b.lang in COMMAND_LANGS and rel.name not in LOGS:
                if b.directive is None:
                    errs.append(f"{b.where()}: a ```{b.lang} block without a <!-- docs-check: ... --> line before it")
                    continue
                try:
                    kind, _, _, by, _ = parse_directive(b.directive)
                except ValueError as e:
                    errs.append(f"{b.where()}: {e}")
                    continue
                if kind == "by":
                    bodies = []
                    for f in by:
                        if not (src / f).is_file():
                            errs.append(f"{b.where()}: by {f}: no such file")
                        else:
                            bodies.append((src / f).read_text())
                    for cmd in command_lines(b.text):
                        name = program_of(cmd)
                        if bodies and not any(name in body for body in bodies):
                            errs.append(f"{b.where()}: `{name}` is in none of {', '.join(by)}")
            if flags and (b.lang in COMMAND_LANGS or rel.name == "performance.md"):
                errs += flag_errors(b.where(), b.text, flags)
    return errs


def make_given(scratch, name, src):
    """An input a block names: text made from this repository's pages; NAME/ is a tiny Hugging Face
    model directory with its tokenizer (make_model.py, in .venv-hf)."""
    if name.endswith("/"):
        make_given(scratch, "model-text.txt", src)
        subprocess.run([str(src / ".venv-hf" / "bin" / "python"), str(src / "tests" / "docs" / "make_model.py"),
                        str(scratch / name), str(scratch / "model-text.txt")], check=True)
        return
    paragraphs = []
    for page in pages(src):
        paragraphs += [p.strip() for p in page.read_text().split("\n\n") if len(p.strip()) > 80]
    paragraphs = paragraphs[:200]  # about 60 kB: enough to train a tokenizer and a few steps, quickly
    path = scratch / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith("pairs.jsonl"):  # TRL's preference rows: a paragraph's start, then two endings
        import json
        path.write_text("".join(json.dumps({"prompt": p[:60], "chosen": p[60:120], "rejected": q[60:100]}) + "\n"
                                for p, q in zip(paragraphs[::2], paragraphs[1::2])))
    elif name.endswith(".jsonl"):
        import json
        path.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    else:
        path.write_text("\n\n".join(paragraphs) + "\n")


def run_page(src, page_name, bin_dir):
    page = src / page_name
    blocks = [b for b in blocks_of(page, src) if b.lang in COMMAND_LANGS and b.directive]
    script, ran, givens = ["set -euo pipefail"], 0, []
    scratch = Path(tempfile.mkdtemp(prefix="docs-check."))
    try:
        for entry in src.iterdir():
            if entry.name not in ("build", ".git") and not entry.name.startswith("build-"):
                (scratch / entry.name).symlink_to(entry)
        (scratch / "build").symlink_to(bin_dir.resolve().parent)
        for b in blocks:
            kind, reps, given, _, reason = parse_directive(b.directive)
            if kind != "run":
                print(f"{b.where()}: {kind} {reason or ''}".rstrip())
                continue
            text = b.text
            for a, r in reps:
                if a not in text:
                    print(f"error: {b.where()}: the replacement \"{a}\" matches nothing in the block")
                    return 1
                text = text.replace(a, r)
            givens += given
            script.append(f"echo '=== {b.where()}'")
            script.append(text)
            ran += 1
        if not ran:
            print(f"{page_name}: no runnable block")
            return 0
        uses_venv = any(".venv-hf" in s or "hf-venv.sh" in s for s in script) or any(
            g.endswith("/") for b in blocks if b.directive for g in parse_directive(b.directive)[2])
        if uses_venv and not (src / ".venv-hf" / "bin" / "python").exists():
            print(f"skip: {page_name} needs .venv-hf (scripts/hf-venv.sh)")
            return 77
        for g in givens:
            make_given(scratch, g, src)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env)
        if r.returncode != 0:
            print(f"error: {page_name}: a command block failed (exit {r.returncode}); the last '===' line names it")
            return 1
        print(f"{page_name}: {ran} block(s) ran")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    src = Path(argv[1]).resolve()
    if argv[2] == "static":
        errs = static_check(src, Path(argv[3]) if len(argv) > 3 else None)
        for e in errs:
            print("error:", e)
        n = sum(len(blocks_of(p, src)) for p in pages(src))
        print(f"{len(pages(src))} pages, {n} blocks: {len(errs)} problem(s)")
        return 1 if errs else 0
    if argv[2] == "run" and len(argv) == 5:
        return run_page(src, argv[3], Path(argv[4]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
