"""sentcl.registry.rules: the gate's rule, GateConfig from params.yaml, what blocks a promotion (pure, no MLflow)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from sentcl.params import ParamsError
from sentcl.registry.rules import (
    TAG_DEV,
    TAG_ROLLED_BACK,
    TAG_STS,
    TAG_STSB_DEV,
    TAG_WEIGHTS,
    GateConfig,
    Scores,
    dev_scores,
    gate_decision,
    promotion_blocked,
    sts_row_from_tags,
    version_weights,
    weight_file_digests,
    weights_fingerprint,
)
from tests.paths import ROOT

TABLE = {"sick_dev": 72.0}  # the dev guards besides STS-B dev: SICK-R trial
TESTS = {"STS12": 70.0, "STS13": 75.0, "STSb": 80.0, "SICK-R": 72.0, "avg": 74.25}  # the seven test tasks
SECTION = {
    "model_name": "m",
    "experiment_model_name": "m-exp",
    "candidate_model_name": "m-candidates",
    "min_delta": 0.5,
    "max_dev_drop": 1.0,
    "min_domain_delta": 1.0,
}
CONFIG = GateConfig.from_params({"registry": SECTION})


def test_first_model_becomes_champion():
    promoted, reasons = gate_decision(Scores(80.0, TABLE, None), None, CONFIG)
    assert promoted and "first model" in reasons[0]


@pytest.mark.parametrize("delta", [-3.0, 0.0, 0.49])
def test_worse_or_equal_or_within_noise_is_never_promoted(delta):
    promoted, reasons = gate_decision(Scores(80.0 + delta, TABLE, None), Scores(80.0, TABLE, None), CONFIG)
    assert not promoted
    assert "min_delta 0.50" in reasons[0]


def test_better_dev_promotes_unless_sick_trial_drops_too_much():
    assert gate_decision(Scores(81.0, TABLE, None), Scores(80.0, TABLE, None), CONFIG)[0]
    # Exactly max_dev_drop is allowed; more is not.
    assert gate_decision(Scores(81.0, {"sick_dev": 71.0}, None), Scores(80.0, TABLE, None), CONFIG)[0]
    promoted, reasons = gate_decision(
        Scores(81.0, {"sick_dev": 70.5}, None), Scores(80.0, TABLE, None), CONFIG
    )
    assert not promoted
    assert any("sick_dev drops 1.50 > max_dev_drop 1.00" in r for r in reasons)


def tags(stsb: float, sick: float | None, tests: dict[str, float]) -> dict[str, str]:
    """A registered version's tags as stages.register writes them."""
    out = {TAG_STSB_DEV: f"{stsb:.6f}", TAG_STS: json.dumps(tests)}
    if sick is not None:
        out[TAG_DEV] = json.dumps({"sick_dev": sick})
    return out


def test_the_gate_never_reads_a_test_score():
    """A challenger that loses 10 points on every test task but holds its dev scores is promoted; one that keeps
    every test score but loses SICK-R trial is not. The seven test scores are on the version, for the record."""
    collapsed = {task: score - 10 for task, score in TESTS.items()}
    champion = Scores.from_tags(tags(80.0, 72.0, TESTS))
    assert gate_decision(Scores.from_tags(tags(81.0, 72.0, collapsed)), champion, CONFIG)[0]
    promoted, reasons = gate_decision(Scores.from_tags(tags(81.0, 70.0, TESTS)), champion, CONFIG)
    assert not promoted and any("sick_dev drops 2.00" in r for r in reasons)
    assert not any(task in " ".join(reasons) for task in ("STS12", "STS13", "SICK-R"))


def test_a_champion_registered_without_sick_trial_is_compared_on_sts_b_dev_only():
    old_champion = Scores.from_tags(tags(80.0, None, TESTS))
    promoted, reasons = gate_decision(Scores.from_tags(tags(81.0, 60.0, TESTS)), old_champion, CONFIG)
    assert promoted and any("champion has no sick_dev score recorded" in r for r in reasons)
    # A challenger without it is rejected while the champion has one: the guard cannot be checked.
    promoted, reasons = gate_decision(
        Scores.from_tags(tags(85.0, None, TESTS)), Scores.from_tags(tags(80.0, 72.0, TESTS)), CONFIG
    )
    assert not promoted and any("challenger has no sick_dev score" in r for r in reasons)


