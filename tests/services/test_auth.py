"""Authenticated servers, for real: MLflow's basic-auth app and a Prefect server with an API auth string.

Each server starts once per module on a free loopback port. Nothing mocked: the requests go over HTTP to
the real apps, as the admin, the gate's account and an ordinary teammate's account.
"""

from __future__ import annotations

import base64
import contextlib
import io
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

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig, LeaseTimes, Registration
from sentcl.registry.verdict import Override
from sentcl_mlflow import auth, store
from sentcl_mlflow.errors import GateRefusedError, PromotionLockTimeout
from sentcl_mlflow.pyfunc_checks import TAG_MANIFEST, ModelTamperedError
from sentcl_mlflow.registry.download import download_verified
from sentcl_mlflow.registry.gate import promote, register_and_gate, register_candidate
from sentcl_mlflow.registry.lease import (
    LEASE_SOURCE,
    LEASE_SUFFIX,
    PromotionLeaseDenied,
    PromotionLeaseLost,
    promotion_lock,
)
from sentcl_mlflow.registry.measure import Evidence
from sentcl_mlflow.registry.names import production_experiment, run_experiment
from tests.mlflow_uris import mlflow_pointed_at
from tests.paths import ROOT
from tests.services.test_mlflow_outage import make_release, run_register
from tests.services.test_registry import TABLE, as_registered, free_port

ADMIN = ("admin", "admin-secret-for-tests-1")
GATE = ("sentcl-gate", "gate-secret-for-tests-1")
TEAM = ("teammate", "team-secret-for-tests-1")
CONFIG = GateConfig("auth-prod", "auth-exp", "auth-candidates", 0.2, 1.0, 1.0)
STORES: dict[str, str] = {}  # a server's URI -> its backend store, for a test that writes behind its back


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
    STORES[uri] = f"sqlite:///{base / 'mlflow.db'}"
    with mlflow_pointed_at(uri):
        yield uri
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


def _setup_as_admin(monkeypatch) -> dict[str, str]:
    as_user(monkeypatch, ADMIN)
    monkeypatch.setenv("SENTCL_GATE_USER", GATE[0])
    monkeypatch.setenv("SENTCL_GATE_PASSWORD", GATE[1])
    monkeypatch.setenv("SENTCL_TEAM_USER", TEAM[0])
    monkeypatch.setenv("SENTCL_TEAM_PASSWORD", TEAM[1])
    return auth.setup(CONFIG)


