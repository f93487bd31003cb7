"""The faults a team meets, each a live test: a store of the team's stack stops in the middle of `make register`.

A stack of this module's own (``infra/team/team.py up``: PostgreSQL 15 + SeaweedFS's S3 gateway on loopback)
and the MLflow server of ``infra/mlflow-server.sh`` on it (backend PostgreSQL, artifacts proxied to S3, basic
auth): these tests stop its servers, so they never touch the session's ``team`` / ``team_mlflow``. The MLflow
server reaches S3 through a loopback relay (``S3Relay``) that can hold the first upload of a model's files, so
the S3 kill lands while an upload is in flight, not at a guessed moment.

1. PostgreSQL stopped (``pg_ctl stop -m immediate``) while ``python -m stages.register`` holds the promotion lease
   and its model run is RUNNING.
2. SeaweedFS killed (-9) while the server proxies the model's artifact upload to it.
3. The MLflow server stopped and started again while a registrar's register step waits for the gate's verdict.

Each time what a person and a flow see is checked: one line on stderr, exit 75 (the flows retry it), and, once the
store is back, a registry with no half-registered version ``ready`` and ``champion`` unchanged or on a judged
version; then a retry of the same stage registers the release and the gate judges it.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from sentcl.registry.rules import READY, REGISTERING, TAG_STATE, version_weights
from sentcl.registry.verdict import TAG_DECISION, reason_tags
from sentcl_mlflow import exit_codes
from sentcl_mlflow.registry.lease import LEASE_SUFFIX, TAG_RUN_LEASE, TAG_RUN_TOKEN
from tests.mlflow_uris import mlflow_pointed_at
from tests.paths import ROOT
from tests.services.conftest import ADMIN, TEAM, kill_server, start_team_mlflow, team_missing
from tests.services.test_mlflow_outage import PROGRESS, make_release, register_command
from tests.services.test_registry import write_dev_pairs

# The two live faults are marked slow: a stack, a server and four register stages, about 4.5 minutes on 2 cores.
needs_team = pytest.mark.skipif(team_missing() is not None, reason=team_missing() or "")

NAME = "sentcl-encoder"  # params.yaml registry.model_name: what `stages.register` registers into
LEASE = NAME + LEASE_SUFFIX
STAGE_BOUND_S = 240  # a faulted stage still running after this long is reported as hung
RETRY_BOUND_S = 480  # a whole registration with the gate, on a shared 2-core machine
# MLflow's own INFO log lines ("2026/12/07 12:34:17 INFO mlflow.pyfunc: Validating input example ..."): the stage's
# work, printed by a registration that succeeds too, not its report (a WARNING or ERROR line would count).
MLFLOW_INFO = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO ")


def team_module():  # noqa: ANN201 (infra/team/team.py, imported by path)
    spec = importlib.util.spec_from_file_location("sentcl_team_faults_team", TEAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class S3Relay:
    """A loopback TCP relay in front of SeaweedFS's S3 port, for the MLflow server's artifact proxy. Once
    ``arm()``-ed, the first request that PUTs a logged model's weights (MLflow 3 stores a model's files under
    ``<experiment>/models/m-<id>/artifacts/``; the weights come after its MLmodel, code and tokenizer files) is
    held there, unforwarded: ``caught`` is set, and it goes on only after ``release()``. An upstream that refuses
    (S3 is down) closes the client's connection, as a dead S3 would."""

    MARKS = (b"/models/m-", b"model.safetensors")

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed, self.caught, self.released = threading.Event(), threading.Event(), threading.Event()
        self.held_request = ""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.caught.clear()
        self.released.clear()
        self.armed.set()

    def release(self) -> None:
        self.released.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # S3 is down: the connection drops, as it would without the relay
                continue
            self.open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, to_s3: bool) -> None:
        try:
            while data := source.recv(65536):
                if to_s3 and self.armed.is_set() and self._held(data):
                    self.armed.clear()
                    self.held_request = data.split(b"\r\n", 1)[0].decode(errors="replace")
                    self.caught.set()
                    self.released.wait(120)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.close()
                except OSError:
                    pass

    def _held(self, data: bytes) -> bool:
        line = data.split(b"\r\n", 1)[0]
        return line.startswith(b"PUT ") and all(mark in line for mark in self.MARKS)

    def close(self) -> None:
        self.released.set()
        for sock in [self.listener, *self.open]:
            try:
                sock.close()
            except OSError:
                pass


