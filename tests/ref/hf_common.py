"""What the scripts that check autosp against transformers share: the skip without the venv of
scripts/hf-venv.sh (exit 77, a ctest skip) and the launch of an autosp binary, under mpirun for
more than one rank, with one OpenMP thread per process and mpirun allowed to run as root.
"""
import os
import subprocess
import sys

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def skip(error, what="transformers"):
    """Exit 77 (skipped, not failed): `what` did not import (`error`)."""
    print(f"skipped: {what} is not importable ({error}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)


def launch(cmd, ranks=1, timeout=300):
    """Runs cmd (a list) on `ranks` processes; returns its stdout, or raises naming the command."""
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *cmd]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout
