#!/usr/bin/env bash
# `make stop`: end everything `make serve` started, by what it recorded in .run/ (infra/run-records.sh): each
# process whose PID still has the start time serve recorded gets TERM, up to 20 s (the worker: a second
# signal, 5 s more), then KILL, and what is left of its session goes with it. A `make serve` still starting is
# ended first. A PID the system has since given to another process is left alone and reported; a process that
# crashed has what is left of its session ended.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN="${SENTCL_RUN_DIR:-$(pwd)/.run}"
source infra/run-records.sh
stopped=0
for name in serve watcher $(workers) gate mlflow-server prefect-server; do
  [[ -f "$RUN/$name.pid" ]] || continue
  end_process "$name" && stopped=$((stopped + 1))
done
[[ -f "$RUN/serve.state" ]] && echo stopped >"$RUN/serve.state"   # nothing left for the next serve to end
(( stopped == 0 )) && echo "stop: nothing was running"
exit 0
