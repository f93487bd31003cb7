"""The three ways around the gate, tried live under `make serve`: none moves ``champion`` or reads a secret.

`make serve` runs for real (infra/serve.sh: Prefect, MLflow with basic auth, the gate process polling every second,
the worker in its sandbox, the watcher) on a copy of this checkout under /tmp, so what the attacks plant cannot
touch the real one. The attackers are who the issue names: a holder of the Prefect auth string (a rogue
deployment whose pull step runs in the worker's sandbox), the registrar's account (every flow run holds it) and a
teammate's account. Candidates are tiny encoders logged the export stage's way and registered as the registrar
does; the gate scores them on a pairs table whose gold is the "good" encoder's own cosines.

1. A pull step replaces ``data/processed/pairs.parquet`` (a pipeline output the sandbox may write) with a link to
   ``.env`` and looks for the gate's copy of it (the MLflow admin password) to move ``champion`` with.
2. The registrar swaps a candidate's files, manifest tag and weights tag for a poor model's after the gate
   downloaded it and while it scores.
3. A teammate (and the registrar) PUT over the champion's files; the admin (or whoever holds the artifact store's
   keys) changes its ``pyfunc_encoder.py``, which must never run on load, and the gate puts the previous verified
   champion back.

Marked slow (`make test-all`): one `make serve` (about 2 minutes) and several judgments.
"""

from __future__ import annotations

import base64
import glob
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig, weight_file_digests, weights_fingerprint
from sentcl_mlflow import store
from sentcl_mlflow.registry.names import production_experiment
from tests.paths import ROOT
from tests.services.test_auth import as_user
from tests.services.test_gate_boundary import POOL, _wait_for_run
from tests.services.test_gatekeeper import _register
from tests.services.test_infra import SECRETS, _free_port, _post_prefect, serve_env
from tests.services.test_pyfunc_manifest import _load_in_a_process, log_tiny_pyfunc, register_tiny_pyfunc
from tests.services.test_registry import write_dev_pairs
from tests.tiny import make_tiny_encoder

pytestmark = pytest.mark.slow

CONFIG = GateConfig.from_params(read_params())
PROD, CANDIDATES = CONFIG.model_name, CONFIG.candidate_model_name
ADMIN = ("admin", SECRETS["MLFLOW_AUTH_ADMIN_PASSWORD"])
REGISTRAR = ("sentcl-registrar", SECRETS["SENTCL_REGISTRAR_PASSWORD"])
TEAM = ("teammate", SECRETS["SENTCL_TEAM_PASSWORD"])


