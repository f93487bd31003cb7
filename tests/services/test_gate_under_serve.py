"""The audit's three findings about what the gate scores and reads, replayed live under a real `make serve`.

One `make serve` (infra/serve.sh: Prefect, MLflow with basic auth, the gate process polling every second with its
scratch in the run folder, the sandboxed worker, the watcher) runs on a copy of this checkout under /tmp, as in
tests/services/test_gate_attacks.py. The copy's ``data/processed/pairs.parquet`` is a mini pairs table whose gold
is the "good" tiny encoder's cosines (the gate pins it at its start), and its params.yaml lowers ``gate:``'s
``max_domain_pairs`` and ``max_domain_mb`` (LIMITS) so that files past them stay small. The first registration
makes a poor encoder champion. Then everything is done with the registrar's account (the one every flow run
holds): candidates registered into the candidates model as the register stage does, and read back through the
MLflow API (``gate.decision``, ``gate.reasons_json``, the gate's scores, the ``champion`` alias) and the gate's
log. Same checks against a gate the tests start themselves: tests/services/test_gate_served.py and
test_gatekeeper.py.

1. Finding (2) (run first: on the old code a promoted part 2 makes the champion score like "good", and this
   candidate would then fall far below it): a candidate just below the champion on STS-B dev brings 200 domain
   pairs whose gold is its own cosines. Rejected; its pairs are scored and reported, never counted; the
   registrar can neither approve them (the approvals CLI's path) nor write the approvals tag itself.
2. Finding (1): the good encoder's transformer (far above the champion) with ``Dense(32 -> 1)`` and
   ``Normalize`` appended, one number per sentence as served: rejected, scored as served, its pipeline named;
   with ``Normalize`` alone (scored as the good encoder): rejected on its shape alone.
3. Finding (3): candidates whose domain pairs pass ``gate.max_domain_pairs`` and ``gate.max_domain_mb``: refused
   unread in one line each, the production lease released, and the next (good) candidate judged and promoted;
   the leftovers planted in the gate's scratch before `make serve` (what a killed gate leaves) are gone, and the
   scratch holds nothing but the pinned pairs.

Marked slow: one `make serve` and eight judgments of tiny models, about 5 minutes on 2 busy cores.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig, weight_file_digests, weights_fingerprint
from sentcl_mlflow import store
from sentcl_mlflow.registry.gatekeeper import DOMAIN_DEV_ARTIFACT, TAG_GATE_INPUTS, gate_inputs_tag
from sentcl_mlflow.registry.lease import LEASE_SUFFIX
from tests.services.test_gate_attacks import _as, _champion, _copy_checkout, _gate_log, _verdict
from tests.services.test_gate_measures import spearman_of
from tests.services.test_gate_served import served_spearman, with_modules
from tests.services.test_gatekeeper import _changed_on_the_domain, _domain_sentences, _lines, _register
from tests.services.test_infra import SECRETS, _free_port, serve_env
from tests.services.test_registry import write_dev_pairs
from tests.tiny import make_tiny_encoder

pytestmark = pytest.mark.slow

CONFIG = GateConfig.from_params(read_params())
PROD, CANDIDATES = CONFIG.model_name, CONFIG.candidate_model_name
REGISTRAR = ("sentcl-registrar", SECRETS["SENTCL_REGISTRAR_PASSWORD"])
LIMITS = {"max_domain_pairs": 300, "max_domain_mb": 0.05}  # the copy's params.yaml gate: (the rest as is)
LEFTOVERS = ("sentcl-gate-killed", "tmp-left-by-a-kill")  # planted in the gate's scratch before make serve


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """`make serve` on a copy of the checkout with the mini pairs table and lowered gate: limits; its run folder,
    stores and secrets outside the copy, and the gate's scratch holding what a killed gate would have left."""
    import yaml

    began = time.monotonic()
    base = Path(
        tempfile.mkdtemp(prefix="sentcl-under-serve-")
    )  # under /tmp, reachable by the worker's account
    base.chmod(0o755)
    checkout = _copy_checkout(base / "checkout")
    work = tmp_path_factory.mktemp("gate-under-serve")
    models = {
        name: make_tiny_encoder(work / name, "encoder", seed=seed, dropout=0.0)  # one folder name: one layout
        for name, seed in (("first", 3), ("good", 11), ("many", 15), ("large", 16))
    }
    pairs = write_dev_pairs(checkout / "data" / "processed", models["good"]) / "pairs.parquet"
    params_file = checkout / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params.setdefault("gate", {}).update(LIMITS)
    params_file.write_text(yaml.safe_dump(params))
    run = work / "run"
    killed = run / "gate" / LEFTOVERS[0] / "0-3"
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"\0" * 4096)
    (run / "gate" / LEFTOVERS[1]).write_bytes(b"left")
    for folder in (run, run / "gate"):
        folder.chmod(0o700)
    env_file = work / "dot.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    env_file.chmod(0o600)
    prefect_port, mlflow_port = _free_port(), _free_port()
    env = serve_env(work, env_file, prefect_port, mlflow_port, SENTCL_GATE_INTERVAL_S="1")
    try:
        serve = subprocess.run(
            ["bash", "infra/serve.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
        )
        assert serve.returncode == 0, serve.stdout + serve.stderr
        print(f"\nmake serve: {time.monotonic() - began:.0f} s (models, pairs and copy included)")
        yield {
            "checkout": checkout,
            "run": run,
            "log": run / "gate.log",
            "mlflow": f"http://127.0.0.1:{mlflow_port}",
            "params": read_params(params_file),
            "pairs": pairs,
            **models,
        }
    finally:
        subprocess.run(
            ["bash", "infra/stop.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=180
        )
        shutil.rmtree(base, ignore_errors=True)
        store._configured = None


@pytest.fixture(scope="module")
def first_champion(serve) -> str:
    """The poor encoder, registered by the registrar and promoted by the gate process: the first champion."""
    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mlc = _as(mp, serve, REGISTRAR)
        version, _ = _register(serve["first"], 10.0, 10.0)
        found = _verdict(mlc, version)
        assert found["decision"] == "promoted", (found, _gate_log(serve)[-3000:])
        print(f"first champion: {time.monotonic() - began:.0f} s")
        return _champion(mlc)


def _with_domain_pairs(folder: Path, domain_dev: Path, claimed: float = 99.0) -> str:
    """``folder`` registered by the registrar with ``domain_dev`` logged as its domain dev pairs (what a retrain's
    --domain-dev does), claiming ``claimed`` on every dev set: its version."""
    artifact_folder, artifact_name = DOMAIN_DEV_ARTIFACT.rsplit("/", 1)
    assert domain_dev.name == artifact_name, domain_dev
    mlc = store.client()
    inputs = {TAG_GATE_INPUTS: gate_inputs_tag(domain_dev)}
    version, _ = _register(
        folder,
        claimed,
        claimed,
        inputs,
        lambda run, _: mlc.log_artifact(run, str(domain_dev), artifact_folder),
    )
    return version


def _one_word_moved(folder: Path, dest: Path, word: str = "man", scale: float = 0.1) -> Path:
    """A copy of ``folder`` whose embedding of the token ``word`` gets gaussian noise of ``scale`` times the
    embeddings' spread (seed 0). On this module's pairs and the poor encoder (changed on the domain letters) that
    is STS-B dev about 0.5 lower and SICK-R trial about 0.3 higher: just below the champion."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    table = model[0].auto_model.embeddings.word_embeddings.weight
    token = model.tokenizer.convert_tokens_to_ids(word)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        table[token] += scale * float(table.std()) * torch.randn(table.shape[1], generator=generator)
    model.save(str(dest))
    return dest


def _tags(mlc, version: str) -> dict[str, str]:  # noqa: ANN001
    return dict(mlc.get_model_version(CANDIDATES, version).tags or {})


def _judged_in_one_line(serve: dict, version: str, word: str) -> str:
    lines = _lines(serve, version)
    assert len(lines) == 1 and word in lines[0], lines
    return lines[0]


# ------------------------------------------------------------------------------ finding (2): the evidence


def test_domain_pairs_the_registrar_fabricated_never_promote_a_candidate_below_the_champion(
    serve, first_champion, monkeypatch, tmp_path
):
    """A candidate just below the champion on STS-B dev (and within max_dev_drop on SICK-R trial) brings 200 domain
    pairs whose gold is its own cosines: its domain score is ~100 against the champion's far less. On the old
    code that was "domain gain accepted" and a promotion. Now: rejected, the pairs reported and not counted,
    champion unmoved; the registrar's approval of those pairs is refused, and so is its own write of the
    approvals tag."""
    from mlflow.exceptions import MlflowException

    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder

    began = time.monotonic()
    pairs, first = serve["pairs"], serve["first"]
    changed = _changed_on_the_domain(first, tmp_path / "changed", scale=2.0)
    candidate = _one_word_moved(changed, tmp_path / "candidate")
    drop = spearman_of(first, pairs, "STSb") - spearman_of(candidate, pairs, "STSb")
    sick_drop = spearman_of(first, pairs, "SICK-R") - spearman_of(candidate, pairs, "SICK-R")
    assert 0.2 < drop < CONFIG.max_dev_drop and sick_drop < CONFIG.max_dev_drop, (drop, sick_drop)
    sentences = _domain_sentences(400, seed=41)
    own = FastEncoder(candidate, backend="torch")
    gold = cosine(own(sentences[0::2]), own(sentences[1::2]))
    dev = tmp_path / "fabricated" / DOMAIN_DEV_ARTIFACT.rsplit("/", 1)[1]
    dev.parent.mkdir()
    dev.write_text(
        "".join(
            f"{a}\t{b}\t{g:.5f}\n" for a, b, g in zip(sentences[0::2], sentences[1::2], gold, strict=True)
        )
    )

    mlc = _as(monkeypatch, serve, REGISTRAR)
    version = _with_domain_pairs(candidate, dev)
    found = _verdict(mlc, version)
    tags = _tags(mlc, version)
    assert found["decision"] == "rejected" and _champion(mlc) == first_champion, (found, tags)
    assert tags["gate.decision"] == "rejected" and json.loads(tags["gate.reasons_json"]) == found["reasons"]
    stsb, champion_stsb = float(tags["gate.stsb_dev"]), float(tags["gate.champion_stsb_dev"])
    assert champion_stsb - CONFIG.max_dev_drop < stsb < champion_stsb, (
        tags
    )  # just below, as the gate measured
    assert float(tags["gate.domain_dev"]) > 99.0 > float(tags["gate.champion_domain_dev"]) + 1.0, tags
    assert any("not approved by an operator" in r for r in found["reasons"]), found
    assert not any("domain gain accepted" in r for r in found["reasons"]), found
    _judged_in_one_line(serve, version, "REJECTED")

    from sentcl_mlflow.registry.evidence import TAG_APPROVED, approve
    from sentcl_mlflow.registry.lease import PromotionLeaseDenied

    with pytest.raises(
        PromotionLeaseDenied
    ):  # `evidence approve` as the registrar: production's lease is not its
        approve(dev, "mallory", serve["params"])
    digest = json.loads(tags[TAG_GATE_INPUTS])["domain_dev"]["sha256"]
    with pytest.raises(
        MlflowException
    ) as denied:  # the approvals tag written directly: READ on production only
        mlc.set_registered_model_tag(
            PROD, TAG_APPROVED, json.dumps({digest: {"by": "mallory", "pairs": 200}})
        )
    assert "PERMISSION_DENIED" in str(denied.value.error_code), denied.value
    assert TAG_APPROVED not in (mlc.get_registered_model(PROD).tags or {})
    assert _champion(mlc) == first_champion
    print(f"finding 2 (fabricated domain pairs): {time.monotonic() - began:.0f} s")


# ------------------------------------------------------------------------- finding (1): the served pipeline


def test_modules_appended_to_the_pipeline_are_scored_as_served_and_refused_on_its_shape(
    serve, first_champion, monkeypatch, tmp_path
):
    """The good encoder's transformer (~100 on STS-B dev, far above the champion) with Dense(32 -> 1) and Normalize
    after its pooling: served, every sentence is one number, so every cosine is the same. The old gate scored the
    bare transformer and promoted it. Now: rejected, its score the served pipeline's (undefined), its changed
    pipeline named. The good encoder with Normalize alone scores as the good one and is rejected on its shape
    alone."""
    began = time.monotonic()
    pairs, good = serve["pairs"], serve["good"]
    dense = with_modules(good, tmp_path / "good-dense", dense_to=1, normalize=True)
    normalized = with_modules(good, tmp_path / "good-normalized", dense_to=None, normalize=True, nudge=1e-3)
    assert spearman_of(good, pairs, "STSb") > 99.0  # its bare transformer would win
    with pytest.warns(Warning, match="constant"):  # scipy's: what production serves ranks nothing
        assert math.isnan(served_spearman(dense, pairs, "STSb"))

    mlc = _as(monkeypatch, serve, REGISTRAR)
    version, _ = _register(dense, 99.0, 99.0)
    found = _verdict(mlc, version)
    tags = _tags(mlc, version)
    assert found["decision"] == "rejected" and _champion(mlc) == first_champion, (found, tags)
    assert tags["gate.decision"] == "rejected" and json.loads(tags["gate.reasons_json"]) == found["reasons"]
    assert math.isnan(float(tags["gate.stsb_dev"])), (
        tags
    )  # the served pipeline's score, not the transformer's
    changed = [r for r in found["reasons"] if "served pipeline changes" in r]
    assert changed and "1 dimensions, not 32" in changed[0] and "Dense" in changed[0], found
    assert "Dense" in tags["gate.pipeline"] and "1-d" in tags["gate.pipeline"], tags
    _judged_in_one_line(serve, version, "REJECTED")
    dense_s = time.monotonic() - began

    version, _ = _register(normalized, 50.0, 50.0)
    found = _verdict(mlc, version)
    tags = _tags(mlc, version)
    assert found["decision"] == "rejected" and _champion(mlc) == first_champion, (found, tags)
    assert float(tags["gate.stsb_dev"]) == pytest.approx(spearman_of(good, pairs, "STSb"), abs=0.1), tags
    assert any(r.startswith("stsb_dev") and ">= min_delta" in r for r in found["reasons"]), found
    assert any("served pipeline changes" in r and "it normalises its vectors" in r for r in found["reasons"])
    _judged_in_one_line(serve, version, "REJECTED")
    print(f"finding 1 (appended modules): Dense {dense_s:.0f} s, both {time.monotonic() - began:.0f} s")


# --------------------------------------------------------------------------- finding (3): bounded reads


def test_domain_pairs_past_the_gates_limits_are_refused_unread_and_the_next_candidate_is_promoted(
    serve, first_champion, monkeypatch, tmp_path
):
    """One more line than gate.max_domain_pairs, then a file of few lines past gate.max_domain_mb: each refused in
    one line without scoring, champion unmoved; the production lease is free afterwards, the good encoder
    registered next is judged and promoted, and the gate's scratch holds its pinned pairs and nothing else (the
    leftovers of a killed gate, planted before make serve, removed at its start)."""
    began = time.monotonic()
    limit, limit_mb = LIMITS["max_domain_pairs"], LIMITS["max_domain_mb"]
    name = DOMAIN_DEV_ARTIFACT.rsplit("/", 1)[1]
    many = tmp_path / "many" / name
    many.parent.mkdir()
    many.write_text("".join(f"sentence {i} one\tsentence {i} two\t{i % 5}\n" for i in range(limit + 1)))
    large = tmp_path / "large" / name
    large.parent.mkdir()
    long = " ".join(["water"] * 60)
    large.write_text("".join(f"{long} {i}\t{long} {i}\t{i % 5}\n" for i in range(100)))
    assert many.stat().st_size < limit_mb * 2**20 < large.stat().st_size

    mlc = _as(monkeypatch, serve, REGISTRAR)
    for folder, dev, says in (
        (serve["many"], many, f"more than gate.max_domain_pairs ({limit})"),
        (serve["large"], large, f"more than gate.max_domain_mb ({limit_mb:g} MiB)"),
    ):
        version = _with_domain_pairs(folder, dev)
        found = _verdict(mlc, version)
        tags = _tags(mlc, version)
        assert found["decision"] == "refused" and says in found["reasons"][0], (found, tags)
        assert "\n" not in found["reasons"][0] and tags["sentcl.state"] == "refused"
        assert "gate.stsb_dev" not in tags and "gate.decision" not in tags, tags  # unread, unscored
        assert _champion(mlc) == first_champion
        line = _judged_in_one_line(serve, version, "refused")
        assert says in line and "champion not moved" in line, line
    refused_s = time.monotonic() - began

    lease = f"{PROD}{LEASE_SUFFIX}"
    deadline = time.monotonic() + 120
    while held := list(mlc.search_model_versions(f"name='{lease}'")):  # released once the refusal is written
        assert time.monotonic() < deadline, [(v.version, v.tags) for v in held]
        time.sleep(0.5)

    # New weights, the good encoder's vectors: its own weights are the Dense candidate's (the weights fingerprint
    # covers the top-level weight files only, so a registration of them reuses that version), and a nudge of 1e-3
    # the Normalize candidate's.
    good = _changed_on_the_domain(serve["good"], tmp_path / "good-again", scale=0.0, nudge=2e-3)
    version, _ = _register(good, 10.0, 10.0)
    found = _verdict(mlc, version)
    assert found["decision"] == "promoted", (found, _gate_log(serve)[-3000:])
    champion = mlc.get_model_version_by_alias(PROD, "champion")
    assert str(champion.version) != first_champion
    assert champion.tags["weights.sha256"] == weights_fingerprint(weight_file_digests(good))
    assert champion.tags["gate.candidate"] == f"{CANDIDATES}/{version}"

    scratch = serve["run"] / "gate"
    deadline = time.monotonic() + 60
    while len(entries := sorted(scratch.iterdir())) != 1:  # emptied right after the judgment's tags
        assert time.monotonic() < deadline, entries
        time.sleep(0.5)
    pinned = entries[0]
    assert pinned.name.startswith("sentcl-gate-") and pinned.is_dir() and not pinned.is_symlink(), entries
    assert [p.name for p in pinned.iterdir()] == ["pairs.parquet"]
    assert (pinned / "pairs.parquet").read_bytes() == serve["pairs"].read_bytes()
    assert not any(name in (p.name for p in entries) for name in LEFTOVERS)
    assert f"gate: removed {len(LEFTOVERS)} entries a previous gate left in {scratch}" in _gate_log(serve)
    print(f"finding 3 (bounded reads): refusals {refused_s:.0f} s, all {time.monotonic() - began:.0f} s")


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def test_a_sparse_table_planted_over_the_dev_pairs_is_never_read_and_judging_goes_on(
    serve, monkeypatch, tmp_path
):
    """The worker owns data/processed: the dev pairs table grown in place into a 2 GiB sparse file (what the
    audit planted) after the gate pinned its copy. The next candidate is judged on the pinned copy, scored, its
    verdict in one line; the gate's peak memory does not grow by the table, and its pinned copy is unchanged."""
    pairs = serve["pairs"]
    scratch = serve["run"] / "gate"
    pinned = next(p for p in scratch.iterdir() if p.name.startswith("sentcl-gate-")) / "pairs.parquet"
    pinned_bytes = pinned.read_bytes()
    gate_pid = int((serve["run"] / "gate.pid").read_text().split()[0])
    peak_before = _peak_rss_mib(gate_pid)
    with open(pairs, "r+b") as table:
        table.truncate(2 * 2**30)  # holes: 2 GiB to a reader, a few KiB on disk
    assert pairs.stat().st_size == 2 * 2**30

    mlc = _as(monkeypatch, serve, REGISTRAR)
    good = _changed_on_the_domain(serve["good"], tmp_path / "good-sparse", scale=0.0, nudge=4e-3)
    version, _ = _register(good, 10.0, 10.0)
    found = _verdict(mlc, version)
    tags = _tags(mlc, version)
    assert found["decision"] in ("promoted", "rejected"), (found, _gate_log(serve)[-3000:])
    assert "gate.stsb_dev" in tags, tags  # scored, on the pinned pairs
    line = _judged_in_one_line(serve, version, found["decision"].upper())
    assert "ArrowInvalid" not in _gate_log(serve) and "\n" not in line
    peak_after = _peak_rss_mib(gate_pid)
    assert peak_after - peak_before < 256, (peak_before, peak_after)
    assert pinned.read_bytes() == pinned_bytes
    print(
        f"sparse plant: judged {found['decision']}, gate peak RSS {peak_before:.0f} -> {peak_after:.0f} MiB"
    )
