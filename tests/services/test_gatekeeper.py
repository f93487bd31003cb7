"""Only the gate moves champion: the gate process, the registrar's account, and every other account's limits.

A real MLflow server with the basic-auth app (``infra/mlflow-server.sh``, as `make serve` starts it) and the
accounts ``sentcl_mlflow.auth setup`` makes, with params.yaml's model names. The gate process
(``python -m sentcl_mlflow.registry.gatekeeper``, its password on stdin as `make serve` hands it) runs for the
module; the registrar registers candidates as `make serve`'s flows do, and the gate's verdicts are read back
from the registry. Each row of docs/registry-security.md's table of accounts names the test that backs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sentcl.params import read_params
from sentcl.registry.rules import GateConfig, GateLimits, LeaseTimes, weight_file_digests, weights_fingerprint
from sentcl.registry.verdict import Override
from sentcl_mlflow import auth, store
from sentcl_mlflow.registry.download import download_verified
from sentcl_mlflow.registry.gate import promote
from sentcl_mlflow.registry.gatekeeper import DOMAIN_DEV_ARTIFACT, TAG_GATE_INPUTS, gate_inputs_tag, verdict
from sentcl_mlflow.registry.lease import PromotionLeaseDenied
from sentcl_mlflow.registry.measure import Evidence
from sentcl_mlflow.registry.names import production_experiment
from tests.paths import ROOT
from tests.services.test_auth import ADMIN, GATE, TEAM, as_user, auth_server  # noqa: F401 (a fixture)
from tests.services.test_gate_measures import spearman_of
from tests.services.test_mlflow_outage import make_release, run_register
from tests.services.test_registry import PLUS1, write_dev_pairs
from tests.tiny import make_tiny_encoder, tiny_sentences

REGISTRAR = ("sentcl-registrar", "registrar-secret-for-tests-1")
READER = ("reader", "reader-secret-for-tests-1")  # an account with no grant: the server's default, READ
CONFIG = GateConfig.from_params(read_params())
LIMITS = GateLimits.from_params(read_params())
PROD, CANDIDATES = CONFIG.model_name, CONFIG.candidate_model_name


def _setup(monkeypatch) -> dict[str, str]:
    as_user(monkeypatch, ADMIN)
    for key, value in {
        "SENTCL_GATE_USER": GATE[0],
        "SENTCL_GATE_PASSWORD": GATE[1],
        "SENTCL_REGISTRAR_USER": REGISTRAR[0],
        "SENTCL_REGISTRAR_PASSWORD": REGISTRAR[1],
        "SENTCL_TEAM_USER": TEAM[0],
        "SENTCL_TEAM_PASSWORD": TEAM[1],
    }.items():
        monkeypatch.setenv(key, value)
    accounts = auth.setup(GateConfig.from_params(read_params()))
    auth.ensure_user(auth._auth_client(), *READER)
    return accounts


@pytest.fixture(scope="module")
def gate_process(auth_server, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """Accounts set up, tiny encoders and dev pairs made, and the gate process running (1 s polls)."""
    base = tmp_path_factory.mktemp("gatekeeper")
    with pytest.MonkeyPatch.context() as mp:
        assert _setup(mp) == {"gate": GATE[0], "registrar": REGISTRAR[0], "team": TEAM[0]}
    models = {
        name: make_tiny_encoder(base, name, seed=seed, dropout=0.0)
        for name, seed in (("good", 11), ("poor", 12), ("other", 13), ("fourth", 14), ("fifth", 15))
    }
    processed = write_dev_pairs(base / "processed", models["good"])
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MLFLOW_TRACKING_USER", "MLFLOW_TRACKING_PASS"))
    }
    env.update(MLFLOW_TRACKING_URI=auth_server, SENTCL_GATE_USER=GATE[0])
    env.pop("PREFECT_API_URL", None)
    log = base / "gate.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "sentcl_mlflow.registry.gatekeeper", "--password-stdin"]
        + ["--processed", str(processed), "--interval", "1"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    process.stdin.write(GATE[1] + "\n")
    process.stdin.close()
    deadline = time.monotonic() + 120
    while "gate: watching" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the gate process did not start: {log.read_text()[-3000:]}")
        time.sleep(0.5)
    yield {"process": process, "log": log, "processed": processed, "base": base, **models}
    process.terminate()
    process.wait(60)  # its SIGTERM unwinds a judgment in flight: seconds alone, more on a loaded machine


def _register(
    folder: Path, stsb_dev: float, sick_dev: float, tags: dict | None = None, before_ready=None
) -> tuple[str, str]:
    """(version, run id): ``folder`` registered into the candidates model as the registrar, with the score
    tags its registrant claims. ``before_ready(run_id, version)`` runs after the registration manifest is recorded
    and before the version is ``ready`` (what the gate process waits for), so nothing races it."""
    from sentcl.registry.rules import Registration
    from sentcl_mlflow.registry.lease import promotion_lock
    from sentcl_mlflow.registry.versions import register_locked

    mlc = store.client()
    run_id = mlc.create_run(store.experiment_id(mlc), run_name=folder.name).info.run_id
    mlc.log_artifacts(run_id, str(folder), "model")
    mlc.set_terminated(run_id)
    with promotion_lock(
        CANDIDATES, LeaseTimes.from_params(read_params()), mlc
    ):  # what register_candidate does, with a pause before `ready`
        registration = Registration(
            f"{mlc.get_run(run_id).info.artifact_uri}/model",
            stsb_dev,
            PLUS1,
            tags={"dev_scores": json.dumps({"sick_dev": sick_dev}), **(tags or {})},
            run_id=run_id,
            weights_sha256=weights_fingerprint(weight_file_digests(folder)),
        )
        version, created = register_locked(mlc, CANDIDATES, registration)
        assert created
        if before_ready is not None:
            before_ready(run_id, version)
        mlc.set_model_version_tag(CANDIDATES, version, "sentcl.state", "ready")
    return version, run_id


def _verdict(version: str, seconds: float = 180) -> dict:
    mlc = store.client()
    deadline = time.monotonic() + seconds
    while (found := verdict(mlc, CANDIDATES, version)) is None:
        assert time.monotonic() < deadline, f"no verdict on {CANDIDATES} version {version}"
        time.sleep(1)
    return found


def _lines(gate: dict, version: str) -> list[str]:
    """The gate process's log lines about ``version`` (one per decision, none of them a progress bar)."""
    pattern = re.compile(rf"\b{re.escape(CANDIDATES)} version {version}\b")
    return [line for line in gate["log"].read_text().splitlines() if pattern.search(line)]


