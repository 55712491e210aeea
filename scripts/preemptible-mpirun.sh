#!/usr/bin/env bash
# Runs `mpirun ARGS...` so that a preemption signal sent to this script reaches every rank as one
# autosp-train can act on, and exits with mpirun's exit code (4 after a save: docs/reliability.md).
#   scripts/preemptible-mpirun.sh [mpirun flags] -np N build/bin/autosp-train ...
# (AUTOSP_MPIRUN names another mpirun, as for autosp-bench.)
# Why: Open MPI's mpirun, given SIGTERM or SIGINT itself (Kubernetes stopping a pod, `kill` of the
# job, Ctrl-C), sends its ranks SIGTERM and then SIGKILL after odls_base_sigkill_timeout (1 s by
# default), and exits 1; SIGTERM cannot be added to the signals it forwards. It does forward
# SIGUSR1, which autosp-train treats as SIGTERM. So here mpirun runs in its own process group (a
# terminal's Ctrl-C reaches this script only) and SIGTERM, SIGINT and SIGHUP are passed on to it as
# SIGUSR1: the ranks finish the step, save and exit 4. A second signal is passed on too, and stops
# the ranks at once (autosp-train's second signal).
set -u
set -m  # background jobs in their own process groups
"${AUTOSP_MPIRUN:-mpirun}" "$@" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null' TERM INT HUP
while :; do
  wait "$pid"
  kill -0 "$pid" 2>/dev/null || break  # a trapped signal interrupts wait; mpirun still runs
done
wait "$pid"  # the status mpirun exited with (not a trap's 128 + n)
exit $?
