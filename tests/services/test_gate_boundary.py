"""The operator's row of docs/registry-security.md: the Prefect auth string runs code on the worker, and still
cannot move champion nor read the gate's password.

`make serve` for real (infra/serve.sh: Prefect server, MLflow server with basic auth, the gate process, the
worker, the watcher), then what a holder of the Prefect auth string can do: create a deployment of
``flows/promote.py:promote_flow`` with ``force=True`` and a ``run_shell_script`` pull step that looks for the
gate's password (its environment, the ``.env`` file, the gate process's ``/proc/<pid>/environ`` and memory) and
tries what would let it reach the gate another way (signal it, change the code it runs, write the MLflow store
or read the users database), and run it on the worker, whose sandbox (infra/worker-sandbox.sh) must stop each.
"""

from __future__ import annotations

import base64
import re
import subprocess
import time

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig
from sentcl_mlflow import store
from tests.paths import ROOT
from tests.services.test_infra import (
    GATE_PASSWORD,
    SECRETS,
    _environ,
    _free_port,
    _post_prefect,
    _serve,
    serve_env,
)

PROD = GateConfig.from_params(read_params()).model_name
POOL = "sentcl-gpu-local"  # infra/serve.sh's default pool


def _wait_for_run(port: int, auth: str, run_id: str, seconds: float = 420) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run = _post_prefect(port, auth, f"flow_runs/{run_id}", method="GET")
        if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(2)
    pytest.fail(f"flow run {run_id} did not finish in {seconds}s")


# In make test although it takes ~2 min (make serve, a flow run on its worker, make stop): it is the proof that
# the Prefect auth string cannot move champion.
def test_a_rogue_forced_promote_deployment_moves_nothing_and_never_sees_the_gate_password(
    tmp_path, monkeypatch
):
    prefect_port, mlflow_port = _free_port(), _free_port()
    env_file = tmp_path / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()) + "SENTCL_TEAM_USER=teammate\n")
    env_file.chmod(0o600)
    run_dir = tmp_path / "run"
    env = serve_env(tmp_path, env_file, prefect_port, mlflow_port)  # the gate's password: never in .env
    try:
        serve = _serve(env)
        assert serve.returncode == 0, serve.stdout + serve.stderr
        pids = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid")}
        assert "gate" in pids and "worker" in pids

        # The admin registers two versions into production by hand; version 1 is champion.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{mlflow_port}")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRETS["MLFLOW_AUTH_ADMIN_PASSWORD"])
        store._configured = None
        mlc = store.client()
        run_id = mlc.create_run(store.experiment_id(mlc)).info.run_id
        (tmp_path / "w.bin").write_bytes(b"weights")
        mlc.log_artifact(run_id, str(tmp_path / "w.bin"), "model")
        source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
        for _ in range(2):
            mlc.create_model_version(PROD, source, run_id=run_id)
        mlc.set_registered_model_alias(PROD, "champion", "1")

        # The holder of the Prefect auth string: a deployment of the gate's flow, forced, with a pull step
        # that looks for the gate's password wherever this OS user might find it and tries the other ways
        # to the gate. Its findings go to the worker's log (the pull step's output); it exits 0 whatever it
        # finds, so the flow itself runs.
        auth = "Basic " + base64.b64encode(SECRETS["PREFECT_AUTH_STRING"].encode()).decode()
        gate_pid = pids["gate"]
        code = ROOT / "sentcl_mlflow" / "registry" / "gatekeeper.py"
        probes = {
            "dotenv": f"grep -q . {env_file}",  # covered: reads as empty
            "gate-environ": f"grep -qa . /proc/{gate_pid}/environ",
            "gate-memory": f"head -c 1 /proc/{gate_pid}/mem",
            "gate-signal": f"kill -0 {gate_pid}",
            "code-write": f"touch {code}",
            "root-write": f": > {ROOT}/rogue-file",
            "store-write": f": >> {tmp_path / 'mlflow.db'}",
            "users-db": f"grep -qa . {run_dir / 'mlflow-users.db'}",
            "output-write": f": > {ROOT}/runs/rogue-probe && rm {ROOT}/runs/rogue-probe",
        }
        script = "bash -c '" + "; ".join(
            f'if {command} >/dev/null 2>&1; then echo "probe {name}=yes"; else echo "probe {name}=no"; fi'
            for name, command in probes.items()
        )
        script += '; echo "pull step: gate=$SENTCL_GATE_PASSWORD mlflow=$MLFLOW_TRACKING_PASSWORD"; true\''
        code_before = code.stat().st_mtime_ns
        flow_id = _post_prefect(prefect_port, auth, "flows/", {"name": "sentcl-promote"})["id"]
        deployment = _post_prefect(
            prefect_port,
            auth,
            "deployments/",
            {
                "name": "rogue-force",
                "flow_id": flow_id,
                "entrypoint": "flows/promote.py:promote_flow",
                "work_pool_name": POOL,
                "work_queue_name": "default",
                "parameters": {"force": True, "version": "2", "actor": "mallory"},
                "pull_steps": [
                    {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}},
                    {"prefect.deployments.steps.run_shell_script": {"script": script}},
                ],
            },
        )
        flow_run = _post_prefect(prefect_port, auth, f"deployments/{deployment['id']}/create_flow_run", {})
        finished = _wait_for_run(prefect_port, auth, flow_run["id"])
        # The run's logs reach the server in batches after it ends: read until the refusal is there (or 60 s).
        deadline = time.monotonic() + 60
        while True:
            logs = _post_prefect(
                prefect_port, auth, "logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run["id"]]}}}
            )
            messages = "\n".join(entry["message"] for entry in logs)
            messages += "\n" + ((finished.get("state") or {}).get("message") or "")
            if (
                "PromotionLeaseDenied" in messages
                or "may not take" in messages
                or time.monotonic() > deadline
            ):
                break
            time.sleep(2)

        assert finished["state_type"] == "FAILED", (finished["state_type"], messages[-3000:])
        assert "PromotionLeaseDenied" in messages or "may not take" in messages, messages[-3000:]
        assert str(mlc.get_model_version_by_alias(PROD, "champion").version) == "1"  # champion did not move
        worker_log = (run_dir / "worker.log").read_text()
        found = dict(re.findall(r"^probe ([\w-]+)=(yes|no)$", worker_log, re.MULTILINE))
        # The sandbox: the pipeline's outputs writable, nothing else that reaches the gate.
        assert found == {name: "yes" if name == "output-write" else "no" for name in probes}, worker_log[
            -3000:
        ]
        assert code.stat().st_mtime_ns == code_before and not (ROOT / "rogue-file").exists()
        # The pull step ran with the worker's environment: the registrar's account, never the gate's.
        assert f"mlflow={SECRETS['SENTCL_REGISTRAR_PASSWORD']}" in worker_log
        for where, text in {"flow run logs": messages, "worker.log": worker_log}.items():
            assert GATE_PASSWORD not in text, where
        assert GATE_PASSWORD.encode() not in _environ(gate_pid)  # on its stdin, never in its environment
        assert "gate: watching" in (run_dir / "gate.log").read_text()
    finally:
        (ROOT / "rogue-file").unlink(missing_ok=True)  # had the sandbox failed
        stop = subprocess.run(
            ["bash", "infra/stop.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        store._configured = None
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "stop: gate (pid" in stop.stdout and "stopped" in stop.stdout, stop.stdout
