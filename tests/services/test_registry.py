"""Registry, gate, rollback, serving and export against a real `mlflow server` on a loopback port.

One server per module. The fast lease / rollback / block tests register versions of a scratch model (name
``sentcl-test``) whose source is a plain folder, and give the gate ``scorer=as_registered``: the scores each test
chose for its versions, so that those tests can order versions at will. The gate still downloads and verifies
every version it would make champion. The gate's own measurement (tiny encoders scored on a mini pairs.parquet
whose gold is one encoder's own cosines) is tested on ``sentcl-measured`` / ``sentcl-tampered``. The slow tests
run the real export (tiny model, ONNX, pyfunc) and serve its champion.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sentcl.params import read_params
from sentcl.registry.rules import Registration, Scores
from sentcl.registry.verdict import Override
from sentcl_mlflow import store
from sentcl_mlflow.registry import gate
from sentcl_mlflow.registry.gate import register_candidate
from sentcl_mlflow.registry.measure import Evidence
from tests.mlflow_uris import mlflow_pointed_at
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, tiny_sentences

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


def as_registered(version, _root: Path):  # noqa: ANN001 (an MLflow ModelVersion)
    """The scores a fast test registered a version with (its tags): the test's stand-in for the dev-set scoring
    of the gate, so that it can order versions at will; the download and its verification stay real."""
    return Scores.from_tags(version.tags)


def promote(name: str, version: str | None = None, actor: str | None = None, force: bool = False) -> dict:
    """The gate on the checkout's params, scored as registered (``as_registered``)."""
    return gate.promote(read_params(), name, version, Evidence(scorer=as_registered), Override(actor, force))


def rollback(name: str, actor: str, reason: str) -> dict:
    return gate.rollback(read_params(), name, actor=actor, reason=reason)


def register(fixture_source: str, stsb_dev: float, table: dict[str, float], **fields) -> str:  # noqa: ANN003
    """``gate.register_candidate`` of a ``Registration`` of ``FAST``, on the checkout's params."""
    return register_candidate(
        Registration(fixture_source, stsb_dev, table, name=FAST, **fields), read_params()
    )


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
        # As infra/mlflow-server.sh serves it: no job runner (four huey consumer processes nothing here uses).
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
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
    with mlflow_pointed_at(uri):
        yield uri
    os.killpg(process.pid, signal.SIGTERM)  # the server's own session: its uvicorn worker goes too
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    log.close()


def write_dev_pairs(folder: Path, reference: Path, stsb: int = 60, sick: int = 40) -> Path:
    """A mini ``pairs.parquet`` in the validate stage's layout: STS-B dev and SICK-R trial (split ``dev``) pairs
    of tiny sentences whose gold score is the cosine of ``reference`` (a tiny encoder): that encoder scores
    ~100 on both, any other far less, so the gate's own measurement ranks them for certain."""
    import pandas as pd

    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder

    sentences = tiny_sentences(2 * (stsb + sick), seed=21)
    firsts, seconds = sentences[0::2], sentences[1::2]
    encode = FastEncoder(reference, backend="torch")
    gold = cosine(encode(firsts), encode(seconds))
    rows = []
    for i, (a, b, score) in enumerate(zip(firsts, seconds, gold, strict=True)):
        task = "STSb" if i < stsb else "SICK-R"
        rows.append((task, "dev", "dev", a, b, round(float(score), 5), "mini", i + 1))
    columns = ["task", "subset", "split", "sentence1", "sentence2", "score", "source", "line"]
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=columns).to_parquet(folder / "pairs.parquet")
    return folder