class Stack:
    """This module's team stack (``team.py up --state``), with the faults: PostgreSQL stopped, SeaweedFS killed."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.team = team_module()

    def command(self, verb: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(TEAM), verb, "--state", str(self.state)],
            capture_output=True,
            text=True,
            timeout=180,
        )

    def up(self) -> float:
        started = time.monotonic()
        done = self.command("up")
        assert done.returncode == 0, done.stderr + done.stdout
        return time.monotonic() - started

    @property
    def config(self) -> dict:
        return self.team.State(self.state).load()

    def stop_postgres(self) -> str:
        """``pg_ctl stop -m immediate`` on the state's data folder, as the account it runs as: PostgreSQL
        crashing (every backend ends at once, no checkpoint; the next start recovers from the WAL)."""
        team, config = self.team, self.config
        folder = team.State(self.state).pg
        command = [str(team.postgres_bin() / "pg_ctl"), "-D", "data", "stop", "-m", "immediate", "-w"]
        done = subprocess.run(
            team.as_account(config.get("account"), command),
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        assert not team.pg_isready(team.postgres_bin(), config["postgres_port"])
        return f"PostgreSQL on 127.0.0.1:{config['postgres_port']} (pg_ctl stop -m immediate)"

    def kill_seaweed(self) -> str:
        """-9 to the PID ``team.py up`` recorded for ``weed server`` (master, volume, filer and S3 in one)."""
        pid = self.config["weed_pid"]
        assert self.team.running(pid, "weed"), f"SeaweedFS's recorded pid {pid} runs no weed"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.team.running(pid, "weed") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.team.running(pid, "weed"), f"weed (pid {pid}) survived SIGKILL"
        return f"SeaweedFS weed server (pid {pid}, S3 on 127.0.0.1:{self.config['s3_port']}) with SIGKILL"


class Mlflow:
    """The MLflow server of ``infra/mlflow-server.sh`` on the stack, its S3 endpoint ``s3_uri`` (the relay), and
    authenticated reads of its REST API (as the admin)."""

    def __init__(self, stack: Stack, s3_uri: str) -> None:
        self.stack, self.s3_uri = stack, s3_uri
        self.process, self.uri, self.log, self.seconds = start_team_mlflow(
            stack.state, MLFLOW_S3_ENDPOINT_URL=s3_uri
        )

    def stop(self) -> None:
        kill_server(self.process)

    def restart(self) -> float:
        """The server started again on its port (its store is PostgreSQL and S3: nothing is lost); seconds."""
        port = int(self.uri.rsplit(":", 1)[1])
        self.process, _, _, seconds = start_team_mlflow(
            self.stack.state, port, MLFLOW_S3_ENDPOINT_URL=self.s3_uri
        )
        return seconds

    def call(self, path: str, body: dict | None = None, **query: str) -> dict:
        url = f"{self.uri}/api/2.0/mlflow/{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
        token = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
        headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=15) as response:
            return json.loads(response.read() or b"{}")

    def versions(self, name: str = NAME) -> list[dict]:
        found = self.call("model-versions/search", filter=f"name='{name}'").get("model_versions", [])
        for version in found:  # the REST form of tags: a list of {key, value}
            version["tags"] = {t["key"]: t["value"] for t in version.get("tags", [])}
        return sorted(found, key=lambda v: int(v["version"]))

    def aliases(self, name: str = NAME) -> dict[str, str]:
        try:
            model = self.call("registered-models/get", name=name)["registered_model"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {}
            raise
        return {a["alias"]: str(a["version"]) for a in model.get("aliases", [])}

    def runs(self, filter_string: str) -> list[dict]:
        experiments = [
            e["experiment_id"] for e in self.call("experiments/search", max_results="100")["experiments"]
        ]
        body = {"experiment_ids": experiments, "filter": filter_string, "max_results": 100}
        found = self.call("runs/search", body).get("runs", [])
        for run in found:
            run["tags"] = {t["key"]: t["value"] for t in run.get("data", {}).get("tags", [])}
        return found

    def registry(self) -> dict:
        """What a person looks at after an outage: each version's state, gate decision and weights; the aliases;
        the promotion lease's versions; the runs a registration left RUNNING."""
        return {
            "versions": [
                {
                    "version": v["version"],
                    "state": v["tags"].get(TAG_STATE),
                    "decision": v["tags"].get("gate.decision"),
                    "run_id": v.get("run_id"),
                    "weights": (version_weights(v["tags"]) or "")[:12],
                }
                for v in self.versions()
            ],
            "aliases": self.aliases(),
            "lease_versions": [v["version"] for v in self.versions(LEASE)],
            "running_runs": [
                r["info"]["run_id"]
                for r in self.runs(f"tags.`{TAG_RUN_LEASE}` = '{LEASE}'")
                if r["info"]["status"] == "RUNNING"
            ],
        }


