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
#   - a private /tmp, and every folder given with --cover (the operator's home) an empty one, except the paths
#     it needs below them (the checkout, the --writable and --keep paths), bound back in: nothing another
#     process leaves in /tmp (the gate's downloads, say) and no shell history or profile is in sight;
#   - nodev and nosuid wherever it may write (its outputs, /tmp, /dev/shm);
#   - with --user NAME (make serve as root), that unprivileged account instead of root; in any case no
#     capability and no new privileges: no ptrace, no remount, no file it does not own or may not read.
# If any of this cannot be set up, the command is not started: one line, exit 2. docs/registry-security.md.
#
# Usage: worker-sandbox.sh [--writable PATH]... [--hide PATH]... [--cover DIR]... [--keep PATH]... [--user NAME]
#        -- COMMAND [ARG]...
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
  for arg in "$@"; do
    [[ "$arg" == -- ]] && break
    if [[ "$arg" == --user ]] && (( EUID != 0 )); then
      echo "worker-sandbox: --user needs root (an ordinary user's sandbox runs as that user); the worker is" \
        "not started" >&2
      exit 2
    fi
  done
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
cover=(/tmp)
keep=()
user=""
while (( $# )) && [[ "$1" != -- ]]; do
  case "$1" in
    --writable) writable+=("$(realpath -m "$2")") ;;
    --hide) hide+=("$(realpath -m "$2")") ;;
    --cover) cover+=("$(realpath -m "$2")") ;;
    --keep) keep+=("$(realpath -m "$2")") ;;
    --user) user="$2" ;;
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
  mount -o remount,bind,rw,nodev,nosuid "$path" || refuse "cannot make $path writable"
done
for path in "${hide[@]}"; do
  if [[ -d "$path" ]]; then
    mount -t tmpfs -o size=64k,mode=0555,nodev,nosuid tmpfs "$path" || refuse "cannot hide $path"
  elif [[ -e "$path" ]]; then
    mount --bind /dev/null "$path" || refuse "cannot hide $path"
  fi
done
# A private, writable scratch space (TMPDIR, HOME).
mount -t tmpfs -o mode=1777,nodev,nosuid tmpfs /dev/shm || refuse "cannot mount a private /dev/shm"

under() { [[ "$1" == "$2" || "$1" == "$2"/* ]]; }  # path, folder
needed=("$PWD" "${writable[@]}" "${keep[@]}")
cover_folder() {  # folder: an empty tmpfs over it; what is needed below it bound back in from where it was
  local folder="$1" stash path rel other top
  for path in "${needed[@]}"; do under "$folder" "$path" && return 0; done  # all of it is needed: not covered
  [[ -d "$folder" ]] || return 0
  stash="$(mktemp -d /dev/shm/.sandbox-cover.XXXXXX)"
  mount --rbind "$folder" "$stash" || refuse "cannot cover $folder"
  mount -t tmpfs -o mode="$( [[ "$folder" == /tmp ]] && echo 1777 || echo 0755 ),nodev,nosuid" tmpfs "$folder" \
    || refuse "cannot cover $folder"
  for path in "${needed[@]}"; do
    under "$path" "$folder" || continue
    top=1
    for other in "${needed[@]}"; do   # bound back once, with everything below it (its own mounts too)
      [[ "$other" != "$path" ]] && under "$path" "$other" && under "$other" "$folder" && top=""
    done
    [[ -n "$top" && -e "$stash/${path#"$folder"/}" ]] || continue
    rel="${path#"$folder"/}"
    # The folders on the way are made traversable (0755, whatever the caller's umask): only the path shows.
    if [[ -d "$stash/$rel" ]]; then (umask 022; mkdir -p "$path"); else (umask 022; mkdir -p "$(dirname "$path")"; : >"$path"); fi
    mount --rbind "$stash/$rel" "$path" || refuse "cannot keep $path in sight"
  done
  umount -l "$stash" && rmdir "$stash" || refuse "cannot cover $folder"
}
for folder in "${cover[@]}"; do cover_folder "$folder"; done

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
# The checkout and the .venv belong to someone else now: git (and DVC through it) would refuse them as
# "dubious ownership".
printf '[safe]\n\tdirectory = *\n' >"$HOME/.gitconfig"
as=()
if [[ -n "$user" ]]; then
  uid="$(id -u "$user" 2>/dev/null)" && gid="$(id -g "$user")" || refuse "no account $user"
  (( uid != 0 )) || refuse "$user is root"
  chown -R "$uid:$gid" "$HOME" "$TMPDIR"
  as=(--reuid="$uid" --regid="$gid" --clear-groups)
fi
env --default-signal=INT setpriv "${as[@]}" --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@" &
command=$!
trap 'kill -TERM "$command" 2>/dev/null || true' TERM
trap 'kill -INT "$command" 2>/dev/null || true' INT
wait_for "$command"   # the namespace's first process: its end ends whatever the command left behind
