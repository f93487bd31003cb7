"""infra/: nothing here can start a container or a cluster, so the files are checked statically."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT

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
    assert {"retrain-local", "pipeline-local", "retrain-k8s", "pipeline-k8s"} <= names
    # No deployment runs the gate, a forced promotion or a rollback: flows/promote.py is a person's CLI.
    assert not [d.name for d in model.deployments if d.entrypoint.startswith("flows/promote.py")]
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
    assert retrain_local.work_pool.job_variables["cuda_visible_devices"] != ""
    # Every local deployment's job variables fit the pool's template, which admits no command/env/working_dir.
    template = json.loads((INFRA / "process-job-template.json").read_text())
    from jsonschema import validate

    for deployment in model.deployments:
        if deployment.work_pool.name == "sentcl-gpu-local":
            validate(deployment.work_pool.job_variables, template["variables"])
    assert template["job_configuration"]["command"] is None
    assert not {"command", "env", "working_dir"} & set(template["variables"]["properties"])
    assert template["variables"]["additionalProperties"] is False
    k8s = json.loads((INFRA / "k8s" / "base-job-template.json").read_text())["variables"]
    assert "command" not in k8s["properties"] and k8s["additionalProperties"] is False
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
    assert {"postgres", "prefect-server", "mlflow", "minio", "gpu-worker", "gate"} <= set(services)
    mlflow_cmd = " ".join(services["mlflow"]["command"])
    assert "postgresql://" in mlflow_cmd and "s3://" in mlflow_cmd
    assert (
        "postgresql+asyncpg://"
        in services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    )
    assert services["gpu-worker"]["build"]["dockerfile"] == "infra/Dockerfile"
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    for name, service in services.items():  # published on loopback unless the team names an address
        for port in service.get("ports", []):
            assert str(port).startswith(("127.0.0.1:", "${SENTCL_BIND_ADDRESS:-127.0.0.1}:")), (name, port)
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
    serve = (INFRA / "serve.sh").read_text() + (INFRA / "mlflow-server.sh").read_text()
    assert "0.0.0.0" not in serve
    assert (
        'PREFECT_HOST="${PREFECT_HOST:-127.0.0.1}"' in serve and 'HOST="${MLFLOW_HOST:-127.0.0.1}"' in serve
    )
    stop = (INFRA / "stop.sh").read_text() + (INFRA / "run-records.sh").read_text()
    assert "kill" in stop and ".pid" in stop and ".start" in stop


# ------------------------------------------------------------------------------ security, statically


def _compose_text() -> str:
    return (INFRA / "docker-compose.yml").read_text()


def test_every_compose_secret_is_required_never_defaulted():
    text = _compose_text()
    for match in re.finditer(r"(?<!\$)\$\{(\w+)(:?[-?])?([^}]*)\}", text):  # $${X}: the container's shell
        name, op = match.group(1), match.group(2)
        if re.search(r"PASSWORD|SECRET|AUTH_STRING|ACCESS_KEY|_KEY$", name) and name not in (
            "SENTCL_TEAM_PASSWORD",  # optional account: empty means none is created
        ):
            assert op == ":?", f"{match.group(0)} must be ${{{name}:?...}}: no default password"
    assert "change-me" not in text.lower()


def test_minio_root_is_not_the_applications_key():
    services = load("docker-compose.yml")["services"]
    minio = services["minio"]["environment"]
    assert "MINIO_ROOT_USER" in minio["MINIO_ROOT_USER"] and "S3_ACCESS_KEY" not in minio["MINIO_ROOT_USER"]
    for name in ("mlflow", "gpu-worker"):
        assert "S3_ACCESS_KEY" in services[name]["environment"]["AWS_ACCESS_KEY_ID"]


def test_compose_servers_ask_for_credentials_and_take_allowed_hosts_from_the_environment():
    services = load("docker-compose.yml")["services"]
    mlflow = services["mlflow"]
    command = " ".join(mlflow["command"])
    assert "--app-name basic-auth" in command
    assert (
        "MLFLOW_ALLOWED_HOSTS" in command
        and "MLFLOW_ALLOWED_HOSTS:?" in mlflow["environment"]["MLFLOW_ALLOWED_HOSTS"]
    )
    # No password in the server's argv (`ps` shows it to every user); the admin's is dropped before exec.
    server_line = next(line for line in command.splitlines() if "mlflow server" in line)
    assert "${POSTGRES_PASSWORD}" not in server_line and "postgresql://" not in server_line
    assert "env -u MLFLOW_AUTH_ADMIN_PASSWORD" in server_line
    prefect = services["prefect-server"]["environment"]
    assert "PREFECT_AUTH_STRING:?" in prefect["PREFECT_SERVER_API_AUTH_STRING"]
    assert prefect["PREFECT_SERVER_CSRF_PROTECTION_ENABLED"] == "true"
    assert "PREFECT_UI_ORIGIN" in prefect["PREFECT_SERVER_CORS_ALLOWED_ORIGINS"]
    worker = services["gpu-worker"]["environment"]
    assert "PREFECT_AUTH_STRING" in worker["PREFECT_API_AUTH_STRING"]
    assert "sentcl_mlflow.auth setup" in " ".join(_shell_lines(services["mlflow-setup"]))


def test_compose_gives_the_worker_the_registrar_and_the_gate_password_to_the_gate_service_alone():
    """As under `make serve`: the worker and its flow runs hold the registrar's account; the gate service runs
    the gatekeeper with the gate's password on its stdin, from a secret file no other long-running service
    mounts; no service has that password in its environment."""
    compose = load("docker-compose.yml")
    services = compose["services"]
    worker = services["gpu-worker"]
    assert "SENTCL_REGISTRAR_USER:?" in worker["environment"]["MLFLOW_TRACKING_USERNAME"]
    assert "SENTCL_REGISTRAR_PASSWORD:?" in worker["environment"]["MLFLOW_TRACKING_PASSWORD"]
    assert worker["environment"]["SENTCL_REGISTRY_ROLE"] == "registrar"
    for name, service in services.items():
        environment = json.dumps(service.get("environment") or {})
        assert "SENTCL_GATE_PASSWORD" not in environment, f"{name} has the gate's password in its environment"
        if name not in ("gate", "mlflow-setup"):
            assert "gate_password" not in json.dumps(service.get("secrets") or []), name
    assert compose["secrets"]["gate_password"] == {"environment": "SENTCL_GATE_PASSWORD"}
    gate = " ".join(_shell_lines(services["gate"]))
    assert "python -m sentcl_mlflow.registry.gatekeeper --password-stdin < /run/secrets/gate_password" in gate
    assert services["gate"]["secrets"] == ["gate_password"]
    assert "SENTCL_GATE_USER:?" in services["gate"]["environment"]["SENTCL_GATE_USER"]
    # The gate scores on the pairs the worker's validate stage writes (read-only for it).
    assert (
        "data:/opt/sentcl/data" in worker["volumes"]
        and "data:/opt/sentcl/data:ro" in services["gate"]["volumes"]
    )
    setup = services["mlflow-setup"]
    assert "/run/secrets/gate_password" in " ".join(_shell_lines(setup)) and "--env-stdin" in " ".join(
        _shell_lines(setup)
    )
    assert "SENTCL_REGISTRAR_PASSWORD:?" in setup["environment"]["SENTCL_REGISTRAR_PASSWORD"]


def test_kubernetes_jobs_hold_the_registrar_and_the_gate_deployment_alone_the_gate_password():
    """The flow-run Jobs get `sentcl-secrets` (the registrar's account); the gate Deployment alone mounts the
    Secret `sentcl-gate`, as a file piped to the gatekeeper's stdin, never as an environment variable."""
    template = json.loads((INFRA / "k8s" / "base-job-template.json").read_text())
    job = json.dumps(template)
    assert "sentcl-gate" not in job  # neither the gate's Secret nor its account
    secrets = {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all((INFRA / "k8s" / "secrets.example.yaml").read_text())
    }
    flow_runs = secrets["sentcl-secrets"]["stringData"]
    assert (
        flow_runs["MLFLOW_TRACKING_USERNAME"] == "sentcl-registrar"
        and flow_runs["SENTCL_REGISTRY_ROLE"] == "registrar"
    )
    assert not {k for k in flow_runs if "GATE" in k}
    assert set(secrets["sentcl-gate"]["stringData"]) == {"user", "password"}
    # Secrets are namespaced: the gate's lives in the gate's namespace, and no Job can be placed there.
    jobs_namespace = template["variables"]["properties"]["namespace"]
    assert (
        jobs_namespace["enum"]
        == [jobs_namespace["default"]]
        == [secrets["sentcl-secrets"]["metadata"]["namespace"]]
    )
    gate_docs = list(yaml.safe_load_all((INFRA / "k8s" / "gate.yaml").read_text()))
    gate_namespace = next(d for d in gate_docs if d["kind"] == "Namespace")["metadata"]["name"]
    assert gate_namespace != jobs_namespace["default"]
    assert secrets["sentcl-gate"]["metadata"]["namespace"] == gate_namespace
    assert secrets["sentcl-gate-s3"]["metadata"]["namespace"] == gate_namespace
    k8s_env = next(d for d in load("prefect.yaml")["deployments"] if d["name"] == "retrain-k8s")
    assert k8s_env["work_pool"]["job_variables"]["env"]["SENTCL_REGISTRY_ROLE"] == "registrar"
    deployment = next(d for d in gate_docs if d["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == gate_namespace
    pod = deployment["spec"]["template"]["spec"]
    (gate,) = pod["containers"]
    assert (
        "python -m sentcl_mlflow.registry.gatekeeper --password-stdin < /run/secrets/sentcl-gate/password"
        in (" ".join(gate["command"]))
    )
    mounted = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in gate["volumeMounts"] if m["mountPath"] == "/run/secrets/sentcl-gate")
    assert mounted[mount["name"]]["secret"]["secretName"] == "sentcl-gate"
    for container in pod["containers"] + pod.get("initContainers", []):
        for variable in container.get("env", []):
            ref = (variable.get("valueFrom") or {}).get("secretKeyRef") or {}
            assert not (ref.get("name") == "sentcl-gate" and ref.get("key") == "password"), container["name"]
        assert not container.get("envFrom"), container["name"]
    assert pod["automountServiceAccountToken"] is False


SERVE_SECRETS = {
    "PREFECT_AUTH_STRING",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "SENTCL_REGISTRAR_PASSWORD",
}


def test_env_example_names_every_secret_and_dot_env_stays_out_of_git_and_images():
    compose_example = (INFRA / "compose.env.example").read_text()
    secret_sources = [s["environment"] for s in load("docker-compose.yml")["secrets"].values()]
    for name in set(re.findall(r"\$\{(\w+):\?", _compose_text())) | set(secret_sources):
        assert re.search(rf"^{name}=", compose_example, re.M), f"compose.env.example lacks {name}"
    # make serve's file names its secrets and none of compose's own keys (which would change make serve).
    example = (ROOT / ".env.example").read_text()
    keys = set(re.findall(r"^(\w+)=", example, re.M))
    assert SERVE_SECRETS <= keys
    assert "SENTCL_GATE_PASSWORD" not in keys  # make serve refuses a .env that holds it
    assert not keys & {"MLFLOW_ALLOWED_HOSTS", "PREFECT_UI_ORIGIN", "POSTGRES_PASSWORD", "S3_SECRET_KEY"}
    ignored = subprocess.run(
        ["git", "check-ignore", ".env", "infra/.env", "infra/k8s/secrets.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == [".env", "infra/.env", "infra/k8s/secrets.yaml"]
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    for entry in (".dvc/cache", ".dvc/config.local", ".env", "mlflow.db*", "mlartifacts"):
        assert entry in dockerignore, entry


def test_serve_reads_secrets_from_the_environment_and_runs_mlflow_with_basic_auth():
    serve = (
        INFRA / "serve.sh"
    ).read_text()  # a missing secret: tests/services/test_serve_secrets.py runs the refusal
    # .env is parsed, never sourced nor exported wholesale: the one file serve.sh sources is its own helpers.
    assert re.findall(r"^\s*(?:source|\.)\s+(\S+)", serve, re.M) == ["infra/run-records.sh"]
    assert "set -a" not in serve
    assert (
        "PREFECT_SERVER_API_AUTH_STRING=" in serve and "PREFECT_SERVER_CSRF_PROTECTION_ENABLED=true" in serve
    )
    assert "--app-name basic-auth" in (INFRA / "mlflow-server.sh").read_text()
    # The worker and its flow runs use the HTTP server as the registrar, never as the gate.
    assert 'MLFLOW_TRACKING_USERNAME="$SENTCL_REGISTRAR_USER"' in serve
    assert 'MLFLOW_TRACKING_USERNAME="$SENTCL_GATE_USER"' not in serve
    assert 'MLFLOW_TRACKING_PASSWORD="$SENTCL_GATE_PASSWORD"' not in serve


def test_worker_image_has_python_3_11():
    dockerfile = (INFRA / "Dockerfile").read_text()
    bases = dict(
        (m.group(2), m.group(1)) for m in re.finditer(r"^FROM\s+(\S+)\s+AS\s+(\w+)", dockerfile, re.M)
    )
    for target in ("worker", "mlflow"):
        assert re.match(r"python:3\.11(\.\d+)?-", bases[target]), (target, bases[target])
    assert (
        "apt-get install" not in dockerfile
        or "python3.11" not in dockerfile.split("apt-get install")[1].split("\n")[0]
    )


def test_kubernetes_job_mounts_the_inbox_the_k8s_retrain_reads():
    template = json.loads((INFRA / "k8s" / "base-job-template.json").read_text())
    spec = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    retrain_k8s = next(d for d in load("prefect.yaml")["deployments"] if d["name"] == "retrain-k8s")
    inbox = retrain_k8s["parameters"]["domain_text"]
    name = next(n for n, path in mounts.items() if inbox == path or inbox.startswith(path + "/"))
    assert "persistentVolumeClaim" in volumes[name]
    assert retrain_k8s["work_pool"]["job_variables"]["env"]["SENTCL_INBOX"] == inbox
    # Writable: the run archives what it read to <inbox>/processed/<date>/ (no state store).
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == name)
    assert not mount.get("readOnly") and not volumes[name]["persistentVolumeClaim"].get("readOnly")


def test_make_stop_leaves_a_reused_pid_alone(tmp_path):
    """A PID from .run/ that now belongs to another process (the PID was reused) is not signalled."""
    import os
    import sys

    run = tmp_path / "run"
    run.mkdir()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run / "worker.pid").write_text(str(stranger.pid))
        (run / "worker.cmdline").write_text(
            "/opt/venv/bin/python /opt/venv/bin/prefect worker start --pool x "
        )
        out = subprocess.run(
            ["bash", "infra/stop.sh"],
            cwd=ROOT,
            env={**os.environ, "SENTCL_RUN_DIR": str(run)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"worker (pid {stranger.pid}) now runs" in out.stdout and "PID reused" in out.stdout
        assert stranger.poll() is None  # alive: never signalled
    finally:
        stranger.kill()
        stranger.wait(10)


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


def _csrf_headers(port: int, auth: str) -> dict[str, str]:
    """Prefect's CSRF protection is on under make serve: a state-changing request (POST, filters too)
    carries a token fetched for a client id, as Prefect's own client does."""
    import urllib.request

    if not auth:
        return {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/csrf-token?client=sentcl-test", headers={"Authorization": auth}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        token = json.load(response)["token"]
    return {"Authorization": auth, "Prefect-Csrf-Token": token, "Prefect-Csrf-Client": "sentcl-test"}


def _post_prefect(port: int, auth: str, path: str, body: dict | None = None, method: str = "POST") -> dict:
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **_csrf_headers(port, auth)},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _wait_for_event_run(port: int, deadline_s: float, auth: str = "") -> list[dict]:
    import time
    import urllib.request

    body = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED"]}}}}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/flow_runs/filter",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **_csrf_headers(port, auth)},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            runs = [r for r in json.load(response) if r["parameters"].get("trigger") == "event"]
        if runs:
            return runs
        time.sleep(2)
    return []


SECRETS = {
    "PREFECT_AUTH_STRING": "admin:serve-test-secret",
    "MLFLOW_AUTH_ADMIN_PASSWORD": "serve-test-admin-1",
    "MLFLOW_FLASK_SERVER_SECRET_KEY": "serve-test-flask",
    "SENTCL_REGISTRAR_PASSWORD": "serve-test-registrar-1",
    "SENTCL_TEAM_PASSWORD": "serve-test-team-1",
}
# Given in the environment of make serve, never in .env (serve refuses that).
GATE_PASSWORD = "serve-test-gate-1"
# What each process may hold (every other secret must be absent from its /proc/<pid>/environ). The gate's
# password is in none: the gate process reads it from its stdin.
ALLOWED = {
    "prefect-server": {"PREFECT_AUTH_STRING"},
    "mlflow-server": {"MLFLOW_FLASK_SERVER_SECRET_KEY"},
    "worker": {"PREFECT_AUTH_STRING", "SENTCL_REGISTRAR_PASSWORD"},
    "watcher": {"PREFECT_AUTH_STRING"},
    "gate": set(),
}


def serve_env(
    tmp_path: Path, env_file: Path, prefect_port: int, mlflow_port: int, **extra: str
) -> dict[str, str]:
    """The environment of a test's `make serve`: this venv; its run folder (``tmp_path``/run), stores and inbox
    under ``tmp_path``; its secrets from ``env_file`` and the gate's password in the environment (never .env);
    the caller's own secrets, tracking URI, Prefect URL and MLflow login removed; plus ``extra``."""
    env = dict(
        os.environ,
        VENV=str(Path(sys.executable).parent.parent),
        SENTCL_RUN_DIR=str(tmp_path / "run"),
        SENTCL_ENV_FILE=str(env_file),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_PORT=str(prefect_port),
        MLFLOW_PORT=str(mlflow_port),
        SENTCL_MLFLOW_BACKEND=f"sqlite:///{tmp_path / 'mlflow.db'}",
        SENTCL_INBOX=str(tmp_path / "inbox"),
        SENTCL_GATE_PASSWORD=GATE_PASSWORD,
        **extra,
    )
    for key in (*SECRETS, "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "MLFLOW_TRACKING_USERNAME"):
        env.pop(key, None)
    env.pop("MLFLOW_TRACKING_PASSWORD", None)
    return env


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def _serve(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "infra/serve.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_make_serve_starts_every_server_on_loopback_and_make_stop_ends_them(tmp_path):
    import base64
    import os
    import signal
    import urllib.error
    import urllib.request

    prefect_port, mlflow_port = _free_port(), _free_port()
    # The documented set-up: one .env with the secrets, plus compose-only keys make serve must ignore.
    env_file = tmp_path / "dot.env"
    env_file.write_text(
        "".join(f"{k}={v}\n" for k, v in SECRETS.items())
        + "SENTCL_TEAM_USER=teammate\n"
        + "# compose only\nMLFLOW_ALLOWED_HOSTS=mlops.example.internal:5000\n"
        + "PREFECT_UI_ORIGIN=http://evil.example\nPOSTGRES_PASSWORD='compose-pg-secret'\n"
    )
    env_file.chmod(0o600)  # serve refuses a .env other users can read
    # S3_SECRET_KEY: the caller's own, in its shell: passed to nothing.
    env = serve_env(tmp_path, env_file, prefect_port, mlflow_port, S3_SECRET_KEY="callers-own-s3-secret")
    pids: dict[str, int] = {}
    try:
        serve = _serve(env)
        assert serve.returncode == 0, serve.stdout + serve.stderr
        assert "serve: ready" in serve.stdout
        pids = {p.stem: int(p.read_text()) for p in (tmp_path / "run").glob("*.pid")}
        assert set(pids) == {"prefect-server", "mlflow-server", "worker", "watcher", "gate"}
        assert _answers(f"http://127.0.0.1:{mlflow_port}/health")  # compose's allowed hosts not applied
        auth = "Basic " + base64.b64encode(b"admin:serve-test-secret").decode()
        # Both servers refuse a request without credentials.
        for url in (
            f"http://127.0.0.1:{prefect_port}/api/admin/version",
            f"http://127.0.0.1:{mlflow_port}/api/2.0/mlflow/experiments/search?max_results=1",
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10)
            assert refused.value.code == 401, url
        # Each process holds its own secrets and no other (compose's and the caller's stray ones: none).
        for name, pid in pids.items():
            environ = _environ(pid)
            for key, value in SECRETS.items():
                assert (value.encode() in environ) == (key in ALLOWED[name]), (name, key)
            assert b"compose-pg-secret" not in environ and b"callers-own-s3-secret" not in environ, name
            assert GATE_PASSWORD.encode() not in environ, name
        server_env = _environ(pids["prefect-server"]).split(b"\0")
        assert f"PREFECT_SERVER_CORS_ALLOWED_ORIGINS=http://127.0.0.1:{prefect_port}".encode() in server_env
        # The run files with secrets in them: the owner's alone.
        for secret_file in ("mlflow-auth.ini", "mlflow-users.db"):
            assert (tmp_path / "run" / secret_file).stat().st_mode & 0o077 == 0, secret_file
        assert (tmp_path / "run").stat().st_mode & 0o077 == 0  # the run folder itself: 0700
        # Inside the worker's sandbox the run folder and the Prefect server's home (its database) are empty
        # tmpfs mounts: not readable, and no folder the worker cannot enter (DVC's walk of the checkout failed on
        # the server's home, 0700 root's, in a real retrain when it sat in the checkout as `.prefect/`).
        sandboxed = [
            pid
            for pid in _processes_with(str(tmp_path / "run").encode())
            if b"PREFECT_HOME=/dev/shm/home/.prefect" in _environ(pid).split(b"\0")
        ]
        assert sandboxed, "no process of the worker's sandbox found"
        mounts = {
            line.split()[4]: line.split(" - ")[1].split()[0]
            for line in Path(f"/proc/{sandboxed[0]}/mountinfo").read_text().splitlines()
        }
        for hidden in (tmp_path / "run", tmp_path / "prefect"):
            assert mounts.get(str(hidden.resolve())) == "tmpfs", (hidden, sorted(mounts))
        # The worker runs as the registrar's account against the HTTP server, not the sqlite file.
        worker_env = _environ(pids["worker"]).split(b"\0")
        assert f"MLFLOW_TRACKING_URI=http://127.0.0.1:{mlflow_port}".encode() in worker_env
        assert b"MLFLOW_TRACKING_USERNAME=sentcl-registrar" in worker_env
        request = urllib.request.Request(
            f"http://127.0.0.1:{prefect_port}/api/deployments/filter",
            data=b"{}",
            headers={"Content-Type": "application/json", **_csrf_headers(prefect_port, auth)},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            deployments = {d["name"]: d for d in json.load(response)}
        assert {"retrain-local", "pipeline-local"} <= set(deployments)
        assert "promote-local" not in deployments
        assert deployments["retrain-local"]["schedules"], "the retrain deployment has its cron schedule"
        assert "is not defined in prefect.yaml" not in serve.stdout  # a fresh server holds only its own

        # A file landing in the inbox: watcher event -> deployment trigger -> worker -> a retrain flow run,
        # which refuses all-duplicate text before training (so the test stays short and changes nothing).
        (tmp_path / "inbox" / "dupes.txt").write_text("same line\nsame line\n")
        runs = _wait_for_event_run(prefect_port, deadline_s=120, auth=auth)
        assert runs and runs[0]["state_type"] == "FAILED", runs
        assert runs[0]["parameters"]["domain_text"] == str(tmp_path / "inbox" / "dupes.txt")
        # For the reason it should fail (the worker's sandbox let it read the text and the code), nothing else.
        assert "after deduplication" in (runs[0]["state"] or {}).get("message", ""), runs[0]["state"]

        # A deployment and a work pool prefect.yaml does not define (what an old checkout or a teammate left):
        # the next `make serve` names each with a warning and removes neither.
        _post_prefect(prefect_port, auth, "work_pools/", {"name": "stray-pool", "type": "process"})
        flow_id = _post_prefect(prefect_port, auth, "flows/", {"name": "stray-flow"})["id"]
        _post_prefect(prefect_port, auth, "deployments/", {"name": "stray-deployment", "flow_id": flow_id})

        # MLflow crashes; `make serve` again: what runs is left alone, the crashed server starts again and the
        # account setup (already done) succeeds a second time.
        os.kill(pids["mlflow-server"], signal.SIGKILL)
        again = _serve(env)
        assert again.returncode == 0, again.stdout + again.stderr
        warnings = [line for line in again.stdout.splitlines() if "is not defined in prefect.yaml" in line]
        assert len(warnings) == 2, again.stdout
        assert "serve: warning: deployment stray-flow/stray-deployment" in warnings[0]
        assert "serve: warning: work pool stray-pool (type process)" in warnings[1]
        _post_prefect(prefect_port, auth, "work_pools/stray-pool", method="GET")  # still there
        assert "mlflow-server" in again.stdout and "starting it again" in again.stdout
        for name in ("prefect-server", "worker", "watcher", "gate"):
            assert f"serve: {name} already running (pid {pids[name]})" in again.stdout
        pids["mlflow-server"] = int((tmp_path / "run" / "mlflow-server.pid").read_text())
        assert _answers(f"http://127.0.0.1:{mlflow_port}/health")
        assert b"serve-test-admin-1" not in _environ(pids["mlflow-server"])
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


# ------------------------------------------------------- MinIO: no secret in an argv, a policy of its own buckets

SECRET_NAME = re.compile(r"PASSWORD|SECRET")  # MINIO_ROOT_PASSWORD, S3_SECRET_KEY, POSTGRES_PASSWORD, ...


def _shell_lines(service: dict) -> list[str]:
    """The shell text a service runs (command, entrypoint, healthcheck), as compose hands it to the shell."""
    texts = []
    for key in ("command", "entrypoint"):
        value = service.get(key)
        if value:
            texts.append(value if isinstance(value, str) else " ".join(map(str, value)))
    test = (service.get("healthcheck") or {}).get("test")
    if test:
        texts.append(test if isinstance(test, str) else " ".join(map(str, test)))
    return texts


def _simple_commands(script: str) -> list[str]:
    return [part.strip() for part in re.split(r"&&|\|\||[|;\n]", script) if part.strip()]


def test_no_minio_secret_is_expanded_into_an_mc_command_line():
    """mc reads root's credentials from MC_HOST_local and the applications' secret from its stdin. A secret
    is expanded only by a shell builtin (printf, piped into `mc admin user add`; export), never into the
    argv of a program."""
    text = _compose_text()
    services = load("docker-compose.yml")["services"]
    mc_commands = []
    for name, service in services.items():
        for script in _shell_lines(service):
            # A compose-time ${SECRET} in a command is its value in the shell's own argv.
            for match in re.finditer(r"(?<!\$)\$\{?(\w+)", script.replace("$$", "")):
                assert not SECRET_NAME.search(match.group(1)), f"{name}: {match.group(0)} in its command line"
            for command in _simple_commands(script):
                words = command.split()
                if words[0] == "mc":
                    mc_commands.append(command)
                    assert not SECRET_NAME.search(command) and "MINIO_ROOT_USER" not in command, (
                        f"{name}: a secret in mc's argv: {command}"
                    )
                elif re.search(r"\$\$\{?\w*(PASSWORD|SECRET)", command):  # the shell expands a secret:
                    assert words[0] in ("printf", "export"), f"{name}: a secret in the argv of {command}"
    assert any(c.startswith("mc admin user add local") for c in mc_commands)
    script = " ".join(_shell_lines(services["create-buckets"]))
    assert re.search(r'printf [^|]*"\$\$\{S3_SECRET_KEY\}" \| mc admin user add local\s', script)
    env = services["create-buckets"]["environment"]
    assert set(env) == {"MC_HOST_local", "S3_ACCESS_KEY", "S3_SECRET_KEY"}
    assert re.fullmatch(
        r"http://\$\{MINIO_ROOT_USER:\?[^}]*\}:\$\{MINIO_ROOT_PASSWORD:\?[^}]*\}@minio:9000",
        env["MC_HOST_local"],
    )
    assert "mc alias set" not in text


def test_the_applications_s3_key_has_a_policy_of_its_own_buckets_only():
    """Not MinIO's `readwrite` (every bucket): infra/minio-app-policy.json names the two buckets compose
    creates (MLflow's artifacts, DVC's remote), object and listing actions only, and is what gets attached."""
    policy = json.loads((INFRA / "minio-app-policy.json").read_text())
    services = load("docker-compose.yml")["services"]
    script = " ".join(_shell_lines(services["create-buckets"]))
    created = set(re.search(r"mc mb --ignore-existing ((?:local/[\w-]+ ?)+)", script).group(1).split())
    buckets = {b.removeprefix("local/") for b in created}
    assert buckets == {"mlflow", "sentcl-dvc"}
    shared = re.search(r"url = s3://([^/\s]+)/", (ROOT / ".dvc" / "config").read_text()).group(1)
    assert shared in buckets  # `dvc push -r shared` reaches a bucket compose creates and the key may write
    assert "--artifacts-destination s3://mlflow/" in " ".join(services["mlflow"]["command"])
    resources, actions = set(), set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        resources |= set(statement["Resource"])
        actions |= set(statement["Action"])
    assert resources == {f"arn:aws:s3:::{b}" for b in buckets} | {f"arn:aws:s3:::{b}/*" for b in buckets}
    assert all(a.startswith("s3:") and "*" not in a for a in actions), actions
    assert {"s3:GetObject", "s3:PutObject", "s3:ListBucket"} <= actions
    assert not actions & {"s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketPolicy"}
    assert (
        "./minio-app-policy.json:/etc/sentcl/minio-app-policy.json:ro"
        in services["create-buckets"]["volumes"]
    )
    assert "mc admin policy create local sentcl-app /etc/sentcl/minio-app-policy.json" in script
    assert 'mc admin policy attach local sentcl-app --user "$${S3_ACCESS_KEY}"' in script
    assert "attach local readwrite" not in script and "detach local readwrite" in script


def _processes_with(marker: bytes) -> set[int]:
    """PIDs whose environment holds ``marker`` (every process a test's make serve started inherits its
    SENTCL_RUN_DIR), sandboxed ones included (root reads every /proc/<pid>/environ)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_make_serve_killed_mid_start_is_cleaned_up_by_the_next_and_make_stop_leaves_nothing(tmp_path):
    """`make serve` killed (its whole process group, -9) once MLflow is starting: the servers it had started run
    on. The next `make serve` finds them by their records (PID and start time), stops them, starts clean and is
    ready; `make stop` then ends everything, and no process of either serve is left. gate.log is appended to."""
    import signal
    import time

    if os.geteuid() != 0:
        pytest.skip("reads every process's environment (the worker's account's too)")
    prefect_port, mlflow_port = _free_port(), _free_port()
    env_file = tmp_path / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    env_file.chmod(0o600)
    env = serve_env(tmp_path, env_file, prefect_port, mlflow_port)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "gate.log").write_text("gate: a line from an earlier run\n")
    marker = f"SENTCL_RUN_DIR={run}".encode()
    # -o setup: the test's .venv as it is (a tree newer than its install stamp would reinstall into it).
    make = ["make", "--no-print-directory", "-o", "setup", f"VENV={env['VENV']}"]
    first = subprocess.Popen(
        [*make, "serve"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        for line in first.stdout:
            if line.startswith("serve: mlflow-server started"):
                break
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        # What it started runs on: MLflow finishes starting (its wrapper script has exec'd the server by then).
        deadline = time.monotonic() + 180
        while not _answers(f"http://127.0.0.1:{mlflow_port}/health"):
            assert time.monotonic() < deadline, "the interrupted serve's MLflow never answered"
            time.sleep(1)
        left = _processes_with(marker)
        assert left, (
            "the interrupted make serve left nothing running: the test did not interrupt it mid-start"
        )
        again = subprocess.run(
            [*make, "serve"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert again.returncode == 0, again.stdout + again.stderr
        assert "the last make serve was interrupted before it was ready" in again.stdout, again.stdout
        for name in ("prefect-server", "mlflow-server"):
            assert re.search(rf"^stop: {name} \(pid \d+\) stopped$", again.stdout, re.M), again.stdout
        assert "serve: ready" in again.stdout
        assert not left & _processes_with(marker), "a process of the interrupted serve is still running"
        log = (run / "gate.log").read_text()
        assert log.startswith("gate: a line from an earlier run\n") and "gate: watching" in log, log
    finally:
        stop = subprocess.run([*make, "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    deadline = time.monotonic() + 20
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_with(marker), (stop.stdout, _processes_with(marker))


# Run in a folder holding only what the compose MLflow image copies, on PYTHONPATH as the image sets it.
NAME_RULE_PROBE = r"""
import json, sys
import mlflow.server.auth  # the server's own app: what it imports comes with `mlflow[auth]`
before = set(sys.modules)
import sentcl, sentcl_mlflow.auth as auth
names = auth._protected_names()
routes = auth._name_routes()
print(json.dumps({
    "sentcl": sentcl.__file__, "auth": auth.__file__, "names": names, "routes": len(routes),
    "cyrillic": auth.name_problem("s\u0435ntcl-encoder", names),
    "new": sorted({m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)),
}))
"""


def test_compose_mlflow_runs_the_name_rule_from_what_its_image_holds(tmp_path):
    """Compose's MLflow server names sentcl's authorization function, and its image (the Dockerfile's mlflow
    target) holds what that function imports: the COPY'd folders and files, run from there, load the rule and
    refuse a Cyrillic lookalike; every package they import beyond MLflow's own is one the image installs."""
    command = " ".join(load("docker-compose.yml")["services"]["mlflow"]["command"])
    assert "authorization_function = sentcl_mlflow.auth:authenticate_request\\n" in command
    dockerfile = (INFRA / "Dockerfile").read_text()
    stage = dockerfile.split("AS mlflow", 1)[1].split("\nFROM ", 1)[0]
    assert "ENV PYTHONPATH=/opt/sentcl" in stage and "WORKDIR /opt/sentcl" in stage
    copied = re.findall(r"^COPY (\S+) \./", stage, re.M)
    assert copied, stage
    for path in copied:
        source = ROOT / path
        target = tmp_path / path
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    installed = re.search(r"pip install(?:[^\n]*\\\n)*[^\n]*", stage).group(0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SENTCL_"))}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", NAME_RULE_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["sentcl"].startswith(str(tmp_path)) and out["auth"].startswith(str(tmp_path))
    assert "sentcl-encoder" in out["names"] and out["routes"] > 0
    assert out["cyrillic"] and "reads the same" in out["cyrillic"]
    distributions = {"yaml": "pyyaml", "confusable_homoglyphs": "confusable-homoglyphs"}
    for module in set(out["new"]) - {"sentcl", "sentcl_mlflow"}:
        assert distributions.get(module, module) in installed, (module, installed)