@pytest.fixture(scope="module")
def stack(request):
    """A stack and an MLflow server of this module's own (its tests stop the servers), the server's S3 behind
    an ``S3Relay``. The state folder is kept, and its path printed, when a test of this module failed."""
    state = Path(tempfile.mkdtemp(prefix="sentcl-team-faults-", dir="/tmp"))
    failed_before = request.session.testsfailed
    team = Stack(state)
    server = relay = None
    try:
        seconds = team.up()
        relay = S3Relay(team.config["s3_port"])
        server = Mlflow(team, relay.uri)
        print(f"team-up {seconds:.1f} s, MLflow server on it {server.seconds:.1f} s")
        yield {"team": team, "server": server, "relay": relay, "state": state}
    finally:
        if server is not None:
            if server.process.poll() is not None:
                print(
                    f"the MLflow server had exited ({server.process.returncode}): {server.log.read_text()[-3000:]}"
                )
            server.stop()
        if relay is not None:
            relay.close()
        down = team.command("down")
        print(down.stdout, down.stderr)
        if request.session.testsfailed > failed_before:
            print(f"team state kept for the failure above: {state} (mlflow.log, postgres/, seaweedfs/)")
        else:
            shutil.rmtree(state, ignore_errors=True)


def stage_env(server: Mlflow) -> dict[str, str]:
    """The register stage's environment on the module's server, as the admin: this process's, less its Prefect
    server, DVC experiment and MLflow request bounds (the stage sets its own from params.yaml)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "DVC_EXP_NAME", "MLFLOW_REGISTRY_URI")
        and not k.startswith("MLFLOW_HTTP_")
    }
    env.update(
        MLFLOW_TRACKING_URI=server.uri,
        MLFLOW_TRACKING_USERNAME=ADMIN[0],
        MLFLOW_TRACKING_PASSWORD=ADMIN[1],
        SENTCL_ACTOR="team-faults-test",
    )
    return env


def stage_command(release: Path, processed: Path, tmp_path: Path) -> list[str]:
    return [*register_command(release, tmp_path), "--processed", str(processed)]


def start_stage(server: Mlflow, release: Path, processed: Path, tmp_path: Path) -> subprocess.Popen:
    return start_on(server, stage_command(release, processed, tmp_path))


def start_on(server: Mlflow, command: list[str]) -> subprocess.Popen:
    """``command`` in a session of its own, with the stage's environment on ``server``, its output piped."""
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=stage_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(stage: subprocess.Popen, since: float) -> tuple[int, list[str], str, float]:
    """(exit code, the stage's report lines on stderr, all of stderr, seconds since ``since``). A stage still
    running after STAGE_BOUND_S hangs: killed, and a failure that says so with its output."""
    try:
        out, err = stage.communicate(timeout=STAGE_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(stage.pid, signal.SIGKILL)
        out, err = stage.communicate()
        pytest.fail(
            f"register hung: still running {STAGE_BOUND_S}s after the fault\n{out[-2000:]}\n{err[-4000:]}"
        )
    seconds = time.monotonic() - since
    # Progress bars (transformers loading the encoder to log it) and MLflow's INFO lines are the stage's work.
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and not PROGRESS.search(line) and not MLFLOW_INFO.match(line)
    ]
    return stage.returncode, lines, err, seconds


def retry(
    server: Mlflow, release: Path, processed: Path, tmp_path: Path
) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        stage_command(release, processed, tmp_path / "retry"),
        cwd=ROOT,
        env=stage_env(server),
        capture_output=True,
        text=True,
        timeout=RETRY_BOUND_S,
    )
    return done, time.monotonic() - started


