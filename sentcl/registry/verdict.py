"""The gate's verdict as a value: the facts the gate gathered (:class:`GateFacts`), :func:`decide` (pure: no I/O,
no clock), and the :class:`Verdict` the gate then applies (``sentcl_mlflow.registry.gate``: move the alias, read
it back, write the tags).

The gate runs in three steps. It gathers: its own verified download of the candidate and the weights it hashed
from it, the champion, the weights of rolled-back versions, the caller. :func:`screen` says whether that is
enough to decide (an unfinished registration, the champion again, a blocked version); if not, the gate measures
both models itself (:class:`Measured`) and :func:`decide` compares them with ``rules.gate_decision``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    gate_decision,
    pipeline_change,
    promotion_blocked,
    version_weights,
)

UNCHANGED, PROMOTED, REJECTED = "unchanged", "promoted", "rejected"
TAG_DECISION = "gate.decision"
TAG_REASONS = "gate.reasons"  # for people: the reasons joined by "; " (a reason may itself hold "; ")
TAG_REASONS_JSON = "gate.reasons_json"  # for programs: the same reasons as a JSON list, read back exactly


def reason_tags(reasons: Sequence[str]) -> dict[str, str]:
    """The two tags that record the gate's reasons: the readable join and the exact JSON list."""
    return {TAG_REASONS: "; ".join(reasons), TAG_REASONS_JSON: json.dumps(list(reasons))}


def reasons_from_tags(tags: Mapping[str, str]) -> list[str]:
    """The reasons a version's tags record: the JSON list where the gate wrote one, else (a version judged before
    that tag existed) the readable join split at "; "."""
    exact = tags.get(TAG_REASONS_JSON)
    if exact is not None:
        try:
            reasons = json.loads(exact)
        except ValueError:
            reasons = None
        if isinstance(reasons, list) and all(isinstance(r, str) for r in reasons):
            return reasons
    return [r for r in tags.get(TAG_REASONS, "").split("; ") if r]


@dataclass(frozen=True)
class Caller:
    """Who runs the gate: the account the tracking server authenticated, and the free-text ``--by`` note that
    nothing checks (recorded only as a labelled note beside the account)."""

    identity: str
    note: str | None = None

    def describe(self) -> str:
        return f"{self.identity} (--by {self.note}, not verified)" if self.note else self.identity


@dataclass(frozen=True)
class Override:
    """What a named person allows the gate (``--by NAME``): ``force`` lifts the rolled-back block (never the score
    rules nor a refusal); ``allow_pipeline_change`` lets a candidate whose served pipeline differs from the
    champion's (modules, vector size, normalisation) be promoted on its scores. ``actor`` alone is a note."""

    actor: str | None = None
    force: bool = False
    allow_pipeline_change: bool = False

    def __post_init__(self) -> None:
        for flag, asked in (("--force", self.force), ("--allow-pipeline-change", self.allow_pipeline_change)):
            if asked and not self.actor:
                raise ValueError(f"{flag} needs the name of the person asking for it (--by NAME)")


@dataclass(frozen=True)
class VersionFacts:
    """A registered version as the gate sees it: its number and its tags (for the candidate, with the weights
    digest the gate hashed from its own download in place of any tag's)."""

    number: str
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Measured:
    """The gate's own measurement of the candidate and the champion (None: there is none yet), each on the same
    pairs, loaded as production loads it; a shape is None where the model did not load as a pipeline."""

    candidate: Scores
    candidate_shape: PipelineShape | None = None
    champion: Scores | None = None
    champion_shape: PipelineShape | None = None


@dataclass(frozen=True)
class GateFacts:
    """Everything :func:`decide` reads. ``name``: the production model; ``source``: the model the candidate
    lives in (another one when the gate process judges a registrar's candidate). ``domain_counts`` False: the
    domain pairs are the registrant's own, reported and never counted. ``at``: the time the gate stamps."""

    name: str
    source: str
    candidate: VersionFacts
    champion: VersionFacts | None
    config: GateConfig
    caller: Caller
    at: str
    rolled_back_weights: frozenset[str] = frozenset()
    forced: bool = False
    allow_pipeline_change: bool = False
    in_registration: bool = False
    domain_counts: bool = True
    measured: Measured | None = None


