#!/usr/bin/env bash
# The MLflow tracking + registry server with MLflow's basic-auth app: what `make serve` runs, and what the
# authentication tests start. Every secret comes from the environment; nothing has a default.
#   infra/mlflow-server.sh PORT [BACKEND_STORE_URI ARTIFACTS_DESTINATION]
# Without the two store arguments the environment decides (sentcl_mlflow/server_store.py): MLFLOW_BACKEND_STORE_URI
#        and MLFLOW_ARTIFACTS_DESTINATION (a team's postgresql:// + s3://, as infra/team/team-up writes them in
#        its mlflow.env), SENTCL_MLFLOW_USERS_DB; none set: sqlite:///<repo>/mlflow.db and <repo>/mlartifacts.
#        A half-set team configuration stops here, one line, exit 2, before anything starts.
# Needs: MLFLOW_FLASK_SERVER_SECRET_KEY (CSRF of the auth app); on the first start only (no users database
#        yet), MLFLOW_AUTH_ADMIN_PASSWORD: a short-lived `python -m sentcl_mlflow.auth bootstrap` creates the
#        admin (MLFLOW_AUTH_ADMIN_USERNAME, default admin) and the server itself starts without the password.
# Optional: MLFLOW_HOST (default 127.0.0.1), MLFLOW_ALLOWED_HOSTS (Host headers accepted, comma-separated;
#        default loopback:PORT), SENTCL_RUN_DIR (where the users database and its config live).
set -euo pipefail
PORT="$1"; shift
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?set MLFLOW_FLASK_SERVER_SECRET_KEY (see .env.example)}"
export MLFLOW_AUTH_ADMIN_USERNAME="${MLFLOW_AUTH_ADMIN_USERNAME:-admin}"
HOST="${MLFLOW_HOST:-127.0.0.1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUN="${SENTCL_RUN_DIR:-$ROOT/.run}"
MLFLOW_BIN="${MLFLOW_BIN:-mlflow}"
if [[ "$MLFLOW_BIN" == */* ]]; then PY="$(dirname "$MLFLOW_BIN")/python"; else PY="${SENTCL_PYTHON:-python3}"; fi
STORES="$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m sentcl_mlflow.server_store --root "$ROOT" \
  --run-dir "$RUN" "$@")" || exit 2
{ read -r STORE; read -r ARTIFACTS; read -r USERS_DB; } <<<"$STORES"
umask 077                                   # the users database and its config: the owner's alone
mkdir -p "$RUN"
[[ "$ARTIFACTS" == *://* ]] || mkdir -p "$ARTIFACTS"
# Users and permissions: their own database beside the run files. default_permission READ: a user reads
# what nobody granted them more on; the gate's account alone edits the production model (sentcl_mlflow.auth).
# auth_cache_ttl_seconds: MLflow checks a password's scrypt hash more than once per request (0.35-0.44 s a
# request on a 2-core EPYC, 0.02 s with the cache); a credential that passed is remembered 60 s, keyed by an
# HMAC of the password. A wrong password is always checked. With one worker, a password changed or an account
# deleted through the API is refused at once; a change made in the users database behind the server's back
# waits out the 60 s.
cat >"$RUN/mlflow-auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = $USERS_DB
authorization_function = sentcl_mlflow.auth:authenticate_request
auth_cache_ttl_seconds = 60
INI
chmod 600 "$RUN/mlflow-auth.ini"
export MLFLOW_AUTH_CONFIG_PATH="$RUN/mlflow-auth.ini"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m sentcl_mlflow.auth bootstrap
[[ -f "$RUN/mlflow-users.db" ]] && chmod 600 "$RUN/mlflow-users.db"
# No background job runner (MLflow's GenAI jobs: unused here; its huey consumers ignore TERM for minutes).
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec env -u MLFLOW_AUTH_ADMIN_PASSWORD "$MLFLOW_BIN" server --app-name basic-auth --host "$HOST" \
  --port "$PORT" --workers 1 --backend-store-uri "$STORE" --artifacts-destination "$ARTIFACTS" --serve-artifacts \
  --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-127.0.0.1:$PORT,localhost:$PORT}"
