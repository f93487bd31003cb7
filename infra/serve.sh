#!/usr/bin/env bash
# `make serve`: a local Prefect server (API auth string, CSRF on, CORS = its own UI), a process work pool +
# worker, the deployments of infra/prefect.yaml (*-local), the promotion concurrency limit, the inbox watcher,
# and the MLflow tracking server with MLflow's basic-auth app. Loopback only unless MLFLOW_HOST/PREFECT_HOST
# say otherwise. Secrets come from the environment or a .env file beside the Makefile (see .env.example;
# the environment wins). The file is parsed, never sourced: only the keys below are read, the rest (the
# compose-only keys of infra/compose.env.example) ignored, and nothing in it is exported wholesale.
# Each process gets only its own secrets (what /proc/<pid>/environ of each shows):
#   Prefect server    PREFECT_SERVER_API_AUTH_STRING
#   MLflow server     MLFLOW_FLASK_SERVER_SECRET_KEY (the admin is created beforehand, by `auth bootstrap`)
#   auth setup        none in its environ: the admin's, gate's, registrar's, teammate's passwords on its stdin
#   worker + its flow runs + their stages: PREFECT_API_AUTH_STRING and the registrar's MLflow account (they
#                     register candidates; they cannot move champion)
#   watcher           PREFECT_API_AUTH_STRING (it only emits events)
#   gate              none in its environ: the gate's password on its stdin; it is non-dumpable
# The gate's password is read from the environment of `make serve` only: a .env that holds it is refused,
# because the worker's flow runs run as this OS user and could read the file (docs: Security).
# Safe to run again: what runs is left running, what crashed (a stale PID) is started again, setup is
# idempotent; after a make serve that was interrupted before it was ready, what it started is stopped first.
# PIDs, start times, command lines and logs (appended) go to .run/ (0700); `make stop` (infra/stop.sh) ends them.
# The team's stores: SENTCL_TEAM_STATE=DIR (environment or .env; the state folder of infra/team/team-up, e.g. .run/team) runs MLflow on
# its PostgreSQL + S3 (DIR/mlflow.env, infra/mlflow-server.sh without store arguments) and the Prefect server on
# its `prefect` database (DIR/prefect.env). Both files are parsed, never sourced, and hold no secret: the passwords
# stay in DIR/secrets (each server gets PGPASSFILE, the path of its own role's file; the MLflow server its S3 key
# file's path). A folder without both files, a key that is not theirs, a secret file that cannot be read, stores that
# do not answer, or SENTCL_MLFLOW_BACKEND given as well: one line, exit 2, before anything
# starts. The worker's sandbox hides DIR. Unset: the sqlite store and Prefect's SQLite under PREFECT_HOME, as ever.
# SENTCL_WORKERS=N (1-16): N workers (worker, worker-2, ...), each sandboxed alike, each one flow run at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
umask 077
SECRET_KEYS=(PREFECT_AUTH_STRING MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY SENTCL_GATE_PASSWORD
  SENTCL_REGISTRAR_PASSWORD SENTCL_TEAM_PASSWORD)
SERVE_KEYS=("${SECRET_KEYS[@]}" MLFLOW_AUTH_ADMIN_USERNAME SENTCL_GATE_USER SENTCL_REGISTRAR_USER SENTCL_TEAM_USER
  SENTCL_TEAM_STATE)
