"""Register then gate under the promotion lease, the gate alone (``promote``), and ``rollback``.

Every path that moves ``champion`` first downloads the model it moves it to and checks every file against the
manifest recorded at registration (``measure.verified_download``): a mismatch is one line
(:class:`GateRefusedError`, exit 2), the version is tagged refused and nothing moves. The candidate is
downloaded once, before the gate decides anything from its tags (``owned.own_download``): its weights are hashed
from those files, its scores measured on them (``measure``), never read from tags a registrant wrote. A candidate
of another model (the gate process's) that wins becomes a production version of the gate's own upload of exactly
those files (``owned.register_owned``).

Each judgment is gather, decide, apply (``_gate_locked``): the gate gathers the facts (its own download, the
weights it hashed, the champion, the rolled-back weights, the caller; its own measurement of both models when
``verdict.screen`` cannot decide without one), ``sentcl.registry.verdict.decide`` turns them into a ``Verdict``
with no I/O, and ``_apply`` moves the alias, reads it back and writes the verdict's tags.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import (
    READY,
    REFUSED,
    TAG_STATE,
    GateConfig,
    GateSettings,
    LeaseTimes,
    Registration,
)
from sentcl.registry.verdict import (
    TAG_DECISION,
    Caller,
    GateFacts,
    Measured,
    Override,
    Verdict,
    VersionFacts,
    candidate_facts,
    decide,
    plan_rollback,
    screen,
)
from sentcl_mlflow.errors import GateRefusedError, NoChampionError
from sentcl_mlflow.registry.lease import Lease, promotion_lock
from sentcl_mlflow.registry.measure import Evidence, measure, verified_download
from sentcl_mlflow.registry.names import (
    CHALLENGER,
    CHAMPION,
    move_champion,
    target_model_name,
    utc_timestamp,
    version_or_none,
)
from sentcl_mlflow.registry.owned import Owned, own_download, register_owned
from sentcl_mlflow.registry.versions import (
    fail_orphaned_runs,
    finish_unfinished,
    register_locked,
    rolled_back_weight_digests,
)
from sentcl_mlflow.store import caller_identity, client

if TYPE_CHECKING:
    from mlflow import MlflowClient


def _caller(note: str | None) -> Caller:
    """The authenticated account (``store.caller_identity``) and what the caller says about who asked (``--by
    NAME``, else ``$SENTCL_ACTOR``): free text that nothing checks, recorded only as a labelled note."""
    return Caller(caller_identity(), note or os.environ.get("SENTCL_ACTOR") or None)


@dataclass(frozen=True)
class Judgment:
    """One run of the gate: which version (None: ``challenger``) of which model (``source``, when not ``name``:
    the gate process judges the candidates model's versions) against the champion of ``name``, under which
    rules, on what evidence, by whom, under ``lease``, with what a named person allows."""

    name: str
    version: str | None
    settings: GateSettings
    caller: Caller
    evidence: Evidence = Evidence()
    lease: Lease | None = None
    source: str | None = None
    override: Override = Override()
    in_registration: bool = False


def register_candidate(registration: Registration, params: Mapping[str, Any]) -> str:
    """Register as ``challenger`` (no gate). The version is ``ready`` when this returns."""
    return register_and_gate(registration, params, gate=False)["version"]


def register_and_gate(
    registration: Registration,
    params: Mapping[str, Any],
    evidence: Evidence | None = None,
    actor: str | None = None,
    gate: bool = True,
) -> dict[str, Any]:
    """Register then gate, as one unit under the promotion lease (see the module's docstring).

    ``registration.model_uri`` may be a function returning (model URI, run id), called only when a new version
    is needed (no version of the model has these weights yet). The gate scores the candidate and the champion
    itself on ``evidence`` (default the validate stage's ``data/processed/pairs.parquet``), never on the score
    tags of the registration."""
    settings = GateSettings.from_params(params)
    name = registration.name or target_model_name(settings.config)
    mlc = client()
    with promotion_lock(name, settings.lease, mlc) as lease:
        finish_unfinished(mlc, name)
        fail_orphaned_runs(mlc, lease)
        version, created = register_locked(mlc, name, registration)
        result: dict[str, Any] = {"model": name, "version": version, "created": created}
        if gate:
            caller, evidence = _caller(actor), evidence or Evidence()
            job = Judgment(name, version, settings, caller, evidence, lease, in_registration=True)
            result["gate"] = _gate_locked(mlc, job)
        if created:
            mlc.set_model_version_tag(name, version, TAG_STATE, READY)
    if "gate" in result:
        print(format_decision(result["gate"]))
    return result


def judge_candidate(
    mlc: MlflowClient, source: str, version: str, lease: Lease, params: Mapping[str, Any], evidence: Evidence
) -> dict[str, Any]:
    """The gate process's gate (``gatekeeper.judge``): ``source`` version ``version`` (a version of the
    candidates model) against the champion of ``registry.model_name``, under ``lease``, that model's promotion
    lease, which the caller holds. As ``promote`` gates, and: the candidate's weights tag must name its
    verified files; on "promoted" the gate registers its own upload of the files it scored as a version of
    the production model (``owned.register_owned``), verifies it and sets ``champion`` there; the verdict is
    tagged on the candidate. ``evidence.domain_counts`` False: its domain pairs are scored and reported, never
    decide."""
    settings = GateSettings.from_params(params)
    job = Judgment(
        settings.config.model_name, version, settings, Caller(caller_identity()), evidence, lease, source
    )
    return _gate_locked(mlc, job)


@dataclass(frozen=True)
class _Gathered:
    """What the gate holds once it gathered the facts: the MLflow versions, its own verified copy of the
    candidate (None: refused before) and when it started."""

    candidate: Any
    champion: Any
    owned: Owned | None
    started: float


def _gate_locked(mlc: MlflowClient, job: Judgment) -> dict[str, Any]:
    """Gather, decide, apply: ``job`` under its lease. The candidate's files first, once, before any decision
    reads its tags: a changed file, or (a version of another model, whose registrar may edit its tags) a weights
    tag that is not its files, is a refusal whatever the gate would decide next. From there on the gate's own copy
    is the source of its weights, its scores and (on promotion) the production version. A version the gate
    refused already stays refused."""
    started = time.time()
    source, version = job.source or job.name, job.version
    cand = mlc.get_model_version(source, version) if version else version_or_none(mlc, source, CHALLENGER)
    if cand is None:
        raise LookupError(f"no {CHALLENGER!r} version of {source!r} to gate; run the export stage first")
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-") as tmp:
        owned = None
        if (cand.tags or {}).get(TAG_STATE) != REFUSED:
            limits = job.settings.limits
            owned = own_download(mlc, source, cand, Path(tmp), weights_tag=source != job.name, limits=limits)
        champ = version_or_none(mlc, job.name, CHAMPION)
        gathered = _Gathered(cand, champ, owned, started)
        facts = _facts(mlc, job, gathered)
        if screen(facts) is None:  # nothing decided yet: the gate measures both itself
            facts = dataclasses.replace(facts, measured=_measure(mlc, job, gathered))
        return _apply(mlc, job, gathered, decide(facts))


def _facts(mlc: MlflowClient, job: Judgment, gathered: _Gathered) -> GateFacts:
    cand, champ, owned = gathered.candidate, gathered.champion, gathered.owned
    return GateFacts(
        name=job.name,
        source=job.source or job.name,
        candidate=candidate_facts(cand.tags or {}, str(cand.version), owned.weights if owned else None),
        champion=VersionFacts(str(champ.version), dict(champ.tags or {})) if champ is not None else None,
        config=job.settings.config,
        caller=job.caller,
        at=utc_timestamp(),
        rolled_back_weights=frozenset(rolled_back_weight_digests(mlc, job.name)),
        forced=job.override.force,
        allow_pipeline_change=job.override.allow_pipeline_change,
        in_registration=job.in_registration,
        domain_counts=job.evidence.domain_counts,
    )


def _measure(mlc: MlflowClient, job: Judgment, gathered: _Gathered) -> Measured:
    """Downloaded and verified (a tampered file: refused, one line, nothing moves), then scored by the gate
    itself, both on the same pairs: a domain score counts only when a domain dev file was given."""
    cand, champ, owned = gathered.candidate, gathered.champion, gathered.owned
    versions = [cand] + ([champ] if champ is not None else [])
    scorer = job.evidence.make_scorer(job.settings.limits)
    roots = [owned.root if owned else None]
    measured = measure(mlc, job.name, versions, scorer, roots, job.settings.limits)
    (cand_scores, cand_shape), (champ_scores, champ_shape) = measured[0], (measured[1:] or [(None, None)])[0]
    return Measured(cand_scores, cand_shape, champ_scores, champ_shape)


def _apply(mlc: MlflowClient, job: Judgment, gathered: _Gathered, verdict: Verdict) -> dict[str, Any]:
    """The verdict applied: on promotion (of another model's version: the gate's own upload of the bytes it
    scored, registered as a production version) the alias moved under the lease's fencing check and read back;
    then the tags, after the alias moved, so a tag never claims a move that did not happen, and
    ``gate.decision`` last: a reader that sees it (a registrar waiting on its candidate) sees the rest too."""
    name, source, cand, champ = job.name, job.source or job.name, gathered.candidate, gathered.champion
    number = str(cand.version)
    target = number  # the version of ``name`` that becomes champion
    tags = dict(verdict.tags)
    tagged = [(source, number)] if tags else []
    if verdict.promoted:
        if source != name:
            target = register_owned(mlc, name, source, cand, gathered.owned)
        if champ is not None:
            mlc.set_model_version_tag(name, target, "previous_champion", champ.version)
        mlc.set_model_version_tag(name, target, "gate.lease_token", job.lease.token)
        move_champion(mlc, name, target, job.lease)
        if source != name:
            mlc.set_model_version_tag(name, target, TAG_STATE, READY)
            # The production version first: the candidate's gate.decision is what a waiting registrar reads.
            mlc.set_model_version_tag(name, target, "gate.candidate", f"{source}/{number}")
            tags["gate.champion_version"] = target  # on the candidate: which production version it became
            tagged.insert(0, (name, target))
    for model, version in tagged:
        for key, value in sorted(tags.items(), key=lambda item: item[0] == TAG_DECISION):
            mlc.set_model_version_tag(model, version, key, value)
    before = verdict.champion_before
    return {
        "model": source,
        "version": number,
        "decision": verdict.decision,
        "promoted": verdict.promoted,
        "champion_before": before,
        "champion_after": target if verdict.promoted else before,
        "reasons": list(verdict.reasons),
        "seconds": round(time.time() - gathered.started, 2),
    }


def promote(
    params: Mapping[str, Any],
    name: str | None = None,
    version: str | None = None,
    evidence: Evidence | None = None,
    override: Override | None = None,
) -> dict[str, Any]:
    """Run the gate on ``version`` (default: the ``challenger`` alias) against ``champion``; print and tag.

    The champion is read after the lease is taken, so two gates cannot both promote against a stale champion.
    Both are downloaded, verified against their registration manifests and scored by the gate on ``evidence``
    (default data/processed/pairs.parquet; a domain's scored pairs when given). What a named person allows:
    ``override``. Who promoted is the authenticated account (``gate.by``, ``gate.forced_by``); ``--by`` is
    recorded as a note (``gate.by_note``)."""
    settings, override = GateSettings.from_params(params), override or Override()
    name = name or settings.config.model_name
    evidence = evidence or Evidence()
    mlc = client()
    with promotion_lock(name, settings.lease, mlc) as lease:
        finish_unfinished(mlc, name)
        caller = _caller(override.actor)
        job = Judgment(name, version, settings, caller, evidence, lease, override=override)
        result = _gate_locked(mlc, job)
    print(format_decision(result))
    return result


def format_decision(result: Mapping[str, Any]) -> str:
    if result["decision"] == "unchanged":
        return f"gate: {result['model']} version {result['version']} is already champion; nothing to do"
    lines = [
        f"gate: {result['model']} version {result['version']} {result['decision'].upper()}"
        f" (champion {result['champion_before'] or '-'} -> {result['champion_after'] or '-'})"
    ]
    lines += [f"  - {reason}" for reason in result["reasons"]]
    return "\n".join(lines)


def rollback(
    params: Mapping[str, Any],
    name: str | None = None,
    actor: str | None = None,
    reason: str = "manual rollback",
) -> dict[str, Any]:
    """Give ``champion`` back to the version it replaced. The demoted version is tagged ``rolled_back`` (no
    gate promotes it, or its weights, again without ``--force``) and loses ``challenger`` if it held it. Who rolled
    back is the authenticated account (``rolled_back_by``); ``actor`` (``--by``) is an unverified note."""
    name = name or GateConfig.from_params(params).model_name
    mlc, caller = client(), _caller(actor)
    with promotion_lock(name, LeaseTimes.from_params(params), mlc) as lease:
        champ = version_or_none(mlc, name, CHAMPION)
        if champ is None:
            raise NoChampionError(f"{name!r} has no champion to roll back")
        previous = (champ.tags or {}).get("previous_champion")
        if not previous:
            raise LookupError(f"champion version {champ.version} has no previous champion to roll back to")
        versions = (champ, mlc.get_model_version(name, previous))
        facts = [VersionFacts(str(v.version), dict(v.tags or {})) for v in versions]
        try:
            plan = plan_rollback(name, *facts, caller, reason, utc_timestamp())
        except ValueError as e:
            raise GateRefusedError(str(e)) from None
        with tempfile.TemporaryDirectory(
            prefix="sentcl-rollback-"
        ) as tmp:  # its files, before it is champion
            verified_download(mlc, name, plan.target, Path(tmp))
        # Marked first: from here on no gate can promote it, whatever happens to the rest of this call.
        _set_tags(mlc, name, plan.demoted, plan.demote_tags)
        move_champion(mlc, name, plan.target, lease)
        challenger = version_or_none(mlc, name, CHALLENGER)
        if challenger is not None and str(challenger.version) == plan.demoted:
            mlc.delete_registered_model_alias(name, CHALLENGER)
        _set_tags(mlc, name, plan.target, plan.restore_tags)
    print(f"rollback: {name} champion {plan.demoted} -> {plan.target} by {caller.describe()}: {reason}")
    who = {"by": caller.identity, "note": caller.note, "reason": reason}
    return {"model": name, "from": plan.demoted, "to": plan.target, **who}


def _set_tags(mlc: MlflowClient, name: str, version: str, tags: Mapping[str, str]) -> None:
    for key, value in tags.items():
        mlc.set_model_version_tag(name, version, key, value)