@pytest.fixture(scope="module")
def exported(mlflow_server, tmp_path_factory):
    """`stages.export` on two tiny checkpoints, then `stages.register`: the better one becomes version 1 and,
    first ever, champion."""
    from stages import export, register

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
            str(base / "export-summary.json"),
        ]
        + ["--model", f"base={base_model}", "--model", f"transfer-base={trained}"]
        + ["--train-metrics", str(base / "train")]
    )
    processed = write_dev_pairs(base / "processed", trained)
    register.main(
        ["--release", str(base / "release"), "--summary", str(base / "s.json"), "--processed", str(processed)]
    )
    return {
        "dir": base,
        "processed": base / "processed",
        "release": base / "release",
        "trained": trained,
        "summary": json.loads((base / "export-summary.json").read_text())
        | json.loads((base / "s.json").read_text()),
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
    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc), run_name="fast-registry").info.run_id
    mlc.log_artifacts(run_id, str(folder), "model")
    mlc.set_terminated(run_id)
    source = f"{mlc.get_run(run_id).info.artifact_uri}/model"
    started = time.monotonic()
    version = register(source, 62.0, PLUS1, run_id=run_id, tags={"dev_scores": json.dumps(SICK_DEV)})
    result = promote(FAST, version=version)
    assert result["promoted"] and "first model" in result["reasons"][0]
    return {"source": source, "run_id": run_id, "seconds": time.monotonic() - started}


PLUS1 = {k: v + 1 for k, v in TABLE.items()}
SICK_DEV = {"sick_dev": 60.0}  # the gate's dev guard besides STS-B dev, as stages.export tags it


def add_version(
    fixture: dict,
    stsb_dev: float,
    table: dict[str, float],
    weights: str | None = None,
    dev: dict[str, float] = SICK_DEV,
) -> str:
    return register(
        fixture["source"],
        stsb_dev,
        table,
        tags={"checkpoint": "test", "dev_scores": json.dumps(dev)},
        run_id=fixture["run_id"],
        weights_sha256=weights,
    )


@pytest.mark.slow
def test_export_registers_first_champion_with_card_and_onnx(exported):
    mlc = store.client()
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
    mlc = store.client()
    assert champion(mlc, FAST) == "1"
    assert str(mlc.get_model_version_by_alias(FAST, "challenger").version) == "1"
    tags = mlc.get_model_version(FAST, "1").tags
    assert tags["gate.decision"] == "promoted" and float(tags["stsb_dev"]) == 62.0
    assert fast_registry["seconds"] < 60


def test_gating_the_champion_again_is_a_no_op_not_a_rejection(fast_registry, capsys):
    mlc = store.client()
    current = champion(mlc, FAST)
    tags = dict(mlc.get_model_version(FAST, current).tags)
    capsys.readouterr()
    result = promote(FAST, version=current)
    assert (result["decision"], result["promoted"]) == ("unchanged", False)
    assert (
        capsys.readouterr().out.strip()
        == f"gate: {FAST} version {current} is already champion; nothing to do"
    )
    assert champion(mlc, FAST) == current
    assert dict(mlc.get_model_version(FAST, current).tags) == tags  # its promotion record is not overwritten


def test_gate_rejects_worse_and_dev_drops_then_promotes_better_whatever_the_tests(fast_registry):
    mlc = store.client()
    before = champion(mlc, FAST)
    worse = add_version(fast_registry, 61.0, PLUS1)
    assert promote(FAST)["decision"] == "rejected"
    assert champion(mlc, FAST) == before
    assert mlc.get_model_version(FAST, worse).tags["gate.decision"] == "rejected"
    assert "min_delta" in mlc.get_model_version(FAST, worse).tags["gate.reasons"]

    add_version(fast_registry, 70.0, PLUS1, dev={"sick_dev": SICK_DEV["sick_dev"] - 3})
    result = promote(FAST)
    assert not result["promoted"] and any("sick_dev drops 3.00" in r for r in result["reasons"])
    assert champion(mlc, FAST) == before

    # A test task that drops 3 is recorded on the version (sts_all) and never read by the gate.
    started = time.monotonic()
    better = add_version(fast_registry, 70.0, {**PLUS1, "STS13": PLUS1["STS13"] - 3})
    result = promote(FAST)
    seconds = time.monotonic() - started
    assert result["promoted"], result
    assert champion(mlc, FAST) == better
    assert mlc.get_model_version(FAST, better).tags["previous_champion"] == before
    assert seconds < 30