def pairs_reversed(pairs: Path, tmp_path: Path) -> Path:
    reversed_file = tmp_path / "reversed.parquet"
    table = pd.read_parquet(pairs)
    table["score"] = table["score"].max() - table["score"]
    table.to_parquet(reversed_file)
    return reversed_file


def _champion(mlc) -> str:
    return str(mlc.get_model_version_by_alias(PROD, "champion").version)


def _champion_or_none(mlc) -> str | None:
    """The champion's version, or None before the first promotion (``pytest -m slow`` deselects the test that
    makes one)."""
    from mlflow.exceptions import MlflowException

    try:
        return _champion(mlc)
    except MlflowException:
        return None


@pytest.fixture
def good_champion(gate_process, monkeypatch) -> str:
    """The good encoder is the champion, whichever tests ran before: registered and promoted here if it is not.
    Its own cosines are the dev pairs' scores, so the gate promotes it over any other."""
    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    digest = weights_fingerprint(weight_file_digests(gate_process["good"]))
    if _champion_or_none(mlc) is not None:
        champion = mlc.get_model_version_by_alias(PROD, "champion")
        if champion.tags.get("weights.sha256") == digest:
            return str(champion.version)
    version, _ = _register(gate_process["good"], 10.0, 10.0)
    assert _verdict(version)["decision"] == "promoted"
    return _champion(mlc)


