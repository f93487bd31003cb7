"""Registry, gate, rollback, serving and export against a real `mlflow server` on a loopback port.

One server per module. The fast tests register versions of a scratch model (name ``sentcl-test``) whose
source is a plain folder: the gate reads only the versions' tags, so that is the whole registry behaviour,
with nothing mocked. The slow tests run the real export (tiny model, ONNX, pyfunc) and serve its champion.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from stages import tracking
from tests.tiny import make_tiny_encoder

ROOT = Path(__file__).resolve().parent.parent
NAME = "sentcl-encoder"  # what stages.export registers (params.yaml registry.model_name)
FAST = "sentcl-test"
TABLE = {
    "STS12": 50.0,
    "STS13": 51.0,
    "STS14": 52.0,
    "STS15": 53.0,
    "STS16": 54.0,
    "STSb": 55.0,
    "SICK-R": 56.0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking + registry server (sqlite backend, proxied artifacts) on 127.0.0.1."""
    base = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(base / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1", "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}"]
        + ["--artifacts-destination", str(base / "artifacts")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"mlflow server did not start: {(base / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    yield uri
    if previous is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = previous
    os.killpg(process.pid, signal.SIGTERM)  # the server's own session: its uvicorn worker goes too
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    log.close()


@pytest.fixture(scope="module")
def exported(mlflow_server, tmp_path_factory):
    """`stages.export` on two tiny checkpoints: the better one becomes version 1 and, first ever, champion."""
    from stages import export

    base = tmp_path_factory.mktemp("export")
    base_model = make_tiny_encoder(base, "base", seed=0)
    trained = make_tiny_encoder(base, "transfer-base", seed=1)
    sts = {
        "base": {"all": {**TABLE, "avg": 53.0}, "stsb_dev": 60.0},
        "transfer-base": {"all": {k: v + 1 for k, v in TABLE.items()} | {"avg": 54.0}, "stsb_dev": 62.0},
    }
    (base / "sts.json").write_text(json.dumps(sts))
    (base / "train").mkdir()
    (base / "train" / "transfer-base.json").write_text(json.dumps({"beat_init": True}))
    started = time.monotonic()
    export.main(
        [
            "--sts",
            str(base / "sts.json"),
            "--output",
            str(base / "release"),
            "--summary",
            str(base / "s.json"),
        ]
        + ["--model", f"base={base_model}", "--model", f"transfer-base={trained}"]
        + ["--train-metrics", str(base / "train")]
    )
    return {
        "dir": base,
        "release": base / "release",
        "trained": trained,
        "summary": json.loads((base / "s.json").read_text()),
        "seconds": time.monotonic() - started,
    }


def versions(mlc, name: str = NAME) -> list[str]:
    return sorted((v.version for v in mlc.search_model_versions(f"name='{name}'")), key=int)


def champion(mlc, name: str = NAME) -> str:
    return str(mlc.get_model_version_by_alias(name, "champion").version)


@pytest.fixture(scope="module")
def fast_registry(mlflow_server, tmp_path_factory):
    """Version 1 of ``sentcl-test``, champion (the first model ever registered)."""
    folder = tmp_path_factory.mktemp("fake-model")
    (folder / "weights.bin").write_bytes(b"weights")
    mlc = tracking.client()
    run_id = mlc.create_run(tracking.experiment_id(mlc), run_name="fast-registry").info.run_id
    mlc.log_artifacts(run_id, str(folder), "model")
    mlc.set_terminated(run_id)
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    started = time.monotonic()
    version = tracking.register_candidate(source, 62.0, PLUS1, name=FAST, run_id=run_id)
    result = tracking.promote(FAST, version=version)
    assert result["promoted"] and "first model" in result["reasons"][0]
    return {"source": source, "run_id": run_id, "seconds": time.monotonic() - started}


PLUS1 = {k: v + 1 for k, v in TABLE.items()}


def add_version(registry: dict, stsb_dev: float, table: dict[str, float]) -> str:
    return tracking.register_candidate(
        registry["source"], stsb_dev, table, name=FAST, tags={"checkpoint": "test"}, run_id=registry["run_id"]
    )


@pytest.mark.slow
def test_export_registers_first_champion_with_card_and_onnx(exported):
    mlc = tracking.client()
    summary = exported["summary"]
    assert summary["checkpoint"] == "transfer-base"
    assert summary["beat_init"] is True
    assert summary["gate"]["decision"] == "promoted"
    assert champion(mlc) == "1"
    assert str(mlc.get_model_version_by_alias(NAME, "challenger").version) == "1"
    tags = mlc.get_model_version(NAME, "1").tags
    assert float(tags["stsb_dev"]) == 62.0
    assert json.loads(tags["sts_all"])["SICK-R"] == 57.0
    assert tags["beat_init"] == "true" and tags["gate.decision"] == "promoted"
    release = exported["release"]
    verification = json.loads((release / "onnx" / "verification.json").read_text())
    assert verification["max_abs_diff_vs_pytorch"] <= 1e-4
    card = (release / "README.md").read_text()
    for needle in (
        "NON-COMMERCIAL",
        "unlabeled sentences of the STS test sets",
        "sha256",
        "Git commit",
        "STS-B dev",
    ):
        assert needle in card
    assert json.loads(tags["weights_sha256"])["model.safetensors"] in card


@pytest.mark.slow
def test_champion_pyfunc_equals_the_exported_folder(exported):
    import mlflow
    from sentence_transformers import SentenceTransformer

    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    sentences = ["a sentence", "another one"]
    vectors = model.predict(sentences)
    assert vectors.shape == (2, 32)
    expected = SentenceTransformer(str(exported["release"])).encode(sentences)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert model.metadata.signature is not None


@pytest.mark.slow
def test_embed_file_with_the_champion(exported, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from stages import embed

    (tmp_path / "in.txt").write_text("a man is playing guitar\ntwo dogs\nthe girl is eating food\n")
    assert (
        embed.main(
            ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.npy"), "--batch-size", "2"]
        )
        == 0
    )
    assert "embed: model = champion = version 1 of sentcl-encoder" in capsys.readouterr().out
    vectors = np.load(tmp_path / "out.npy")
    expected = SentenceTransformer(str(exported["release"])).encode(["two dogs"])[0]
    np.testing.assert_allclose(vectors[1], expected, atol=1e-6)


def test_first_model_is_champion_and_challenger(fast_registry):
    mlc = tracking.client()
    assert champion(mlc, FAST) == "1"
    assert str(mlc.get_model_version_by_alias(FAST, "challenger").version) == "1"
    tags = mlc.get_model_version(FAST, "1").tags
    assert tags["gate.decision"] == "promoted" and float(tags["stsb_dev"]) == 62.0
    assert fast_registry["seconds"] < 60


def test_gate_rejects_worse_and_task_drops_then_promotes_better(fast_registry):
    mlc = tracking.client()
    before = champion(mlc, FAST)
    worse = add_version(fast_registry, 61.0, PLUS1)
    assert tracking.promote(FAST)["decision"] == "rejected"
    assert champion(mlc, FAST) == before
    assert mlc.get_model_version(FAST, worse).tags["gate.decision"] == "rejected"
    assert "min_delta" in mlc.get_model_version(FAST, worse).tags["gate.reasons"]

    add_version(fast_registry, 70.0, {**PLUS1, "STS13": PLUS1["STS13"] - 3})
    result = tracking.promote(FAST)
    assert not result["promoted"] and any("STS13 drops 3.00" in r for r in result["reasons"])
    assert champion(mlc, FAST) == before

    started = time.monotonic()
    better = add_version(fast_registry, 70.0, PLUS1)
    result = tracking.promote(FAST)
    seconds = time.monotonic() - started
    assert result["promoted"], result
    assert champion(mlc, FAST) == better
    assert mlc.get_model_version(FAST, better).tags["previous_champion"] == before
    assert seconds < 30


def test_rollback_restores_the_previous_champion_and_says_who(fast_registry):
    mlc = tracking.client()
    current = champion(mlc, FAST)
    add_version(fast_registry, 90.0, PLUS1)
    newest = tracking.promote(FAST)["version"]
    assert champion(mlc, FAST) == newest
    tracking.rollback(FAST, actor="alice", reason="bad on tickets")
    assert champion(mlc, FAST) == current
    tags = mlc.get_model_version(FAST, newest).tags
    assert tags["rolled_back_by"] == "alice" and tags["rolled_back_reason"] == "bad on tickets"
    assert mlc.get_model_version(FAST, current).tags["restored_by"] == "alice"


def test_two_promotions_at_once_cannot_both_win(fast_registry):
    """Two challengers, each better than the champion and equal to each other, gated at the same moment:
    exactly one wins, because the second gate re-reads the champion after the lock and sees no gain."""
    import threading

    mlc = tracking.client()
    table = {k: v + 5 for k, v in TABLE.items()}
    a = add_version(fast_registry, 95.0, table)
    b = add_version(fast_registry, 95.0, table)
    barrier = threading.Barrier(2)
    results: dict[str, dict] = {}

    def gate(version: str) -> None:
        barrier.wait()
        results[version] = tracking.promote(FAST, version=version)

    threads = [threading.Thread(target=gate, args=(v,)) for v in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(r["decision"] for r in results.values()) == ["promoted", "rejected"], results
    winner = next(v for v, r in results.items() if r["promoted"])
    assert champion(mlc, FAST) == winner


@pytest.mark.slow
def test_promote_cli_gates_and_rolls_back(fast_registry):
    """`python -m flows.promote` without a Prefect server: the gate under the file lock, in its own process."""
    mlc = tracking.client()
    before = champion(mlc, FAST)
    version = add_version(fast_registry, 99.0, {k: v + 9 for k, v in TABLE.items()})
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    cmd = [sys.executable, "-m", "flows.promote", "--model", FAST]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"version {version} PROMOTED" in out.stdout and "delta" in out.stdout
    out = subprocess.run(
        cmd + ["--rollback", "--by", "bob", "--reason", "regression"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert champion(mlc, FAST) == before
    assert mlc.get_model_version(FAST, version).tags["rolled_back_by"] == "bob"


@pytest.mark.slow
def test_failed_export_leaves_registry_untouched(exported, tmp_path):
    """A run that fails (here: a checkpoint folder without weights) never registers and never moves aliases."""
    from stages import export

    mlc = tracking.client()
    before = (versions(mlc), champion(mlc))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a folder, but no model in it
    (tmp_path / "sts.json").write_text(json.dumps({"broken": {"all": TABLE, "stsb_dev": 99.0}}))
    with pytest.raises(Exception):  # noqa: B017 (any failure will do; the point is what it leaves behind)
        export.main(
            ["--sts", str(tmp_path / "sts.json"), "--model", f"broken={broken}"]
            + ["--output", str(tmp_path / "out"), "--summary", str(tmp_path / "s.json")]
        )
    assert (versions(mlc), champion(mlc)) == before


@pytest.mark.slow
def test_export_against_a_dead_server_fails_fast_and_registers_nothing(exported, tmp_path):
    mlc = tracking.client()
    before = versions(mlc)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{dead}",
        "SENTCL_MLFLOW_CONNECT_TIMEOUT_S": "1",
    }
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "stages.export", "--sts", str(exported["dir"] / "sts.json")]
        + ["--model", f"transfer-base={exported['trained']}", "--output", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "unreachable after 3 attempts" in out.stderr
    assert time.monotonic() - started < 60  # interpreter start + imports + 3 x 1 s probes
    assert not (tmp_path / "out").exists()
    assert versions(mlc) == before


@pytest.mark.slow
def test_mlflow_models_serve_answers_embedding_requests(exported):
    """`mlflow models serve -m models:/sentcl-encoder@champion` in this environment (--env-manager local)."""
    from sentence_transformers import SentenceTransformer

    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{NAME}@champion"]
        + ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "model server did not start"
                time.sleep(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps({"inputs": ["a sentence", "another one"]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        predictions = np.asarray(
            json.loads(urllib.request.urlopen(request, timeout=60).read())["predictions"]
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
    champion_version = tracking.client().get_model_version_by_alias(NAME, "champion")
    assert champion_version.tags["checkpoint"] == "transfer-base"
    expected = SentenceTransformer(str(exported["release"])).encode(["a sentence", "another one"])
    np.testing.assert_allclose(predictions, expected, atol=1e-5)