def test_rollback_restores_the_previous_champion_and_says_who(fast_registry):
    mlc = store.client()
    current = champion(mlc, FAST)
    add_version(fast_registry, 90.0, PLUS1)
    newest = promote(FAST)["version"]
    assert champion(mlc, FAST) == newest
    rollback(FAST, actor="alice", reason="bad on tickets")
    assert champion(mlc, FAST) == current
    tags = mlc.get_model_version(FAST, newest).tags
    # No accounts on this server: who is the login name, marked as such; --by is a note beside it.
    who = f"unauthenticated:{getpass.getuser()}"
    assert tags["rolled_back_by"] == who and tags["rolled_back_by_note"] == "alice"
    assert tags["rolled_back_reason"] == "bad on tickets"
    restored = mlc.get_model_version(FAST, current).tags
    assert restored["restored_by"] == who and restored["restored_by_note"] == "alice"


def test_two_promotions_at_once_cannot_both_win(fast_registry):
    """Two challengers, each better than the champion and equal to each other, gated at the same moment:
    exactly one wins, because the second gate re-reads the champion after the lock and sees no gain."""
    import threading

    mlc = store.client()
    table = {k: v + 5 for k, v in TABLE.items()}
    a = add_version(fast_registry, 95.0, table)
    b = add_version(fast_registry, 95.0, table)
    barrier = threading.Barrier(2)
    results: dict[str, dict] = {}

    def gate(version: str) -> None:
        barrier.wait()
        results[version] = promote(FAST, version=version)

    threads = [threading.Thread(target=gate, args=(v,)) for v in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(r["decision"] for r in results.values()) == ["promoted", "rejected"], results
    winner = next(v for v, r in results.items() if r["promoted"])
    assert champion(mlc, FAST) == winner


@pytest.mark.slow
def test_failed_registration_leaves_registry_untouched(exported, tmp_path):
    """A registration that fails (here: a release folder of new weights whose files are gone) registers nothing
    and moves no alias."""
    from stages import register

    mlc = store.client()
    before = (versions(mlc), champion(mlc))
    broken = tmp_path / "release"
    shutil.copytree(exported["release"], broken)
    info = json.loads((broken / "export.json").read_text())
    info["weights_fingerprint"] = "0" * 64  # weights no version holds: this registration must log them
    (broken / "export.json").write_text(json.dumps(info))
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(Exception):  # noqa: B017 (any failure will do; the point is what it leaves behind)
        register.main(["--release", str(broken), "--summary", str(tmp_path / "s.json")])
    assert (versions(mlc), champion(mlc)) == before
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_register_against_a_dead_server_fails_fast_and_registers_nothing(exported, tmp_path):
    mlc = store.client()
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
        [sys.executable, "-m", "stages.register", "--release", str(exported["release"])]
        + ["--summary", str(tmp_path / "out" / "registry.json")],
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
    champion_version = store.client().get_model_version_by_alias(NAME, "champion")
    assert champion_version.tags["checkpoint"] == "transfer-base"
    expected = SentenceTransformer(str(exported["release"])).encode(["a sentence", "another one"])
    np.testing.assert_allclose(predictions, expected, atol=1e-5)


# ------------------------------------------------------------------------------ promotion that sticks


def test_rollback_sticks_against_the_gate_and_against_the_same_weights(fast_registry):
    """After a rollback, gating the demoted version (it was still `challenger` before this fix) and
    re-registering its weights both leave the restored champion in place."""
    mlc = store.client()
    restored = champion(mlc, FAST)
    high = {k: v + 30 for k, v in TABLE.items()}  # beats every champion the other tests leave behind
    bad = add_version(fast_registry, 150.0, high, weights="f" * 64)
    assert promote(FAST)["promoted"]
    rollback(FAST, actor="carol", reason="worse on tickets")
    assert champion(mlc, FAST) == restored
    tags = mlc.get_model_version(FAST, bad).tags
    assert tags["rolled_back"] == "true" and tags["rolled_back_by_note"] == "carol"
    with pytest.raises(Exception):  # noqa: B017 (the alias is gone: MLflow says so in its own words)
        mlc.get_model_version_by_alias(FAST, "challenger")

    result = promote(FAST, version=bad)  # the gate run again on the demoted version
    assert not result["promoted"] and "rolled back" in result["reasons"][0]
    assert champion(mlc, FAST) == restored

    before = versions(mlc, FAST)
    again = add_version(fast_registry, 150.0, high, weights="f" * 64)  # a retrain that lands on them again
    assert again == bad and versions(mlc, FAST) == before  # same weights: no second version
    assert not promote(FAST, version=again)["promoted"]
    assert champion(mlc, FAST) == restored

    with pytest.raises(ValueError, match="--by"):
        promote(FAST, version=bad, force=True)
    forced = promote(FAST, version=bad, actor="dave", force=True)
    who = f"unauthenticated:{getpass.getuser()}"
    assert forced["promoted"] and f"forced by {who} (--by dave, not verified)" in forced["reasons"]
    forced_tags = mlc.get_model_version(FAST, bad).tags
    assert forced_tags["gate.forced_by"] == who and forced_tags["gate.by_note"] == "dave"
    rollback(FAST, actor="dave", reason="undo the forced promotion")
    assert champion(mlc, FAST) == restored


KILLED_REGISTRATION = """
import sys, time
from sentcl_mlflow import store
from sentcl_mlflow.registry.lease import promotion_lock
from sentcl.registry.rules import LeaseTimes, Registration
from sentcl_mlflow.registry.versions import register_locked
name, source, run_id = sys.argv[1:4]
mlc = store.client()
with promotion_lock(name, LeaseTimes(lease_s=3, wait_s=600), mlc):
    registration = Registration(source, 500.0, {"STS12": 99.0}, run_id=run_id, weights_sha256="e" * 64)
    version, _ = register_locked(mlc, name, registration)
    print("registered", version, flush=True)
    time.sleep(600)  # killed here: after the version exists, before the gate and the `ready` mark
"""


def test_a_kill_between_registration_and_gate_leaves_no_promotable_orphan(fast_registry):
    mlc = store.client()
    before = champion(mlc, FAST)
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_REGISTRATION, FAST, fast_registry["source"], fast_registry["run_id"]],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("registered"), line
    orphan = line.split()[1]
    process.kill()
    process.wait(30)
    tags = mlc.get_model_version(FAST, orphan).tags
    assert tags["sentcl.state"] == "registering"  # plainly marked unfinished
    # The next gate breaks the dead holder's lease once it expires (3 s here), cleans up, and never
    # promotes the orphan, though its scores would beat every champion.
    with pytest.raises(LookupError):  # its alias went with it: nothing to gate
        promote(FAST)
    assert champion(mlc, FAST) == before
    assert orphan not in versions(mlc, FAST)