is_serve_key() { local k; for k in "${SERVE_KEYS[@]}"; do [[ "$k" == "$1" ]] && return 0; done; return 1; }
ENV_FILE="${SENTCL_ENV_FILE:-$ROOT/.env}"
if [[ -f "$ENV_FILE" ]]; then
  # Refused, not fixed: whoever could read it may already have the secrets (they need changing, which only
  # the owner can judge), and a chmod behind the owner's back would hide that. `cp .env.example .env` under
  # the usual umask 022 gives 0644: the message says what to run.
  mode="$(stat -L -c %a "$ENV_FILE")"  # -L: a linked .env is judged by its file
  if (( 8#$mode & 8#077 )); then
    echo "serve: $ENV_FILE is open to other users (mode 0$mode): run chmod 600 $ENV_FILE, and change its" \
      "secrets if anyone else could have read them" >&2
    exit 2
  fi
  lineno=0
  while IFS= read -r line || [[ -n "$line" ]]; do
    lineno=$((lineno + 1))
    line="${line%$'\r'}"
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! "$line" =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      echo "serve: $ENV_FILE line $lineno is not KEY=VALUE" >&2; exit 2
    fi
    key="${BASH_REMATCH[2]}" value="${BASH_REMATCH[3]}"
    is_serve_key "$key" || continue                       # compose-only (or foreign): not make serve's
    if [[ "$key" == SENTCL_GATE_PASSWORD && -n "$value" ]]; then
      echo "serve: $ENV_FILE line $lineno holds SENTCL_GATE_PASSWORD, which the worker's flow runs (this OS" \
        "user) could read: remove it, change it, and give it in the environment of make serve only" >&2
      exit 2
    fi
    [[ -n "${!key:-}" ]] && continue                      # the environment wins
    if [[ "$value" =~ ^\"(.*)\"$ || "$value" =~ ^\'(.*)\'$ ]]; then value="${BASH_REMATCH[1]}"; fi
    printf -v "$key" '%s' "$value"
  done <"$ENV_FILE"
fi
# No default for a secret: a missing one stops here, named, exit 2 like every refused input.
for key in PREFECT_AUTH_STRING MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY SENTCL_GATE_PASSWORD \
  SENTCL_REGISTRAR_PASSWORD; do
  if [[ -z "${!key:-}" ]]; then
    echo "serve: $key is not set (in $ENV_FILE or the environment; see .env.example)" >&2
    exit 2
  fi
done
SENTCL_GATE_USER="${SENTCL_GATE_USER:-sentcl-gate}"
SENTCL_REGISTRAR_USER="${SENTCL_REGISTRAR_USER:-sentcl-registrar}"
if [[ "$SENTCL_REGISTRAR_USER" == "$SENTCL_GATE_USER" ]]; then
  echo "serve: SENTCL_REGISTRAR_USER must differ from SENTCL_GATE_USER: the worker would hold the gate's account" >&2
  exit 2
fi
MLFLOW_AUTH_ADMIN_USERNAME="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
SENTCL_TEAM_USER="${SENTCL_TEAM_USER:-}" SENTCL_TEAM_PASSWORD="${SENTCL_TEAM_PASSWORD:-}"
SENTCL_TEAM_STATE="${SENTCL_TEAM_STATE:-}"
# A value left from .env.example, or one easy to guess (shorter than 16 characters, spaces only, or one character
# repeated), would make a public operator credential (the Prefect auth string starts any deployment; MLflow checks
# its own passwords, Prefect and Flask check none). Refused before anything starts, naming the key: a value is
# never printed. `auth setup` applies the same rule to the accounts' passwords (sentcl_mlflow.auth).
MIN_SECRET=16
shopt -s nocasematch
for key in "${SERVE_KEYS[@]}"; do
  if [[ "${!key}" == *CHANGE-ME* ]]; then
    echo "serve: $key still reads CHANGE-ME (from .env.example): set a value of its own" \
      "(in $ENV_FILE or the environment)" >&2
    exit 2
  fi
done
shopt -u nocasematch
for key in "${SECRET_KEYS[@]}"; do
  value="${!key}"
  [[ -z "$value" ]] && continue                             # only the optional teammate's can be empty here
  [[ "$key" == PREFECT_AUTH_STRING ]] && value="${value#*:}"  # user:password: the password is the secret
  what="$key"; [[ "$key" == PREFECT_AUTH_STRING ]] && what="the password of $key (user:password)"
  problem=""
  if (( ${#value} < MIN_SECRET )); then problem="is shorter than $MIN_SECRET characters"
  elif [[ -z "${value//[[:space:]]/}" ]]; then problem="is blank (spaces only)"
  elif [[ -z "${value//"${value:0:1}"/}" ]]; then problem="is one character repeated"
  fi
  if [[ -n "$problem" ]]; then
    echo "serve: $what $problem: use a long random one" \
      "(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')" >&2
    exit 2
  fi
done
unset problem what
unset value
# Shell variables from here on, never exported: a process gets a secret only where it is named below. The
# caller's own copies of other secrets (compose's, a personal MLflow login) are not passed on either.
export -n "${SERVE_KEYS[@]}"
unset PREFECT_API_AUTH_STRING PREFECT_SERVER_API_AUTH_STRING MLFLOW_TRACKING_USERNAME MLFLOW_TRACKING_PASSWORD \
  POSTGRES_PASSWORD MINIO_ROOT_USER MINIO_ROOT_PASSWORD S3_ACCESS_KEY S3_SECRET_KEY SENTCL_REGISTRY_ROLE
VENV="${VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"
BIN="$VENV/bin"
RUN="${SENTCL_RUN_DIR:-$ROOT/.run}"       # a test points this (and the ports, stores) elsewhere
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
POOL="${SENTCL_POOL:-sentcl-gpu-local}"
INBOX="${SENTCL_INBOX:-$ROOT/inbox}"
PREFECT_HOST="${PREFECT_HOST:-127.0.0.1}"
WORKERS="${SENTCL_WORKERS:-}"
if [[ -n "$WORKERS" && ! "$WORKERS" =~ ^([1-9]|1[0-6])$ ]]; then
  echo "serve: SENTCL_WORKERS=$WORKERS is not a number of workers from 1 to 16" >&2
  exit 2
fi
TEAM_STATE="${SENTCL_TEAM_STATE:-}"
TEAM_MLFLOW_ENV=() TEAM_PREFECT_ENV=()
if [[ -n "$TEAM_STATE" ]]; then
  team_refuse() { echo "serve: SENTCL_TEAM_STATE=$TEAM_STATE: $*" >&2; exit 2; }
  up_hint="run infra/team/team-up --state $TEAM_STATE first"
  [[ -d "$TEAM_STATE" ]] || team_refuse "no such folder ($up_hint)"
  TEAM_STATE="$(cd "$TEAM_STATE" && pwd)"
  # The caller's MLFLOW_TRACKING_URI is not asked: as ever, make serve points its processes at its own server.
  [[ -z "${SENTCL_MLFLOW_BACKEND:-}" ]] \
    || team_refuse "SENTCL_MLFLOW_BACKEND is set as well; the team's mlflow.env names MLflow's store: unset one"
  read_team_env() {  # file, array name, allowed keys...: its KEY=VALUE lines, as they are, into the array
    local file="$1" line n=0 k a allowed; local -n into="$2"; shift 2
    [[ -f "$file" && -r "$file" ]] || team_refuse "no readable $(basename "$file") ($up_hint)"
    while IFS= read -r line || [[ -n "$line" ]]; do
      n=$((n + 1))
      [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
      [[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || team_refuse "$(basename "$file") line $n is not KEY=VALUE"
      k="${BASH_REMATCH[1]}" allowed=""
      for a in "$@"; do [[ "$a" == "$k" ]] && allowed=1; done
      [[ -n "$allowed" ]] || team_refuse "$(basename "$file") line $n sets $k, not one of its keys ($*)"
      into+=("$line")
    done <"$file"
  }
  team_value() {  # file name, array name, key: its value (printed), or a refusal naming it (exit 2)
    local entry; local -n from="$2"
    for entry in "${from[@]}"; do [[ "$entry" == "$3="* ]] && { printf '%s' "${entry#*=}"; return; }; done
    team_refuse "$1 has no $3 ($up_hint)"
  }
  read_team_env "$TEAM_STATE/mlflow.env" TEAM_MLFLOW_ENV MLFLOW_BACKEND_STORE_URI SENTCL_MLFLOW_USERS_DB \
    MLFLOW_ARTIFACTS_DESTINATION MLFLOW_S3_ENDPOINT_URL AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE \
    AWS_DEFAULT_REGION PGPASSFILE
  read_team_env "$TEAM_STATE/prefect.env" TEAM_PREFECT_ENV PREFECT_SERVER_DATABASE_CONNECTION_URL PGPASSFILE
  # Plain assignments: a refusal in $(...) ends the script (set -e) with its exit 2.
  team_value mlflow.env TEAM_MLFLOW_ENV MLFLOW_BACKEND_STORE_URI >/dev/null
  team_value mlflow.env TEAM_MLFLOW_ENV MLFLOW_ARTIFACTS_DESTINATION >/dev/null
  mlflow_pgpass="$(team_value mlflow.env TEAM_MLFLOW_ENV PGPASSFILE)"
  s3_key="$(team_value mlflow.env TEAM_MLFLOW_ENV AWS_SHARED_CREDENTIALS_FILE)"
  s3_endpoint="$(team_value mlflow.env TEAM_MLFLOW_ENV MLFLOW_S3_ENDPOINT_URL)"
  prefect_pgpass="$(team_value prefect.env TEAM_PREFECT_ENV PGPASSFILE)"
  PREFECT_DB="$(team_value prefect.env TEAM_PREFECT_ENV PREFECT_SERVER_DATABASE_CONNECTION_URL)"
  for secret in "$mlflow_pgpass" "$s3_key" "$prefect_pgpass"; do
    [[ -f "$secret" && -r "$secret" ]] || team_refuse "cannot read the secret file $secret ($up_hint)"
  done
  # The password stays in the file PGPASSFILE names (asyncpg reads it): a URI with one would be in the settings
  # the server logs; a ${PREFECT_SERVER_DATABASE_PASSWORD} placeholder would need it in the server's environ.
  [[ "$PREFECT_DB" =~ ^postgresql\+asyncpg://[A-Za-z0-9_]+@([0-9.]+|localhost):([0-9]+)/[A-Za-z0-9_]+$ ]] \
    || team_refuse "PREFECT_SERVER_DATABASE_CONNECTION_URL is not postgresql+asyncpg://ROLE@HOST:PORT/DATABASE without a password"
  pg_port="${BASH_REMATCH[2]}"
  [[ "$s3_endpoint" =~ ^http://127\.0\.0\.1:([0-9]+)$ ]] || team_refuse "MLFLOW_S3_ENDPOINT_URL $s3_endpoint is not team-up's"
  s3_port="${BASH_REMATCH[1]}"
  for what in "PostgreSQL:$pg_port" "S3:$s3_port"; do
    (exec 3<>"/dev/tcp/127.0.0.1/${what#*:}") 2>/dev/null \
      || team_refuse "the team's ${what%%:*} on 127.0.0.1:${what#*:} does not answer ($up_hint)"
  done
  unset up_hint pg_port s3_endpoint s3_port what secret mlflow_pgpass prefect_pgpass s3_key PREFECT_DB
fi
# As root, the worker's sandbox runs as an unprivileged account of its own (created here when missing), which
# owns the pipeline's outputs and nothing else: it cannot read the gate's scratch, .env or the run folder even
# where the sandbox's mounts would let it. An ordinary user's sandbox maps its root to that user instead.
WORKER_USER="${SENTCL_WORKER_USER:-sentcl-worker}"
if (( EUID == 0 )); then
  if ! id -u "$WORKER_USER" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
      "$WORKER_USER" >/dev/null || { echo "serve: could not create the account $WORKER_USER for the worker's" \
      "sandbox (useradd, above); create an unprivileged one and name it in SENTCL_WORKER_USER" >&2; exit 2; }
    echo "serve: created the system account $WORKER_USER; the worker's sandbox runs as it"
  elif [[ "$(id -u "$WORKER_USER")" == 0 ]]; then
    echo "serve: SENTCL_WORKER_USER=$WORKER_USER is root: the worker's sandbox needs an unprivileged account" >&2
    exit 2
  fi
fi
mkdir -p "$RUN" "$INBOX"
chmod 700 "$RUN"
INBOX="$(cd "$INBOX" && pwd)"
source infra/run-records.sh
# One make serve at a time in this checkout (the lock goes with this process, however it ends). One that was
# interrupted before it was ready (killed, a server that did not start) is found by its state, and what it
# started is stopped first, by the records it left (infra/run-records.sh): then this one starts clean.
exec 9>>"$RUN/serve.lock"
if ! flock -n 9; then
  echo "serve: another make serve is starting in this checkout (it holds $RUN/serve.lock); wait for it" >&2
  exit 2
fi
if [[ "$(cat "$RUN/serve.state" 2>/dev/null)" == starting ]]; then
  echo "serve: the last make serve was interrupted before it was ready; stopping what it started first"
  for name in watcher $(workers) gate mlflow-server prefect-server; do
    if [[ -f "$RUN/$name.pid" ]]; then end_process "$name" || true; fi
  done
fi
echo starting >"$RUN/serve.state"
note_started serve $$

export SENTCL_ROOT="$ROOT" SENTCL_INBOX="$INBOX"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"      # this checkout's server database, not ~/.prefect
export PREFECT_API_URL="${PREFECT_PUBLIC_API_URL:-http://127.0.0.1:$PREFECT_PORT/api}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}" MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
export PATH="$BIN:$PATH"

alive() { ours "$1"; }  # its recorded PID still runs what serve started (infra/run-records.sh)
declare -A LOG_FROM      # where this serve's part of each (appended) log begins

start() {  # name, command...: own session (so stop can end its children too), pid and start time, log file
  local name="$1"; shift
  if alive "$name"; then echo "serve: $name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  if [[ -f "$RUN/$name.pid" ]]; then
    # It crashed (or its PID now belongs to another program). What is left of its own session (a server's
    # workers, which would keep the port) is ended first.
    echo "serve: $name (pid $(cat "$RUN/$name.pid")) is gone; starting it again"
    end_process "$name" >/dev/null || true
  fi
  LOG_FROM[$name]=$(($(stat -c %s "$RUN/$name.log" 2>/dev/null || echo 0) + 1))
  if [[ -n "${START_STDIN:-}" ]]; then  # a secret for its stdin (a shell variable: in no environ, no argv)
    setsid "$@" >>"$RUN/$name.log" 2>&1 9>&- < <(printf '%s\n' "$START_STDIN") &
  else
    setsid "$@" >>"$RUN/$name.log" 2>&1 9>&- < /dev/null &
  fi
  local pid=$!
  note_started "$name" "$pid"
  # Once setsid has exec'd the command: its command line is what `make stop` checks before signalling.
  for _ in $(seq 1 50); do
    [[ -r "/proc/$pid/cmdline" ]] && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE '^(setsid|env) ' && break
    sleep 0.1
  done
  record "$name"
  echo "serve: $name started (pid $pid, log $RUN/$name.log)"
}

record() {  # name: the command line the process runs now (again after a wrapper script has exec'd)
  local pid
  pid="$(cat "$RUN/$1.pid")"
  tr '\0' ' ' <"/proc/$pid/cmdline" >"$RUN/$1.cmdline" 2>/dev/null || true
}

wait_http() {  # name, url, seconds: any HTTP answer counts (401 from an authenticated server too)
  local deadline=$((SECONDS + $3))
  until python3 -c "
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass" "$2" 2>/dev/null; do
    if (( SECONDS > deadline )); then echo "serve: $1 did not answer on $2; see $RUN/$1.log" >&2; exit 1; fi
    if ! alive "$1"; then echo "serve: $1 exited; see $RUN/$1.log" >&2; tail -20 "$RUN/$1.log" >&2; exit 1; fi
    sleep 1
  done
  record "$1"
  echo "serve: $1 answers on $2"
}

wait_log() {  # name, pattern, what: this start's part of its log shows the pattern within 120 s, or serve stops
  local deadline=$((SECONDS + 120))
  until tail -c "+${LOG_FROM[$1]:-1}" "$RUN/$1.log" 2>/dev/null | grep -q "$2"; do
    if (( SECONDS > deadline )) || ! alive "$1"; then
      echo "serve: $3 did not start; see $RUN/$1.log" >&2; tail -20 "$RUN/$1.log" >&2; exit 1
    fi
    sleep 1
  done
}

# The server alone holds the auth string as PREFECT_SERVER_API_AUTH_STRING; CORS admits only its own UI
# (compose's PREFECT_UI_ORIGIN is not make serve's).
# On the team's PostgreSQL (SENTCL_TEAM_STATE) it gets prefect.env's URI and PGPASSFILE too (no one else does);
# it migrates its database in its start-up, before /api/health answers and so before any worker starts.
PREFECT_SERVER_COMMAND=("$BIN/prefect" server start --host "$PREFECT_HOST" --port "$PREFECT_PORT")
if [[ -n "$TEAM_STATE" ]]; then
  PREFECT_SERVER_COMMAND=(env -u PGPASSWORD "${TEAM_PREFECT_ENV[@]}" "${PREFECT_SERVER_COMMAND[@]}")
fi
PREFECT_SERVER_API_AUTH_STRING="$PREFECT_AUTH_STRING" \
PREFECT_SERVER_CSRF_PROTECTION_ENABLED=true \
PREFECT_SERVER_CORS_ALLOWED_ORIGINS="http://127.0.0.1:$PREFECT_PORT" \
  start prefect-server "${PREFECT_SERVER_COMMAND[@]}"
wait_http prefect-server "http://127.0.0.1:$PREFECT_PORT/api/health" 120
# Flows started by hand from this checkout find the server here (flows/__init__.py), while its pid is alive.
echo "$PREFECT_API_URL" >"$RUN/prefect-api-url"

# MLflow: the tracking + registry server over the store that `make run` fills (sqlite + mlartifacts), with
# the basic-auth app. From here on everything this script starts talks to it over HTTP, never to the file.
STORE="${SENTCL_MLFLOW_BACKEND:-${MLFLOW_TRACKING_URI:-sqlite:///$ROOT/mlflow.db}}"
[[ -n "$TEAM_STATE" ]] && STORE=team
if [[ "$STORE" == sqlite:* || "$STORE" == team ]]; then
  # The artifacts folder beside the database, where `make run` keeps them (sentcl_mlflow.store), is the one the
  # server serves. The worker's sandbox cannot write it (the production versions' files are there), so every
  # experiment whose artifact root is a file: path in it (the ones `make run` creates) logs through the server
  # from now on, which checks the account at each upload; runs logged before keep their files
  # (sentcl_mlflow.artifact_roots; one line and exit 2 for an experiment of ours the server cannot serve).
  if [[ "$STORE" == team ]]; then
    # The team's: mlflow.env's stores (infra/mlflow-server.sh checks them whole), the server's own S3 key file
    # and PGPASSFILE; the caller's AWS keys or PostgreSQL password would win over those files, so they are dropped.
    STORE_ARGS=() MLFLOW_STORE_ENV=(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN
      -u AWS_PROFILE -u PGPASSWORD "${TEAM_MLFLOW_ENV[@]}")
  else
    ARTIFACTS="$(dirname "${STORE#sqlite:///}")/mlartifacts"
    "$BIN/python" -m sentcl_mlflow.artifact_roots --store "$STORE" || exit 2
    STORE_ARGS=("$STORE" "$ARTIFACTS") MLFLOW_STORE_ENV=()
  fi
  # The script creates the admin with a short-lived bootstrap, then execs the server without the password.
  MLFLOW_BIN="$BIN/mlflow" MLFLOW_AUTH_ADMIN_USERNAME="$MLFLOW_AUTH_ADMIN_USERNAME" \
  MLFLOW_AUTH_ADMIN_PASSWORD="$MLFLOW_AUTH_ADMIN_PASSWORD" MLFLOW_FLASK_SERVER_SECRET_KEY="$MLFLOW_FLASK_SERVER_SECRET_KEY" \
    start mlflow-server "${MLFLOW_STORE_ENV[@]}" bash infra/mlflow-server.sh "$MLFLOW_PORT" "${STORE_ARGS[@]}"
  wait_http mlflow-server "http://127.0.0.1:$MLFLOW_PORT/health" 180
  export MLFLOW_TRACKING_URI="${MLFLOW_PUBLIC_URI:-http://127.0.0.1:$MLFLOW_PORT}"
  # The passwords on its stdin, not in its environ: a worker left running by an earlier `make serve` (its flow
  # runs, this OS user) could read /proc/<pid>/environ while setup runs.
  printf '%s\n' "MLFLOW_TRACKING_USERNAME=$MLFLOW_AUTH_ADMIN_USERNAME" \
    "MLFLOW_TRACKING_PASSWORD=$MLFLOW_AUTH_ADMIN_PASSWORD" \
    "SENTCL_GATE_USER=$SENTCL_GATE_USER" "SENTCL_GATE_PASSWORD=$SENTCL_GATE_PASSWORD" \
    "SENTCL_REGISTRAR_USER=$SENTCL_REGISTRAR_USER" "SENTCL_REGISTRAR_PASSWORD=$SENTCL_REGISTRAR_PASSWORD" \
    "SENTCL_TEAM_USER=$SENTCL_TEAM_USER" "SENTCL_TEAM_PASSWORD=$SENTCL_TEAM_PASSWORD" \
    | "$BIN/python" -m sentcl_mlflow.auth setup --env-stdin \
    || { echo "serve: MLflow account setup failed (above); make stop ends what started" >&2; exit 1; }
else
  export MLFLOW_TRACKING_URI="$STORE"
  echo "serve: MLFLOW_TRACKING_URI=$STORE is a shared server; no local MLflow server started"
fi
prefect_cli() { PREFECT_API_AUTH_STRING="$PREFECT_AUTH_STRING" "$BIN/prefect" --no-prompt "$@"; }
# The pool's base job template fixes command, env and working_dir: job variables cannot change them.
prefect_cli work-pool create "$POOL" --type process --base-job-template infra/process-job-template.json \
  --overwrite >/dev/null
prefect_cli global-concurrency-limit create sentcl-promotion --limit 1 >/dev/null 2>&1 || true
prefect_cli deploy --prefect-file infra/prefect.yaml \
  -n retrain-local -n pipeline-local >"$RUN/deploy.log" 2>&1 \
  || { echo "serve: prefect deploy failed; see $RUN/deploy.log" >&2; tail -30 "$RUN/deploy.log" >&2; exit 1; }
echo "serve: deployments retrain-local, pipeline-local registered (pool $POOL)"
# What else the server holds (an old deployment, a pool someone added) also runs with operator rights: listed
# with a warning, never removed here (it may be a teammate's work; `prefect deployment delete` is one command).
PREFECT_API_AUTH_STRING="$PREFECT_AUTH_STRING" \
  "$BIN/python" -m flows.inventory --prefect-file infra/prefect.yaml --pool "$POOL" \
  || echo "serve: warning: could not list the server's deployments and work pools (above)" >&2

# The gate process: the only one given the gate's MLflow account (on its stdin). It judges what the flows
# register into registry.candidate_model_name and alone moves champion (sentcl_mlflow.registry.gatekeeper).
# Its scratch (downloads, the pinned dev pairs) is .run/gate, 0700: the worker's sandbox sees .run/ as empty.
START_STDIN="$SENTCL_GATE_PASSWORD"
SENTCL_GATE_USER="$SENTCL_GATE_USER" start gate "$BIN/python" -m sentcl_mlflow.registry.gatekeeper --password-stdin \
  --interval "${SENTCL_GATE_INTERVAL_S:-5}" --scratch "$RUN/gate"
START_STDIN=""
wait_log gate "^gate: watching" "the gate process"
# The worker's flow runs (and the stages they start) register candidates: the registrar's account only. They
# run in a sandbox (infra/worker-sandbox.sh): their own PID and mount namespaces, no capability, everything
# read-only but the pipeline's outputs, .env and the run folder (the MLflow users database) hidden. Code a
# pull step brings cannot read the gate's memory, change the code it runs, or write the stores directly.
mkdir -p data models metrics reports checkpoints runs .dvc/tmp .dvc/cache
SANDBOX=()
for path in data models metrics reports checkpoints runs .dvc/tmp .dvc/cache dvc.lock "$INBOX"; do
  [[ -e "$path" ]] && SANDBOX+=(--writable "$path")
done
# The Prefect server's home (its database; a folder the worker cannot read, which DVC's ignore walk would trip on).
for path in "$ENV_FILE" .env infra/.env "$RUN" "$PREFECT_HOME" ${TEAM_STATE:+"$TEAM_STATE"}; do SANDBOX+=(--hide "$path"); done
# What it runs (the checkout, the .venv and the Python it was made from) and the inbox stay visible; the rest of
# the operator's home (shell history, profiles) is covered by an empty folder, as /tmp is by a private one.
for path in "$ROOT" "$VENV" "$("$BIN/python" -c 'import sys; print(sys.base_prefix)')" "$INBOX"; do
  SANDBOX+=(--keep "$path")
done
[[ -n "${HOME:-}" && -d "$HOME" && "$(realpath "$HOME")" != / ]] && SANDBOX+=(--cover "$HOME")
if (( EUID == 0 )); then
  # The pipeline's outputs become the worker's account's (once: what it already owns is left as it is).
  given=()
  for path in data models metrics reports checkpoints runs .dvc/tmp .dvc/cache dvc.lock "$INBOX"; do
    if [[ -e "$path" && "$(stat -c %U "$path")" != "$WORKER_USER" ]]; then
      chown -R --no-dereference "$WORKER_USER:" "$path" && given+=("$path")
    fi
  done
  (( ${#given[@]} )) && echo "serve: gave ${given[*]} to $WORKER_USER, the worker's account"
  SANDBOX+=(--user "$WORKER_USER")
fi
# SENTCL_WORKERS=N: N workers (worker, worker-2, ...), each in a sandbox of its own made alike, each running one
# flow run at a time (--limit 1): N flow runs at once, of deployments each still held to its concurrency_limit
# (infra/prefect.yaml). Unset: one worker, no limit of its own.
WORKER_NAMES=(worker) WORKER_LIMIT=()
if [[ -n "$WORKERS" ]]; then
  for n in $(seq 2 "$WORKERS"); do WORKER_NAMES+=("worker-$n"); done
  WORKER_LIMIT=(--limit 1)
fi
for name in "${WORKER_NAMES[@]}"; do
  PREFECT_API_AUTH_STRING="$PREFECT_AUTH_STRING" SENTCL_REGISTRY_ROLE=registrar \
  MLFLOW_TRACKING_USERNAME="$SENTCL_REGISTRAR_USER" MLFLOW_TRACKING_PASSWORD="$SENTCL_REGISTRAR_PASSWORD" \
  PREFECT_HOME=/dev/shm/home/.prefect DVC_SITE_CACHE_DIR=/dev/shm/dvc \
    start "$name" env --default-signal=INT bash infra/worker-sandbox.sh "${SANDBOX[@]}" -- \
    "$BIN/prefect" worker start --pool "$POOL" --type process "${WORKER_LIMIT[@]}"
done
for name in "${WORKER_NAMES[@]}"; do
  wait_log "$name" "Worker '.*' started!" "the $name (in its sandbox)"
done
PREFECT_API_AUTH_STRING="$PREFECT_AUTH_STRING" start watcher "$BIN/python" -m flows.watch --folder "$INBOX"
# A file that lands before the watcher observes the folder would be missed (the nightly run still takes it).
wait_log watcher "^watch: watching" "the inbox watcher"

# What `make stop` checks before it signals a PID: the command line each process runs now (after exec).
for name in prefect-server mlflow-server gate "${WORKER_NAMES[@]}" watcher; do
  if alive "$name"; then record "$name"; fi
done

echo ready >"$RUN/serve.state"
forget serve
cat <<MSG
serve: ready
  Prefect UI   http://127.0.0.1:$PREFECT_PORT   (export PREFECT_API_URL=$PREFECT_API_URL)
  MLflow       $MLFLOW_TRACKING_URI   (basic auth; the flows started here log in as $SENTCL_REGISTRAR_USER)
  gate         $RUN/gate.log   (the only process with $SENTCL_GATE_USER; it moves champion)
  inbox        $INBOX   (a file dropped here starts sentcl-retrain/retrain-local)
  stop with    make stop
MSG
