#!/usr/bin/env bash
# make serve's Prefect worker runs in here, and with it everything it starts: flow runs, the stages they run and
# any pull step a holder of the Prefect auth string adds to a deployment. Code run here cannot reach the gate:
#   - its own PID namespace: it sees and signals only its own processes, never the gate process, make serve's
#     caller or another process whose /proc/<pid>/environ or memory holds a secret;
#   - its own mount namespace in which every file system is read-only except the paths given with --writable
#     (the pipeline's outputs) and a private /dev/shm (its TMPDIR and HOME): it cannot change the code, the
#     .venv or the system Python the gate process runs, nor write the MLflow or Prefect stores behind their
#     servers' backs;
#   - the paths given with --hide (.env, .run/ with the MLflow users database) are covered by empty ones;
#   - no capability and no new privileges, even when make serve runs as root: no ptrace, no remount.
# If any of this cannot be set up, the command is not started: one line, exit 2. docs/registry-security.md.
#
# Usage: worker-sandbox.sh [--writable PATH]... [--hide PATH]... -- COMMAND [ARG]...
set -euo pipefail

wait_for() {  # pid: exit with its status. A trapped signal ends `wait` early, not the process: wait again.
  local status
  while :; do
    wait "$1" && status=0 || status=$?
    kill -0 "$1" 2>/dev/null || exit "$status"
  done
}

if [[ "${1:-}" != --inside ]]; then
  # The leader make serve records and make stop signals. unshare --fork blocks TERM and INT in itself, so the
  # leader passes them on to the namespace's first process (below), which passes them to the command.
  userns=()
  (( EUID == 0 )) || userns=(--user --map-root-user)   # an ordinary user: mounts need a user namespace
  # env --default-signal: a background job of a shell without job control would ignore INT, and so would
  # everything it starts (bash cannot trap a signal ignored at its start).
  env --default-signal=INT unshare "${userns[@]}" --mount --pid --fork --mount-proc --propagation private -- \
    "$BASH" "$0" --inside "$@" &
  namespace=$!
  forward() { pkill "-$1" -P "$namespace" 2>/dev/null || true; }
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  wait_for "$namespace"
fi

shift
writable=()
hide=()
while (( $# )) && [[ "$1" != -- ]]; do
  case "$1" in
    --writable) writable+=("$(realpath -m "$2")") ;;
    --hide) hide+=("$(realpath -m "$2")") ;;
    *) echo "worker-sandbox: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
shift
(( $# )) || { echo "worker-sandbox: no command after --" >&2; exit 2; }
refuse() { echo "worker-sandbox: $1; the worker is not started (docs: Security, the worker's sandbox)" >&2; exit 2; }

for path in "${writable[@]}"; do
  [[ -e "$path" ]] || refuse "$path does not exist"
  mount --bind "$path" "$path" || refuse "cannot bind $path"   # its own mount, made writable again below
done
# Every mount read-only, deepest first; findmnt writes a space in a path as \x20.
while read -r target; do
  target="$(printf '%b' "$target")"
  mount -o remount,bind,ro "$target" 2>/dev/null || true      # checked below, not trusted
done < <(findmnt -rn -o TARGET | tac)
for path in "${writable[@]}"; do
  mount -o remount,bind,rw "$path" || refuse "cannot make $path writable"
done
# A private, writable scratch space (TMPDIR, HOME). Not over /tmp: the checkout itself may lie under it.
mount -t tmpfs -o mode=1777 tmpfs /dev/shm || refuse "cannot mount a private /dev/shm"
for path in "${hide[@]}"; do
  if [[ -d "$path" ]]; then
    mount -t tmpfs -o size=64k,mode=0500 tmpfs "$path" || refuse "cannot hide $path"
  elif [[ -e "$path" ]]; then
    mount --bind /dev/null "$path" || refuse "cannot hide $path"
  fi
done

# Checked, not assumed: the command starts only if the file systems it should not write are read-only.
program="$(command -v "$1")" || refuse "$1: not found or not executable"
for path in / "$PWD" "$(dirname "$(realpath "$program")")"; do
  if ( : >"$path/.worker-sandbox-probe" ) 2>/dev/null; then
    rm -f "$path/.worker-sandbox-probe"
    refuse "$path is still writable inside the sandbox"
  fi
done

export HOME=/dev/shm/home TMPDIR=/dev/shm/tmp
mkdir -p "$HOME" "$TMPDIR"
env --default-signal=INT setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@" &
command=$!
trap 'kill -TERM "$command" 2>/dev/null || true' TERM
trap 'kill -INT "$command" 2>/dev/null || true' INT
wait_for "$command"   # the namespace's first process: its end ends whatever the command left behind
