"""The gate scores what production serves, against a real `mlflow server` on a loopback port.

A registrant can ship a model whose files are all in its manifest and whose transformer is a good encoder, with
modules after the pooling that wreck what a caller gets (a ``Dense`` to one dimension, then ``Normalize``). The
gate loads every version the way ``models:/...@champion`` loads it, so it scores those modules too, and it refuses
a candidate whose pipeline differs from the champion's (modules, vector size, normalisation) unless an operator
allows it. A logged model must carry this repository's serving code, byte for byte: the code the gate runs to score
it is the code production runs to serve it.

On the old code the Dense model was scored as its bare transformer (the evaluate stage's encoder ignores modules
after it) and promoted over a poorer champion.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from sentcl.params import read_params
from sentcl.registry.rules import Registration
from sentcl.registry.verdict import Override
from sentcl_mlflow import runs, store
from sentcl_mlflow.registration import PYFUNC_MODEL
from sentcl_mlflow.registry import gate
from sentcl_mlflow.registry.measure import Evidence
from tests.services.test_gate_measures import register_folder
from tests.services.test_registry import TABLE, champion, mlflow_server, write_dev_pairs  # noqa: F401 (a fixture)
from tests.tiny import make_tiny_encoder

SHAPED, CODED = "sentcl-shaped", "sentcl-coded"


def with_modules(folder: Path, dest: Path, dense_to: int | None, normalize: bool, nudge: float = 0.0) -> Path:
    """A copy of the sentence-transformers ``folder`` with a ``Dense`` (to ``dense_to`` dimensions) and/or a
    ``Normalize`` module appended after its pooling, saved by sentence-transformers itself. ``nudge`` is added to
    one bias of the transformer: other weights (a version of their own), the same scores to two decimals."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    model = SentenceTransformer(str(folder), device="cpu")
    if nudge:
        with torch.no_grad():
            model[0].auto_model.pooler.dense.bias[0] += nudge
    modules = list(model)
    if dense_to is not None:
        torch.manual_seed(0)
        modules.append(models.Dense(model.get_embedding_dimension(), dense_to))
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(dest))
    return dest


def served_spearman(folder: Path, pairs_file: Path, task: str) -> float:
    """Spearman x 100 on one dev split of what sentence-transformers serves from ``folder`` (every module), written
    out here with scipy: the cosine of the two vectors of each pair against the gold score."""
    import pandas as pd
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    rows = pd.read_parquet(pairs_file).query("task == @task and split == 'dev'")
    model = SentenceTransformer(str(folder), device="cpu")
    a = model.encode(list(rows["sentence1"]), convert_to_numpy=True)
    b = model.encode(list(rows["sentence2"]), convert_to_numpy=True)
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    return float(spearmanr(cosines, rows["score"]).statistic * 100)


