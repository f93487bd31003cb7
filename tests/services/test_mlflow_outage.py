"""MLflow dying or hanging in the middle of `make register` (``python -m stages.register``), for real.

A real `mlflow server` on a free loopback port. It is killed with -9 while the register stage holds the
promotion lease and its model run is RUNNING, then started again on the same store. For the hang, the stage
talks to that server through a loopback TCP relay that, once switched, accepts and reads and never answers.
What is checked is what a person and a flow see: one line on stderr, exit 75 (the flows retry it), within
tens of seconds, and what is left on the server (the lease, the run) once it is back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import Registration, weight_file_digests, weights_fingerprint
from sentcl_mlflow import errors, exit_codes, store
from sentcl_mlflow.errors import PromotionLockTimeout
from sentcl_mlflow.registry.gate import register_candidate
from sentcl_mlflow.registry.lease import LEASE_SUFFIX, TAG_RUN_LEASE
from tests.paths import ROOT
from tests.services.test_registry import TABLE, free_port
from tests.tiny import make_tiny_encoder

NAME = "sentcl-encoder"  # params.yaml registry.model_name: what `stages.register` registers into
LEASE = NAME + LEASE_SUFFIX
PROGRESS = re.compile(r"\|\s*\d+/\d+ \[")  # a tqdm bar: "Loading weights: 100%|####| 39/39 [00:00<...]"
LEASE_S = 3  # the killed stage's lease, so the next registration breaks it after 3 s of server time


class Server:
    """`mlflow server` on one port and one store, that a test can kill and start again."""

    def __init__(self, base: Path) -> None:
        self.base, self.port = base, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.base / "server.log", "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port)]
            + ["--workers", "1", "--backend-store-uri", f"sqlite:///{self.base / 'mlflow.db'}"]
            + ["--artifacts-destination", str(self.base / "artifacts")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(
                        f"mlflow server did not start: {(self.base / 'server.log').read_text()[-2000:]}"
                    )
                time.sleep(0.5)

    def kill(self) -> None:
        """-9 to the server's whole session (the leader and its uvicorn worker): MLflow dying."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(30)

    def get(self, path: str, **query: str) -> dict:
        url = f"{self.uri}/api/2.0/mlflow/{path}?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def lease_versions(self) -> list[dict]:
        return self.get("model-versions/search", filter=f"name='{LEASE}'").get("model_versions", [])

    def runs_under_lease(self) -> list[dict]:
        body = json.dumps(
            {
                "experiment_ids": [
                    e["experiment_id"]
                    for e in self.get("experiments/search", max_results="100")["experiments"]
                ],
                "filter": f"tags.`{TAG_RUN_LEASE}` = '{LEASE}'",
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read()).get("runs", [])


class Relay:
    """A loopback TCP relay in front of the server. ``hang()``: from then on it accepts connections and
    reads what is sent, and answers nothing, on new and already open connections alike (a hung server)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.hung = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hang(self) -> None:
        self.hung.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(client)
            if self.hung.is_set():
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.held.append(upstream)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _swallow(self, sock: socket.socket) -> None:
        while sock.recv(65536):
            pass

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.hung.is_set():  # read on, forward nothing: the request sits unanswered
                    continue
                sink.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for sock in [self.listener, *self.held]:
            try:
                sock.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("mlflow-outage")
    srv = Server(base)
    srv.start()
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = srv.uri
    store._configured = None
    yield srv
    srv.kill()
    store._configured = None
    if previous is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = previous


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return make_release(tmp_path_factory.mktemp("release"))


def make_release(base: Path) -> Path:
    """What `stages.export` leaves in models/export, minus the ONNX file the register stage never reads."""
    folder = make_tiny_encoder(base, "release", seed=3)
    digests = weight_file_digests(folder)
    row = {"all": {**TABLE, "avg": 53.0}, "stsb_dev": 61.0}
    info = {
        "checkpoint": "transfer-base",
        "model_name": NAME,
        "stsb_dev": 61.0,
        "sts_all": row["all"],
        "dev_scores": {},
        "beat_init": True,
        "trained_beat_init": True,
        "weights_sha256": digests,
        "weights_fingerprint": weights_fingerprint(digests),
        "onnx": {"max_abs_diff_vs_pytorch": 0.0},
        "sts_row": row,
    }
    (folder / "export.json").write_text(json.dumps(info))
    return folder


def register_command(release: Path, tmp_path: Path) -> list[str]:
    """The register stage on ``release``, its summary in ``tmp_path``: what every registering test runs."""
    return [
        sys.executable,
        "-m",
        "stages.register",
        "--release",
        str(release),
        "--summary",
        str(tmp_path / "r.json"),
    ]


def run_register(release: Path, tmp_path: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    """``register_command`` run to its end from the repository root, with this process's environment less its
    Prefect server and DVC experiment (never the stage's), plus ``env`` (an account, a registry role)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "DVC_EXP_NAME")}
    environment.update(env)
    return subprocess.run(
        register_command(release, tmp_path),
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_register(uri: str, release: Path, tmp_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL" and not k.startswith("MLFLOW_HTTP_")}
    env.update(MLFLOW_TRACKING_URI=uri, SENTCL_ACTOR="outage-test")
    return subprocess.Popen(
        [*register_command(release, tmp_path), "--set", f"promotion.lease_s={LEASE_S}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until_mid_registration(srv: Server, stage: subprocess.Popen, seconds: float = 240) -> None:
    """Until the stage holds the lease and its model run is RUNNING (it is uploading the model)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stage.poll() is not None:
            pytest.fail(f"register ended before the outage: {stage.returncode} {stage.stderr.read()}")
        if srv.lease_versions() and any(r["info"]["status"] == "RUNNING" for r in srv.runs_under_lease()):
            return
        time.sleep(0.1)
    stage.kill()
    pytest.fail("register never reached its model upload")


def one_line_75(stage: subprocess.Popen, timeout: float) -> tuple[str, float]:
    started = time.monotonic()
    out, err = stage.communicate(timeout=timeout)
    seconds = time.monotonic() - started
    # Progress bars (transformers loading the encoder to log it) are the stage's work, not its report.
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert stage.returncode == exit_codes.EXIT_TRANSIENT == 75, (stage.returncode, err[-3000:])
    assert len(lines) == 1 and "Traceback" not in err, repr(err[-3000:])
    return lines[0], seconds


def test_killed_mlflow_mid_register_is_one_line_exit_75_and_the_next_registration_cleans_up(
    server, release, tmp_path
):
    stage = start_register(server.uri, release, tmp_path)
    wait_until_mid_registration(server, stage)
    token = server.lease_versions()[0]["version"]
    server.kill()
    line, seconds = one_line_75(stage, timeout=120)
    print(f"killed server: register exited 75 {seconds:.1f}s after the kill: {line}")
    assert "stopped answering" in line and f"lease version {token}" in line
    assert "expires by itself" in line  # the server was gone: nothing could release it
    assert seconds < 45, seconds

    # Back up: the dead registration's lease breaks after its 3 s, and the next holder ends its run FAILED.
    server.start()
    store._configured = None
    orphans = [r["info"]["run_id"] for r in server.runs_under_lease() if r["info"]["status"] == "RUNNING"]
    assert orphans, "the killed registration left no RUNNING run to clean up"
    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc)).info.run_id
    (tmp_path / "w.bin").write_bytes(b"w")
    mlc.log_artifact(run_id, str(tmp_path / "w.bin"), "model")
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    register_candidate(Registration(source, 70.0, TABLE, name=NAME, run_id=run_id), read_params())
    for orphan in orphans:
        run = mlc.get_run(orphan)
        assert run.info.status == "FAILED" and "sentcl.failed_by" in run.data.tags
    assert server.lease_versions() == []  # broken, then ours released


def test_hung_mlflow_mid_register_fails_within_the_bounded_timeout_one_line_exit_75(
    server, release, tmp_path
):
    relay = Relay(server.port)
    try:
        stage = start_register(relay.uri, release, tmp_path)
        wait_until_mid_registration(server, stage)
        relay.hang()
        started = time.monotonic()
        line, seconds = one_line_75(stage, timeout=300)
        print(f"hung server: register exited 75 {seconds:.1f}s after the hang: {line}")
    finally:
        relay.close()
    bound = store.TrackingConfig.from_params(read_params()).worst_case_s()
    assert "stopped answering" in line and "promotion lease" in line
    # One bounded request, the renewer's join and two short cleanup tries; MLflow's defaults took 385 s.
    assert seconds < 3 * bound + 20, (seconds, bound)
    assert time.monotonic() - started < 120


def test_a_socket_that_never_answers_fails_a_stage_before_its_work(release, tmp_path):
    """Hung from the start: the reachability probe (3 tries of 3 s) fails it, one line, exit 75."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        stage = start_register(f"http://127.0.0.1:{listener.getsockname()[1]}", release, tmp_path)
        line, seconds = one_line_75(stage, timeout=120)
    finally:
        listener.close()
        for sock in held:
            sock.close()
    print(f"never-answering socket: exit 75 in {seconds:.1f}s: {line}")
    assert "unreachable" in line and seconds < 60


def test_network_errors_behind_mlflow_exceptions_are_transient_and_others_are_not():
    """The classification itself, on the exceptions MLflow's REST client really raises (a refused port)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    from flows.common import transient_error

    creds = MlflowHostCreds(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(MlflowException) as refused:
        http_request(creds, "/health", "GET", max_retries=0, timeout=2)
    assert errors.unreachable(refused.value) and transient_error(refused.value)
    assert errors.one_line("register", refused.value)[0] == 75
    busy = PromotionLockTimeout("the lease is held by someone")
    assert not errors.unreachable(busy) and errors.one_line("register", busy)[0] == 75
    assert not errors.unreachable(TimeoutError("a Prefect slot"))
    from mlflow.protos.databricks_pb2 import PERMISSION_DENIED

    denied = MlflowException("no", error_code=PERMISSION_DENIED)
    assert errors.one_line("register", denied)[0] == 2
    assert errors.one_line("register", ValueError("a bug")) is None


def test_a_server_that_dies_mid_response_is_transient():
    """MLflow killed while it sends a body: the client reads fewer bytes than Content-Length announced and
    requests raises ChunkedEncodingError ("Connection broken: IncompleteRead"); that is an outage, exit 75."""
    import requests
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    from flows.common import transient_error

    listener = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14276\r\n\r\n{"runs": ['
        )
        conn.close()  # the server dies here

    serving = threading.Thread(target=answer_half, daemon=True)
    serving.start()
    creds = MlflowHostCreds(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(Exception) as broken:
            http_request(creds, "/api/2.0/mlflow/runs/search", "GET", max_retries=0, timeout=5).json()
    finally:
        serving.join(5)
        listener.close()
    # MLflow's REST client re-raises it as a plain MlflowException, the requests error as its context.
    assert isinstance(broken.value.__context__, requests.exceptions.ChunkedEncodingError), (
        broken.value.__context__
    )
    assert errors.unreachable(broken.value) and transient_error(broken.value)
    code, line = errors.one_line("register", broken.value)
    assert code == 75 and "stopped answering (ProtocolError)" in line, line


def test_a_wait_for_the_gate_on_a_server_still_down_at_its_deadline_is_one_line_exit_75(monkeypatch):
    """The wait rides out an outage (tests/services/test_team_faults.py restarts a server under it), but not
    past its deadline: a server that never answers ends it with the last error, transient (exit 75), after one
    line saying so; the deadline is kept (no poll runs past it by more than a request's bound)."""
    from sentcl_mlflow.registry.gatekeeper import wait_for_verdict

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(Exception) as down:
        wait_for_verdict("sentcl-wait-test", "1", timeout_s=4, poll_s=0.5, say=said.append)
    seconds = time.monotonic() - started
    assert 4 <= seconds < 15, seconds  # client() probes /health 3 times, 3 s each
    assert errors.unreachable(down.value) and errors.one_line("register", down.value)[0] == 75
    assert len(said) == 1 and "stopped answering (TrackingUnavailableError)" in said[0], said