def wait_until(stage: subprocess.Popen, condition, what: str, seconds: float = 300) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stage.poll() is not None:
            pytest.fail(f"register ended before {what}: {stage.returncode} {stage.stderr.read()[-3000:]}")
        if condition():
            return
        time.sleep(0.2)
    os.killpg(stage.pid, signal.SIGKILL)
    pytest.fail(f"register never reached {what}")


def the_release(base: Path, seed: int) -> tuple[Path, Path, str]:
    """A tiny release (``make_release``, weights of ``seed``) and a dev ``pairs.parquet`` whose gold is its own
    cosines (the gate measures it at ~100 there); (release, processed folder, its weights fingerprint)."""
    folder = make_release(base)
    info = json.loads((folder / "export.json").read_text())
    if seed != 3:  # make_release's seed: other weights, the same layout
        from sentcl.registry.rules import weight_file_digests, weights_fingerprint
        from tests.tiny import make_tiny_encoder

        make_tiny_encoder(base, "release", seed=seed)
        digests = weight_file_digests(folder)
        info |= {"weights_sha256": digests, "weights_fingerprint": weights_fingerprint(digests)}
        (folder / "export.json").write_text(json.dumps(info))
    processed = write_dev_pairs(base / "processed", folder)
    return folder, processed, info["weights_fingerprint"]


def ours(registry: dict, weights: str) -> list[dict]:
    return [v for v in registry["versions"] if v["weights"] == weights[:12]]


def report(fault: str, killed: str, code: int, lines: list[str], seconds: float, after: dict) -> None:
    print(f"\n[{fault}] killed: {killed}")
    shown = lines if len(lines) <= 3 else [*lines[:1], f"... {len(lines) - 2} more lines ...", lines[-1]]
    print(f"[{fault}] register exited {code} {seconds:.1f}s after the fault; stderr: {shown}")
    print(f"[{fault}] registry after the restart: {json.dumps(after, indent=None)}")


def check_consistent(registry: dict, before_aliases: dict[str, str]) -> None:
    """No half-registered version is ``ready``, and ``champion`` is where it was or on a judged version."""
    for version in registry["versions"]:
        assert version["state"] in (READY, REGISTERING, "refused"), version
        if version["state"] == READY:
            assert version["decision"], f"version {version['version']} is ready but was never judged"
    champion = registry["aliases"].get("champion")
    if champion != before_aliases.get("champion"):
        judged = {v["version"] for v in registry["versions"] if v["decision"] and v["state"] == READY}
        assert champion in judged, (champion, registry)


