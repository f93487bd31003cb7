"""infra/: nothing here can start a container or a cluster, so the files are checked statically."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import import_module
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"


def load(name: str):
    with open(INFRA / name) as f:
        return yaml.safe_load(f)


def test_prefect_yaml_is_valid_for_prefect_deploy():
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.client.schemas.schedules import construct_schedule
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    from flows.watch import EVENT

    raw = load("prefect.yaml")
    model = PrefectYamlModel.model_validate(raw)
    names = {d.name for d in model.deployments}
    assert {"retrain-local", "pipeline-local", "promote-local", "retrain-k8s", "pipeline-k8s"} <= names
    for deployment in model.deployments:
        module, _, attr = deployment.entrypoint.partition(":")
        flow = getattr(import_module(module.removesuffix(".py").replace("/", ".")), attr)
        assert hasattr(flow, "deploy"), f"{deployment.entrypoint} is not a Prefect flow"
        assert set(deployment.parameters) <= set(flow.parameters.properties)
        for schedule in deployment.schedules or []:
            construct_schedule(cron=schedule.cron, timezone=schedule.timezone)
        for trigger in deployment.triggers or []:
            parsed = DeploymentEventTrigger.model_validate({k: v for k, v in trigger.items() if k != "type"})
            assert EVENT in parsed.expect
            assert "{{ event." in str(parsed.parameters)
    retrain_local = next(d for d in model.deployments if d.name == "retrain-local")
    assert retrain_local.work_pool.job_variables["env"]["CUDA_VISIBLE_DEVICES"] != ""
    assert retrain_local.schedules and retrain_local.triggers
    retrain_k8s = next(d for d in model.deployments if d.name == "retrain-k8s")
    assert retrain_k8s.work_pool.name == "sentcl-gpu-k8s" and retrain_k8s.work_pool.job_variables["gpus"] >= 1


def test_kubernetes_job_template_requests_a_gpu():
    template = json.loads((INFRA / "k8s" / "base-job-template.json").read_text())
    assert set(template) == {"job_configuration", "variables"}
    manifest = template["job_configuration"]["job_manifest"]
    assert manifest["kind"] == "Job" and manifest["apiVersion"] == "batch/v1"
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpus }}"
    variables = template["variables"]["properties"]
    assert variables["gpus"]["default"] >= 1
    # Every {{ placeholder }} of the job configuration is a declared variable (what the worker fills in).
    import re

    placeholders = set(re.findall(r"{{\s*(\w+)\s*}}", json.dumps(template["job_configuration"])))
    assert placeholders <= set(variables), placeholders - set(variables)


def test_compose_stack_has_postgres_prefect_mlflow_s3_and_a_gpu_worker():
    compose = load("docker-compose.yml")
    services = compose["services"]
    assert {"postgres", "prefect-server", "mlflow", "minio", "gpu-worker"} <= set(services)
    mlflow_cmd = services["mlflow"]["command"]
    assert "postgresql://" in mlflow_cmd and "s3://" in mlflow_cmd
    assert (
        "postgresql+asyncpg://"
        in services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    )
    assert services["gpu-worker"]["build"]["dockerfile"] == "infra/Dockerfile"
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    for name, service in services.items():  # published ports stay on loopback
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    dockerfile = (INFRA / "Dockerfile").read_text()
    assert "AS worker" in dockerfile and "AS mlflow" in dockerfile


def _compose_v2() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _compose_v2() and shutil.which("docker-compose") is None,
    reason="neither the docker compose plugin nor docker-compose is installed",
)
def test_docker_compose_config_accepts_the_file(tmp_path):
    compose = INFRA / "docker-compose.yml"
    if _compose_v2():
        command = ["docker", "compose", "-f", str(compose), "config", "--quiet"]
    else:
        # docker-compose 1.x (Debian's package) predates the Compose spec's top-level `name:`; everything else
        # it checks as v2 does. The copy sits in infra/ so that relative build contexts resolve the same.
        text = compose.read_text()
        assert text.count("\nname: sentcl\n") == 1
        copy = INFRA / f".compose-check-{tmp_path.name}.yml"
        copy.write_text(text.replace("\nname: sentcl\n", "\n"))
        command = ["docker-compose", "-f", str(copy), "config", "--quiet"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        if not _compose_v2():
            copy.unlink()
    assert out.returncode == 0, out.stderr


def test_dvc_remotes_local_default_and_shared_s3():
    from configobj import ConfigObj  # the parser DVC itself uses for .dvc/config

    config = ConfigObj(str(ROOT / ".dvc" / "config"))
    assert config["core"]["remote"] == "local"
    assert config['remote "local"']["url"]
    assert config['remote "shared"']["url"].startswith("s3://")


def test_serve_and_stop_scripts_bind_loopback_only():
    serve = (INFRA / "serve.sh").read_text()
    assert "0.0.0.0" not in serve
    assert serve.count("--host 127.0.0.1") == 2
    assert "kill" in (INFRA / "stop.sh").read_text() and ".pid" in (INFRA / "stop.sh").read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


def _wait_for_event_run(port: int, deadline_s: float) -> list[dict]:
    import time
    import urllib.request

    body = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED"]}}}}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/flow_runs/filter",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            runs = [r for r in json.load(response) if r["parameters"].get("trigger") == "event"]
        if runs:
            return runs
        time.sleep(2)
    return []


@pytest.mark.slow
def test_make_serve_starts_every_server_on_loopback_and_make_stop_ends_them(tmp_path):
    import os
    import sys
    import urllib.request

    prefect_port, mlflow_port = _free_port(), _free_port()
    env = dict(
        os.environ,
        VENV=str(Path(sys.executable).parent.parent),
        SENTCL_RUN_DIR=str(tmp_path / "run"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_PORT=str(prefect_port),
        MLFLOW_PORT=str(mlflow_port),
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
        SENTCL_INBOX=str(tmp_path / "inbox"),
    )
    env.pop("PREFECT_API_URL", None)
    pids: dict[str, int] = {}
    try:
        serve = subprocess.run(
            ["bash", "infra/serve.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert serve.returncode == 0, serve.stdout + serve.stderr
        assert "serve: ready" in serve.stdout
        pids = {p.stem: int(p.read_text()) for p in (tmp_path / "run").glob("*.pid")}
        assert set(pids) == {"prefect-server", "mlflow-ui", "worker", "watcher"}
        assert _answers(f"http://127.0.0.1:{prefect_port}/api/health")
        assert _answers(f"http://127.0.0.1:{mlflow_port}/health")
        request = urllib.request.Request(
            f"http://127.0.0.1:{prefect_port}/api/deployments/filter",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            deployments = {d["name"]: d for d in json.load(response)}
        assert {"retrain-local", "pipeline-local", "promote-local"} <= set(deployments)
        assert deployments["retrain-local"]["schedules"], "the retrain deployment has its cron schedule"

        # A file landing in the inbox: watcher event -> deployment trigger -> worker -> a retrain flow run,
        # which refuses all-duplicate text before training (so the test stays short and changes nothing).
        (tmp_path / "inbox" / "dupes.txt").write_text("same line\nsame line\n")
        runs = _wait_for_event_run(prefect_port, deadline_s=120)
        assert runs and runs[0]["state_type"] == "FAILED", runs
        assert runs[0]["parameters"]["domain_text"] == str(tmp_path / "inbox" / "dupes.txt")
    finally:
        stop = subprocess.run(
            ["bash", "infra/stop.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    for name, pid in pids.items():
        assert f"stop: {name} (pid {pid}) stopped" in stop.stdout, stop.stdout  # not killed
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not _answers(f"http://127.0.0.1:{prefect_port}/api/health")
    assert not _answers(f"http://127.0.0.1:{mlflow_port}/health")
    assert not list((tmp_path / "run").glob("*.pid"))