TWO_CHECKOUT_GATE = """
import sys, time
from sentcl.params import read_params
from sentcl.registry.rules import Scores
from sentcl_mlflow.registry.gate import promote
from sentcl_mlflow.registry.measure import Evidence
name, version, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
scorer = lambda v, root: Scores.from_tags(v.tags)  # as_registered
print(promote(read_params(), name, version, Evidence(scorer=scorer))["decision"], flush=True)
"""


@pytest.mark.slow
def test_two_gates_from_two_checkouts_against_one_http_store_give_one_champion(fast_registry, tmp_path):
    """Two processes, each in its own checkout folder (a per-checkout file lock would not see the other),
    gate two equally better challengers at the same moment: one champion."""
    mlc = store.client()
    table = {k: v + 20 for k, v in TABLE.items()}
    a = add_version(fast_registry, 300.0, table)
    b = add_version(fast_registry, 300.0, table)
    start = time.time() + 8
    processes = []
    for version, checkout in ((a, "checkout-a"), (b, "checkout-b")):
        (tmp_path / checkout).mkdir()
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", TWO_CHECKOUT_GATE, FAST, version, str(start)],
                cwd=tmp_path / checkout,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    decisions = [p.communicate(timeout=240)[0].strip().splitlines()[-1] for p in processes]
    assert sorted(decisions) == ["promoted", "rejected"], decisions
    assert champion(mlc, FAST) in (a, b)


def test_same_weights_are_never_registered_twice(fast_registry):
    mlc = store.client()
    first = add_version(fast_registry, 40.0, PLUS1, weights="a" * 64)
    count = len(versions(mlc, FAST))
    assert add_version(fast_registry, 41.0, PLUS1, weights="a" * 64) == first
    assert len(versions(mlc, FAST)) == count
    assert mlc.get_model_version(FAST, first).tags["sentcl.state"] == "ready"