def test_dev_scores_and_the_registered_row():
    row = {"all": TESTS, "stsb_dev": 80.0, "sick_dev": 72.5, "mean": {}, "seconds": 3.0}
    assert dev_scores(row) == {"sick_dev": 72.5}
    assert dev_scores({"all": TESTS, "stsb_dev": 80.0, "sick_dev": None}) == {}
    registered = sts_row_from_tags(tags(80.0, 72.5, TESTS))
    assert registered == {"all": TESTS, "stsb_dev": 80.0, "sick_dev": 72.5}
    assert sts_row_from_tags(tags(80.0, None, TESTS)) == {"all": TESTS, "stsb_dev": 80.0}


def test_domain_gain_is_weighed_against_general_sts():
    # STS-B dev dips 0.5 (within max_dev_drop) but the domain gains 5: promoted.
    promoted, reasons = gate_decision(Scores(79.5, TABLE, 65.0), Scores(80.0, TABLE, 60.0), CONFIG)
    assert promoted, reasons
    # STS-B dev dips 2 (beyond max_dev_drop): the domain gain does not buy that.
    assert not gate_decision(Scores(78.0, TABLE, 65.0), Scores(80.0, TABLE, 60.0), CONFIG)[0]
    # STS-B dev gains, but the domain collapses: rejected.
    assert not gate_decision(Scores(82.0, TABLE, 50.0), Scores(80.0, TABLE, 60.0), CONFIG)[0]
    # Domain scores from different dev sets are ignored when asked.
    assert not gate_decision(Scores(79.5, TABLE, 65.0), Scores(80.0, TABLE, 60.0), CONFIG, use_domain=False)[
        0
    ]


def test_gate_config_comes_from_params_yaml_only():
    """params.yaml is the one home of every value: no field has a default in code."""
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(GateConfig)
    )
    with open(ROOT / "params.yaml") as f:
        params = yaml.safe_load(f)
    params["registry"]["min_delta"] = 0.123  # a value no default in code could hold by chance
    params["registry"]["model_name"] = "team-encoder"
    config = GateConfig.from_params(params)
    assert config.min_delta == 0.123 and config.model_name == "team-encoder"
    assert config.model_name != config.experiment_model_name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"min_dleta": 0.3}, "unknown key 'min_dleta' in section 'registry'"),
        ({"min_delta": -1}, "registry.min_delta must be a number >= 0, got -1"),
        ({"max_dev_drop": "lots"}, "registry.max_dev_drop must be a number"),
        ({"max_task_drop": 1.0}, "unknown key 'max_task_drop' in section 'registry'"),
        ({"experiment_model_name": "m"}, "must differ from model_name"),
        ({"candidate_model_name": "m"}, "candidate_model_name must differ from model_name"),
        ({"candidate_model_name": "m-exp"}, "candidate_model_name must differ from model_name"),
    ],
)
def test_gate_config_errors_name_the_key_in_one_line(change, message):
    with pytest.raises(ParamsError, match=message) as error:
        GateConfig.from_params({"registry": {**SECTION, **change}})
    assert "\n" not in str(error.value)


def test_gate_config_missing_key_or_section():
    with pytest.raises(ParamsError, match="registry.min_domain_delta is missing"):
        GateConfig.from_params({"registry": {k: v for k, v in SECTION.items() if k != "min_domain_delta"}})
    with pytest.raises(ParamsError, match="registry.candidate_model_name is missing"):
        GateConfig.from_params(
            {"registry": {k: v for k, v in SECTION.items() if k != "candidate_model_name"}}
        )
    with pytest.raises(ParamsError, match="section 'registry' is missing"):
        GateConfig.from_params({})


