#!/usr/bin/env bash
# `make serve`: a local Prefect server (API auth string, CSRF on, CORS = its own UI), a process work pool +
# worker, the deployments of infra/prefect.yaml (*-local), the promotion concurrency limit, the inbox watcher,
# and the MLflow tracking server with MLflow's basic-auth app. Loopback only unless MLFLOW_HOST/PREFECT_HOST
# say otherwise. Secrets come from the environment (or a .env file beside the Makefile; see .env.example).
# The worker, its flow runs and the stages they start use the MLflow server over HTTP as the gate's account.
# PIDs, command lines and logs go to .run/; `make stop` (infra/stop.sh) ends exactly those processes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
if [[ -f "${SENTCL_ENV_FILE:-$ROOT/.env}" ]]; then set -a; source "${SENTCL_ENV_FILE:-$ROOT/.env}"; set +a; fi
: "${PREFECT_AUTH_STRING:?set PREFECT_AUTH_STRING=user:password (see .env.example)}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?set MLFLOW_AUTH_ADMIN_PASSWORD (see .env.example)}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (see .env.example)}"
: "${SENTCL_GATE_PASSWORD:?set SENTCL_GATE_PASSWORD (see .env.example)}"
export SENTCL_GATE_USER="${SENTCL_GATE_USER:-sentcl-gate}"
export MLFLOW_AUTH_ADMIN_USERNAME="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
export MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY
VENV="${VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"
BIN="$VENV/bin"
RUN="${SENTCL_RUN_DIR:-$ROOT/.run}"       # a test points this (and the ports, stores) elsewhere
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
POOL="${SENTCL_POOL:-sentcl-gpu-local}"
INBOX="${SENTCL_INBOX:-$ROOT/inbox}"
PREFECT_HOST="${PREFECT_HOST:-127.0.0.1}"
mkdir -p "$RUN" "$INBOX"
INBOX="$(cd "$INBOX" && pwd)"

export SENTCL_ROOT="$ROOT" SENTCL_INBOX="$INBOX"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"      # this checkout's server database, not ~/.prefect
export PREFECT_API_URL="${PREFECT_PUBLIC_API_URL:-http://127.0.0.1:$PREFECT_PORT/api}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_AUTH_STRING="$PREFECT_AUTH_STRING"       # clients: CLI, worker, watcher, flow runs
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}" MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
export PATH="$BIN:$PATH"

running() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

start() {  # name, command...: own session (so stop can end its children too), pid file, log file
  local name="$1"; shift
  if running "$name"; then echo "serve: $name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  setsid "$@" >"$RUN/$name.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" >"$RUN/$name.pid"
  # Once setsid has exec'd the command: its command line is what `make stop` checks before signalling.
  for _ in $(seq 1 50); do
    [[ -r "/proc/$pid/cmdline" ]] && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^setsid ' && break
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
    if ! running "$1"; then echo "serve: $1 exited; see $RUN/$1.log" >&2; tail -20 "$RUN/$1.log" >&2; exit 1; fi
    sleep 1
  done
  record "$1"
  echo "serve: $1 answers on $2"
}

# The server alone holds the auth string as PREFECT_SERVER_API_AUTH_STRING; CORS admits only its own UI.
PREFECT_SERVER_API_AUTH_STRING="$PREFECT_AUTH_STRING" \
PREFECT_SERVER_CSRF_PROTECTION_ENABLED=true \
PREFECT_SERVER_CORS_ALLOWED_ORIGINS="${PREFECT_UI_ORIGIN:-http://127.0.0.1:$PREFECT_PORT}" \
  start prefect-server "$BIN/prefect" server start --host "$PREFECT_HOST" --port "$PREFECT_PORT"
wait_http prefect-server "http://127.0.0.1:$PREFECT_PORT/api/health" 120
# Flows started by hand from this checkout find the server here (flows/__init__.py), while its pid is alive.
echo "$PREFECT_API_URL" >"$RUN/prefect-api-url"

# MLflow: the tracking + registry server over the store that `make run` fills (sqlite + mlartifacts), with
# the basic-auth app. From here on everything this script starts talks to it over HTTP, never to the file.
STORE="${SENTCL_MLFLOW_BACKEND:-${MLFLOW_TRACKING_URI:-sqlite:///$ROOT/mlflow.db}}"
if [[ "$STORE" == sqlite:* ]]; then
  MLFLOW_BIN="$BIN/mlflow" start mlflow-server bash infra/mlflow-server.sh "$MLFLOW_PORT" "$STORE" "$ROOT/mlartifacts"
  wait_http mlflow-server "http://127.0.0.1:$MLFLOW_PORT/health" 180
  export MLFLOW_TRACKING_URI="${MLFLOW_PUBLIC_URI:-http://127.0.0.1:$MLFLOW_PORT}"
  MLFLOW_TRACKING_USERNAME="$MLFLOW_AUTH_ADMIN_USERNAME" MLFLOW_TRACKING_PASSWORD="$MLFLOW_AUTH_ADMIN_PASSWORD" \
    "$BIN/python" -m sentcl_mlflow.auth setup
else
  export MLFLOW_TRACKING_URI="$STORE"
  echo "serve: MLFLOW_TRACKING_URI=$STORE is a shared server; no local MLflow server started"
fi
export MLFLOW_TRACKING_USERNAME="$SENTCL_GATE_USER" MLFLOW_TRACKING_PASSWORD="$SENTCL_GATE_PASSWORD"

"$BIN/prefect" --no-prompt work-pool create "$POOL" --type process --overwrite >/dev/null
"$BIN/prefect" --no-prompt global-concurrency-limit create sentcl-promotion --limit 1 >/dev/null 2>&1 || true
"$BIN/prefect" --no-prompt deploy --prefect-file infra/prefect.yaml \
  -n retrain-local -n pipeline-local -n promote-local >"$RUN/deploy.log" 2>&1 \
  || { echo "serve: prefect deploy failed; see $RUN/deploy.log" >&2; tail -30 "$RUN/deploy.log" >&2; exit 1; }
echo "serve: deployments retrain-local, pipeline-local, promote-local registered (pool $POOL)"

start worker "$BIN/prefect" worker start --pool "$POOL" --type process
start watcher "$BIN/python" -m flows.watch --folder "$INBOX"
# A file that lands before the watcher observes the folder would be missed (the nightly run still takes it).
deadline=$((SECONDS + 120))
until grep -q "^watch: watching" "$RUN/watcher.log" 2>/dev/null; do
  if (( SECONDS > deadline )) || ! running watcher; then
    echo "serve: the inbox watcher did not start; see $RUN/watcher.log" >&2; tail -20 "$RUN/watcher.log" >&2; exit 1
  fi
  sleep 1
done

# What `make stop` checks before it signals a PID: the command line each process runs now (after exec).
for name in prefect-server mlflow-server worker watcher; do
  if running "$name"; then record "$name"; fi
done

cat <<MSG
serve: ready
  Prefect UI   http://127.0.0.1:$PREFECT_PORT   (export PREFECT_API_URL=$PREFECT_API_URL)
  MLflow       $MLFLOW_TRACKING_URI   (basic auth; the stages and flows started here log in as $SENTCL_GATE_USER)
  inbox        $INBOX   (a file dropped here starts sentcl-retrain/retrain-local)
  stop with    make stop
MSG
