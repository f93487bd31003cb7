"""`make run`, then `make serve` on the same checkout: a file dropped in the inbox is retrained on, and its
candidate is registered and judged by the gate process (issue 58, finding 4).

`make run` tracks into the checkout's sqlite store with no server: the experiments it creates (``sentcl``,
``sentcl-production``) keep their artifacts in ``<checkout>/mlartifacts``. Under `make serve` the flow runs work
in the worker's sandbox, where that folder is read-only (the registrar must not write production files), so
their artifacts have to go through the MLflow server, which checks the registrar's account on every upload.

The make-run state is built the fast way: tiny models and data inside a copy of the checkout, the starting model
registered and made champion by the evaluate, export and register stages against the local store, as `make run`
ends. Then the real `make serve` (infra/serve.sh: Prefect, MLflow, the gate process, the sandboxed worker, the
inbox watcher), a text file in the inbox, and a run of the retrain deployment on it with the parameters of the
inbox event plus ``processed`` (the tiny data are not what dvc.lock records, so the flow's `dvc repro validate`
would fetch the real data; the watcher's event is tested in tests/services/test_infra.py). Marked slow: about 5 minutes on
2 busy cores.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig
from sentcl_mlflow import store
from sentcl_mlflow.registry.names import production_experiment
from tests.services.test_gate_attacks import _copy_checkout
from tests.services.test_infra import SECRETS, _free_port, _post_prefect, serve_env
from tests.tiny import make_tiny_encoder, tiny_sentences, write_tiny_processed

pytestmark = pytest.mark.slow

CONFIG = GateConfig.from_params(read_params())
REGISTRAR = ("sentcl-registrar", SECRETS["SENTCL_REGISTRAR_PASSWORD"])


def _tiny_params(checkout: Path, model: Path, teacher: Path) -> Path:
    """The checkout's params.yaml on the tiny models: the nightly retrain recipe of
    tests/services/test_flows.py (distilled on held-out parts, a trained candidate registered), a gate that
    rejects it (min_delta 1000): what is tested is that it is registered and judged, not promoted."""
    import yaml

    path = checkout / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params["seed"], params["model"] = 1, {"name": str(model), "max_length": 12}
    params["train"].update(eval_steps=1, patience=10, device="cpu", bf16=False, min_delta=0.0)
    params["transfer"].update(steps=2, batch_size=8, lr=1e-3, eval_steps=1)
    params["teacher"].update(model=str(teacher), backend="torch")
    params["registry"].update(max_dev_drop=100.0, min_delta=1000.0, min_domain_delta=1000.0)
    params["retrain"]["method"] = "distill"
    params["retrain"]["heldout_share"] = 0.5
    recipe = {"examples": "sentences", "group_weight": 1.0}
    distill = {"steps": 8, "eval_steps": 1, "lr": 2e-3, "batch_size": 16, "distill": recipe}
    params["retrain"]["transfer"]["distillation"].update(distill)
    path.write_text(yaml.safe_dump(params))
    return path


def _candidate_version(mlc, seconds: float) -> str | None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        versions = list(mlc.search_model_versions(f"name='{CONFIG.candidate_model_name}'"))
        if versions:
            return str(max(int(v.version) for v in versions))
        time.sleep(3)
    return None


def _logs(run: Path) -> str:
    return "\n".join(
        f"--- {name}.log (tail) ---\n" + (run / f"{name}.log").read_text()[-4000:]
        for name in ("worker", "gate")
        if (run / f"{name}.log").exists()
    )


def test_a_retrain_under_make_serve_registers_its_candidate_after_make_run(tmp_path_factory, monkeypatch):
    from mlflow import MlflowClient

    from benchmarks.bench_nightly import register_starting_model
    from sentcl_mlflow.registry.gatekeeper import verdict
    from tests.services.test_auth import as_user
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval
    from tests.unit.training.test_distill import make_tiny_teacher

    base = Path(tempfile.mkdtemp(prefix="sentcl-after-run-"))  # under /tmp, reachable by the worker's account
    base.chmod(0o755)
    checkout = _copy_checkout(base / "checkout")
    work = tmp_path_factory.mktemp("after-run")
    # Everything the retrain reads lies in the checkout: the worker's sandbox shows it (read-only) and its outputs.
    hub = checkout / "models" / "tiny"
    params_file = _tiny_params(checkout, make_tiny_encoder(hub), make_tiny_teacher(hub))
    processed = write_tiny_processed(checkout / "data" / "processed")
    raw = checkout / "data" / "raw"
    write_mini_senteval(raw)
    local = f"sqlite:///{checkout / 'mlflow.db'}"  # `make run`'s store: no server, no MLFLOW_TRACKING_URI set
    env = dict(os.environ, MLFLOW_TRACKING_URI=local)
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(key, None)
    start = register_starting_model(read_params(params_file), work, env, raw, processed)
    assert start["gate"]["decision"] == "promoted" and start["registered_version"] == "1", start
    mlc = MlflowClient(tracking_uri=local, registry_uri=local)
    # The export's choice among the candidates reads this tag (never the gate): the trained one is registered.
    mlc.set_model_version_tag(CONFIG.model_name, "1", "stsb_dev", "-1000")
    # make run's training and evaluation stages log into the shared experiment (created here as they create it).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", local)
    store.experiment_id(mlc)
    for name in (store.EXPERIMENT, production_experiment()):  # what make run leaves: roots in the checkout
        assert mlc.get_experiment_by_name(name).artifact_location.startswith(
            (checkout / "mlartifacts").as_uri()
        )

    env_file = work / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    env_file.chmod(0o600)
    inbox = base / "inbox"
    prefect_port, mlflow_port = _free_port(), _free_port()
    env = serve_env(work, env_file, prefect_port, mlflow_port, SENTCL_GATE_INTERVAL_S="1")
    env |= {"SENTCL_MLFLOW_BACKEND": local, "SENTCL_INBOX": str(inbox)}  # make run's store, in the checkout
    try:
        began = time.monotonic()
        serve = subprocess.run(
            ["bash", "infra/serve.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
        )
        assert serve.returncode == 0, serve.stdout + serve.stderr
        served_s = time.monotonic() - began
        sentences = tiny_sentences(40, seed=9)
        inbox.mkdir(exist_ok=True)
        text = inbox / "domain.txt"
        text.write_text("\n".join(sentences + [s.upper() + " ." for s in sentences[:10]]) + "\n")
        text.chmod(0o644)
        # The retrain deployment, as the inbox event starts it, with the processed data named: the tiny data are
        # not the ones dvc.lock records, so the flow's own `dvc repro validate` would fetch the real ones.
        auth = "Basic " + base64.b64encode(SECRETS["PREFECT_AUTH_STRING"].encode()).decode()
        deployment = _post_prefect(
            prefect_port, auth, "deployments/name/sentcl-retrain/retrain-local", None, method="GET"
        )
        parameters = {"domain_text": str(text), "trigger": "event", "processed": str(processed)}
        _post_prefect(
            prefect_port, auth, f"deployments/{deployment['id']}/create_flow_run", {"parameters": parameters}
        )

        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{mlflow_port}")
        as_user(monkeypatch, REGISTRAR)
        served = store.client()
        version = _candidate_version(served, seconds=600)
        assert version is not None, (
            f"no candidate registered {time.monotonic() - began:.0f} s after make serve\n"
            + _logs(work / "run")
        )
        deadline = time.monotonic() + 300
        while (found := verdict(served, CONFIG.candidate_model_name, version)) is None:
            assert time.monotonic() < deadline, f"no verdict on candidate {version}\n" + _logs(work / "run")
            time.sleep(2)
        assert found["decision"] == "rejected", (found, _logs(work / "run"))  # judged: min_delta 1000
        candidate = served.get_model_version(CONFIG.candidate_model_name, version)
        assert candidate.tags.get("trigger") == "event", candidate.tags
        print(
            f"make serve {served_s:.0f} s; candidate {version} judged {time.monotonic() - began:.0f} s after"
        )
    finally:
        subprocess.run(
            ["bash", "infra/stop.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=180
        )
        shutil.rmtree(base, ignore_errors=True)
        store._configured = None
