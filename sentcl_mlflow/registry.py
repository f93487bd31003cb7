"""The model registry in MLflow: register a candidate, gate it, roll back, serialise promotions, download.

The rules (what the gate decides, what blocks a promotion) are pure functions in ``sentcl.registry``; this
module does the I/O around them, in an order that leaves nothing half-done that could be promoted:

1. take the promotion lease (a lock that lives in the registry itself, so it spans machines);
2. finish or clean up what an earlier, interrupted run left (versions tagged ``sentcl.state=registering``);
3. register the candidate, unless a version with the same weights (sha256) exists: that one is reused;
4. point ``challenger`` at it, run the gate, move ``champion`` and read it back, then write the gate's tags;
5. mark the version ``sentcl.state=ready``, release the lease.

A kill between 3 and 5 leaves a version marked ``registering``: never promotable, deleted (or, if
``champion`` already moved to it, finished) by the next registration or gate.
"""

from __future__ import annotations

import getpass
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry import (
    TAG_DOMAIN,
    TAG_ROLLED_BACK,
    TAG_STATE,
    TAG_STS,
    TAG_STSB_DEV,
    TAG_WEIGHTS,
    GateConfig,
    gate_decision,
    promotion_blocked,
    scores_from_tags,
    version_weights,
    weight_file_digests,
    weights_fingerprint,
)
from sentcl_mlflow.store import client, git_commit, load_params_file

if TYPE_CHECKING:
    from mlflow import MlflowClient

CHALLENGER, CHAMPION = "challenger", "champion"
REGISTERING, READY = "registering", "ready"
LEASE_SUFFIX = ".promotion-lease"
# How long one promotion may hold the lease before another process may break it, and how long a gate waits.
LEASE_S = float(os.environ.get("SENTCL_PROMOTION_LEASE_S", "900"))
LOCK_WAIT_S = float(os.environ.get("SENTCL_PROMOTION_WAIT_S", "600"))

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "TAG_DOMAIN",
    "TAG_STS",
    "TAG_STSB_DEV",
    "TAG_WEIGHTS",
    "gate_config",
    "register_candidate",
    "register_and_gate",
    "promote",
    "rollback",
    "promotion_lock",
    "alias_version",
    "download_alias",
    "download_model",
    "WeightsMismatchError",
    "NoChampionError",
    "PromotionLockTimeout",
]


class WeightsMismatchError(RuntimeError):
    """A downloaded version's weights do not hash to the sha256 recorded when it was registered."""


class NoChampionError(LookupError):
    """Nothing is registered as champion (yet)."""


class PromotionLockTimeout(TimeoutError):
    """Another promotion held the lease for longer than this gate was willing to wait."""


def gate_config(params: Mapping[str, Any] | None = None) -> GateConfig:
    return GateConfig.from_params(params if params is not None else load_params_file())


def target_model_name(config: GateConfig) -> str:
    """The production model, except inside a DVC experiment (``dvc exp run``, ``make exp``), which registers
    into ``experiment_model_name`` unless ``SENTCL_REGISTER_PRODUCTION=1`` asks for production."""
    in_experiment = bool(os.environ.get("DVC_EXP_NAME"))
    asked = os.environ.get("SENTCL_REGISTER_PRODUCTION", "").lower() in ("1", "true", "yes")
    return config.experiment_model_name if in_experiment and not asked else config.model_name


def _actor(actor: str | None) -> str:
    return actor or os.environ.get("SENTCL_ACTOR") or getpass.getuser()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _error_code(error: Exception) -> str:
    return str(getattr(error, "error_code", ""))


# --------------------------------------------------------------------------------------------- the lease


