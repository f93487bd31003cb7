"""sentcl.registry.verdict: the gate's decision as a value, one test per branch, no server.

The facts are built by hand as the gate would gather them; each test states the verdict, reasons and tags it
expects from the rules written out here, never read back from the code under test.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from sentcl.registry.rules import (
    REFUSED,
    REGISTERING,
    TAG_REFUSED,
    TAG_ROLLED_BACK,
    TAG_STATE,
    TAG_WEIGHTS,
    GateConfig,
    PipelineShape,
    Scores,
)
from sentcl.registry.verdict import (
    PROMOTED,
    REJECTED,
    UNCHANGED,
    Caller,
    GateFacts,
    Measured,
    VersionFacts,
    candidate_facts,
    decide,
    plan_rollback,
    reason_tags,
    reasons_from_tags,
    screen,
    verdict_from_tags,
)

CONFIG = GateConfig.from_params(
    {
        "registry": {
            "model_name": "prod",
            "experiment_model_name": "prod-exp",
            "candidate_model_name": "prod-candidates",
            "min_delta": 0.5,
            "max_dev_drop": 1.0,
            "min_domain_delta": 1.0,
        }
    }
)
SHAPE = PipelineShape(("sentence_transformers.models.Transformer", "...Pooling", "...Normalize"), 384, True)
AT = "2026-12-07T05:00:00Z"


def facts(candidate_tags=None, champion="3", champion_tags=None, number="4", **changes) -> GateFacts:
    """Version ``number`` of the production model against champion ``champion`` (None: none yet)."""
    base = GateFacts(
        name="prod",
        source="prod",
        candidate=VersionFacts(number, {TAG_STATE: "ready", **(candidate_tags or {})}),
        champion=VersionFacts(champion, champion_tags or {}) if champion else None,
        config=CONFIG,
        caller=Caller("gate-account"),
        at=AT,
    )
    return dataclasses.replace(base, **changes)


def measured(candidate: float, champion: float | None = 80.0, **shapes) -> Measured:
    scores = Scores(champion, {"sick_dev": 72.0}) if champion is not None else None
    return Measured(
        Scores(candidate, {"sick_dev": 72.0}),
        shapes.get("candidate_shape", SHAPE),
        scores,
        shapes.get("champion_shape", SHAPE if champion is not None else None),
    )


def test_an_unfinished_registration_is_rejected_without_measuring():
    job = facts({TAG_STATE: REGISTERING})
    verdict = screen(job)
    assert verdict is not None and verdict.decision == REJECTED
    assert verdict.reasons == ("version 4 is unfinished (an interrupted registration)",)
    assert verdict.tags["gate.decision"] == REJECTED and verdict.tags["gate.at"] == AT
    # The registration that is running judges its own version: not unfinished then.
    assert screen(dataclasses.replace(job, in_registration=True)) is None


def test_the_champion_gated_again_is_unchanged_and_writes_nothing_over_its_promotion():
    verdict = decide(facts(number="3"))
    assert (verdict.decision, verdict.promoted, verdict.champion_before) == (UNCHANGED, False, "3")
    assert verdict.reasons == ("version 3 is already champion (prod version 3)",)
    assert verdict.tags == {}


def test_another_models_version_with_the_champions_weights_is_unchanged_and_says_so_on_itself():
    job = facts({TAG_WEIGHTS: "w1"}, champion_tags={TAG_WEIGHTS: "w1"}, source="prod-candidates")
    verdict = decide(job)
    assert verdict.decision == UNCHANGED
    reason = verdict.reasons[0]
    assert verdict.tags == {
        "gate.decision": UNCHANGED,
        "gate.reasons": reason,
        "gate.reasons_json": json.dumps([reason]),
    }
    # Other weights: not the champion, so it needs measuring.
    assert screen(dataclasses.replace(job, candidate=VersionFacts("4", {TAG_WEIGHTS: "w2"}))) is None


def test_the_weights_compared_are_the_gates_own_hash_never_the_candidates_tag():
    # A candidate whose tag claims the champion's weights but whose files hash to others is not "unchanged".
    own = candidate_facts({TAG_WEIGHTS: "w1", TAG_STATE: "ready"}, "4", own_weights="w-own")
    job = facts(champion_tags={TAG_WEIGHTS: "w1"}, source="prod-candidates", candidate=own)
    assert own.tags[TAG_WEIGHTS] == "w-own" and screen(job) is None


def test_a_refused_version_is_blocked_even_forced():
    refused = {TAG_STATE: REFUSED, TAG_REFUSED: "model.safetensors changed since registration"}
    for forced in (False, True):
        verdict = decide(facts(refused, forced=forced, caller=Caller("gate-account", "eve")))
        assert verdict.decision == REJECTED and "model.safetensors changed" in verdict.reasons[0]
        assert len(verdict.reasons) == 1  # nothing measured, nothing else said


def test_a_rolled_back_version_and_its_weights_are_blocked_unless_forced_by_name():
    rolled = facts({TAG_ROLLED_BACK: "true", "rolled_back_reason": "bad on tickets"})
    verdict = decide(rolled)
    assert verdict.decision == REJECTED and "bad on tickets" in verdict.reasons[0]
    same_weights = facts({TAG_WEIGHTS: "w9"}, rolled_back_weights=frozenset({"w9"}))
    assert "rolled-back version" in decide(same_weights).reasons[0]
    forced = dataclasses.replace(rolled, forced=True, caller=Caller("gate-account", "dave"))
    assert screen(forced) is None  # the block lifted: the gate measures, the score rules still apply
    verdict = decide(dataclasses.replace(forced, measured=measured(81.0)))
    assert verdict.decision == PROMOTED
    assert verdict.reasons[-1] == "forced by gate-account (--by dave, not verified)"
    assert verdict.tags["gate.forced_by"] == "gate-account" and verdict.tags["gate.by_note"] == "dave"


def test_decide_refuses_to_guess_without_a_measurement():
    with pytest.raises(ValueError, match="measure"):
        decide(facts())


def test_the_first_model_is_promoted_on_its_measurement():
    verdict = decide(facts(champion=None, measured=measured(80.0, champion=None)))
    assert verdict.decision == PROMOTED and verdict.champion_before is None
    assert "first model" in verdict.reasons[0]
    assert verdict.tags["gate.champion_before"] == "" and verdict.tags["gate.stsb_dev"] == "80.0000"
    assert not any(key.startswith("gate.champion_stsb") for key in verdict.tags)


def test_scored_promoted_and_refused_with_both_models_scores_in_reasons_and_tags():
    better = decide(facts(measured=measured(80.6)))  # 0.6 >= min_delta 0.5
    assert better.promoted and better.champion_before == "3"
    assert better.reasons[-1] == (
        "the gate's scores: version 4 stsb_dev 80.60, sick_dev 72.00; champion 3 stsb_dev 80.00, sick_dev 72.00"
    )
    assert better.tags["gate.stsb_dev"] == "80.6000" and better.tags["gate.champion_stsb_dev"] == "80.0000"
    assert better.tags["gate.pipeline"] == SHAPE.describe()
    assert (better.tags["gate.min_delta"], better.tags["gate.max_dev_drop"]) == ("0.5", "1.0")
    worse = decide(facts(measured=measured(80.4)))  # 0.4 < min_delta
    assert worse.decision == REJECTED and "min_delta 0.50" in worse.reasons[0]
    assert worse.tags["gate.decision"] == REJECTED and worse.tags["gate.by"] == "gate-account"


def test_a_registrants_own_domain_pairs_are_reported_and_never_decide():
    scores = Measured(
        Scores(79.6, {"sick_dev": 72.0}, 100.0), SHAPE, Scores(80.0, {"sick_dev": 72.0}, 40.0), SHAPE
    )
    counted = decide(facts(measured=scores))  # STS-B dev -0.4 within max_dev_drop, domain +60: promoted
    assert counted.promoted
    own = decide(facts(measured=scores, domain_counts=False))
    assert own.decision == REJECTED
    assert any("registrant's own, not approved" in reason for reason in own.reasons)
    assert own.tags["gate.domain_dev"] == "100.0000"  # reported all the same


def test_a_changed_served_pipeline_is_refused_unless_a_named_person_allows_it():
    dense = PipelineShape(SHAPE.modules[:2] + ("...Dense", "...Normalize"), 1, True)
    changed = facts(measured=measured(86.0, candidate_shape=dense))
    verdict = decide(changed)
    assert verdict.decision == REJECTED
    assert any("1 dimensions, not 384" in r and "--allow-pipeline-change" in r for r in verdict.reasons)
    allowed = decide(
        dataclasses.replace(changed, allow_pipeline_change=True, caller=Caller("gate-account", "ann"))
    )
    assert allowed.promoted
    assert any(r.endswith("allowed by gate-account (--by ann, not verified)") for r in allowed.reasons)
    # An unknown shape (a caller's own scorer on a folder that does not load) is no change.
    assert decide(facts(measured=measured(86.0, candidate_shape=None))).promoted


def test_a_rollback_marks_the_demoted_and_the_restored_version_with_who_why_and_when():
    plan = plan_rollback(
        "prod", VersionFacts("4"), VersionFacts("3"), Caller("gate-account", "alice"), "bad", AT
    )
    assert (plan.demoted, plan.target) == ("4", "3")
    assert plan.demote_tags == {
        TAG_ROLLED_BACK: "true",
        "rolled_back_by": "gate-account",
        "rolled_back_by_note": "alice",
        "rolled_back_reason": "bad",
        "rolled_back_at": AT,
    }
    assert plan.restore_tags == {
        "restored_by": "gate-account",
        "restored_by_note": "alice",
        "restored_reason": "bad",
        "restored_at": AT,
    }
    unnoted = plan_rollback("prod", VersionFacts("4"), VersionFacts("3"), Caller("gate-account"), "bad", AT)
    assert not any(key.endswith("_note") for key in {**unnoted.demote_tags, **unnoted.restore_tags})
    # The demoted version is then blocked for every later gate until someone forces it by name.
    assert "was rolled back (bad)" in decide(facts(plan.demote_tags, number="4")).reasons[0]


def test_a_rollback_to_a_version_the_gate_refused_is_refused_in_one_line():
    refused = VersionFacts("3", {TAG_STATE: REFUSED})
    with pytest.raises(ValueError, match="^rollback refused: prod version 3 was refused by the gate") as e:
        plan_rollback("prod", VersionFacts("4"), refused, Caller("gate-account"), "bad", AT)
    assert "\n" not in str(e.value)


def test_the_verdict_a_waiting_registrar_reads_back_from_the_tags():
    assert verdict_from_tags({TAG_STATE: "ready"}) is None  # not judged yet: keep waiting
    promoted = decide(facts(measured=measured(81.0)))
    read = verdict_from_tags({**promoted.tags, "gate.champion_version": "7"})
    assert (read["decision"], read["champion_after"]) == (PROMOTED, "7")
    assert "; ".join(read["reasons"]) == "; ".join(promoted.reasons)  # one "; "-joined text in the tag
    refused = {TAG_STATE: REFUSED, TAG_REFUSED: "MLmodel changed"}
    assert verdict_from_tags(refused) == {
        "decision": "refused",
        "reasons": ["MLmodel changed"],
        "champion_after": None,
    }


def test_reasons_that_hold_the_separator_read_back_exactly_from_the_tags():
    # The scores reason itself holds "; " ("... 84.1; champion ..."): split at "; ", two reasons read back as three.
    reasons = ["candidate STS-B dev 84.10; champion 85.00", "forced by ops"]
    tags = {"gate.decision": "promoted", **reason_tags(reasons)}
    assert tags["gate.reasons"] == "candidate STS-B dev 84.10; champion 85.00; forced by ops"
    assert verdict_from_tags(tags)["reasons"] == reasons
    # A version the gate judged before the JSON tag existed reads as before: the join split.
    assert reasons_from_tags({"gate.reasons": "a; b"}) == ["a", "b"]
    # A JSON tag that is not a list of strings is not trusted: the readable join is read instead.
    assert reasons_from_tags({"gate.reasons": "a", "gate.reasons_json": '{"x": 1}'}) == ["a"]
