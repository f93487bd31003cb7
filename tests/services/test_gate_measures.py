"""The gate measures instead of believing, against a real `mlflow server` on a loopback port.

Tiny encoders are registered as plain model folders, with the score tags their registrant chooses. The dev pairs
are a mini ``pairs.parquet`` (STS-B dev, SICK-R trial) whose gold score is the ``good`` encoder's own cosine:
the gate's scoring puts ``good`` at ~100 and any other encoder far below, whatever the tags say. A version whose
files change after registration is refused before ``champion`` moves: one line, tagged refused, never promoted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import TAG_WEIGHTS, Registration, weight_file_digests, weights_fingerprint
from sentcl.registry.verdict import Override
from sentcl_mlflow import store
from sentcl_mlflow.errors import GateRefusedError
from sentcl_mlflow.registry import gate
from sentcl_mlflow.registry.gate import register_candidate
from sentcl_mlflow.registry.measure import Evidence
from tests.paths import ROOT
from tests.services.test_registry import PLUS1, champion, mlflow_server, write_dev_pairs  # noqa: F401 (a fixture)
from tests.tiny import make_tiny_encoder, tiny_sentences

MEASURED, TAMPERED, CLI = "sentcl-measured", "sentcl-tampered", "sentcl-cli"
# The gate process's case: a production model and the candidates model its registrar registers into.
JUDGED, JUDGED_CANDIDATES = "sentcl-judged", "sentcl-judged-candidates"


@pytest.fixture(scope="module")
def models(mlflow_server, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    base = tmp_path_factory.mktemp("measured")
    good = make_tiny_encoder(base, "good", seed=11, dropout=0.0)
    poor = make_tiny_encoder(base, "poor", seed=12, dropout=0.0)
    other = make_tiny_encoder(base, "other", seed=13, dropout=0.0)
    processed = write_dev_pairs(base / "processed", good)
    return {
        "good": good,
        "poor": poor,
        "other": other,
        "processed": processed,
        "pairs": processed / "pairs.parquet",
    }


def register_folder(folder: Path, name: str, stsb_dev: float, sick_dev: float) -> tuple[str, str]:
    """(version, run id): ``folder`` logged as a run's ``model`` artifacts and registered as ``challenger`` of
    ``name``, tagged with the scores its registrant claims."""
    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc), run_name=folder.name).info.run_id
    mlc.log_artifacts(run_id, str(folder), "model")
    mlc.set_terminated(run_id)
    version = register_candidate(
        Registration(
            f"{mlc.get_run(run_id).info.artifact_uri}/model",
            stsb_dev,
            PLUS1,
            name=name,
            tags={"dev_scores": json.dumps({"sick_dev": sick_dev})},
            run_id=run_id,
            weights_sha256=weights_fingerprint(weight_file_digests(folder)),
        ),
        read_params(),
    )
    return version, run_id


def spearman_of(folder: Path, pairs_file: Path, task: str) -> float:
    """The Spearman x 100 of ``folder`` on one dev split, computed here (torch, not the gate's ONNX)."""
    import pandas as pd

    from sentcl.evaluation.sts import STSEvaluator
    from sentcl.model.fast_encode import FastEncoder

    rows = pd.read_parquet(pairs_file).query("task == @task and split == 'dev'")
    pairs = list(zip(rows["sentence1"], rows["sentence2"], rows["score"], strict=True))
    return STSEvaluator(pairs)(FastEncoder(folder, backend="torch"))


def test_false_score_tags_are_not_believed_the_gates_own_scores_decide(models, capsys):
    mlc = store.client()
    pairs = models["pairs"]
    good, _ = register_folder(models["good"], MEASURED, 10.0, 10.0)  # it claims little
    assert gate.promote(read_params(), MEASURED, version=good, evidence=Evidence(dev_pairs=pairs))[
        "promoted"
    ]  # the first model
    poor, _ = register_folder(models["poor"], MEASURED, 99.0, 99.0)  # it claims far more than it has
    capsys.readouterr()
    result = gate.promote(read_params(), MEASURED, version=poor, evidence=Evidence(dev_pairs=pairs))
    out = capsys.readouterr().out

    assert not result["promoted"] and champion(mlc, MEASURED) == good
    tags = mlc.get_model_version(MEASURED, poor).tags
    real_stsb = spearman_of(models["poor"], pairs, "STSb")
    real_sick = spearman_of(models["poor"], pairs, "SICK-R")
    assert float(tags["gate.stsb_dev"]) == pytest.approx(real_stsb, abs=0.05)
    assert float(tags["gate.sick_dev"]) == pytest.approx(real_sick, abs=0.05)
    assert float(tags["gate.champion_stsb_dev"]) > 99.0 and float(tags["gate.champion_sick_dev"]) > 99.0
    assert real_stsb < 98.0
    assert float(tags["stsb_dev"]) == 99.0  # the registrant's claim stays on record, unread
    assert tags["gate.decision"] == "rejected"
    # The log line carries the gate's numbers, the same as its tags, and not the claim.
    measured = (
        f"the gate's scores: version {poor} stsb_dev {float(tags['gate.stsb_dev']):.2f}, "
        f"sick_dev {float(tags['gate.sick_dev']):.2f}; champion {good} "
        f"stsb_dev {float(tags['gate.champion_stsb_dev']):.2f}"
    )
    assert measured in out, out
    assert "stsb_dev 99.00" not in out
    assert f"version {poor} REJECTED" in out


def test_the_gate_scores_both_models_on_a_domain_dev_file_itself(models, tmp_path):
    """A retrain's domain dev pairs (what --domain-dev hands the export and register path): the gate scores the
    candidate and the champion on them, whatever file it is (here gold = the champion's own cosines)."""
    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder

    mlc = store.client()
    sentences = tiny_sentences(40, seed=31)
    encode = FastEncoder(models["good"], backend="torch")
    gold = cosine(encode(sentences[0::2]), encode(sentences[1::2]))
    dev = tmp_path / "agreement.tsv"
    dev.write_text(
        "".join(
            f"{a}\t{b}\t{g:.5f}\n" for a, b, g in zip(sentences[0::2], sentences[1::2], gold, strict=True)
        )
    )
    version, _ = register_folder(models["other"], MEASURED, 99.0, 99.0)
    result = gate.promote(
        read_params(), MEASURED, version=version, evidence=Evidence(dev_pairs=models["pairs"], domain_dev=dev)
    )
    assert not result["promoted"] and any("domain spearman" in r for r in result["reasons"])
    tags = mlc.get_model_version(MEASURED, version).tags
    assert float(tags["gate.champion_domain_dev"]) > 99.0
    assert float(tags["gate.domain_dev"]) < float(tags["gate.champion_domain_dev"])


def test_a_version_changed_after_registration_is_refused_and_champion_stays(models, tmp_path):
    """The issue's attack: a registered version's MLmodel replaced afterwards (a teammate's artifact PUT does
    this, tests/services/test_auth.py), then gated, even forced. Its scores would win: the check stops it first."""
    mlc = store.client()
    pairs = models["pairs"]
    first, _ = register_folder(models["poor"], TAMPERED, 50.0, 50.0)
    assert gate.promote(read_params(), TAMPERED, version=first, evidence=Evidence(dev_pairs=pairs))[
        "promoted"
    ]
    better = tmp_path / "better"
    shutil.copytree(models["good"], better)
    (better / "MLmodel").write_text("flavors: {}\n")
    version, run_id = register_folder(better, TAMPERED, 60.0, 60.0)
    swapped = tmp_path / "swap" / "MLmodel"
    swapped.parent.mkdir()
    swapped.write_text("flavors: {python_function: {loader_module: os}}\n")
    mlc.log_artifact(run_id, str(swapped), "model")  # replaces model/MLmodel in the store

    with pytest.raises(GateRefusedError) as refused:
        gate.promote(read_params(), TAMPERED, version=version, evidence=Evidence(dev_pairs=pairs))
    message = str(refused.value)
    assert "\n" not in message and f"{TAMPERED} version {version}" in message
    assert "MLmodel changed since registration" in message and "champion not moved" in message
    assert champion(mlc, TAMPERED) == first
    tags = mlc.get_model_version(TAMPERED, version).tags
    assert tags["sentcl.state"] == "refused" and "MLmodel changed" in tags["gate.refused"]
    assert "gate.decision" not in tags  # no decision was made on it

    forced = gate.promote(
        read_params(),
        TAMPERED,
        version=version,
        evidence=Evidence(dev_pairs=pairs),
        override=Override(actor="eve", force=True),
    )
    assert not forced["promoted"] and "refused" in forced["reasons"][0]
    assert champion(mlc, TAMPERED) == first


def test_the_gate_process_verifies_a_candidate_before_its_tags_decide_anything(models, tmp_path):
    """The gate process's gate, in process (``gatekeeper.judge``). A candidate whose tags say it holds the
    champion's weights would be "already champion", a no-op judged on tags alone: whether the tag lies (the
    registrar may edit it) or its MLmodel changed after registration, it is refused in one line instead, and
    tagged refused. One that truly holds the champion's weights, unchanged, is still "unchanged"."""
    from sentcl_mlflow.registry.gatekeeper import judge

    mlc = store.client()
    pairs = models["pairs"]
    params = read_params()
    registry = {**params["registry"], "model_name": JUDGED, "candidate_model_name": JUDGED_CANDIDATES}
    params = {**params, "registry": registry}
    first, _ = register_folder(models["good"], JUDGED, 10.0, 10.0)
    assert gate.promote(params, JUDGED, version=first, evidence=Evidence(dev_pairs=pairs))["promoted"]
    champion_weights = mlc.get_model_version(JUDGED, first).tags[TAG_WEIGHTS]

    def refused_in_one_line(version: str) -> str:
        with pytest.raises(GateRefusedError) as refused:
            judge(JUDGED_CANDIDATES, version, params, pairs)
        message = str(refused.value)
        assert "\n" not in message and f"{JUDGED_CANDIDATES} version {version}" in message, message
        assert message.endswith("champion not moved"), message
        tags = mlc.get_model_version(JUDGED_CANDIDATES, version).tags
        assert tags["sentcl.state"] == "refused" and "gate.decision" not in tags
        assert champion(mlc, JUDGED) == first
        return message

    lying, _ = register_folder(models["poor"], JUDGED_CANDIDATES, 10.0, 10.0)
    mlc.set_model_version_tag(JUDGED_CANDIDATES, lying, TAG_WEIGHTS, champion_weights)
    actual = weights_fingerprint(weight_file_digests(models["poor"]))
    message = refused_in_one_line(lying)
    assert f"its weights hash to {actual[:12]}, not {champion_weights[:12]}" in message

    changed = tmp_path / "champion-again"
    shutil.copytree(models["good"], changed)
    (changed / "MLmodel").write_text("flavors: {}\n")
    version, run_id = register_folder(changed, JUDGED_CANDIDATES, 10.0, 10.0)
    assert mlc.get_model_version(JUDGED_CANDIDATES, version).tags[TAG_WEIGHTS] == champion_weights
    swapped = tmp_path / "swap" / "MLmodel"
    swapped.parent.mkdir()
    swapped.write_text("flavors: {python_function: {loader_module: os}}\n")
    mlc.log_artifact(run_id, str(swapped), "model")  # replaces model/MLmodel in the store
    assert "MLmodel changed since registration" in refused_in_one_line(version)

    same, _ = register_folder(models["good"], JUDGED_CANDIDATES, 10.0, 10.0)
    result = judge(JUDGED_CANDIDATES, same, params, pairs)
    assert result["decision"] == "unchanged" and champion(mlc, JUDGED) == first
    assert mlc.get_model_version(JUDGED_CANDIDATES, same).tags["gate.decision"] == "unchanged"


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    cmd = [sys.executable, "-m", "flows.promote", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_promote_cli_measures_promotes_refuses_changed_weights_and_rolls_back(models, tmp_path):
    """`python -m flows.promote` without a Prefect server, in its own process: measured promotion, a version
    whose weights were replaced after registration refused in one line with exit 2, a verified rollback."""
    mlc = store.client()
    processed = ["--processed", str(models["processed"])]
    first, _ = register_folder(models["poor"], CLI, 90.0, 90.0)
    assert _cli("--model", CLI, *processed).returncode == 0
    better, _ = register_folder(models["good"], CLI, 1.0, 1.0)  # claims nothing, measures ~100
    out = _cli("--model", CLI, *processed)
    assert out.returncode == 0, out.stderr
    assert f"version {better} PROMOTED" in out.stdout and "delta" in out.stdout
    assert f"the gate's scores: version {better} stsb_dev" in out.stdout

    swapped_dir = tmp_path / "other"
    shutil.copytree(models["other"], swapped_dir)
    version, run_id = register_folder(swapped_dir, CLI, 500.0, 500.0)
    weights = tmp_path / "w" / "model.safetensors"
    weights.parent.mkdir()
    shutil.copy(models["good"] / "model.safetensors", weights)  # the champion's weights, under its tags
    mlc.log_artifact(run_id, str(weights), "model")
    out = _cli("--model", CLI, "--version", version, *processed)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"version {version}" in lines[0], out.stderr
    assert "model.safetensors changed since registration" in lines[0]
    assert champion(mlc, CLI) == better
    assert mlc.get_model_version(CLI, version).tags["sentcl.state"] == "refused"

    out = _cli("--model", CLI, "--rollback", "--by", "bob", "--reason", "regression")
    assert out.returncode == 0, out.stderr
    assert champion(mlc, CLI) == first
    assert mlc.get_model_version(CLI, better).tags["rolled_back_by_note"] == "bob"
    assert "by unauthenticated:" in out.stdout and "(--by bob, not verified)" in out.stdout