# In make test although it takes a minute or more: it makes the champion the tests below compare against.
def test_the_registrars_register_stage_asks_the_gate_process_which_promotes_a_first_model(
    gate_process, monkeypatch, tmp_path
):
    """`make serve`'s worker runs stages as the registrar (SENTCL_REGISTRY_ROLE=registrar): the stage registers
    into the candidates model, waits for the gate process and prints its verdict. The first model ever becomes
    champion of the production model as a verified copy of the candidate."""
    release = make_release(tmp_path)
    # The worker writes data/processed (it runs the pipeline). Pairs rewritten after the gate started, scores
    # reversed: the gate must judge on the table it read at its start.
    pairs = gate_process["processed"] / "pairs.parquet"
    original = pairs.read_bytes()
    kept = tmp_path / "original.parquet"
    kept.write_bytes(original)
    pairs_reversed(kept, tmp_path).replace(pairs)
    try:
        out = run_register(
            release,
            tmp_path,
            600,
            MLFLOW_TRACKING_USERNAME=REGISTRAR[0],
            MLFLOW_TRACKING_PASSWORD=REGISTRAR[1],
            SENTCL_REGISTRY_ROLE="registrar",
        )
    finally:
        pairs.write_bytes(original)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"registered {CANDIDATES} version 1 as challenger" in out.stdout, out.stdout
    assert f"the gate's verdict on {CANDIDATES} version 1: PROMOTED" in out.stdout, out.stdout
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["registered_model"] == CANDIDATES and summary["gate"]["decision"] == "promoted"

    as_user(monkeypatch, READER)
    mlc = store.client()
    champion = mlc.get_model_version_by_alias(PROD, "champion")
    assert champion.tags["gate.candidate"] == f"{CANDIDATES}/1" and champion.tags["gate.by"] == GATE[0]
    # The gate's own upload of the files it scored: a run of the production experiment (the gate's alone),
    # tagged with the manifest the gate computed, which is the candidate's registration manifest.
    run = mlc.get_run(champion.run_id)
    assert run.info.experiment_id == store.experiment_id(mlc, production_experiment())
    assert champion.source == f"{run.info.artifact_uri}/model" and champion.tags["sentcl.state"] == "ready"
    candidate = mlc.get_model_version(CANDIDATES, "1")
    assert champion.tags["sentcl.manifest"] == candidate.tags["sentcl.manifest"]
    assert champion.tags["weights.sha256"] == candidate.tags["weights.sha256"]
    download_verified(f"models:/{PROD}@champion", tmp_path / "champion")  # its manifest holds for the upload
    assert mlc.get_model_version(CANDIDATES, "1").tags["gate.champion_version"] == str(champion.version)
    tags = mlc.get_model_version(CANDIDATES, "1").tags
    assert float(tags["gate.stsb_dev"]) == pytest.approx(spearman_of(release, kept, "STSb"), abs=0.05)
    assert spearman_of(release, pairs_reversed(kept, tmp_path), "STSb") < 0 < float(tags["gate.stsb_dev"])
    log = gate_process["log"].read_text().splitlines()
    digest = hashlib.sha256(original).hexdigest()[:12]
    assert log[0].startswith(f"gate: dev pairs {pairs} (sha256 {digest}) read once"), log
    assert log[1].startswith("gate: watching") and all(line.startswith("gate") for line in log), log
    lines = _lines(gate_process, "1")
    assert len(lines) == 1 and "PROMOTED (champion - -> 1)" in lines[0] and "first model" in lines[0], lines


@pytest.mark.slow  # minutes on 2 cores: two verdicts; the in-process gate's false-tags case is test_gate_measures.py's, in make test
def test_the_gate_process_scores_a_candidate_itself_whatever_its_tags_claim(gate_process, monkeypatch):
    """The registrant's score tags are its own claims: a good model claiming 10 is promoted, a poor one
    claiming 99 is rejected, on the gate's own scores (tagged gate.*), computed here independently."""
    as_user(monkeypatch, REGISTRAR)
    before = _champion_or_none(store.client())
    good, _ = _register(gate_process["good"], 10.0, 10.0)
    assert _verdict(good)["decision"] == "promoted"
    mlc = store.client()
    assert _champion(mlc) != before
    promoted = _champion(mlc)

    poor, _ = _register(gate_process["poor"], 99.0, 99.0)
    found = _verdict(poor)
    assert found["decision"] == "rejected" and _champion(mlc) == promoted
    tags = mlc.get_model_version(CANDIDATES, poor).tags
    pairs = gate_process["processed"] / "pairs.parquet"
    assert float(tags["gate.stsb_dev"]) == pytest.approx(
        spearman_of(gate_process["poor"], pairs, "STSb"), abs=0.05
    )
    assert float(tags["gate.sick_dev"]) == pytest.approx(
        spearman_of(gate_process["poor"], pairs, "SICK-R"), abs=0.05
    )
    assert float(tags["gate.champion_stsb_dev"]) > 99.0 > float(tags["gate.stsb_dev"])
    assert float(tags["stsb_dev"]) == 99.0  # the claim stays on record, unread
    lines = _lines(gate_process, poor)
    assert len(lines) == 1 and "REJECTED" in lines[0] and "stsb_dev 99.00" not in lines[0], lines