def test_served_model_refuses_inputs_that_are_not_strings():
    """The pyfunc's input check (what `mlflow models serve` turns into a 400 with the message)."""
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from sentcl_mlflow.pyfunc_encoder import _sentences

    assert _sentences(["a", "b"]) == ["a", "b"]
    assert _sentences(pd.DataFrame({"sentence": ["a", "b"]})) == ["a", "b"]
    for bad in ([123, None], pd.DataFrame({0: [123, None]}), {"sentence": ["ok", 4.5]}):
        with pytest.raises(MlflowException, match="not a string") as refused:
            _sentences(bad)
        assert refused.value.get_http_status_code() == 400


def test_evaluate_on_a_folder_that_is_not_a_model_is_one_line_exit_2(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    data = tmp_path / "data"
    (data / "STS").mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-m", "stages.evaluate", "--model", str(tmp_path / "notes"), "--data", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "not a model folder" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_register_stage_finds_registered_weights_and_experiments_register_elsewhere(exported, tmp_path):
    """`stages.register` (the DVC stage after export) on a release already registered: the same weights are
    found, not registered again; inside a DVC experiment it registers into the experiments model."""
    mlc = store.client()
    before = versions(mlc)
    cmd = [sys.executable, "-m", "stages.register", "--release", str(exported["release"])]
    cmd += ["--processed", str(exported["processed"])]
    out = subprocess.run(
        cmd + ["--summary", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["registered_version"] == "1" and summary["new_version"] is False
    assert versions(mlc) == before and champion(mlc) == "1"

    env = {**os.environ, "DVC_EXP_NAME": "exp-test"}
    out = subprocess.run(
        cmd + ["--summary", str(tmp_path / "e.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "e.json").read_text())
    assert summary["registered_model"] == "sentcl-encoder-experiments" and summary["new_version"] is True
    assert versions(mlc) == before  # production untouched


def test_served_model_answers_400_to_inputs_that_are_not_strings_over_http(tmp_path):
    """`python -m sentcl_mlflow.serve`'s app over real HTTP: MLflow's own parser would coerce [123, null] to
    the strings "123" and "None" (the logged signature says string); the check in front answers 400 first."""
    import threading
    import urllib.request

    import mlflow
    import numpy as np
    import uvicorn
    from mlflow.models import infer_signature
    from mlflow.pyfunc.scoring_server import init

    from sentcl_mlflow.serve import ServeLimits, build_app

    class Lengths(mlflow.pyfunc.PythonModel):
        _skip_type_hint_validation = True  # as sentcl_mlflow/pyfunc_encoder.py

        def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201
            return np.asarray([[float(len(str(s)))] for s in model_input.iloc[:, 0]], dtype=np.float32)

    model_dir = tmp_path / "model"
    mlflow.pyfunc.save_model(
        str(model_dir),
        python_model=Lengths(),
        signature=infer_signature(["a sentence"], np.zeros((1, 1), dtype=np.float32)),
    )

    def post(port: int, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def serving(app):  # noqa: ANN001, ANN202
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return server, thread, port

    # MLflow alone: the numbers pass as text (what this check exists for).
    server, thread, port = serving(init(mlflow.pyfunc.load_model(str(model_dir))))
    try:
        status, answer = post(port, {"inputs": [123, None]})
        assert status == 200 and answer["predictions"] == [[3.0], [4.0]], answer  # "123", "None"
    finally:
        server.should_exit = True
        thread.join(10)

    server, thread, port = serving(build_app(model_dir, ServeLimits.from_params(read_params())))
    try:
        for body in (
            {"inputs": [123, None]},
            {"instances": ["fine", 4.5]},
            {"dataframe_split": {"columns": ["sentence"], "data": [["ok"], [7]]}},
            {"dataframe_records": [{"sentence": None}]},
        ):
            status, answer = post(port, body)
            assert status == 400, (body, answer)
            assert answer["error_code"] == "INVALID_PARAMETER_VALUE" and "not a string" in answer["message"]
        status, answer = post(port, {"inputs": ["two dogs", "a cat"]})
        assert status == 200 and answer["predictions"] == [[8.0], [5.0]]
    finally:
        server.should_exit = True
        thread.join(10)