def test_setup_runs_again_and_puts_back_a_changed_permission(auth_server, monkeypatch):
    """`make serve` and compose's mlflow-setup run setup at every start: the second run must succeed."""
    assert _setup_as_admin(monkeypatch) == {"gate": GATE[0], "team": TEAM[0]}
    admin = auth._auth_client()
    admin.revoke_user_permission(GATE[0], "registered_model", CONFIG.model_name)
    admin.grant_user_permission(GATE[0], "registered_model", CONFIG.model_name, "READ")
    assert _setup_as_admin(monkeypatch) == {"gate": GATE[0], "team": TEAM[0]}
    permission = admin.get_user_permission(GATE[0], "registered_model", CONFIG.model_name).permission
    assert permission == "MANAGE"
    out = subprocess.run(
        [sys.executable, "-m", "sentcl_mlflow.auth", "setup"],
        cwd=ROOT,
        env={**os.environ, "SENTCL_MLFLOW_EXPERIMENT": store.EXPERIMENT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The CLI reads params.yaml's model names: a third run, other names, still exit 0.
    assert out.returncode == 0, out.stderr


def test_a_remembered_password_still_refuses_a_wrong_one_and_an_old_one_after_a_change(
    auth_server, monkeypatch
):
    """infra/mlflow-server.sh lets MLflow remember a credential that passed (auth_cache_ttl_seconds): a wrong
    password is still refused right after the right one passed, and a password changed through the API is
    refused at the next request, not 60 s later (one worker)."""
    _setup_as_admin(monkeypatch)
    old, new = TEAM[1], "team-secret-for-tests-2"
    as_user(monkeypatch, TEAM)
    assert store.caller_identity() == TEAM[0]  # now remembered
    as_user(monkeypatch, (TEAM[0], old + "x"))
    with pytest.raises(store.TrackingAuthError):
        store.caller_identity()
    as_user(monkeypatch, ADMIN)
    auth._auth_client().update_user_password(TEAM[0], new)
    try:
        as_user(monkeypatch, TEAM)
        with pytest.raises(store.TrackingAuthError):
            store.caller_identity()
        as_user(monkeypatch, (TEAM[0], new))
        assert store.caller_identity() == TEAM[0]
    finally:
        as_user(monkeypatch, ADMIN)
        auth._auth_client().update_user_password(TEAM[0], old)


def test_only_the_gate_account_moves_champion(auth_server, monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException

    assert _setup_as_admin(monkeypatch) == {"gate": GATE[0], "team": TEAM[0]}

    as_user(monkeypatch, GATE)
    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc)).info.run_id
    (tmp_path / "w.bin").write_bytes(b"w")
    mlc.log_artifact(run_id, str(tmp_path / "w.bin"), "model")
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    params = {**read_params(), "registry": {**CONFIG.__dict__}}  # the gate, lease and limits of the checkout
    first = register_and_gate(
        Registration(source, 80.0, TABLE, name=CONFIG.model_name, run_id=run_id),
        params,
        evidence=Evidence(scorer=as_registered),
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


def test_a_changed_file_of_a_registered_model_is_refused_before_loading(auth_server, monkeypatch, tmp_path):
    """The teammate's artifact write of the issue (a PUT over the serving code through MLflow's artifact
    proxy) succeeds on the server, and is caught by the manifest the gate recorded at registration."""
    _setup_as_admin(monkeypatch)
    as_user(monkeypatch, GATE)
    mlc = store.client()
    exp_id = store.experiment_id(mlc)
    run_id = mlc.create_run(exp_id).info.run_id
    folder = tmp_path / "model"
    (folder / "encoder").mkdir(parents=True)
    (folder / "encoder" / "model.safetensors").write_bytes(b"weights")
    (folder / "pyfunc_encoder.py").write_text("print('the serving code')\n")
    (folder / "MLmodel").write_text("flavors: {}\n")
    mlc.log_artifacts(run_id, str(folder), "model")
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    version = register_candidate(
        Registration(source, 70.0, TABLE, name=CONFIG.model_name, run_id=run_id), read_params()
    )
    manifest = json.loads(mlc.get_model_version(CONFIG.model_name, version).tags[TAG_MANIFEST])
    assert set(manifest) == {"encoder/model.safetensors", "pyfunc_encoder.py", "MLmodel"}
    root = download_verified(f"models:/{CONFIG.model_name}/{version}", tmp_path / "ok")
    assert (root / "pyfunc_encoder.py").read_text() == "print('the serving code')\n"

    request = urllib.request.Request(
        f"{auth_server}/api/2.0/mlflow-artifacts/artifacts/{exp_id}/{run_id}/artifacts/model/pyfunc_encoder.py",
        data=b"import os; os.system('id')\n",
        method="PUT",
        headers={"Authorization": "Basic " + base64.b64encode(":".join(TEAM).encode()).decode()},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            written = response.status
    except urllib.error.HTTPError as e:
        written = e.code
    if written != 200:  # refused outright is fine too; then change it as the gate to exercise the check
        mlc.log_artifact(run_id, str(_write(tmp_path / "x" / "pyfunc_encoder.py", "changed\n")), "model")
    with pytest.raises(ModelTamperedError, match="pyfunc_encoder.py changed since registration"):
        download_verified(f"models:/{CONFIG.model_name}/{version}", tmp_path / "bad")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sentcl_mlflow.serve",
            f"models:/{CONFIG.model_name}/{version}",
            "--port",
            "1",
        ],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "pyfunc_encoder.py changed since registration" in out.stderr

    # And the gate, as the gate's account (even forced), refuses to make it champion: one line, nothing moves.
    before = mlc.get_model_version_by_alias(CONFIG.model_name, "champion").version
    params = {**read_params(), "registry": {**CONFIG.__dict__}}  # the gate, lease and limits of the checkout
    with pytest.raises(GateRefusedError, match=f"version {version}: .*pyfunc_encoder.py changed") as refused:
        promote(params, CONFIG.model_name, version=version, evidence=Evidence(scorer=as_registered))
    assert "\n" not in str(refused.value)
    forced = promote(
        params,
        CONFIG.model_name,
        version=version,
        evidence=Evidence(scorer=as_registered),
        override=Override(actor="eve", force=True),
    )
    assert not forced["promoted"] and "refused" in forced["reasons"][0]
    assert mlc.get_model_version_by_alias(CONFIG.model_name, "champion").version == before
    tags = mlc.get_model_version(CONFIG.model_name, version).tags
    assert tags["sentcl.state"] == "refused" and "pyfunc_encoder.py changed" in tags["gate.refused"]


def test_production_runs_are_written_by_the_gate_only(auth_server, monkeypatch, tmp_path):
    """Issue item 4: a production registration logs its run in `<experiment>-production`, which setup
    makes the gate's alone; the teammate's artifact PUT of the test above is refused there (403)."""
    from mlflow.exceptions import MlflowException

    _setup_as_admin(monkeypatch)
    assert run_experiment(CONFIG.model_name, CONFIG) == production_experiment()
    assert run_experiment(CONFIG.experiment_model_name, CONFIG) == store.EXPERIMENT
    as_user(monkeypatch, GATE)
    mlc = store.client()
    prod_id = store.experiment_id(mlc, production_experiment())
    run_id = mlc.create_run(prod_id).info.run_id
    mlc.log_artifact(run_id, str(_write(tmp_path / "model" / "pyfunc_encoder.py", "served\n")), "model")
    url = f"{auth_server}/api/2.0/mlflow-artifacts/artifacts/{prod_id}/{run_id}/artifacts/model/pyfunc_encoder.py"
    team = {"Authorization": "Basic " + base64.b64encode(":".join(TEAM).encode()).decode()}
    with urllib.request.urlopen(urllib.request.Request(url, headers=team), timeout=20) as response:
        assert response.read() == b"served\n"  # a teammate reads production runs
    put = urllib.request.Request(url, data=b"import os; os.system('id')\n", method="PUT", headers=team)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(put, timeout=20)
    assert refused.value.code == 403
    as_user(monkeypatch, TEAM)
    with pytest.raises(MlflowException) as denied:
        store.client().create_run(prod_id)
    assert "PERMISSION_DENIED" in str(denied.value.error_code)
    as_user(monkeypatch, GATE)
    local = tmp_path / "back"
    root = Path(store.client().download_artifacts(run_id, "model", str(local)))
    assert (root / "pyfunc_encoder.py").read_text() == "served\n"


def test_a_teammates_make_register_is_refused_in_one_line(auth_server, monkeypatch, tmp_path):
    """`python -m stages.register` as a teammate: refused at the production lease, one line, exit 2."""
    release = make_release(tmp_path)
    as_user(monkeypatch, ADMIN)
    monkeypatch.setenv("SENTCL_GATE_USER", GATE[0])
    monkeypatch.setenv("SENTCL_GATE_PASSWORD", GATE[1])
    monkeypatch.setenv("SENTCL_TEAM_USER", TEAM[0])
    monkeypatch.setenv("SENTCL_TEAM_PASSWORD", TEAM[1])
    auth.setup(GateConfig.from_params(read_params()))  # the model names `make register` uses
    out = run_register(
        release, tmp_path, 180, MLFLOW_TRACKING_USERNAME=TEAM[0], MLFLOW_TRACKING_PASSWORD=TEAM[1]
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "may not take its lease" in out.stderr


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


HOLD_LEASE = """
import sys, time
from sentcl.registry.rules import LeaseTimes
from sentcl_mlflow.registry import lease as leases
if sys.argv[4:] == ["elsewhere"]:  # a holder on another machine: nothing here can tell whether it still runs
    leases.holder_identity = lambda: "{}"
with leases.promotion_lock(sys.argv[1], LeaseTimes(lease_s=float(sys.argv[2]), wait_s=600)) as lease:
    print("holding", lease.token, flush=True)
    time.sleep(float(sys.argv[3]))
print("released", flush=True)
"""


def _hold_lease(
    name: str, lease_s: float, hold_s: float, user: tuple[str, str], where: str = "here"
) -> subprocess.Popen:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_USERNAME": user[0],
        "MLFLOW_TRACKING_PASSWORD": user[1],
    }
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, name, str(lease_s), str(hold_s), where],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("holding"), line + process.stderr.read()
    return process


def test_a_teammate_can_neither_take_nor_block_the_promotion_lease(auth_server, monkeypatch):
    from mlflow.exceptions import MlflowException

    _setup_as_admin(monkeypatch)
    lease_model = CONFIG.model_name + LEASE_SUFFIX
    # The attack: a teammate creates the lease model first (here: after the admin removed it), which
    # makes it theirs. The next setup (every make serve / compose up) takes it back: an idle lease model is
    # created again by the admin.
    store.client().delete_registered_model(lease_model)
    as_user(monkeypatch, TEAM)
    store.client().create_registered_model(lease_model, tags={"owner": "teammate", "expires": "0"})
    _setup_as_admin(monkeypatch)
    as_user(monkeypatch, TEAM)
    mlc = store.client()
    assert "owner" not in (mlc.get_registered_model(lease_model).tags or {})
    with pytest.raises(MlflowException):  # it exists (the admin made it): nobody else owns it
        mlc.create_registered_model(lease_model)
    with pytest.raises(PromotionLeaseDenied, match="only the gate's account"):
        with promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=1), mlc):
            pass
    for attempt in (
        lambda: mlc.create_model_version(lease_model, LEASE_SOURCE),
        lambda: mlc.set_registered_model_tag(lease_model, "owner", "teammate"),
        lambda: mlc.delete_registered_model(lease_model),
        lambda: mlc.rename_registered_model(lease_model, lease_model + ".gone"),
    ):
        with pytest.raises(MlflowException) as denied:
            attempt()
        assert "PERMISSION_DENIED" in str(denied.value.error_code)
    # The one-line answer of the CLI a teammate would run.
    out = subprocess.run(
        [sys.executable, "-m", "flows.promote", "--model", CONFIG.model_name],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "may not take its lease" in out.stderr
    # Meanwhile the gate takes and releases it at once: nothing was left behind by the attempts.
    # (wait_s=5: a lease version left ahead of it would make this wait, then time out.)
    as_user(monkeypatch, GATE)
    with promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=5), store.client()) as lease:
        assert int(lease.token) >= 1