def test_a_candidate_changed_after_registration_is_refused_in_one_line(gate_process, monkeypatch, tmp_path):
    """Its MLmodel replaced after registration (anyone with EDIT on the experiment can overwrite a run's
    artifacts): refused before scoring, one line, tagged refused, champion unchanged."""
    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    before = _champion(mlc)
    folder = tmp_path / "tampered"
    shutil.copytree(gate_process["other"], folder)
    (folder / "MLmodel").write_text("flavors: {}\n")
    swapped = tmp_path / "swap" / "MLmodel"
    swapped.parent.mkdir()
    swapped.write_text("flavors: {python_function: {loader_module: os}}\n")
    # Swapped after its manifest was recorded (replaces model/MLmodel in the store), before it is ready.
    version, _ = _register(
        folder, 60.0, 60.0, before_ready=lambda run, _: mlc.log_artifact(run, str(swapped), "model")
    )
    found = _verdict(version)
    assert found["decision"] == "refused" and "MLmodel changed since registration" in found["reasons"][0], (
        found
    )
    tags = mlc.get_model_version(CANDIDATES, version).tags
    assert tags["sentcl.state"] == "refused" and "gate.decision" not in tags
    assert _champion(mlc) == before
    lines = _lines(gate_process, version)
    assert len(lines) == 1 and "refused" in lines[0] and "champion not moved" in lines[0], lines


@pytest.mark.slow  # minutes on 2 cores: two verdicts
def test_the_gate_process_scores_on_the_candidates_domain_pairs_and_refuses_changed_ones(
    gate_process, good_champion, monkeypatch, tmp_path
):
    """The pairs a retrain passes as --domain-dev travel with the candidate's run (their digest on the version):
    the gate scores the candidate and the champion on them; a file changed after registration is a refusal."""
    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder
    from sentcl_mlflow.registration import log_gate_inputs

    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    sentences = tiny_sentences(40, seed=31)
    encode = FastEncoder(gate_process["good"], backend="torch")  # the champion's own cosines: it scores ~100
    gold = cosine(encode(sentences[0::2]), encode(sentences[1::2]))
    dev = tmp_path / "agreement.tsv"
    dev.write_text(
        "".join(
            f"{a}\t{b}\t{g:.5f}\n" for a, b, g in zip(sentences[0::2], sentences[1::2], gold, strict=True)
        )
    )
    inputs = {TAG_GATE_INPUTS: gate_inputs_tag(dev)}
    version, _ = _register(
        gate_process["other"], 99.0, 99.0, inputs, lambda run, _: log_gate_inputs(run, dev)
    )
    found = _verdict(version)
    tags = mlc.get_model_version(CANDIDATES, version).tags
    assert found["decision"] == "rejected", found
    assert float(tags["gate.champion_domain_dev"]) > 99.0 > float(tags["gate.domain_dev"])

    changed = tmp_path / "changed" / "domain_dev.tsv"
    changed.parent.mkdir()
    changed.write_text(dev.read_text() + "an added pair\tof sentences\t0.5\n")

    def log_changed(
        run: str, _version: str
    ) -> None:  # logged, then overwritten (a teammate's EDIT on the experiment)
        log_gate_inputs(run, dev)
        mlc.log_artifact(run, str(changed), DOMAIN_DEV_ARTIFACT.rsplit("/", 1)[0])

    version, _ = _register(gate_process["fourth"], 99.0, 99.0, inputs, log_changed)
    found = _verdict(version)
    assert found["decision"] == "refused" and "domain dev pairs" in found["reasons"][0], found


DOMAIN_LETTERS = "bcdfghjklmnpqrstvwxyz0123456789"  # tokens no STS-B dev or SICK-R trial sentence holds


