"""Register then gate under the promotion lease, the gate alone (``promote``), and ``rollback``.

Every path that moves ``champion`` first downloads the model it moves it to and checks every file against the
manifest recorded at registration (``measure.verified_download``): a mismatch is one line
(:class:`GateRefusedError`, exit 2), the version is tagged refused and nothing moves. The candidate is
downloaded once, before the gate decides anything from its tags (``owned.own_download``): its weights are hashed
from those files, its scores measured on them (``measure``), never read from tags a registrant wrote. A candidate
of another model (the gate process's) that wins becomes a production version of the gate's own upload of exactly
those files (``owned.register_owned``).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.params import process_params
from sentcl.registry.rules import (
    REFUSED,
    TAG_ROLLED_BACK,
    TAG_STATE,
    TAG_WEIGHTS,
    GateConfig,
    GateLimits,
    gate_decision,
    gate_score_tags,
    pipeline_change,
    promotion_blocked,
    scores_text,
    version_weights,
)
from sentcl_mlflow.errors import GateRefusedError, NoChampionError
from sentcl_mlflow.registry.lease import Lease, promotion_lock
from sentcl_mlflow.registry.measure import DevScorer, DevSets, Scorer, measure, verified_download
from sentcl_mlflow.registry.names import (
    CHALLENGER,
    CHAMPION,
    READY,
    REGISTERING,
    gate_config,
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


def _note(note: str | None) -> str | None:
    """What the caller says about who asked (``--by NAME``, else ``$SENTCL_ACTOR``): free text that nothing
    checks, recorded only as a labelled note beside the authenticated account (``store.caller_identity``)."""
    return note or os.environ.get("SENTCL_ACTOR") or None


def _who(identity: str, note: str | None) -> str:
    return f"{identity} (--by {note}, not verified)" if note else identity


@dataclass(frozen=True)
class Judgment:
    """One run of the gate: which version of which model, against the champion of ``name``, by whom, what
    scores it, and what the caller allows. ``source``: the registered model the candidate lives in when it is not
    ``name`` (the gate process judges the candidates model's versions). ``domain_counts``: the domain pairs decide
    (an operator's, or approved ones) or only inform (a registrant's own, not approved)."""

    name: str
    version: str | None
    config: GateConfig
    limits: GateLimits
    caller: tuple[str, str | None]  # the authenticated account, the caller's unverified --by note or None
    dev_pairs: Path | str | None = None  # default: the validate stage's data/processed/pairs.parquet
    domain_dev: Path | str | None = None
    scorer: Scorer | None = None  # replaces the dev-set scoring (Python callers); the verification stays
    lease: Lease | None = None
    source: str | None = None
    forced: bool = False
    in_registration: bool = False
    domain_counts: bool = True
    allow_pipeline_change: bool = False

    def make_scorer(self) -> Scorer:
        """What scores the candidate and the champion, built only when the gate gets that far (a blocked or
        unfinished version needs no dev pairs)."""
        if self.scorer is not None:
            return self.scorer
        dev = DevSets.load(self.dev_pairs, self.domain_dev, self.limits)
        print(f"gate: scoring on {dev.describe()} ({dev.source})")
        return DevScorer(dev)


def _params(params: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return params if params is not None else process_params()


def register_candidate(
    model_uri: str,
    stsb_dev: float,
    sts_all: Mapping[str, float],
    name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    weights_sha256: str | None = None,
) -> str:
    """Register ``model_uri`` as ``challenger`` (no gate). The version is ``ready`` when this returns."""
    return register_and_gate(
        model_uri,
        stsb_dev,
        sts_all,
        name=name,
        tags=tags,
        run_id=run_id,
        weights_sha256=weights_sha256,
        gate=False,
    )["version"]


def register_and_gate(
    model_uri: str | Callable[[], tuple[str, str | None]],
    stsb_dev: float,
    sts_all: Mapping[str, float],
    name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    weights_sha256: str | None = None,
    gate: bool = True,
    actor: str | None = None,
    params: Mapping[str, Any] | None = None,
    domain_dev: Path | str | None = None,
    dev_pairs: Path | str | None = None,
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """Register then gate, as one unit under the promotion lease (see the module's docstring).

    ``model_uri`` may be a function returning (model URI, run id), called only when a new version is needed
    (no version of ``name`` has these weights yet). The gate scores the candidate and the champion itself on
    ``dev_pairs`` (default the validate stage's ``data/processed/pairs.parquet``) and on ``domain_dev`` (scored
    pairs of the domain a retrain brought), never on the score tags of the registration."""
    config = gate_config(params)
    limits = GateLimits.from_params(_params(params))
    name = name or target_model_name(config)
    mlc = client()
    with promotion_lock(name, mlc=mlc) as lease:
        finish_unfinished(mlc, name)
        fail_orphaned_runs(mlc, lease)
        version, created = register_locked(
            mlc, name, model_uri, stsb_dev, sts_all, weights_sha256, tags, run_id
        )
        result: dict[str, Any] = {"model": name, "version": version, "created": created}
        if gate:
            job = Judgment(
                name,
                version,
                config,
                limits,
                (caller_identity(), _note(actor)),
                dev_pairs,
                domain_dev,
                scorer,
                lease=lease,
                in_registration=True,
            )
            result["gate"] = _gate_locked(mlc, job)
        if created:
            mlc.set_model_version_tag(name, version, TAG_STATE, READY)
    if "gate" in result:
        print(format_decision(result["gate"]))
    return result


def judge_candidate(
    mlc: MlflowClient,
    source: str,
    version: str,
    config: GateConfig,
    lease: Lease,
    params: Mapping[str, Any] | None,
    dev_pairs: Path | str | None = None,
    domain_dev: Path | str | None = None,
    domain_counts: bool = True,
) -> dict[str, Any]:
    """The gate process's gate (``gatekeeper.judge``): ``source`` version ``version`` (a version of the
    candidates model) against the champion of ``config.model_name``, under ``lease``, that model's promotion
    lease, which the caller holds. As ``promote`` gates, and: the candidate's weights tag must name its
    verified files; on "promoted" the gate registers its own upload of the files it scored as a version of
    ``config.model_name`` (``owned.register_owned``), verifies it and sets ``champion`` there; the verdict is
    tagged on the candidate. ``domain_counts`` False: its domain pairs are scored and reported, never decide."""
    limits = GateLimits.from_params(_params(params))
    job = Judgment(
        config.model_name,
        version,
        config,
        limits,
        (caller_identity(), None),
        dev_pairs,
        domain_dev,
        lease=lease,
        source=source,
        domain_counts=domain_counts,
    )
    return _gate_locked(mlc, job)


def _gate_locked(mlc: MlflowClient, job: Judgment) -> dict[str, Any]:
    """``job`` under its lease: on promotion of another model's version (``job.source``) the gate's own upload of
    the files it scored becomes a version of ``job.name``, verified, and ``champion`` is set there."""
    started = time.time()
    source, version = job.source or job.name, job.version
    cand = mlc.get_model_version(source, version) if version else version_or_none(mlc, source, CHALLENGER)
    if cand is None:
        raise LookupError(f"no {CHALLENGER!r} version of {source!r} to gate; run the export stage first")
    with tempfile.TemporaryDirectory(prefix="sentcl-gate-") as tmp:
        # Its files first, once, before any decision reads its tags: a changed file, or (a version of another
        # model, whose registrar may edit its tags) a weights tag that is not its files, is a refusal whatever the
        # gate would decide next. From here on the gate's own copy is the source of its weights, its scores and
        # (on promotion) the production version. A version the gate refused already stays refused.
        owned = None
        if (cand.tags or {}).get(TAG_STATE) != REFUSED:
            owned = own_download(
                mlc, source, cand, Path(tmp), weights_tag=source != job.name, limits=job.limits
            )
        return _decide(mlc, job, cand, owned, started)


def _decide(
    mlc: MlflowClient, job: Judgment, cand: Any, owned: Owned | None, started: float
) -> dict[str, Any]:
    """``_gate_locked`` once the gate holds its own verified copy of the candidate (``owned``; None: it was
    refused before). Its weights are the ones the gate hashed from that copy, never a tag's."""
    name, source, config, lease = job.name, job.source or job.name, job.config, job.lease
    forced, in_registration = job.forced, job.in_registration
    identity, note = job.caller
    forced_by = _who(identity, note) if forced else None
    tags = dict(cand.tags or {})
    if owned is not None and owned.weights:
        tags[TAG_WEIGHTS] = owned.weights  # what blocks and "already champion" compare: the gate's own hash
    champ = version_or_none(mlc, name, CHAMPION)
    blocked = promotion_blocked(tags, rolled_back_weight_digests(mlc, name), forced_by)
    measured_tags: dict[str, str] = {}
    if source == name:
        same_as_champion = champ is not None and str(champ.version) == str(cand.version)
    else:  # another model's version: the champion's weights registered again (a retrain whose init won)
        weights = version_weights(tags)
        same_as_champion = (
            champ is not None and bool(weights) and weights == version_weights(champ.tags or {})
        )
    if tags.get(TAG_STATE) == REGISTERING and not in_registration:
        promoted, reasons = False, [f"version {cand.version} is unfinished (an interrupted registration)"]
    elif same_as_champion and (source == name or not blocked):
        # Gating the champion again is a no-op: no decision, and no tag over the one that promoted it.
        result = {
            "model": source,
            "version": str(cand.version),
            "decision": "unchanged",
            "promoted": False,
            "champion_before": str(champ.version),
            "champion_after": str(champ.version),
            "reasons": [f"version {cand.version} is already champion ({name} version {champ.version})"],
            "seconds": round(time.time() - started, 2),
        }
        if source != name:  # the gate process's verdict, so the registrar waiting on it sees one
            mlc.set_model_version_tag(source, cand.version, "gate.decision", "unchanged")
            mlc.set_model_version_tag(source, cand.version, "gate.reasons", result["reasons"][0])
        return result
    elif blocked:
        promoted, reasons = False, [blocked]
    else:
        # Downloaded and verified (a tampered file: refused, one line, nothing moves), then scored by the gate
        # itself, both on the same pairs: a domain score counts only when a domain dev file was given.
        versions = [cand] + ([champ] if champ is not None else [])
        measured = measure(
            mlc, name, versions, job.make_scorer(), [owned.root if owned else None], job.limits
        )
        cand_scores, cand_shape = measured[0]
        champ_scores, champ_shape = measured[1] if champ is not None else (None, None)
        promoted, reasons = gate_decision(cand_scores, champ_scores, config, use_domain=job.domain_counts)
        if not job.domain_counts and cand_scores[2] is not None:
            reasons.append(
                "its domain dev pairs are the registrant's own, not approved by an operator: reported, never "
                "counted (sentcl_mlflow.registry.evidence)"
            )
        changed = pipeline_change(cand_shape, champ_shape)
        if changed and job.allow_pipeline_change:
            reasons.append(f"{changed}: allowed by {_who(identity, note)}")
        elif changed:
            promoted = False
            reasons.append(f"{changed}; promote it only with --allow-pipeline-change --by NAME")
        measured_tags = gate_score_tags(cand_scores)
        if cand_shape is not None:
            measured_tags["gate.pipeline"] = cand_shape.describe()
        own = f"the gate's scores: version {cand.version} {scores_text(cand_scores)}"
        if champ_scores is not None:
            measured_tags.update(gate_score_tags(champ_scores, "gate.champion_"))
            own += f"; champion {champ.version} {scores_text(champ_scores)}"
        reasons.append(own)
        if forced_by:
            reasons.append(f"forced by {forced_by}")
    target = str(cand.version)  # the version of ``name`` that becomes champion
    if promoted:
        if source != name:  # a production version of the gate's own upload of the bytes it scored
            target = register_owned(mlc, name, source, cand, owned)
        if champ is not None:
            mlc.set_model_version_tag(name, target, "previous_champion", champ.version)
        if lease is not None:  # fencing: a holder whose lease was broken stops before the alias moves
            lease.check()
            mlc.set_model_version_tag(name, target, "gate.lease_token", lease.token)
        mlc.set_registered_model_alias(name, CHAMPION, target)
        after = version_or_none(mlc, name, CHAMPION)
        if after is None or str(after.version) != target:
            raise RuntimeError(
                f"champion of {name!r} reads back as {after.version if after else None} after moving it to "
                f"{target}: another writer bypassed the promotion lease"
            )
        if source != name:
            mlc.set_model_version_tag(name, target, TAG_STATE, READY)
    decision = "promoted" if promoted else "rejected"
    gate_tags = {
        "gate.decision": decision,
        "gate.reasons": "; ".join(reasons),
        "gate.champion_before": champ.version if champ is not None else "",
        "gate.min_delta": str(config.min_delta),
        "gate.max_dev_drop": str(config.max_dev_drop),
        "gate.at": utc_timestamp(),
        "gate.by": identity,  # the account the server authenticated, never free text
    }
    if note:
        gate_tags["gate.by_note"] = note  # --by: what the caller says, not verified
    if forced:
        gate_tags["gate.forced_by"] = identity
    gate_tags.update(measured_tags)  # gate.stsb_dev, gate.sick_dev, gate.domain_dev, gate.champion_*
    tagged = [(source, str(cand.version))]
    if promoted and source != name:
        # The production version first: the candidate's gate.decision is what a waiting registrar reads as done.
        mlc.set_model_version_tag(name, target, "gate.candidate", f"{source}/{cand.version}")
        gate_tags["gate.champion_version"] = target  # on the candidate: which production version it became
        tagged.insert(0, (name, target))
    # After the alias moved: a tag never claims a move that did not happen. gate.decision last: a reader
    # that sees it (a registrar waiting on its candidate) sees the gate's scores and reasons too.
    for model, number in tagged:
        for key, value in sorted(gate_tags.items(), key=lambda item: item[0] == "gate.decision"):
            mlc.set_model_version_tag(model, number, key, value)
    return {
        "model": source,
        "version": str(cand.version),
        "decision": decision,
        "promoted": promoted,
        "champion_before": str(champ.version) if champ is not None else None,
        "champion_after": target if promoted else (str(champ.version) if champ else None),
        "reasons": reasons,
        "seconds": round(time.time() - started, 2),
    }


def promote(
    name: str | None = None,
    version: str | None = None,
    actor: str | None = None,
    params: Mapping[str, Any] | None = None,
    domain_dev: Path | str | None = None,
    force: bool = False,
    dev_pairs: Path | str | None = None,
    scorer: Scorer | None = None,
    allow_pipeline_change: bool = False,
) -> dict[str, Any]:
    """Run the gate on ``version`` (default: the ``challenger`` alias) against ``champion``; print and tag.

    The champion is read after the lease is taken, so two gates cannot both promote against a stale champion.
    Both are downloaded, verified against their registration manifests and scored by the gate on ``dev_pairs``
    (default data/processed/pairs.parquet) and ``domain_dev`` (a domain's scored pairs, when given).
    ``force`` (with a named ``actor``) lifts the rolled-back block, never the score rules nor a refusal.
    ``actor`` (``--by``) is recorded as a note (``gate.by_note``); who promoted is the authenticated account
    (``gate.by``, ``gate.forced_by``). ``scorer`` replaces the dev-set scoring (Python callers only).
    ``allow_pipeline_change`` (with a named ``actor``) lets a candidate whose served pipeline differs from the
    champion's (modules, vector size, normalisation) be promoted on its scores."""
    if force and not actor:
        raise ValueError("--force needs the name of the person forcing it (--by NAME)")
    if allow_pipeline_change and not actor:
        raise ValueError("--allow-pipeline-change needs the name of the person allowing it (--by NAME)")
    config = gate_config(params)
    limits = GateLimits.from_params(_params(params))
    name = name or config.model_name
    mlc = client()
    with promotion_lock(name, mlc=mlc) as lease:
        finish_unfinished(mlc, name)
        job = Judgment(
            name,
            version,
            config,
            limits,
            (caller_identity(), _note(actor)),
            dev_pairs,
            domain_dev,
            scorer,
            lease=lease,
            forced=force,
            allow_pipeline_change=allow_pipeline_change,
        )
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
    name: str | None = None, actor: str | None = None, reason: str = "manual rollback"
) -> dict[str, Any]:
    """Give ``champion`` back to the version it replaced. The demoted version is tagged ``rolled_back`` (no
    gate promotes it, or its weights, again without ``--force``) and loses ``challenger`` if it held it. Who rolled
    back is the authenticated account (``rolled_back_by``); ``actor`` (``--by``) is an unverified note."""
    name = name or gate_config().model_name
    mlc = client()
    identity, note = caller_identity(), _note(actor)
    by = {"_by": identity, **({"_by_note": note} if note else {})}
    with promotion_lock(name, mlc=mlc) as lease:
        champ = version_or_none(mlc, name, CHAMPION)
        if champ is None:
            raise NoChampionError(f"{name!r} has no champion to roll back")
        previous = (champ.tags or {}).get("previous_champion")
        if not previous:
            raise LookupError(f"champion version {champ.version} has no previous champion to roll back to")
        if (mlc.get_model_version(name, previous).tags or {}).get(TAG_STATE) == REFUSED:
            raise GateRefusedError(
                f"rollback refused: {name} version {previous} was refused by the gate; champion not moved"
            )
        with tempfile.TemporaryDirectory(
            prefix="sentcl-rollback-"
        ) as tmp:  # its files, before it is champion
            verified_download(mlc, name, str(previous), Path(tmp))
        stamp = utc_timestamp()
        # Marked first: from here on no gate can promote it, whatever happens to the rest of this call.
        for key, value in {
            TAG_ROLLED_BACK: "true",
            **{f"rolled_back{k}": v for k, v in by.items()},
            "rolled_back_reason": reason,
            "rolled_back_at": stamp,
        }.items():
            mlc.set_model_version_tag(name, champ.version, key, value)
        lease.check()
        mlc.set_registered_model_alias(name, CHAMPION, previous)
        challenger = version_or_none(mlc, name, CHALLENGER)
        if challenger is not None and str(challenger.version) == str(champ.version):
            mlc.delete_registered_model_alias(name, CHALLENGER)
        restored = {
            **{f"restored{k}": v for k, v in by.items()},
            "restored_reason": reason,
            "restored_at": stamp,
        }
        for key, value in restored.items():
            mlc.set_model_version_tag(name, previous, key, value)
        after = version_or_none(mlc, name, CHAMPION)
        if after is None or str(after.version) != str(previous):
            raise RuntimeError(
                f"champion of {name!r} reads back as {after and after.version}, not {previous}"
            )
    print(f"rollback: {name} champion {champ.version} -> {previous} by {_who(identity, note)}: {reason}")
    return {
        "model": name,
        "from": champ.version,
        "to": previous,
        "by": identity,
        "note": note,
        "reason": reason,
    }