@dataclass(frozen=True)
class Verdict:
    """What the gate decided and what it writes: ``decision`` (unchanged, promoted, rejected), the reasons in
    order, the champion before, and ``tags`` for the judged version (and, on promotion of another model's
    version, for the production version the gate registers)."""

    decision: str
    reasons: tuple[str, ...]
    champion_before: str | None
    tags: Mapping[str, str]

    @property
    def promoted(self) -> bool:
        return self.decision == PROMOTED


def screen(facts: GateFacts) -> Verdict | None:
    """The verdicts that need no measurement, else None (the gate measures, then calls :func:`decide`):

    - an unfinished registration (``sentcl.state=registering``) judged outside it: rejected;
    - the champion itself (another model's version: one with the champion's weights, when nothing blocks it):
      unchanged, no tag over the one that promoted it (another model's version gets the verdict it waits for);
    - a refused or rolled-back version, or rolled-back weights: rejected, with the block as the reason."""
    candidate, champion = facts.candidate, facts.champion
    blocked = promotion_blocked(
        candidate.tags, set(facts.rolled_back_weights), facts.caller.describe() if facts.forced else None
    )
    if candidate.tags.get(TAG_STATE) == REGISTERING and not facts.in_registration:
        return _rejected(facts, [f"version {candidate.number} is unfinished (an interrupted registration)"])
    if _same_as_champion(facts) and (facts.source == facts.name or not blocked):
        reason = f"version {candidate.number} is already champion ({facts.name} version {champion.number})"
        tags = {TAG_DECISION: UNCHANGED, **reason_tags([reason])} if facts.source != facts.name else {}
        return Verdict(UNCHANGED, (reason,), champion.number, tags)
    if blocked:
        return _rejected(facts, [blocked])
    return None


def decide(facts: GateFacts) -> Verdict:
    """The gate's verdict on ``facts``: :func:`screen`'s when it has one; else (``facts.measured`` required) the
    score rules (``rules.gate_decision``) on the gate's own measurement, a served pipeline that changes refused
    unless an operator allowed it, the scores of both in the reasons and the tags."""
    early = screen(facts)
    if early is not None:
        return early
    measured = facts.measured
    if measured is None:
        raise ValueError("decide: the gate must measure the candidate first (screen found nothing to decide)")
    promoted, reasons = gate_decision(
        measured.candidate, measured.champion, facts.config, use_domain=facts.domain_counts
    )
    if not facts.domain_counts and measured.candidate.domain is not None:
        reasons.append(
            "its domain dev pairs are the registrant's own, not approved by an operator: reported, never "
            "counted (sentcl_mlflow.registry.evidence)"
        )
    changed = pipeline_change(measured.candidate_shape, measured.champion_shape)
    if changed and facts.allow_pipeline_change:
        reasons.append(f"{changed}: allowed by {facts.caller.describe()}")
    elif changed:
        promoted = False
        reasons.append(f"{changed}; promote it only with --allow-pipeline-change --by NAME")
    score_tags = measured.candidate.tags()
    if measured.candidate_shape is not None:
        score_tags["gate.pipeline"] = measured.candidate_shape.describe()
    own = f"the gate's scores: version {facts.candidate.number} {measured.candidate.text()}"
    if measured.champion is not None and facts.champion is not None:
        score_tags.update(measured.champion.tags("gate.champion_"))
        own += f"; champion {facts.champion.number} {measured.champion.text()}"
    reasons.append(own)
    if facts.forced:
        reasons.append(f"forced by {facts.caller.describe()}")
    decision = PROMOTED if promoted else REJECTED
    return Verdict(
        decision, tuple(reasons), _champion_number(facts), _gate_tags(facts, decision, reasons, score_tags)
    )