def _changed_on_the_domain(folder: Path, dest: Path, scale: float, nudge: float = 0.0) -> Path:
    """A copy of ``folder`` whose embeddings of the DOMAIN_LETTERS tokens (and their ``##`` forms) get gaussian
    noise of ``scale`` times the embeddings' spread (seed 0): the same vectors for every dev sentence (made of
    whole words), other vectors for the domain's. ``nudge`` is added to one pooler bias (new weights, the same
    vectors: mean pooling never reads the pooler)."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    bert = model[0].auto_model
    ids = model.tokenizer.convert_tokens_to_ids(list(DOMAIN_LETTERS) + [f"##{c}" for c in DOMAIN_LETTERS])
    table = bert.embeddings.word_embeddings.weight
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        table[ids] += (
            scale * float(table.std()) * torch.randn((len(ids), table.shape[1]), generator=generator)
        )
        bert.pooler.dense.bias[0] += nudge
    model.save(str(dest))
    return dest


def _domain_sentences(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        words = ("".join(rng.choice(DOMAIN_LETTERS) for _ in range(rng.randint(2, 4))) for _ in range(5))
        out[" ".join(words)] = None
    return list(out)


@pytest.mark.slow  # minutes on 2 cores: three verdicts
def test_pairs_the_registrant_fabricated_never_outvote_stsb_dev_and_approved_ones_count(
    gate_process, good_champion, monkeypatch, tmp_path
):
    """The attack: a candidate no better than the champion on STS-B dev and SICK-R trial brings domain pairs
    whose gold is its own cosines (domain ~100 against the champion's far less). On the old code that promoted it
    ("domain gain accepted"). Now the registrant's pairs are scored and reported, never counted: rejected. The
    registrar cannot approve pairs (no EDIT on the production model); once the gate's account approves exactly
    those bytes, they count, and a candidate of the same kind is promoted."""
    from mlflow.exceptions import MlflowException

    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder
    from sentcl_mlflow.registration import log_gate_inputs

    pairs = gate_process["processed"] / "pairs.parquet"
    folder = _changed_on_the_domain(gate_process["good"], tmp_path / "changed", scale=2.0)
    for task in ("STSb", "SICK-R"):  # computed here: the dev splits see the champion's vectors
        assert spearman_of(folder, pairs, task) == pytest.approx(
            spearman_of(gate_process["good"], pairs, task)
        )
    sentences = _domain_sentences(400, seed=41)
    own = FastEncoder(folder, backend="torch")  # the candidate's own cosines as gold: it scores ~100
    gold = cosine(own(sentences[0::2]), own(sentences[1::2]))
    dev = tmp_path / "fabricated.tsv"
    dev.write_text(
        "".join(
            f"{a}\t{b}\t{g:.5f}\n" for a, b, g in zip(sentences[0::2], sentences[1::2], gold, strict=True)
        )
    )
    inputs = {TAG_GATE_INPUTS: gate_inputs_tag(dev)}

    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    before = _champion(mlc)
    version, _ = _register(folder, 99.0, 99.0, inputs, lambda run, _: log_gate_inputs(run, dev))
    found = _verdict(version)
    tags = mlc.get_model_version(CANDIDATES, version).tags
    assert found["decision"] == "rejected" and _champion(mlc) == before, found
    assert float(tags["gate.domain_dev"]) > 99.0 > float(tags["gate.champion_domain_dev"]) + 1.0, tags
    assert any("not approved by an operator" in r for r in found["reasons"]), found
    from sentcl_mlflow.registry.evidence import TAG_APPROVED, approve

    # The registrar approving its own pairs: refused (it may not take production's lease, nor edit its tags).
    with pytest.raises((MlflowException, PromotionLeaseDenied)):
        approve(dev, "mallory", read_params())

    as_user(monkeypatch, GATE)
    approved = approve(dev, "ops", read_params())
    assert approved["sha256"] == hashlib.sha256(dev.read_bytes()).hexdigest() and approved["pairs"] == 200
    assert approved["sha256"] in store.client().get_registered_model(PROD).tags[TAG_APPROVED]
    as_user(monkeypatch, REGISTRAR)
    again = _changed_on_the_domain(gate_process["good"], tmp_path / "changed-again", scale=2.0, nudge=1e-3)
    version, _ = _register(again, 99.0, 99.0, inputs, lambda run, _: log_gate_inputs(run, dev))
    found = _verdict(version)
    assert found["decision"] == "promoted", found
    assert any("domain gain accepted" in r for r in found["reasons"]), found


@pytest.mark.slow  # a verdict
def test_domain_pairs_past_the_gates_limits_are_refused_unread_and_the_gate_goes_on(
    gate_process, monkeypatch, tmp_path
):
    """A registrant's domain pairs file of more lines than gate.max_domain_pairs (200,000 pairs held the lease
    for minutes at 5 GB on the old code): refused in one line without scoring, the lease free, and the next
    candidate judged."""
    from sentcl_mlflow.registration import log_gate_inputs

    limit = GateLimits.from_params(read_params()).max_domain_pairs
    big = tmp_path / "big.tsv"
    big.write_text("".join(f"sentence {i} one\tsentence {i} two\t{i % 5}\n" for i in range(limit + 1)))
    inputs = {TAG_GATE_INPUTS: gate_inputs_tag(big)}
    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    before = _champion_or_none(mlc)
    version, _ = _register(
        gate_process["fifth"], 99.0, 99.0, inputs, lambda run, _: log_gate_inputs(run, big)
    )
    found = _verdict(version)
    assert (
        found["decision"] == "refused" and f"more than gate.max_domain_pairs ({limit})" in found["reasons"][0]
    )
    assert (
        _champion_or_none(mlc) == before
        and "gate.stsb_dev" not in mlc.get_model_version(CANDIDATES, version).tags
    )
    lines = _lines(gate_process, version)
    assert len(lines) == 1 and "refused" in lines[0], lines
    poor, _ = _register(
        _changed_on_the_domain(gate_process["poor"], tmp_path / "poor-after", 0.0, 1e-3), 99.0, 99.0
    )
    assert _verdict(poor)["decision"] in (
        "rejected",
        "promoted",
    )  # the lease was free: the next one is judged


def test_a_candidate_whose_weights_tag_is_not_its_files_is_refused(gate_process, monkeypatch):
    """The registrar may edit its candidates' tags: one naming other weights (a rolled-back version's block
    reads that tag) is refused once the gate has hashed the verified files itself."""
    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    other_weights = "0" * 64  # weights no version has: neither its own nor the champion's
    version, _ = _register(
        gate_process["fifth"],
        99.0,
        99.0,
        before_ready=lambda _, number: mlc.set_model_version_tag(
            CANDIDATES, number, "weights.sha256", other_weights
        ),
    )
    found = _verdict(version)
    assert found["decision"] == "refused" and "its weights hash to" in found["reasons"][0], found


# ------------------------------------------------- the table of accounts: what each cannot do to champion


def _denied(call) -> None:  # noqa: ANN001
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as denied:
        call()
    assert "PERMISSION_DENIED" in str(denied.value.error_code), denied.value


def test_the_registrar_registers_candidates_and_cannot_move_champion(gate_process, monkeypatch, tmp_path):
    as_user(monkeypatch, ADMIN)  # a second production version to point champion at (the admin may add one)
    other = str(store.client().create_model_version(PROD, f"models:/{CANDIDATES}/1").version)
    as_user(monkeypatch, REGISTRAR)
    mlc = store.client()
    champion = _champion(mlc)  # it reads production (the retrain flow starts from the champion)
    assert other != champion
    _denied(lambda: mlc.set_registered_model_alias(PROD, "champion", other))
    _denied(lambda: mlc.delete_registered_model_alias(PROD, "champion"))
    _denied(lambda: mlc.create_model_version(PROD, f"models:/{CANDIDATES}/1"))
    with pytest.raises(PromotionLeaseDenied):  # the CLI's forced promotion, as the worker's account
        promote(
            read_params(),
            PROD,
            version=other,
            evidence=Evidence(dev_pairs=gate_process["processed"] / "pairs.parquet"),
            override=Override(actor="mallory", force=True),
        )
    assert _champion(mlc) == champion
    mlc.set_registered_model_alias(CANDIDATES, "challenger", "1")  # its own model: it may


def _reads_champion_and_cannot_move_it_nor_alias_candidates(monkeypatch, account: tuple[str, str]):  # noqa: ANN202
    """As ``account``: the champion is read; moving it, and aliasing a candidate, are denied. Its client."""
    as_user(monkeypatch, account)
    mlc = store.client()
    champion = _champion(mlc)
    _denied(lambda: mlc.set_registered_model_alias(PROD, "champion", champion))
    _denied(lambda: mlc.set_registered_model_alias(CANDIDATES, "challenger", "1"))
    return mlc


def test_a_teammate_cannot_move_champion_nor_touch_candidates(gate_process, monkeypatch):
    mlc = _reads_champion_and_cannot_move_it_nor_alias_candidates(monkeypatch, TEAM)
    _denied(lambda: mlc.set_model_version_tag(CANDIDATES, "1", "gate.decision", "promoted"))
    _denied(lambda: mlc.create_model_version(CANDIDATES, f"models:/{CANDIDATES}/1"))


def test_a_reader_with_no_grant_reads_and_cannot_move_champion(gate_process, monkeypatch):
    _reads_champion_and_cannot_move_it_nor_alias_candidates(monkeypatch, READER)


# ------------------------------------------------- the gate process's memory and environment, to its own user


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to switch to nobody")
@pytest.mark.parametrize("closed", [True, False])
def test_a_non_dumpable_process_hides_its_environ_from_its_own_os_user(closed, tmp_path):
    """What ``close_process`` (the gate process's first call) buys: another process of the same ordinary OS
    user (here both run as ``nobody``) cannot read its /proc/<pid>/environ; without it, it can. The function's
    own source runs, under the system python (the venv's may not be readable by nobody)."""
    import inspect

    from sentcl.registry.host import PR_SET_DUMPABLE, close_process

    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"]
    body = f"PR_SET_DUMPABLE = {PR_SET_DUMPABLE}\n" + inspect.getsource(close_process)
    body += (
        "close_process()\n" if closed else ""
    ) + "print('ready', flush=True)\nimport time\ntime.sleep(60)\n"
    holder = subprocess.Popen(
        [*as_nobody, body],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOLDER_SECRET": "in-the-environment-1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        reader = subprocess.run(
            [*as_nobody, f"print(open('/proc/{holder.pid}/environ', 'rb').read())"],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        holder.kill()
        holder.wait(10)
    if closed:
        assert reader.returncode != 0 and "PermissionError" in reader.stderr, reader.stdout + reader.stderr
    else:
        assert reader.returncode == 0 and "in-the-environment-1" in reader.stdout, reader.stderr


def _pairs_table(rows: int, word: str) -> bytes:
    """A pairs table in the validate stage's layout: ``rows`` STS-B dev pairs (and as many SICK-R trial ones)."""
    import io

    table = pd.DataFrame(
        [
            (task, "dev", "dev", f"{word} {i} a", f"{word} {i} b", float(i % 5), "mini", i + 1)
            for task in ("STSb", "SICK-R")
            for i in range(rows)
        ],
        columns=["task", "subset", "split", "sentence1", "sentence2", "score", "source", "line"],
    )
    out = io.BytesIO()
    table.to_parquet(out)
    return out.getvalue()


def test_dev_pairs_absent_at_the_gates_start_are_pinned_when_they_first_appear(tmp_path):
    """No `dvc repro validate` before `make serve`: the first table the gate finds is the one it keeps."""
    from sentcl.registry.dev_sets import GateDevSetError
    from sentcl_mlflow.registry.gatekeeper import PinnedDevPairs

    source = tmp_path / "processed" / "pairs.parquet"
    (tmp_path / "own").mkdir()
    pinned = PinnedDevPairs(tmp_path, "processed/pairs.parquet", tmp_path / "own", LIMITS)
    with pytest.raises(GateDevSetError, match="no dev pairs"):  # absent: the decision says so in one line
        pinned.path()
    source.parent.mkdir()
    first, later = _pairs_table(5, "first"), _pairs_table(6, "later")
    source.write_bytes(first)
    copy = pinned.path()
    assert copy != source and copy.read_bytes() == first
    source.write_bytes(later)
    assert pinned.path() == copy and copy.read_bytes() == first
    assert pinned.sha256 == hashlib.sha256(first).hexdigest()


def test_a_table_that_is_not_pairs_or_too_large_is_refused_unpinned_and_read_again_later(tmp_path):
    """A file the worker wrote in place of the pairs table that is no parquet (a 2 GB sparse file did this: every
    later judgment failed until a restart), or one past gate.max_pairs_table_mb (refused on its size, unread):
    one line each, nothing pinned, and the next judgment reads the table again and pins a good one."""
    import dataclasses

    from sentcl.registry.dev_sets import GateDevSetError
    from sentcl_mlflow.registry.gatekeeper import PinnedDevPairs

    source = tmp_path / "processed" / "pairs.parquet"
    source.parent.mkdir()
    own = tmp_path / "own"
    own.mkdir()
    limits = dataclasses.replace(LIMITS, max_pairs_table_mb=1.0)
    pinned = PinnedDevPairs(tmp_path, "processed/pairs.parquet", own, limits)
    source.write_bytes(b"not a parquet file at all")
    with pytest.raises(GateDevSetError, match="not a pairs table") as refused:
        pinned.path()
    assert "\n" not in str(refused.value) and pinned.copy is None and list(own.iterdir()) == []
    with open(source, "wb") as sparse:  # 3 MiB by its size, almost nothing on disk
        sparse.truncate(3 * 2**20)
    with pytest.raises(GateDevSetError, match="more than gate.max_pairs_table_mb") as refused:
        pinned.path()
    assert "3.0 MiB" in str(refused.value) and pinned.copy is None and list(own.iterdir()) == []
    good = _pairs_table(5, "good")
    source.write_bytes(good)
    assert pinned.path().read_bytes() == good


def test_the_gates_scratch_is_emptied_but_for_its_pinned_copy(tmp_path):
    """What a killed gate left in its scratch (downloads, copies, a planted link) is removed at start and after
    each judgment; the pinned dev pairs stay, and a link is removed without following it."""
    from sentcl.registry.host import clear_scratch

    scratch = tmp_path / "scratch"
    (scratch / "sentcl-gate-old" / "0-3").mkdir(parents=True)
    (scratch / "sentcl-gate-old" / "0-3" / "model.safetensors").write_bytes(b"x" * 1000)
    (scratch / "tmp1234").write_bytes(b"left")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the gate's")
    (scratch / "link").symlink_to(outside)
    pinned = scratch / "sentcl-gate-pinned"
    pinned.mkdir()
    (pinned / "pairs.parquet").write_bytes(b"pinned")
    assert clear_scratch(scratch, keep=pinned) == 3
    assert sorted(p.name for p in scratch.iterdir()) == ["sentcl-gate-pinned"]
    assert (pinned / "pairs.parquet").read_bytes() == b"pinned" and (outside / "keep.txt").exists()


@pytest.mark.parametrize("planted", ["link", "folder-link", "fifo", "folder"])
def test_what_the_worker_plants_in_place_of_the_dev_pairs_is_refused_never_followed(tmp_path, planted):
    """The worker writes data/processed: a link to a secret there (or a linked folder on the way, a FIFO, a
    folder) is refused in one line, and nothing of the secret is read or copied into the gate's folder."""
    from sentcl.registry.dev_sets import GateDevSetError
    from sentcl_mlflow.registry.gatekeeper import PinnedDevPairs

    secret = tmp_path / "dot.env"
    secret.write_text("MLFLOW_AUTH_ADMIN_PASSWORD=the-operators-secret\n")
    data = tmp_path / "checkout" / "data"
    data.mkdir(parents=True)
    if planted == "folder-link":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "pairs.parquet").symlink_to(secret)
        (data / "processed").symlink_to(tmp_path / "elsewhere")
    else:
        (data / "processed").mkdir()
        target = data / "processed" / "pairs.parquet"
        {
            "link": lambda: target.symlink_to(secret),
            "fifo": lambda: os.mkfifo(target),
            "folder": target.mkdir,
        }[planted]()
    own = tmp_path / "own"
    own.mkdir()
    pinned = PinnedDevPairs(tmp_path / "checkout", "data/processed/pairs.parquet", own, LIMITS)
    with pytest.raises(GateDevSetError) as refused:
        pinned.path()
    assert "is not a regular file under" in str(refused.value) and "\n" not in str(refused.value)
    assert list(own.iterdir()) == [] and pinned.copy is None