@contextmanager
def promotion_lock(
    name: str, wait_s: float | None = None, lease_s: float | None = None, mlc: MlflowClient | None = None
) -> Iterator[None]:
    """One promotion at a time per registered model, across every machine that reaches the store.

    MLflow has no compare-and-set on aliases, but creating a registered model is atomic (its name is the
    primary key): the lease is a registered model ``<name>.promotion-lease`` whose tags say who holds it
    and until when. A holder that died leaves a lease that expires after ``lease_s``; the next waiter renames
    it away (rename is atomic too: one waiter wins) and takes its own.
    """
    from mlflow.exceptions import MlflowException

    mlc = mlc or client()
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    lease_s = LEASE_S if lease_s is None else lease_s
    lease = f"{name}{LEASE_SUFFIX}"
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            mlc.create_registered_model(
                lease,
                tags={"owner": owner, "expires": f"{time.time() + lease_s:.3f}"},
                description=f"promotion lease of {name!r}; deleted when the promotion ends",
            )
            break
        except MlflowException as e:
            if _error_code(e) != "RESOURCE_ALREADY_EXISTS":
                raise
        _break_if_expired(mlc, lease)
        if time.monotonic() > deadline:
            holder = _lease_tags(mlc, lease).get("owner", "?")
            raise PromotionLockTimeout(
                f"promotion of {name!r}: the lease {lease!r} is held by {holder}; waited {wait_s:g}s"
            )
        time.sleep(0.2 + random.random() * 0.3)
    try:
        yield
    finally:
        try:
            if _lease_tags(mlc, lease).get("owner") == owner:
                mlc.delete_registered_model(lease)
        except MlflowException:
            pass


