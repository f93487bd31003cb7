#!/usr/bin/env bash
# `make stop`: end what `make serve` started, by the PIDs it recorded in .run/ (each process's own session,
# so a server's child processes go with it): TERM, up to 20 s (the worker: a second signal, 5 s more), then KILL.
# A PID is signalled only if its command line is still the one `make serve` recorded (.run/<name>.cmdline):
# a PID the system has since given to another process is left alone and reported.
set -uo pipefail
cd "$(dirname "$0")/.."
RUN="${SENTCL_RUN_DIR:-$(pwd)/.run}"
shopt -s nullglob
stopped=0
wait_exit() {  # pid, half-seconds
  for _ in $(seq 1 "$2"); do kill -0 "$1" 2>/dev/null || break; sleep 0.5; done
}
same_process() {  # name, pid: is it still running what serve started?
  local recorded="$RUN/$1.cmdline" now
  [[ -r "/proc/$2/cmdline" ]] || return 1
  now="$(tr '\0' ' ' <"/proc/$2/cmdline")"
  if [[ ! -f "$recorded" ]]; then
    echo "stop: $1 (pid $2): no recorded command line ($recorded); left alone" >&2
    return 1
  fi
  if [[ "$now" != "$(cat "$recorded")" ]]; then
    echo "stop: $1 (pid $2) now runs '$now', not what serve started; left alone (PID reused)"
    return 1
  fi
}
for name in watcher worker gate mlflow-server prefect-server; do
  pidfile="$RUN/$name.pid"
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  zombie=""
  [[ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" == Z ]] && zombie=1
  if ! kill -0 "$pid" 2>/dev/null || [[ -n "$zombie" ]]; then
    # It crashed: what is left of its own session (a server's workers) is ended, then the record goes.
    if kill -TERM -- "-$pid" 2>/dev/null; then
      sleep 2; kill -KILL -- "-$pid" 2>/dev/null
      echo "stop: $name (pid $pid) had exited; ended what was left of its session"
    fi
    rm -f "$pidfile" "$RUN/$name.cmdline"
    continue
  fi
  if ! same_process "$name" "$pid"; then
    # A reused PID: the file is stale. No record at all: keep the file for a person to look at.
    [[ -f "$RUN/$name.cmdline" ]] && rm -f "$pidfile" "$RUN/$name.cmdline"
    continue
  fi
  if true; then
    # The leader first: Prefect's CLI forwards the signal to its own children and waits for them; signalling
    # the whole group at once makes them receive it twice.
    # Prefect's worker takes TERM or INT as "stop polling, then exit"; after it has run a flow, Prefect 3.9's
    # worker can stay in its event loop. A second signal is Prefect's own "force" path (it then kills itself).
    kill -TERM "$pid" 2>/dev/null
    wait_exit "$pid" 40
    if [[ "$name" == worker ]] && kill -0 "$pid" 2>/dev/null; then
      kill -INT "$pid" 2>/dev/null
      wait_exit "$pid" 10
      forced=" on a second signal"
    else
      forced=""
    fi
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
      echo "stop: $name (pid $pid) killed: it did not exit on TERM"
    else
      echo "stop: $name (pid $pid) stopped$forced"
    fi
    # Whatever is left of its session (a uvicorn worker whose parent already exited).
    kill -TERM -- "-$pid" 2>/dev/null && sleep 1 && kill -KILL -- "-$pid" 2>/dev/null
    stopped=$((stopped + 1))
  fi
  rm -f "$pidfile" "$RUN/$name.cmdline"
done
(( stopped == 0 )) && echo "stop: nothing was running"
exit 0