def test_rolled_back_versions_and_their_weights_are_blocked_unless_forced_by_someone():
    digest = weights_fingerprint({"model.safetensors": "ab" * 32})
    demoted = {TAG_ROLLED_BACK: "true", "rolled_back_reason": "bad", TAG_WEIGHTS: digest}
    assert "rolled back" in promotion_blocked(demoted, {digest}, None)
    assert promotion_blocked(demoted, {digest}, "alice") is None
    same_weights = {TAG_WEIGHTS: digest}
    assert "rolled-back" in promotion_blocked(same_weights, {digest}, None)
    assert promotion_blocked({TAG_WEIGHTS: "other"}, {digest}, None) is None
    # Versions registered before the fingerprint tag: derived from their per-file digests.
    legacy = {"weights_sha256": '{"model.safetensors": "' + "ab" * 32 + '"}'}
    assert version_weights(legacy) == digest


def test_a_refused_version_is_blocked_even_when_forced():
    from sentcl.registry.rules import REFUSED, TAG_REFUSED, TAG_STATE

    refused = {TAG_STATE: REFUSED, TAG_REFUSED: "models:/m/3: MLmodel changed since registration"}
    for forced_by in (None, "alice"):
        reason = promotion_blocked(refused, set(), forced_by)
        assert "refused" in reason and "MLmodel changed" in reason
    assert promotion_blocked({TAG_STATE: "ready"}, set(), None) is None


def test_the_gates_own_scores_become_gate_tags_and_one_log_text():
    scores = Scores(81.234567, {"sick_dev": 75.1}, 60.0)
    assert scores.tags() == {
        "gate.stsb_dev": "81.2346",
        "gate.sick_dev": "75.1000",
        "gate.domain_dev": "60.0000",
    }
    assert set(Scores(80.0).tags("gate.champion_")) == {"gate.champion_stsb_dev"}
    assert scores.text() == "stsb_dev 81.23, sick_dev 75.10, domain_dev 60.00"


def _st_folder(root, modules):  # noqa: ANN001, ANN202
    """A sentence-transformers folder's weight layout: a transformer at the top, each module's files below."""
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"transformer")
    (root / "modules.json").write_text(
        json.dumps([{"idx": 0, "path": "", "type": "x.Transformer"}, *modules])
    )
    return root


def test_one_transformer_under_two_heads_is_two_sets_of_weights(tmp_path):
    from hashlib import sha256

    bare = _st_folder(tmp_path / "bare", [{"idx": 1, "path": "1_Pooling", "type": "x.Pooling"}])
    (bare / "1_Pooling").mkdir()
    (bare / "1_Pooling" / "config.json").write_text("{}")
    # The transformer alone: the top file, keyed by its name, as every version registered so far was tagged.
    assert weight_file_digests(bare) == {"model.safetensors": sha256(b"transformer").hexdigest()}
    heads = []
    for head in (b"head one", b"head two"):
        folder = _st_folder(
            tmp_path / f"head-{len(heads)}", [{"idx": 1, "path": "2_Dense", "type": "x.Dense"}]
        )
        (folder / "2_Dense").mkdir()
        (folder / "2_Dense" / "model.safetensors").write_bytes(head)
        (folder / "onnx").mkdir()  # an export beside the pipeline, which no module names: not its weights
        (folder / "onnx" / "model.bin").write_bytes(b"onnx graph")
        heads.append(weight_file_digests(folder))
    assert heads[0] == {
        "model.safetensors": sha256(b"transformer").hexdigest(),
        "2_Dense/model.safetensors": sha256(b"head one").hexdigest(),
    }
    fingerprints = {weights_fingerprint(d) for d in (*heads, weight_file_digests(bare))}
    assert len(fingerprints) == 3


def test_a_module_path_outside_the_folder_is_not_followed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "model.safetensors").write_bytes(b"not this model's")
    folder = _st_folder(tmp_path / "m", [{"idx": 1, "path": "../elsewhere", "type": "x.Dense"}])
    assert list(weight_file_digests(folder)) == ["model.safetensors"]