def _lease_tags(mlc: MlflowClient, lease: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        return dict(mlc.get_registered_model(lease).tags or {})
    except MlflowException:
        return {}


def _break_if_expired(mlc: MlflowClient, lease: str) -> None:
    from mlflow.exceptions import MlflowException

    tags = _lease_tags(mlc, lease)
    try:
        expired = float(tags.get("expires", "inf")) < time.time()
    except ValueError:
        expired = True
    if not expired:
        return
    stale = f"{lease}.expired-{uuid.uuid4().hex[:8]}"
    try:
        mlc.rename_registered_model(lease, stale)
    except MlflowException:
        return  # another waiter broke it first
    print(f"registry: broke the expired promotion lease of {tags.get('owner', '?')}")
    try:
        mlc.delete_registered_model(stale)
    except MlflowException:
        pass


# --------------------------------------------------------------------------------------------- versions


def _version_or_none(mlc: MlflowClient, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlc.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def version_scores(version) -> tuple[float | None, dict[str, float], float | None]:  # noqa: ANN001
    return scores_from_tags(version.tags)


def _all_versions(mlc: MlflowClient, name: str) -> list:
    return list(mlc.search_model_versions(f"name='{name}'"))


def finish_unfinished(mlc: MlflowClient, name: str) -> list[str]:
    """Versions an interrupted run left at ``registering``: finished if ``champion`` already moved to them
    (the gate had decided), deleted otherwise. Call with the lease held."""
    champ = _version_or_none(mlc, name, CHAMPION)
    done = []
    for version in _all_versions(mlc, name):
        if (version.tags or {}).get(TAG_STATE) != REGISTERING:
            continue
        if champ is not None and str(champ.version) == str(version.version):
            mlc.set_model_version_tag(name, version.version, "gate.finished_by_cleanup", _now())
            mlc.set_model_version_tag(name, version.version, TAG_STATE, READY)
            print(f"registry: finished version {version.version} (champion already pointed at it)")
        else:
            mlc.delete_model_version(name, version.version)
            print(f"registry: deleted unfinished version {version.version} left by an interrupted run")
        done.append(str(version.version))
    return done


def _same_weights(mlc: MlflowClient, name: str, digest: str):
    for version in _all_versions(mlc, name):
        tags = version.tags or {}
        if tags.get(TAG_STATE) != REGISTERING and version_weights(tags) == digest:
            return version
    return None


def _rolled_back_weights(mlc: MlflowClient, name: str) -> set[str]:
    found = set()
    for version in _all_versions(mlc, name):
        tags = version.tags or {}
        if str(tags.get(TAG_ROLLED_BACK, "")).lower() == "true" and version_weights(tags):
            found.add(version_weights(tags))
    return found


def _create_version(mlc: MlflowClient, name: str, model_uri: str, run_id: str | None, tags: dict) -> str:
    import mlflow
    from mlflow.exceptions import MlflowException

    if model_uri.startswith(("runs:/", "models:/")):  # a logged model: MLflow resolves where it lives
        return str(mlflow.register_model(model_uri, name, tags=tags).version)
    try:  # an artifact location of a run (the server wants the run that holds it)
        mlc.create_registered_model(name)
    except MlflowException as e:
        if _error_code(e) != "RESOURCE_ALREADY_EXISTS":
            raise
    return str(mlc.create_model_version(name, model_uri, run_id=run_id, tags=tags).version)


def _register_locked(
    mlc: MlflowClient,
    name: str,
    model_uri: str | Callable[[], tuple[str, str | None]],
    stsb_dev: float,
    sts_all: Mapping[str, float],
    weights_sha256: str | None,
    tags: Mapping[str, Any] | None,
    run_id: str | None,
) -> tuple[str, bool]:
    """(version, created?). With the lease held. A version with the same weights is reused, never doubled."""
    if weights_sha256:
        existing = _same_weights(mlc, name, weights_sha256)
        if existing is not None:
            print(
                f"registry: {name} version {existing.version} already holds these weights "
                f"(sha256 {weights_sha256[:12]}); not registering them again"
            )
            return str(existing.version), False
    if callable(model_uri):  # logged only now that it is known to be needed
        model_uri, run_id = model_uri()
    all_tags = {
        TAG_STSB_DEV: f"{float(stsb_dev):.6f}",
        TAG_STS: json_dumps({k: round(float(v), 6) for k, v in sts_all.items()}),
        **{k: str(v) for k, v in (tags or {}).items()},
        TAG_STATE: REGISTERING,
    }
    if weights_sha256:
        all_tags[TAG_WEIGHTS] = weights_sha256
    if run_id:
        all_tags.setdefault("run_id", run_id)
    commit = git_commit()
    if commit:
        all_tags.setdefault("git_commit", commit)
    version = _create_version(mlc, name, model_uri, run_id, all_tags)
    mlc.set_registered_model_alias(name, CHALLENGER, version)
    if run_id:
        mlc.set_tag(run_id, "registered_version", f"{name}/{version}")
    return version, True


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


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
    domain: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Register then gate, as one unit under the promotion lease (see the module's docstring).

    ``model_uri`` may be a function returning (model URI, run id), called only when a new version is needed
    (no version of ``name`` has these weights yet)."""
    config = gate_config(params)
    name = name or target_model_name(config)
    mlc = client()
    with promotion_lock(name, mlc=mlc):
        finish_unfinished(mlc, name)
        version, created = _register_locked(
            mlc, name, model_uri, stsb_dev, sts_all, weights_sha256, tags, run_id
        )
        result: dict[str, Any] = {"model": name, "version": version, "created": created}
        if gate:
            result["gate"] = _gate_locked(mlc, name, version, config, _actor(actor), domain, None, True)
        if created:
            mlc.set_model_version_tag(name, version, TAG_STATE, READY)
    if "gate" in result:
        print(format_decision(result["gate"]))
    return result


# --------------------------------------------------------------------------------------------- the gate


def _gate_locked(
    mlc: MlflowClient,
    name: str,
    version: str | None,
    config: GateConfig,
    actor: str,
    domain: Mapping[str, Any] | None,
    forced_by: str | None,
    in_registration: bool,
) -> dict[str, Any]:
    started = time.time()
    cand = mlc.get_model_version(name, version) if version else _version_or_none(mlc, name, CHALLENGER)
    if cand is None:
        raise LookupError(f"no {CHALLENGER!r} version of {name!r} to gate; run the export stage first")
    tags = cand.tags or {}
    champ = _version_or_none(mlc, name, CHAMPION)
    blocked = promotion_blocked(tags, _rolled_back_weights(mlc, name), forced_by)
    if tags.get(TAG_STATE) == REGISTERING and not in_registration:
        promoted, reasons = False, [f"version {cand.version} is unfinished (an interrupted registration)"]
    elif champ is not None and str(champ.version) == str(cand.version):
        # Gating the champion again is a no-op: no decision, and no tag over the one that promoted it.
        return {
            "model": name,
            "version": str(cand.version),
            "decision": "unchanged",
            "promoted": False,
            "champion_before": str(champ.version),
            "champion_after": str(champ.version),
            "reasons": [f"version {cand.version} is already champion"],
            "seconds": round(time.time() - started, 2),
        }
    elif blocked:
        promoted, reasons = False, [blocked]
    else:
        cand_scores = version_scores(cand)
        champ_scores = version_scores(champ) if champ is not None else None
        if domain is not None and champ is not None:
            if str(domain.get("champion_version")) == str(champ.version):
                cand_scores = (cand_scores[0], cand_scores[1], float(domain["challenger"]))
                champ_scores = (champ_scores[0], champ_scores[1], float(domain["champion"]))
                promoted, reasons = gate_decision(cand_scores, champ_scores, config)
            else:
                promoted, reasons = (
                    False,
                    [
                        f"champion changed to version {champ.version} since the domain scores were computed "
                        f"against version {domain.get('champion_version')}; re-run the retrain"
                    ],
                )
        else:  # domain scores from different dev sets are not comparable
            promoted, reasons = gate_decision(cand_scores, champ_scores, config, use_domain=False)
        if forced_by:
            reasons.append(f"forced by {forced_by}")
    if promoted:
        if champ is not None:
            mlc.set_model_version_tag(name, cand.version, "previous_champion", champ.version)
        mlc.set_registered_model_alias(name, CHAMPION, cand.version)
        after = _version_or_none(mlc, name, CHAMPION)
        if after is None or str(after.version) != str(cand.version):
            raise RuntimeError(
                f"champion of {name!r} reads back as {after.version if after else None} after moving it to "
                f"{cand.version}: another writer bypassed the promotion lease"
            )
    decision = "promoted" if promoted else "rejected"
    gate_tags = {
        "gate.decision": decision,
        "gate.reasons": "; ".join(reasons),
        "gate.champion_before": champ.version if champ is not None else "",
        "gate.min_delta": str(config.min_delta),
        "gate.max_task_drop": str(config.max_task_drop),
        "gate.at": _now(),
        "gate.by": actor,
    }
    if forced_by:
        gate_tags["gate.forced_by"] = forced_by
    for (
        key,
        value,
    ) in gate_tags.items():  # after the alias moved: a tag never claims a move that did not happen
        mlc.set_model_version_tag(name, cand.version, key, value)
    return {
        "model": name,
        "version": str(cand.version),
        "decision": decision,
        "promoted": promoted,
        "champion_before": str(champ.version) if champ is not None else None,
        "champion_after": str(cand.version) if promoted else (str(champ.version) if champ else None),
        "reasons": reasons,
        "seconds": round(time.time() - started, 2),
    }


def promote(
    name: str | None = None,
    version: str | None = None,
    actor: str | None = None,
    params: Mapping[str, Any] | None = None,
    domain: Mapping[str, Any] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run the gate on ``version`` (default: the ``challenger`` alias) against ``champion``; print and tag.

    The champion is read after the lease is taken, so two gates cannot both promote against a stale champion.
    ``domain`` = ``{"challenger": x, "champion": y, "champion_version": v}``: both models scored on the same
    domain dev set; it only counts while ``v`` is still the champion. ``force`` (with a named ``actor``)
    lifts the rolled-back block, never the score rules.
    """
    if force and not actor:
        raise ValueError("--force needs the name of the person forcing it (--by NAME)")
    config = gate_config(params)
    name = name or config.model_name
    mlc = client()
    with promotion_lock(name, mlc=mlc):
        finish_unfinished(mlc, name)
        result = _gate_locked(
            mlc, name, version, config, _actor(actor), domain, actor if force else None, False
        )
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
    gate promotes it, or its weights, again without ``--force``) and loses ``challenger`` if it held it."""
    name = name or gate_config().model_name
    actor = _actor(actor)
    mlc = client()
    with promotion_lock(name, mlc=mlc):
        champ = _version_or_none(mlc, name, CHAMPION)
        if champ is None:
            raise NoChampionError(f"{name!r} has no champion to roll back")
        previous = (champ.tags or {}).get("previous_champion")
        if not previous:
            raise LookupError(f"champion version {champ.version} has no previous champion to roll back to")
        stamp = _now()
        # Marked first: from here on no gate can promote it, whatever happens to the rest of this call.
        for key, value in {
            TAG_ROLLED_BACK: "true",
            "rolled_back_by": actor,
            "rolled_back_reason": reason,
            "rolled_back_at": stamp,
        }.items():
            mlc.set_model_version_tag(name, champ.version, key, value)
        mlc.set_registered_model_alias(name, CHAMPION, previous)
        challenger = _version_or_none(mlc, name, CHALLENGER)
        if challenger is not None and str(challenger.version) == str(champ.version):
            mlc.delete_registered_model_alias(name, CHALLENGER)
        for key, value in {"restored_by": actor, "restored_reason": reason, "restored_at": stamp}.items():
            mlc.set_model_version_tag(name, previous, key, value)
        after = _version_or_none(mlc, name, CHAMPION)
        if after is None or str(after.version) != str(previous):
            raise RuntimeError(
                f"champion of {name!r} reads back as {after and after.version}, not {previous}"
            )
    print(f"rollback: {name} champion {champ.version} -> {previous} by {actor}: {reason}")
    return {"model": name, "from": champ.version, "to": previous, "by": actor, "reason": reason}


# --------------------------------------------------------------------------------------------- download


def alias_version(alias: str, name: str | None = None) -> str | None:
    mlc = client()
    version = _version_or_none(mlc, name or gate_config().model_name, alias)
    return version.version if version is not None else None


def champion_scores(name: str | None = None) -> tuple[str, tuple] | None:
    """(version, scores) of the champion, or None when nothing is champion yet."""
    mlc = client()
    version = _version_or_none(mlc, name or gate_config().model_name, CHAMPION)
    return (str(version.version), version_scores(version)) if version is not None else None


def download_alias(alias: str, dest: Path, name: str | None = None) -> Path:
    """The sentence-transformers folder of the version ``alias`` points at, its weights checked against the
    sha256 recorded at registration. Raises :class:`NoChampionError` when the alias is unset."""
    name = name or gate_config().model_name
    version = alias_version(alias, name)
    if version is None:
        raise NoChampionError(
            f"{name!r} has no {alias!r} version: run the pipeline (make run) or a retrain first"
        )
    return download_model(f"models:/{name}/{version}", dest)


def download_model(model_uri: str, dest: Path) -> Path:
    """The sentence-transformers folder inside a logged model (``models:/...``, ``runs:/...``); for a
    registered version, its weights must hash to the recorded sha256 (:class:`WeightsMismatchError`)."""
    import mlflow

    mlc = client()
    expected = None
    if model_uri.startswith("models:/"):
        ref = model_uri.removeprefix("models:/")
        name, _, rest = ref.partition("/") if "@" not in ref else ref.partition("@")
        mv = mlc.get_model_version_by_alias(name, rest) if "@" in ref else mlc.get_model_version(name, rest)
        expected = version_weights(mv.tags or {})
        model_uri = f"models:/{name}/{mv.version}"
    dest.mkdir(parents=True, exist_ok=True)
    folder = st_folder_in(Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(dest))))
    if expected:
        actual = weights_fingerprint(weight_file_digests(folder))
        if actual != expected:
            raise WeightsMismatchError(
                f"{model_uri}: downloaded weights hash to {actual[:12]}..., registered as {expected[:12]}...; "
                "refusing to load them"
            )
    return folder


def st_folder_in(model_dir: Path) -> Path:
    """Find the sentence-transformers folder (the one with modules.json) inside a logged pyfunc model."""
    if (model_dir / "modules.json").exists():
        return model_dir
    for candidate in sorted(model_dir.rglob("modules.json")):
        return candidate.parent
    raise FileNotFoundError(f"no sentence-transformers folder (modules.json) under {model_dir}")