def check_retry(
    done: subprocess.CompletedProcess, registry: dict, weights: str, failed_run: str | None
) -> dict:
    """The retry registered the release once, ready and judged; the run the faulted stage left is FAILED."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    mine = ours(registry, weights)
    assert len(mine) == 1 and mine[0]["state"] == READY and mine[0]["decision"], registry
    assert mine[0]["run_id"] != failed_run
    assert not [v for v in registry["versions"] if v["state"] == REGISTERING], registry
    assert registry["lease_versions"] == [] and registry["running_runs"] == [], registry
    assert registry["aliases"].get("champion") in {
        v["version"] for v in registry["versions"] if v["decision"] and v["state"] == READY
    }, registry
    return mine[0]


@pytest.mark.slow
@needs_team
def test_postgres_stopped_mid_registration_is_one_line_exit_75_and_a_retry_registers(stack, tmp_path):
    team, server = stack["team"], stack["server"]
    release, processed, weights = the_release(tmp_path / "a", seed=3)
    before = server.aliases()
    stage = start_stage(server, release, processed, tmp_path)

    def mid_registration() -> bool:
        leases = server.versions(LEASE)
        if not leases:
            return False
        running = [
            r for r in server.runs(f"tags.`{TAG_RUN_LEASE}` = '{LEASE}'") if r["info"]["status"] == "RUNNING"
        ]
        return any(r["tags"].get(TAG_RUN_TOKEN) for r in running)

    wait_until(stage, mid_registration, "the lease with its model run RUNNING")
    running = [
        r for r in server.runs(f"tags.`{TAG_RUN_LEASE}` = '{LEASE}'") if r["info"]["status"] == "RUNNING"
    ]
    failed_run = running[0]["info"]["run_id"]
    killed = team.stop_postgres()
    stopped = time.monotonic()
    code, lines, err, seconds = finish(stage, stopped)
    team.up()  # PostgreSQL starts again (crash recovery), on the same port and data
    after = server.registry()
    report("postgres", killed, code, lines, seconds, after)
    assert code == exit_codes.EXIT_TRANSIENT == 75, (code, err[-4000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-4000:]
    assert lines[0].startswith("register: "), lines
    check_consistent(after, before)
    assert not [v for v in ours(after, weights) if v["state"] == READY], after

    done, retry_s = retry(server, release, processed, tmp_path)
    final = server.registry()
    print(f"[postgres] retry exited {done.returncode} in {retry_s:.1f}s: {done.stdout.strip().splitlines()}")
    print(f"[postgres] registry after the retry: {json.dumps(final)}")
    mine = check_retry(done, final, weights, failed_run)
    failed = server.call("runs/get", run_id=failed_run)["run"]["info"]
    assert failed["status"] == "FAILED", failed  # the orphan the stage left, ended by the retry's cleanup
    assert mine["decision"]


@pytest.mark.slow
@needs_team
def test_s3_killed_mid_upload_is_one_line_exit_75_never_ready_and_a_retry_is_judged(stack, tmp_path):
    team, server, relay = stack["team"], stack["server"], stack["relay"]
    release, processed, weights = the_release(tmp_path / "b", seed=11)
    before = server.aliases()
    relay.arm()
    stage = start_stage(server, release, processed, tmp_path)
    wait_until(stage, relay.caught.is_set, "its model upload")
    running = [
        r for r in server.runs(f"tags.`{TAG_RUN_LEASE}` = '{LEASE}'") if r["info"]["status"] == "RUNNING"
    ]
    failed_run = running[0]["info"]["run_id"] if running else None
    killed = team.kill_seaweed() + f"; held upload: {relay.held_request}"
    relay.release()
    killed_at = time.monotonic()
    code, lines, err, seconds = finish(stage, killed_at)
    # MLflow (on PostgreSQL) still answers while S3 is down: the version never became ready, nothing moved.
    during = server.registry()
    assert not ours(during, weights), during
    assert during["aliases"].get("champion") == before.get("champion"), during
    team.up()  # SeaweedFS starts again on the same ports and data
    after = server.registry()
    report("s3", killed, code, lines, seconds, after)
    assert code == exit_codes.EXIT_TRANSIENT == 75, (code, err[-4000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-4000:]
    assert lines[0].startswith("register: "), lines
    check_consistent(after, before)
    assert not ours(after, weights), after

    done, retry_s = retry(server, release, processed, tmp_path)
    final = server.registry()
    print(f"[s3] retry exited {done.returncode} in {retry_s:.1f}s: {done.stdout.strip().splitlines()}")
    print(f"[s3] registry after the retry: {json.dumps(final)}")
    mine = check_retry(done, final, weights, failed_run)
    assert mine["decision"]  # the gate judged the retry's version, and only that one of these weights
    if failed_run:
        failed = server.call("runs/get", run_id=failed_run)["run"]
        assert failed["info"]["status"] == "FAILED", failed["info"]
        tags = {t["key"]: t["value"] for t in failed.get("data", {}).get("tags", [])}
        assert "registered_version" not in tags, tags


# The register stage's wait for the gate process's verdict (what a flow run's register step does once its
# candidate is registered), in a process of its own with the stage's request bounds from params.yaml.
WAITER = r"""
import json, sys
from sentcl.params import read_params
from sentcl_mlflow import store
from sentcl_mlflow.registration import _await_gate

