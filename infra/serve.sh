#!/usr/bin/env bash
# `make serve`: a local Prefect server, a process work pool + worker, the deployments of infra/prefect.yaml
# (*-local), the promotion concurrency limit, the inbox watcher and the MLflow UI. Loopback only.
# PIDs and logs go to .run/; `make stop` (infra/stop.sh) ends exactly those processes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="${VENV:-.venv}"
[[ "$VENV" == /* ]] || VENV="$ROOT/$VENV"
BIN="$VENV/bin"
RUN="${SENTCL_RUN_DIR:-$ROOT/.run}"       # a test points this (and the ports, stores) elsewhere
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
POOL="${SENTCL_POOL:-sentcl-gpu-local}"
INBOX="${SENTCL_INBOX:-$ROOT/inbox}"
mkdir -p "$RUN" "$INBOX"

export SENTCL_ROOT="$ROOT"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"      # this checkout's server database, not ~/.prefect
export PREFECT_API_URL="http://127.0.0.1:$PREFECT_PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}" MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
export PATH="$BIN:$PATH"

running() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

start() {  # name, command...: own session (so stop can end its children too), pid file, log file
  local name="$1"; shift
  if running "$name"; then echo "serve: $name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  setsid "$@" >"$RUN/$name.log" 2>&1 < /dev/null &
  echo $! >"$RUN/$name.pid"
  echo "serve: $name started (pid $!, log $RUN/$name.log)"
}

wait_http() {  # name, url, seconds
  local deadline=$((SECONDS + $3))
  until python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$2" 2>/dev/null; do
    if (( SECONDS > deadline )); then echo "serve: $1 did not answer on $2; see $RUN/$1.log" >&2; exit 1; fi
    if ! running "$1"; then echo "serve: $1 exited; see $RUN/$1.log" >&2; tail -20 "$RUN/$1.log" >&2; exit 1; fi
    sleep 1
  done
  echo "serve: $1 answers on $2"
}

start prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
wait_http prefect-server "$PREFECT_API_URL/health" 120
# Flows started by hand from this checkout find the server here (flows/__init__.py), while its pid is alive.
echo "$PREFECT_API_URL" >"$RUN/prefect-api-url"

# MLflow UI on the same store the stages write to (MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlflow.db).
STORE="${MLFLOW_TRACKING_URI:-sqlite:///$ROOT/mlflow.db}"
if [[ "$STORE" == sqlite:* ]]; then
  "$BIN/python" -c "from stages import tracking; tracking.client(); tracking.experiment_id(tracking.client())" >/dev/null
  start mlflow-ui "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
    --backend-store-uri "$STORE" --default-artifact-root "file://$ROOT/mlartifacts"
  wait_http mlflow-ui "http://127.0.0.1:$MLFLOW_PORT/health" 120
else
  echo "serve: MLFLOW_TRACKING_URI=$STORE is a shared server; no local MLflow UI started"
fi

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

cat <<MSG
serve: ready
  Prefect UI   http://127.0.0.1:$PREFECT_PORT   (export PREFECT_API_URL=$PREFECT_API_URL)
  MLflow UI    http://127.0.0.1:$MLFLOW_PORT
  inbox        $INBOX   (a file dropped here starts sentcl-retrain/retrain-local)
  stop with    make stop
MSG