@pytest.fixture(scope="module")
def shaped(mlflow_server, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    base = tmp_path_factory.mktemp("shaped")
    good = make_tiny_encoder(base, "good", seed=11, dropout=0.0)
    poor = make_tiny_encoder(base, "poor", seed=12, dropout=0.0)
    processed = write_dev_pairs(base / "processed", good)
    return {
        "base": base,
        "good": good,
        "poor": poor,
        "dense": with_modules(good, base / "good-dense", dense_to=2, normalize=True),
        "normalized": with_modules(good, base / "good-normalized", dense_to=None, normalize=True, nudge=1e-3),
        "pairs": processed / "pairs.parquet",
    }


def test_a_dense_module_after_the_pooling_is_scored_as_served_and_refused(shaped):
    """Champion: the poor encoder. Candidate: the good one's transformer, then Dense(32 -> 2) and Normalize: two
    numbers per sentence reach a caller. The gate's STS-B dev is the served pipeline's, computed here
    independently (far below the bare transformer's); the candidate is rejected and the champion stays."""
    mlc = store.client()
    pairs = shaped["pairs"]
    first, _ = register_folder(shaped["poor"], SHAPED, 10.0, 10.0)
    assert gate.promote(read_params(), SHAPED, version=first, evidence=Evidence(dev_pairs=pairs))["promoted"]
    version, _ = register_folder(shaped["dense"], SHAPED, 99.0, 99.0)
    result = gate.promote(read_params(), SHAPED, version=version, evidence=Evidence(dev_pairs=pairs))
    tags = mlc.get_model_version(SHAPED, version).tags
    assert not result["promoted"] and champion(mlc, SHAPED) == first, result
    assert float(tags["gate.stsb_dev"]) == pytest.approx(
        served_spearman(shaped["dense"], pairs, "STSb"), abs=0.05
    )
    assert served_spearman(shaped["good"], pairs, "STSb") > 99.0  # its bare transformer would have won
    changed = [r for r in result["reasons"] if "served pipeline changes" in r]
    assert changed and "2 dimensions, not 32" in changed[0] and "Dense" in changed[0], result["reasons"]
    assert "Dense" in tags["gate.pipeline"] and "2-d" in tags["gate.pipeline"]


def test_another_pipeline_is_refused_on_its_shape_alone_unless_an_operator_allows_it(shaped):
    """The good encoder with a Normalize module appended scores as the good one (cosine ignores length), far
    above the poor champion: refused only because its pipeline differs, then promoted when an operator allows it
    by name. Without a name, allowing is refused before anything is judged."""
    mlc = store.client()
    pairs = shaped["pairs"]
    before = champion(mlc, SHAPED)
    version, _ = register_folder(shaped["normalized"], SHAPED, 50.0, 50.0)
    result = gate.promote(read_params(), SHAPED, version=version, evidence=Evidence(dev_pairs=pairs))
    assert not result["promoted"] and champion(mlc, SHAPED) == before
    stsb = [r for r in result["reasons"] if r.startswith("stsb_dev")]
    assert stsb and ">= min_delta" in stsb[0], result["reasons"]  # the score alone would promote it
    assert any("it normalises its vectors" in r for r in result["reasons"]), result["reasons"]
    with pytest.raises(ValueError, match="--by NAME"):
        gate.promote(
            read_params(),
            SHAPED,
            version=version,
            evidence=Evidence(dev_pairs=pairs),
            override=Override(allow_pipeline_change=True),
        )
    allowed = gate.promote(
        read_params(),
        SHAPED,
        version=version,
        evidence=Evidence(dev_pairs=pairs),
        override=Override(actor="ops", allow_pipeline_change=True),
    )
    assert allowed["promoted"] and any("allowed by" in r for r in allowed["reasons"]), allowed
    assert champion(mlc, SHAPED) == version


def _log_pyfunc(folder: Path, model_file: Path) -> str:
    """``folder`` logged the export stage's way, with ``model_file`` as its serving code: the model's URI."""
    from sentence_transformers import SentenceTransformer

    example = ["a man is playing a guitar", "a dog is running"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(example)
    model = runs.PyfuncModel(model_file, {"encoder": folder}, example, expected, ["mlflow"])
    _, uri = runs.log_pyfunc_run("export", {"model": "tiny"}, model, runs.StageRecord({"stsb_dev": 1.0}))
    return uri


def test_a_logged_model_is_scored_through_its_loader_and_only_with_this_repositorys_serving_code(
    shaped, tmp_path
):
    """A pyfunc logged with the repository's pyfunc_encoder.py is loaded by MLflow's loader and scored (its
    STS-B dev is the served folder's); the same encoder logged with a serving code of the registrant's own (one
    line added; another encoder, so a new version) is refused before it is loaded, tagged refused, in one line."""
    from sentcl.registry.rules import weight_file_digests, weights_fingerprint
    from sentcl_mlflow.errors import GateRefusedError

    mlc = store.client()
    pairs = shaped["pairs"]
    digest = weights_fingerprint(weight_file_digests(shaped["good"]))
    uri = _log_pyfunc(shaped["good"], PYFUNC_MODEL)
    first = gate.register_candidate(
        Registration(uri, 10.0, TABLE, name=CODED, weights_sha256=digest), read_params()
    )
    result = gate.promote(read_params(), CODED, version=first, evidence=Evidence(dev_pairs=pairs))
    assert result["promoted"], result
    tags = mlc.get_model_version(CODED, first).tags
    assert float(tags["gate.stsb_dev"]) == pytest.approx(
        served_spearman(shaped["good"], pairs, "STSb"), abs=0.05
    )

    theirs = tmp_path / "pyfunc_encoder.py"
    theirs.write_text(PYFUNC_MODEL.read_text() + "\nREGISTRANTS_OWN = True\n")
    copy = shutil.copytree(shaped["poor"], tmp_path / "poor-again")
    poor = weights_fingerprint(weight_file_digests(copy))
    second = gate.register_candidate(
        Registration(_log_pyfunc(copy, theirs), 99.0, TABLE, name=CODED, weights_sha256=poor), read_params()
    )
    with pytest.raises(GateRefusedError) as refused:
        gate.promote(read_params(), CODED, version=second, evidence=Evidence(dev_pairs=pairs))
    assert "pyfunc_encoder.py is not this repository's" in str(refused.value)
    assert "\n" not in str(refused.value) and champion(mlc, CODED) == first
    assert mlc.get_model_version(CODED, second).tags["sentcl.state"] == "refused"