params = read_params(overrides=[f"flows.gate_wait_s={sys.argv[3]}"])
store.bound_requests(store.TrackingConfig.from_params(params))
print("result " + json.dumps(_await_gate(sys.argv[1], sys.argv[2], params)), flush=True)
"""


class Lines:
    """A process's stdout, read line by line in a thread, waited on by content."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.lines = process, []
        threading.Thread(
            target=lambda: self.lines.extend(iter(process.stdout.readline, "")), daemon=True
        ).start()

    def wait_for(self, text: str, seconds: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if any(text in line for line in self.lines):
                return time.monotonic() - started
            if self.process.poll() is not None:
                time.sleep(0.5)  # the reader thread's last lines
                if any(text in line for line in self.lines):
                    return time.monotonic() - started
                pytest.fail(
                    f"the wait ended ({self.process.returncode}) before {text!r}: {self.lines} "
                    f"{self.process.stderr.read()[-3000:]}"
                )
            time.sleep(0.2)
        os.killpg(self.process.pid, signal.SIGKILL)
        pytest.fail(f"no {text!r} in {seconds:.0f}s: {self.lines}")


@pytest.mark.slow
@needs_team
def test_mlflow_restarted_while_register_waits_for_the_gate_is_ridden_out_and_the_verdict_arrives(stack):
    """The server stopped (SIGTERM to its process group) and started again on its port while the wait polls: the
    wait says so in one line, says when it answers again, and returns the verdict the gate then writes; the
    version is the one it was (nothing registered again). On the code before, the first failed poll ended the
    wait with a traceback, and the flow's retry of the whole stage was the only way on."""
    server = stack["server"]
    name = "sentcl-wait-test"
    with mlflow_pointed_at(server.uri, ADMIN, registry=True):
        from mlflow import MlflowClient

        mlc = MlflowClient()
        mlc.create_registered_model(name)
        version = mlc.create_model_version(name, source="s3://sentcl-artifacts/candidates/wait-test").version
    waiter = start_on(server, [sys.executable, "-c", WAITER, name, str(version), "300"])
    out = Lines(waiter)
    out.wait_for("waiting up to 300s", 120)
    server.stop()
    stopped = time.monotonic()
    noticed = out.wait_for("stopped answering", 90)
    restart_s = server.restart()
    back = out.wait_for("answers again", 60)
    with mlflow_pointed_at(server.uri, ADMIN, registry=True):
        mlc = MlflowClient()
        for key, value in {
            TAG_DECISION: "reject",
            **reason_tags(["wait test: scored below the champion"]),
        }.items():
            mlc.set_model_version_tag(name, str(version), key, value)
        versions = [v.version for v in mlc.search_model_versions(f"name='{name}'")]
    out.wait_for("result ", 60)
    _, err = waiter.communicate(timeout=30)
    print(
        f"\n[mlflow restart] down {time.monotonic() - stopped:.0f}s in all; the wait noticed it {noticed:.1f}s "
        f"after the stop; the new server started in {restart_s:.1f}s; answered again {back:.1f}s after; "
        f"stdout: {out.lines}"
    )
    assert waiter.returncode == 0 and "Traceback" not in err, err[-3000:]
    said = [line for line in out.lines if "MLflow server" in line]
    assert len(said) == 2 and "stopped answering (" in said[0] and "answers again" in said[1], out.lines
    assert any("the gate's verdict on sentcl-wait-test version 1: REJECT" in line for line in out.lines)
    result = json.loads(out.lines[-1].removeprefix("result "))
    assert result["gate"]["decision"] == "reject", result
    assert result["gate"]["reasons"] == ["wait test: scored below the champion"]
    assert versions == [str(version)]  # the wait registers nothing


def test_a_server_that_answers_only_503_is_transient():
    """What PostgreSQL stopping behind MLflow looks like to a stage: the server's SQLAlchemy store turns the
    OperationalError into TEMPORARILY_UNAVAILABLE (HTTP 503), MLflow's client retries it until its retries run
    out and raises a plain MlflowException with requests' RetryError as its context. That is exit 75, one line."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    from flows.common import transient_error
    from sentcl_mlflow import errors

    listener = socket.create_server(("127.0.0.1", 0))
    body = b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "(psycopg2.OperationalError) refused"}'
    answer = b"HTTP/1.1 503 SERVICE UNAVAILABLE\r\nContent-Type: application/json\r\nConnection: close\r\n"
    answer += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    def unavailable() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=unavailable, daemon=True).start()
    creds = MlflowHostCreds(f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(MlflowException) as failed:
            http_request(creds, "/api/2.0/mlflow/runs/get", "GET", max_retries=1, backoff_factor=0, timeout=5)
    finally:
        listener.close()
    assert errors.unreachable(failed.value) and transient_error(failed.value)
    code, line = errors.one_line("register", failed.value)
    assert code == exit_codes.EXIT_TRANSIENT and "\n" not in line, line
    assert "(ResponseError: too many 503 error responses)" in line, line  # it answered, with 503s
    print(line)
