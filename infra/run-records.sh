# What `make serve` records of each process it starts, and how `make serve` and `make stop` end one: sourced by
# infra/serve.sh and infra/stop.sh (RUN is the run folder, .run/ by default).
#
# A process is known by three files in RUN: <name>.pid, <name>.start (its start time, in clock ticks since boot,
# field 22 of /proc/<pid>/stat, written the moment it is started) and <name>.cmdline (what it runs, for people).
# It is ours while that PID still has that start time: exec (a wrapper script that execs the server) keeps it,
# and a PID the system has given to another process has another. Each runs in a session of its own, whose
# process group is its PID: what it started (a server's workers) is ended with it, even after it died.
# serve.sh runs with errexit: every function here returns a status only where a caller tests it.

started_at() {  # pid: its start time; nothing when it is gone or a zombie (a crashed leader nobody reaped)
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  stat="${stat##*) }"
  local fields=($stat)
  [[ "${fields[0]}" == Z ]] || echo "${fields[19]}"
}

note_started() {  # name pid: the records of a process just started (before it can exec or exit)
  echo "$2" >"$RUN/$1.pid"
  started_at "$2" >"$RUN/$1.start"
}

ours() {  # name: its recorded PID still runs the process serve started
  [[ -f "$RUN/$1.pid" ]] || return 1
  local pid
  pid="$(cat "$RUN/$1.pid")"
  if [[ ! -f "$RUN/$1.start" && -f "$RUN/$1.cmdline" ]]; then  # recorded by an older serve: its command line
    [[ -n "$(started_at "$pid")" && "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == "$(cat "$RUN/$1.cmdline")" ]]
    return
  fi
  [[ -s "$RUN/$1.start" && "$(started_at "$pid")" == "$(cat "$RUN/$1.start")" ]]
}

group_left() {  # pid: members of its process group still running (the leader excluded)
  pgrep -g "$1" 2>/dev/null | grep -vx "$1"
}

end_group() {  # pid: what is left of a session whose leader is gone: TERM, up to 10 s, then KILL
  local _
  kill -TERM -- "-$1" 2>/dev/null || return 0
  for _ in $(seq 1 20); do group_left "$1" >/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$1" 2>/dev/null || true
  return 0
}

workers() {  # the names of the workers recorded in RUN: worker, and worker-2 ... when SENTCL_WORKERS started more
  local file
  echo worker
  for file in "$RUN"/worker-*.pid; do [[ -e "$file" ]] && basename "$file" .pid; done
  return 0
}

forget() {  # name
  rm -f "$RUN/$1.pid" "$RUN/$1.start" "$RUN/$1.cmdline"
}

end_process() {  # name: stop it if it is ours (TERM, 20 s, KILL), end what is left of its session, forget it.
  # Prints one line; returns 0 when it stopped a process. A PID that now belongs to another process is left
  # alone (its group too: it is not ours).
  local name="$1" pid _ forced=""
  pid="$(cat "$RUN/$name.pid")"
  if ! kill -0 "$pid" 2>/dev/null || [[ -z "$(started_at "$pid")" ]]; then
    # It exited (or is a zombie): its group can no longer be another's, since a PID is not reused while a
    # process group of that number has members.
    if group_left "$pid" >/dev/null || kill -0 "$pid" 2>/dev/null; then
      end_group "$pid"
      echo "stop: $name (pid $pid) had exited; ended what was left of its session"
    fi
    forget "$name"
    return 1
  fi
  if ! ours "$name"; then
    echo "stop: $name (pid $pid) now runs '$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)', not what serve" \
      "started; left alone (PID reused)"
    forget "$name"
    return 1
  fi
  # The leader first: Prefect's CLI forwards the signal to its own children and waits for them; signalling the
  # whole group at once makes them receive it twice. Prefect's worker takes TERM or INT as "stop polling, then
  # exit"; after it has run a flow, Prefect 3.9's worker can stay in its event loop: a second signal is
  # Prefect's own "force" path.
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if [[ "$name" == worker || "$name" == worker-* ]] && kill -0 "$pid" 2>/dev/null; then
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 1 10); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    forced=" on a second signal"
  fi
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    echo "stop: $name (pid $pid) killed: it did not exit on TERM"
  else
    echo "stop: $name (pid $pid) stopped$forced"
  fi
  group_left "$pid" >/dev/null && end_group "$pid"   # a server's worker whose parent already exited
  forget "$name"
  return 0
}