def test_a_killed_holders_lease_expires_on_the_servers_clock_and_a_broken_holder_stops(
    auth_server, monkeypatch
):
    _setup_as_admin(monkeypatch)
    as_user(monkeypatch, GATE)
    mlc = store.client()
    # A live holder (renewing every lease_s / 3) is never broken, whatever the waiter's own clock says.
    # It runs "elsewhere" (no holder identity this host can check), as on another machine.
    holder = _hold_lease(CONFIG.model_name, 3.0, 9.0, GATE, where="elsewhere")
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 10**6)  # the waiter's clock, far ahead
    with pytest.raises(PromotionLockTimeout, match="held by"):
        with promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=5), mlc):
            pass
    monkeypatch.setattr(time, "time", real_time)
    holder.kill()
    holder.wait(30)
    # Killed with -9: its lease stops being renewed and is broken once 3 s of server time have passed.
    started = time.monotonic()
    with promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=30), mlc) as lease:
        waited = time.monotonic() - started
        # Fencing: a holder whose lease was broken (here: its version deleted, as a waiter does to an
        # expired one) is stopped by the check before any alias write.
        mlc.delete_model_version(lease.model, lease.token)
        with pytest.raises(PromotionLeaseLost):
            lease.check()
    assert 2.0 < waited < 30, waited