def _same_as_champion(facts: GateFacts) -> bool:
    champion = facts.champion
    if champion is None:
        return False
    if facts.source == facts.name:
        return champion.number == facts.candidate.number
    # Another model's version: the champion's weights registered again (a retrain whose init won).
    weights = version_weights(facts.candidate.tags)
    return bool(weights) and weights == version_weights(champion.tags)


def _champion_number(facts: GateFacts) -> str | None:
    return facts.champion.number if facts.champion is not None else None


def _rejected(facts: GateFacts, reasons: list[str]) -> Verdict:
    return Verdict(
        REJECTED, tuple(reasons), _champion_number(facts), _gate_tags(facts, REJECTED, reasons, {})
    )


def _gate_tags(
    facts: GateFacts, decision: str, reasons: list[str], score_tags: Mapping[str, str]
) -> dict[str, str]:
    """The gate's record on the judged version: its decision and reasons, the rules it applied, who (the
    authenticated account; the ``--by`` note apart), when, and its own scores (``gate.stsb_dev`` ...)."""
    tags = {
        TAG_DECISION: decision,
        **reason_tags(reasons),
        "gate.champion_before": _champion_number(facts) or "",
        "gate.min_delta": str(facts.config.min_delta),
        "gate.max_dev_drop": str(facts.config.max_dev_drop),
        "gate.at": facts.at,
        "gate.by": facts.caller.identity,  # the account the server authenticated, never free text
    }
    if facts.caller.note:
        tags["gate.by_note"] = facts.caller.note  # --by: what the caller says, not verified
    if facts.forced:
        tags["gate.forced_by"] = facts.caller.identity
    tags.update(score_tags)
    return tags


def verdict_from_tags(tags: Mapping[str, str]) -> dict[str, object] | None:
    """A judged version's verdict as its tags record it (what a registrar waiting on the gate process reads):
    decision, reasons and the champion after; "refused" for a version whose files failed; None while it has none."""
    if tags.get(TAG_STATE) == REFUSED:
        return {"decision": "refused", "reasons": [tags.get(TAG_REFUSED, "")], "champion_after": None}
    if TAG_DECISION not in tags:
        return None
    return {
        "decision": tags[TAG_DECISION],
        "reasons": reasons_from_tags(tags),
        "champion_after": tags.get("gate.champion_version") or tags.get("gate.champion_before") or None,
    }


def candidate_facts(tags: Mapping[str, str], number: str, own_weights: str | None) -> VersionFacts:
    """The candidate as the gate judges it: its tags, with the weights digest the gate hashed from its own
    download (``own_weights``) in place of a tag's, which is what blocks and "already champion" compare."""
    tags = dict(tags)
    if own_weights:
        tags[TAG_WEIGHTS] = own_weights
    return VersionFacts(number, tags)


@dataclass(frozen=True)
class Rollback:
    """A rollback as a value: ``champion`` goes back to ``target`` (the version it replaced); the tags that mark the
    demoted one (``rolled_back``: no gate promotes it, or its weights, again without ``--force``) and the restored
    one, each with who (the authenticated account; the ``--by`` note apart), why and when."""

    demoted: str
    target: str
    demote_tags: Mapping[str, str]
    restore_tags: Mapping[str, str]


def plan_rollback(
    name: str, champion: VersionFacts, previous: VersionFacts, caller: Caller, reason: str, at: str
) -> Rollback:
    """The rollback of ``name``'s ``champion`` to ``previous`` (its ``previous_champion``); ``ValueError`` (one
    line) when the gate refused ``previous``: its files differ from what was registered, so it is never champion
    again."""
    if previous.tags.get(TAG_STATE) == REFUSED:
        raise ValueError(
            f"rollback refused: {name} version {previous.number} was refused by the gate; champion not moved"
        )
    by = {"_by": caller.identity, **({"_by_note": caller.note} if caller.note else {})}
    demote = {TAG_ROLLED_BACK: "true", **{f"rolled_back{k}": v for k, v in by.items()}}
    demote |= {"rolled_back_reason": reason, "rolled_back_at": at}
    restore = {**{f"restored{k}": v for k, v in by.items()}, "restored_reason": reason, "restored_at": at}
    return Rollback(champion.number, previous.number, demote, restore)