def _copy_checkout(dest: Path) -> Path:
    """The files git knows of (tracked, and new ones not ignored), as they are in this working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`make serve` on a copy of the checkout; its run folder, stores and secrets outside the copy."""
    base = Path(tempfile.mkdtemp(prefix="sentcl-attacks-"))  # under /tmp, reachable by the worker's account
    base.chmod(0o755)
    checkout = _copy_checkout(base / "checkout")
    work = tmp_path_factory.mktemp("attacks")
    env_file = work / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()) + "SENTCL_TEAM_USER=teammate\n")
    env_file.chmod(0o600)
    prefect_port, mlflow_port = _free_port(), _free_port()
    env = serve_env(work, env_file, prefect_port, mlflow_port, SENTCL_GATE_INTERVAL_S="1")
    models = {
        name: make_tiny_encoder(work / name, "encoder", seed=seed, dropout=0.0)  # one folder name: one layout
        for name, seed in (("trigger", 5), ("first", 3), ("good", 11), ("poor", 12))
    }
    try:
        serve = subprocess.run(
            ["bash", "infra/serve.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
        )
        assert serve.returncode == 0, serve.stdout + serve.stderr
        yield {
            "checkout": checkout,
            "run": work / "run",
            "env_file": env_file,
            "prefect_port": prefect_port,
            "mlflow": f"http://127.0.0.1:{mlflow_port}",
            "work": work,
            **models,
        }
    finally:
        subprocess.run(
            ["bash", "infra/stop.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=180
        )
        shutil.rmtree(base, ignore_errors=True)
        store._configured = None


def _as(monkeypatch, served: dict, user: tuple[str, str]):  # noqa: ANN202 (an MlflowClient)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", served["mlflow"])
    as_user(monkeypatch, user)
    return store.client()


def _champion(mlc) -> str | None:  # noqa: ANN001
    from mlflow.exceptions import MlflowException

    try:
        return str(mlc.get_model_version_by_alias(PROD, "champion").version)
    except MlflowException:
        return None


def _verdict(mlc, version: str, seconds: float = 900) -> dict:  # noqa: ANN001
    """The gate's verdict (it scores 20,000 pairs per model: minutes on a loaded 2-core machine)."""
    from sentcl_mlflow.registry.gatekeeper import verdict

    deadline = time.monotonic() + seconds
    while (found := verdict(mlc, CANDIDATES, version)) is None:
        assert time.monotonic() < deadline, f"no verdict on {CANDIDATES} version {version}"
        time.sleep(1)
    return found


def _gate_log(served: dict) -> str:
    return (served["run"] / "gate.log").read_text()


# ------------------------------------------------------------------------------------------------ attack 1

ROGUE_PULL_STEP = r"""
import base64, glob, json, os, sys, time, urllib.request
checkout, dot_env, run_dir, prod, seconds = sys.argv[1:6]
processed = os.path.join(checkout, "data", "processed")
os.makedirs(processed, exist_ok=True)
target = os.path.join(processed, "pairs.parquet")
if os.path.lexists(target):
    os.remove(target)
os.symlink(dot_env, target)  # a pipeline output: the sandbox may write it
print("rogue: planted", flush=True)
password, deadline = None, time.time() + float(seconds)
while password is None and time.time() < deadline:  # wherever the gate might keep a copy of what it read
    for pattern in ("/tmp/sentcl-gate-*/**", "/tmp/*/pairs.parquet", os.path.join(run_dir, "**")):
        for path in glob.glob(pattern, recursive=True):
            try:
                text = open(path, "rb").read().decode("utf-8", "replace")
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("MLFLOW_AUTH_ADMIN_PASSWORD="):
                    password = line.split("=", 1)[1]
    time.sleep(0.5)
print("rogue: leaked=" + ("yes" if password else "no"), flush=True)
if password:  # as the admin: a version of production of its own, made champion
    uri = os.environ["MLFLOW_TRACKING_URI"]
    auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    def call(path, body):
        request = urllib.request.Request(uri + "/api/2.0/mlflow/" + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": auth})
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.load(response)
        except Exception as e:
            return getattr(e, "code", 0), {}
    call("registered-models/create", {"name": prod})
    _, made = call("model-versions/create", {"name": prod, "source": "rogue:/weights"})
    status, _ = call("registered-models/alias", {"name": prod, "alias": "champion",
                                                 "version": (made.get("model_version") or {}).get("version", "1")})
    print(f"rogue: champion-set={status}", flush=True)
"""


def _rogue_flow_run(served: dict, script: Path, args: list[str]) -> str:
    """A deployment the holder of the Prefect auth string makes: its pull step runs ``script`` in the worker's
    sandbox (as the worker's account). The flow itself (a forced promote) fails on the lease, as it must."""
    auth = "Basic " + base64.b64encode(SECRETS["PREFECT_AUTH_STRING"].encode()).decode()
    port = served["prefect_port"]
    command = " ".join([str(Path(sys.executable)), str(script), *args])
    flow_id = _post_prefect(port, auth, "flows/", {"name": "sentcl-promote"})["id"]
    deployment = _post_prefect(
        port,
        auth,
        "deployments/",
        {
            "name": f"rogue-{script.stem}",
            "flow_id": flow_id,
            "entrypoint": "flows/promote.py:promote_flow",
            "work_pool_name": POOL,
            "work_queue_name": "default",
            "parameters": {"force": True, "version": "1", "actor": "mallory"},
            "pull_steps": [
                {"prefect.deployments.steps.set_working_directory": {"directory": str(served["checkout"])}},
                {"prefect.deployments.steps.run_shell_script": {"script": command}},
            ],
        },
    )
    return _post_prefect(port, auth, f"deployments/{deployment['id']}/create_flow_run", {})["id"]


def test_a_link_planted_in_the_dev_pairs_is_never_followed_and_no_secret_reaches_the_sandbox(
    served, monkeypatch
):
    """Attack 1. The pull step links data/processed/pairs.parquet to .env; a candidate makes the gate read its
    dev pairs. The gate refuses the link in one line and reads nothing through it; the pull step, looking in
    /tmp and the run folder for a copy, finds no admin password, and champion does not exist."""
    checkout = served["checkout"]
    script = checkout / "rogue_pull_step.py"
    script.write_text(ROGUE_PULL_STEP)
    script.chmod(0o644)
    args = [str(checkout), str(served["env_file"]), str(served["run"]), PROD, "60"]
    run_id = _rogue_flow_run(served, script, args)
    planted = checkout / "data" / "processed" / "pairs.parquet"
    deadline = time.monotonic() + 240
    while not planted.is_symlink():  # the pull step has run its first lines
        assert time.monotonic() < deadline, "the pull step did not plant its link"
        time.sleep(0.5)
    mlc = _as(monkeypatch, served, REGISTRAR)
    version, _ = _register(served["trigger"], 60.0, 60.0)  # the gate judges it: it reads its dev pairs now
    auth = "Basic " + base64.b64encode(SECRETS["PREFECT_AUTH_STRING"].encode()).decode()
    _wait_for_run(served["prefect_port"], auth, run_id)
    worker = (served["run"] / "worker.log").read_text()
    said = [line for line in worker.splitlines() if line.startswith("rogue:")]
    assert said == ["rogue: planted", "rogue: leaked=no"], (said, _gate_log(served)[-2000:])
    assert _champion(mlc) is None and not list(mlc.search_model_versions(f"name='{PROD}'"))
    lines = [line for line in _gate_log(served).splitlines() if "pairs.parquet" in line]
    assert lines and all("is not a regular file under" in line for line in lines), lines
    assert "read once" not in _gate_log(served)  # nothing was pinned through the link
    assert not any(Path(p).read_bytes().startswith(b"MLFLOW_") for p in glob.glob("/tmp/sentcl-gate-*/*"))
    found = _verdict(mlc, version, seconds=60)  # three tries, then an error verdict: nobody waits forever
    assert found["decision"] == "error" and "not a regular file" in found["reasons"][0], found


# ------------------------------------------------------------------------------------------------ attack 2


@pytest.fixture(scope="module")
def pairs(served):
    """A real pairs table in the copy's data/processed (a planted link removed first); gold: "good"'s cosines.
    Large (20,000 pairs), so scoring both models takes seconds: the window of attack 2."""
    processed = served["checkout"] / "data" / "processed"
    target = processed / "pairs.parquet"
    if target.is_symlink() or target.exists():
        target.unlink()
    write_dev_pairs(processed, served["good"], stsb=16000, sick=4000)
    return target


@pytest.fixture(scope="module")
def first_champion(served, pairs):
    """The first candidate, promoted by the gate process: champion version 1."""
    with pytest.MonkeyPatch.context() as mp:
        mlc = _as(mp, served, REGISTRAR)
        uri, _ = register_tiny_pyfunc(served["first"], CANDIDATES)
        found = _verdict(mlc, uri.rsplit("/", 1)[1])
        assert found["decision"] == "promoted", found
        return _champion(mlc)


def _logged_locally(folder: Path, dest: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """``folder`` logged as a pyfunc run (not registered) and downloaded: (its files, their manifest, its
    weight files' digests)."""
    import mlflow

    from sentcl_mlflow.pyfunc_checks import DOWNLOAD_META, files_manifest
    from sentcl_mlflow.registry.download import st_folder_in

    _, model_uri = log_tiny_pyfunc(folder, [[0.0] * 32, [0.0] * 32])
    root = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(dest)))
    (root / DOWNLOAD_META).unlink(missing_ok=True)
    return root, files_manifest(root), weight_file_digests(st_folder_in(root))


def _gate_scoring_started(served: dict, seconds: float) -> bool:
    """The gate has downloaded and verified the candidate and now downloads the champion (``measure``'s folder
    ``1-<version>``), after which it scores both: whichever folder its scratch is in."""
    deadline = time.monotonic() + seconds
    patterns = [str(served["run"] / "gate" / "sentcl-gate-*" / "1-*"), "/tmp/sentcl-gate-*/1-*"]
    while time.monotonic() < deadline:
        if any(glob.glob(pattern) for pattern in patterns):
            return True
        time.sleep(0.05)
    return False


def test_files_and_tags_swapped_while_the_gate_scores_never_become_champion(
    served, first_champion, monkeypatch, tmp_path
):
    """Attack 2. The registrar registers the good model; once the gate has downloaded it and scores, the
    registrar overwrites the candidate's files with a poor model's and points its manifest and weights tags at
    them. Whatever the gate decides, champion holds exactly the files it scored: the good model's, from the gate's
    own upload, never the poor one."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    from sentcl_mlflow.registry.download import download_model

    mlc = _as(monkeypatch, served, REGISTRAR)
    poor_root, poor_manifest, poor_digests = _logged_locally(served["poor"], tmp_path / "poor")
    good_weights = weights_fingerprint(weight_file_digests(served["good"]))
    poor_weights = weights_fingerprint(poor_digests)
    assert good_weights != poor_weights

    swapped = threading.Event()
    version_box: list[str] = []

    def swap() -> None:
        if not _gate_scoring_started(served, 900) or not version_box:
            return
        version = version_box[0]
        repo = get_artifact_repository(mlc.get_model_version_download_uri(CANDIDATES, version))
        repo.log_artifacts(str(poor_root))  # every file overwritten with the poor model's
        mlc.set_model_version_tag(
            CANDIDATES, version, "sentcl.manifest", json.dumps(poor_manifest, sort_keys=True)
        )
        mlc.set_model_version_tag(CANDIDATES, version, "weights.sha256", poor_weights)
        mlc.set_model_version_tag(CANDIDATES, version, "weights_sha256", json.dumps(poor_digests))
        swapped.set()

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    uri, _ = register_tiny_pyfunc(served["good"], CANDIDATES)
    version_box.append(uri.rsplit("/", 1)[1])
    found = _verdict(mlc, version_box[0])
    swapper.join(60)
    assert swapped.is_set(), "the swap did not happen while the gate scored"
    champion = _champion(mlc)
    held = weights_fingerprint(
        weight_file_digests(download_model(f"models:/{PROD}/{champion}", tmp_path / "c"))
    )
    assert held != poor_weights, f"champion {champion} holds the poor model's weights ({found})"
    if found["decision"] == "promoted":
        assert champion != first_champion and held == good_weights, found
        version = mlc.get_model_version(PROD, champion)
        run = mlc.get_run(version.run_id)  # the gate's own upload, in the experiment only it may write
        assert run.info.experiment_id == mlc.get_experiment_by_name(production_experiment()).experiment_id
        assert version.tags["weights.sha256"] == good_weights
    else:
        assert champion == first_champion, found


# ------------------------------------------------------------------------------------------------ attack 3


def _put(url: str, data: bytes, user: tuple[str, str]) -> int:
    auth = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    request = urllib.request.Request(url, data=data, method="PUT", headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def _get(url: str, user: tuple[str, str]) -> bytes:
    auth = "Basic " + base64.b64encode(":".join(user).encode()).decode()
    with urllib.request.urlopen(
        urllib.request.Request(url, headers={"Authorization": auth}), timeout=30
    ) as r:
        return r.read()


def test_the_champions_files_refuse_a_put_and_changed_serving_code_never_runs(
    served, first_champion, monkeypatch, tmp_path
):
    """Attack 3. A teammate's and the registrar's PUT over the champion's pyfunc_encoder.py answer 403. The
    admin (or whoever holds the artifact store's keys) changes it anyway: `mlflow.pyfunc.load_model` of that
    version raises one line and the code never runs (its marker file stays absent); within a poll the gate
    process refuses that champion and restores the previous verified one, saying so; @champion loads again."""
    mlc = _as(monkeypatch, served, REGISTRAR)
    if not mlc.get_model_version(PROD, _champion(mlc)).tags.get("previous_champion"):
        uri, _ = register_tiny_pyfunc(served["good"], CANDIDATES)  # a second champion, so there is a previous
        assert _verdict(mlc, uri.rsplit("/", 1)[1])["decision"] == "promoted"
    champion = _champion(mlc)
    previous = mlc.get_model_version(PROD, champion).tags["previous_champion"]
    location = mlc.get_model_version_download_uri(PROD, champion)
    assert location.startswith("mlflow-artifacts:/"), location
    url = (
        f"{served['mlflow']}/api/2.0/mlflow-artifacts/artifacts/{location.removeprefix('mlflow-artifacts:/')}"
    )
    code_url = f"{url}/pyfunc_encoder.py"
    original = _get(code_url, TEAM)  # everyone reads the champion
    marker = Path(tempfile.mkdtemp(prefix="sentcl-marker-")) / "the-changed-code-ran"
    marker.parent.chmod(0o777)
    tampered = original + f"\nopen({str(marker)!r}, 'w').write('ran')\n".encode()
    for who in (TEAM, REGISTRAR):
        assert _put(code_url, tampered, who) == 403, who[0]
    assert _get(code_url, TEAM) == original

    changed_at = time.monotonic()
    assert _put(code_url, tampered, ADMIN) == 200  # the admin's account: the store itself is not the gate's
    as_user(monkeypatch, TEAM)  # a teammate loads it, as the README says
    try:
        last = _load_in_a_process(f"models:/{PROD}/{champion}", tmp_path)
        assert not marker.exists(), "the changed serving code ran on load"
        assert (
            last.startswith("ModelTamperedError ") and "pyfunc_encoder.py changed since registration" in last
        )
        deadline = time.monotonic() + 60
        while _champion(store.client()) == champion:
            assert time.monotonic() < deadline, "the gate did not restore the previous champion"
            time.sleep(0.2)
        restored_in = time.monotonic() - changed_at
        assert _champion(store.client()) == previous
        line = next(line for line in _gate_log(served).splitlines() if "failed verification" in line)
        assert f"restored version {previous}, the previous verified champion" in line, line
        assert re.search(rf"champion {re.escape(PROD)} version {champion} failed", line), line
        tags = store.client().get_model_version(PROD, champion).tags
        assert tags["sentcl.state"] == "refused" and "pyfunc_encoder.py changed" in tags["gate.refused"]
        assert _load_in_a_process(f"models:/{PROD}@champion", tmp_path) == "loaded"
        assert not marker.exists()
        print(f"restored in {restored_in:.1f}s")
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)
