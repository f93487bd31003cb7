#!/usr/bin/env bash
# `make stop`: end what `make serve` started, by the PIDs it recorded in .run/ (each process's own session,
# so a server's child processes go with it): TERM, up to 20 s, then KILL.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN="${SENTCL_RUN_DIR:-$(pwd)/.run}"
shopt -s nullglob
stopped=0
for name in watcher worker mlflow-ui prefect-server; do
  pidfile="$RUN/$name.pid"
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    # The leader first: Prefect's CLI forwards the signal to its own children and waits for them; signalling
    # the whole group at once makes them receive it twice.
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
      echo "stop: $name (pid $pid) killed after 20 s"
    else
      echo "stop: $name (pid $pid) stopped"
    fi
    # Whatever is left of its session (a uvicorn worker whose parent already exited).
    kill -TERM -- "-$pid" 2>/dev/null && sleep 1 && kill -KILL -- "-$pid" 2>/dev/null
    stopped=$((stopped + 1))
  fi
  rm -f "$pidfile"
done
(( stopped == 0 )) && echo "stop: nothing was running"
exit 0
