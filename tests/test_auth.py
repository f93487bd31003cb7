"""Authenticated servers, for real: MLflow's basic-auth app and a Prefect server with an API auth string.

Slow (each starts its own server). Nothing mocked: the requests go over HTTP to the real apps.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sentcl.registry import GateConfig
from sentcl_mlflow import auth, registry, store
from tests.test_registry import TABLE, free_port

ROOT = Path(__file__).resolve().parent.parent
ADMIN = ("admin", "admin-secret-for-tests-1")
GATE = ("sentcl-gate", "gate-secret-for-tests-1")
TEAM = ("teammate", "team-secret-for-tests-1")
CONFIG = GateConfig("auth-prod", "auth-exp", 0.2, 1.0, 1.0)

pytestmark = pytest.mark.slow


def wait_for(url: str, process: subprocess.Popen, log: Path, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers (401 is an answer)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"server did not start: {log.read_text()[-3000:]}")
            time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """`infra/serve.sh`'s MLflow command line, on a scratch store: basic-auth app, admin from the env."""
    base = tmp_path_factory.mktemp("mlflow-auth")
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "flask-secret-for-tests",
        "SENTCL_RUN_DIR": str(base),
        "MLFLOW_BIN": str(Path(sys.executable).parent / "mlflow"),
    }
    log = base / "server.log"
    process = subprocess.Popen(
        [
            "bash",
            "infra/mlflow-server.sh",
            str(port),
            f"sqlite:///{base / 'mlflow.db'}",
            str(base / "artifacts"),
        ],
        cwd=ROOT,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    wait_for(f"{uri}/health", process, log)
    saved = {
        k: os.environ.get(k)
        for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    }
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    stop(process)


def as_user(monkeypatch, user: tuple[str, str] | None) -> None:
    if user is None:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", user[1])
    store._configured = None  # the next client() checks the credentials again


def test_mlflow_refuses_requests_without_credentials(auth_server, monkeypatch):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{auth_server}/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
    assert refused.value.code == 401
    as_user(monkeypatch, None)
    with pytest.raises(store.TrackingAuthError, match="MLFLOW_TRACKING_USERNAME"):
        store.client()


def test_only_the_gate_account_moves_champion(auth_server, monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException

    as_user(monkeypatch, ADMIN)
    monkeypatch.setenv("SENTCL_GATE_USER", GATE[0])
    monkeypatch.setenv("SENTCL_GATE_PASSWORD", GATE[1])
    monkeypatch.setenv("SENTCL_TEAM_USER", TEAM[0])
    monkeypatch.setenv("SENTCL_TEAM_PASSWORD", TEAM[1])
    assert auth.setup(CONFIG) == {"gate": GATE[0], "team": TEAM[0]}

    as_user(monkeypatch, GATE)
    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc)).info.run_id
    (tmp_path / "w.bin").write_bytes(b"w")
    mlc.log_artifact(run_id, str(tmp_path / "w.bin"), "model")
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    params = {"registry": {**CONFIG.__dict__}}
    first = registry.register_and_gate(
        source, 80.0, TABLE, name=CONFIG.model_name, run_id=run_id, params=params
    )
    assert first["gate"]["promoted"]

    as_user(monkeypatch, TEAM)
    mlc = store.client()
    assert (
        str(mlc.get_model_version_by_alias(CONFIG.model_name, "champion").version) == first["version"]
    )  # reads
    with pytest.raises(MlflowException) as denied:
        mlc.set_registered_model_alias(CONFIG.model_name, "champion", first["version"])
    assert "PERMISSION_DENIED" in str(denied.value.error_code)
    with pytest.raises(MlflowException):
        mlc.delete_registered_model_alias(CONFIG.model_name, "champion")
    # A teammate registers into the experiments model, never into production.
    version = mlc.create_model_version(CONFIG.experiment_model_name, source, run_id=run_id).version
    assert str(version) == "1"
    as_user(monkeypatch, GATE)
    assert (
        str(store.client().get_model_version_by_alias(CONFIG.model_name, "champion").version)
        == first["version"]
    )


@pytest.fixture(scope="module")
def prefect_auth_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("prefect-auth")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(base),
        "PREFECT_SERVER_API_AUTH_STRING": "admin:prefect-secret-for-tests",
        "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": f"http://127.0.0.1:{port}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = base / "server.log"
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    wait_for(f"{url}/health", process, log)
    yield url
    stop(process)


def _post(url: str, body: dict, auth_string: str | None) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


CREATE_FLOW = """
from prefect import flow
from prefect.client.orchestration import get_client

@flow(name="auth-check")
def noop():
    pass

with get_client(sync_client=True) as client:
    run = client.create_flow_run(noop)
    print("created", run.id)
"""


def _get(url: str, auth_string: str | None) -> int:
    request = urllib.request.Request(url)
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_prefect_refuses_flow_runs_and_events_without_the_auth_string(prefect_auth_server):
    url = prefect_auth_server
    # Refused: creating a flow, a flow run, an event (CSRF protection answers 403 before auth's 401 on
    # state-changing requests without a token; either way nothing is created).
    assert _post(f"{url}/flows/", {"name": "x"}, None) in (401, 403)
    assert _post(f"{url}/flow_runs/", {"flow_id": "00000000-0000-0000-0000-000000000000"}, None) in (401, 403)
    assert _post(f"{url}/events", [], None) in (401, 403)
    assert _get(f"{url}/admin/version", None) == 401
    assert _get(f"{url}/admin/version", "admin:wrong") == 401
    assert _get(f"{url}/admin/version", "admin:prefect-secret-for-tests") == 200
    # With the string and no CSRF token, a state change is still refused.
    assert _post(f"{url}/flows/", {"name": "x"}, "admin:prefect-secret-for-tests") == 403
    # The right string (with the CSRF token Prefect's own client fetches) is accepted by the real client.
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_API_AUTH_STRING": "admin:prefect-secret-for-tests"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CREATE_FLOW,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "created" in out.stdout
    assert out.returncode == 0, out.stderr
    # CORS: only the UI's own origin.
    request = urllib.request.Request(
        f"{url}/health",
        method="OPTIONS",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            allowed = response.headers.get("access-control-allow-origin")
    except urllib.error.HTTPError as e:
        allowed = e.headers.get("access-control-allow-origin")
    assert allowed != "*" and allowed != "http://evil.example"