def test_a_dead_holders_lease_on_this_host_is_broken_at_once_and_a_live_one_never(auth_server, monkeypatch):
    """A gate killed with -9 while it held the production lease (900 s) must not block the next one for 15
    minutes: a contender on the same host and PID namespace finds the holder's process gone (its PID no longer
    runs the process that started at the recorded moment) and breaks the lease at once, saying why. A live
    holder on this host is waited for."""
    _setup_as_admin(monkeypatch)
    as_user(monkeypatch, GATE)
    mlc = store.client()
    holder = _hold_lease(CONFIG.model_name, 900.0, 120.0, GATE)
    try:
        with pytest.raises(PromotionLockTimeout, match="held by"):  # alive: not broken
            with promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=3), mlc):
                pass
    finally:
        holder.kill()
        holder.wait(30)
    started = time.monotonic()
    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        promotion_lock(CONFIG.model_name, LeaseTimes(lease_s=900, wait_s=60), mlc) as lease,
    ):
        waited = time.monotonic() - started
        assert int(lease.token) >= 1
    assert waited < 30, waited  # not the 900 s of its lease
    assert f"process {holder.pid} on this host has exited" in out.getvalue(), out.getvalue()


def start_prefect_server(port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`prefect server start` on loopback ``port`` in its own session (so a test can kill it whole)."""
    prefect = str(Path(sys.executable).parent / "prefect")
    return subprocess.Popen(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
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
    process = start_prefect_server(port, env, log)
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


REFUSE_COMMAND = """
import json, sys
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import PrefectHTTPStatusError

@flow(name="job-variables-check")
def noop():
    pass

template = json.load(open("infra/process-job-template.json"))
with get_client(sync_client=True) as client:
    client.create_work_pool(WorkPoolCreate(name="jv-pool", type="process", base_job_template=template))
    flow_id = client.create_flow(noop)
    deployment_id = client.create_deployment(
        flow_id=flow_id, name="jv", work_pool_name="jv-pool", entrypoint="x.py:noop",
        job_variables={"cuda_visible_devices": "0"},
    )
    for variables in ({"command": "id > /tmp/owned"}, {"env": {"MLFLOW_TRACKING_URI": "http://evil"}},
                      {"working_dir": "/tmp"}, {"cuda_visible_devices": "0; id"}):
        try:
            client.create_flow_run_from_deployment(deployment_id, job_variables=variables)
            print("accepted", list(variables))
        except PrefectHTTPStatusError as e:
            print("refused", list(variables), e.response.status_code)
    run = client.create_flow_run_from_deployment(deployment_id, job_variables={"cuda_visible_devices": ""})
    print("created", run.id)
"""


def test_the_pools_template_refuses_job_variables_that_change_the_command(prefect_auth_server):
    """With the Prefect auth string alone, a flow run cannot run another command on the worker, change its
    environment (the registrar's MLflow account goes where MLFLOW_TRACKING_URI says) or its working directory."""
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_auth_server,
        "PREFECT_API_AUTH_STRING": "admin:prefect-secret-for-tests",
    }
    out = subprocess.run(
        [sys.executable, "-c", REFUSE_COMMAND], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for name in ("command", "env", "working_dir", "cuda_visible_devices"):
        assert f"refused ['{name}'] 422" in lines, out.stdout
    assert not any(line.startswith("accepted") for line in lines), out.stdout
    assert any(line.startswith("created") for line in lines)  # what the pool does accept still works


def test_who_promoted_and_rolled_back_is_the_authenticated_account_and_by_is_a_note(
    auth_server, monkeypatch, tmp_path
):
    """`--by NAME` is free text, and the gate's account is shared: the registry records the account MLflow's
    auth app authenticated (its /users/current) as who acted, and --by only as a note labelled unverified.
    The CLI, as the gate with `--by alice`: rolled_back_by is the gate's account, rolled_back_by_note alice."""
    _setup_as_admin(monkeypatch)
    for user in (GATE, TEAM, ADMIN):
        as_user(monkeypatch, user)
        assert store.caller_identity() == user[0]
    as_user(monkeypatch, (GATE[0], "not-the-password"))
    with pytest.raises(store.TrackingAuthError, match="did not authenticate sentcl-gate"):
        store.caller_identity()

    as_user(monkeypatch, GATE)
    mlc = store.client()
    params = {**read_params(), "registry": {**CONFIG.__dict__}}  # the gate, lease and limits of the checkout
    versions = []
    for score in (500.0, 600.0):  # above any champion the other tests leave; weights of their own
        run_id = mlc.create_run(store.experiment_id(mlc, production_experiment())).info.run_id
        mlc.log_artifact(run_id, str(_write(tmp_path / f"w{score}" / "w.bin", str(score))), "model")
        source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
        result = register_and_gate(
            Registration(
                source,
                score,
                {k: v + score for k, v in TABLE.items()},
                name=CONFIG.model_name,
                run_id=run_id,
                weights_sha256=f"{int(score) * 7919:064x}",
            ),
            params,
            evidence=Evidence(scorer=as_registered),
            actor="bob",
        )
        versions.append(result["version"])
    tags = mlc.get_model_version(CONFIG.model_name, versions[-1]).tags
    assert tags["gate.decision"] == "promoted", tags.get("gate.reasons")
    assert tags["gate.by"] == GATE[0] and tags["gate.by_note"] == "bob"

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(MLFLOW_TRACKING_USERNAME=GATE[0], MLFLOW_TRACKING_PASSWORD=GATE[1])
    out = subprocess.run(
        [sys.executable, "-m", "flows.promote", "--model", CONFIG.model_name, "--rollback", "--by", "alice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert f"by {GATE[0]} (--by alice, not verified)" in out.stdout
    demoted = mlc.get_model_version(CONFIG.model_name, versions[-1]).tags
    assert demoted["rolled_back_by"] == GATE[0] and demoted["rolled_back_by_note"] == "alice"
    restored = mlc.get_model_version(CONFIG.model_name, versions[0]).tags
    assert restored["restored_by"] == GATE[0] and restored["restored_by_note"] == "alice"
