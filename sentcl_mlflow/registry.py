"""The model registry in MLflow: register a candidate, gate it, roll back, serialise promotions, download.

The rules (what the gate decides, what blocks a promotion) are pure functions in ``sentcl.registry.rules``; this
module does the I/O around them, in an order that leaves nothing half-done that could be promoted:

1. take the promotion lease (a queue of versions of a lease model only the gate may edit, so it spans
   machines; see ``promotion_lock``);
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import (
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
    sts_row_from_tags,
    version_weights,
    weight_file_digests,
    weights_fingerprint,
)
from sentcl_mlflow import runs
from sentcl_mlflow.errors import describe, unreachable
from sentcl_mlflow.pyfunc_checks import (  # the checks a logged model also runs on itself when it loads
    TAG_MANIFEST,
    ModelTamperedError,
    WeightsMismatchError,
    check_manifest,
    file_sha256,
    files_manifest,
)
from sentcl_mlflow.store import (
    EXPERIMENT,
    TrackingAuthError,
    TrackingUnavailableError,
    caller_identity,
    client,
    git_commit,
    load_params_file,
    quick_requests,
    tracking_uri,
)

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
    "ModelTamperedError",
    "download_verified",
    "NoChampionError",
    "PromotionLockTimeout",
    "PromotionLeaseDenied",
    "PromotionLeaseLost",
]


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


# Production runs go to an experiment of their own, which `auth setup` makes editable by the gate's account
# only: in the shared experiment every teammate with EDIT could overwrite a production run's artifacts.
PRODUCTION_EXPERIMENT_SUFFIX = "-production"


def production_experiment(experiment: str = EXPERIMENT) -> str:
    return experiment + PRODUCTION_EXPERIMENT_SUFFIX


def run_experiment(model_name: str, config: GateConfig | None = None) -> str:
    """The experiment a registration's model run is logged in: the gate-only production experiment for the
    production model, the shared one for the experiments model (and anything else)."""
    config = config or gate_config()
    return production_experiment() if model_name == config.model_name else EXPERIMENT


def _note(note: str | None) -> str | None:
    """What the caller says about who asked (``--by NAME``, else ``$SENTCL_ACTOR``): free text that nothing
    checks, recorded only as a labelled note beside the authenticated account (``store.caller_identity``)."""
    return note or os.environ.get("SENTCL_ACTOR") or None


def _who(identity: str, note: str | None) -> str:
    return f"{identity} (--by {note}, not verified)" if note else identity


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _error_code(error: Exception) -> str:
    return str(getattr(error, "error_code", ""))


# --------------------------------------------------------------------------------------------- the lease


class PromotionLeaseDenied(TrackingAuthError):
    """This account may not take the promotion lease (only the gate's account may promote). Not transient:
    every caller that reports refused credentials in one line reports this one too."""


class PromotionLeaseLost(PromotionLockTimeout):
    """The lease was broken (expired while this process was still working); nothing more is written.
    Transient, like a lease that stayed busy: a retry takes a fresh lease."""


LEASE_SOURCE = "sentcl-lease:/promotion-lease"  # never read: a lease version has no files
# On every MLflow run started while a lease is held: the lease model and the holder's token (version).
TAG_RUN_LEASE, TAG_RUN_TOKEN = "sentcl.lease_model", "sentcl.lease_token"


class Lease:
    """A held promotion lease: version ``token`` of the lease model. The version number is the fencing
    token (the server hands them out in order, atomically). ``renew`` touches the version (the server stamps
    ``last_updated_timestamp``, its own clock) and fails once someone broke the lease by deleting it."""

    def __init__(self, mlc: MlflowClient, model: str, token: str, lease_s: float) -> None:
        self.mlc, self.model, self.token, self.lease_s = mlc, model, token, lease_s
        self._renewals = 0
        self._lost: BaseException | None = None
        self._lock = threading.Lock()

    def renew(self) -> int:
        """Touch the version; returns the server's time of the touch (ms). Raises PromotionLeaseLost."""
        from mlflow.exceptions import MlflowException

        with self._lock:
            if self._lost is not None:
                raise PromotionLeaseLost(f"promotion lease {self.model} token {self.token} was lost")
            self._renewals += 1
            try:
                mv = self.mlc.update_model_version(
                    self.model, self.token, description=f"held; renewal {self._renewals}"
                )
            except MlflowException as e:
                if _error_code(e) == "RESOURCE_DOES_NOT_EXIST":
                    self._lost = e
                    raise PromotionLeaseLost(
                        f"promotion lease {self.model} token {self.token} was broken by another process "
                        f"(it expired: not renewed within {self.lease_s:g}s)"
                    ) from None
                raise
            return int(mv.last_updated_timestamp)

    def check(self) -> None:
        """The fencing check right before a write that needs the lease (the champion alias)."""
        self.renew()


def _lease_model(mlc: MlflowClient, name: str) -> str:
    from mlflow.exceptions import MlflowException

    lease = f"{name}{LEASE_SUFFIX}"
    try:
        mlc.get_registered_model(lease)
    except MlflowException as e:
        if _error_code(e) != "RESOURCE_DOES_NOT_EXIST":
            raise
        try:  # a store without `auth setup` (the local sqlite store): the first gate creates it
            mlc.create_registered_model(
                lease, description=f"promotion lease of {name!r}: one version per holder or waiter"
            )
        except MlflowException as e2:
            if _error_code(e2) != "RESOURCE_ALREADY_EXISTS":
                raise
    return lease


@contextmanager
def promotion_lock(
    name: str, wait_s: float | None = None, lease_s: float | None = None, mlc: MlflowClient | None = None
) -> Iterator[Lease]:
    """One promotion at a time per registered model, across every machine that reaches the store.

    The lease model ``<name>.promotion-lease`` (created by ``sentcl_mlflow.auth setup``: only the gate's
    account may edit the production one, everyone else reads it) gets one model version per contender. The
    server numbers versions atomically and in order, so the number is a queue ticket and a fencing token:
    a contender holds the lease once no lower-numbered version is left. Holders and waiters renew their
    version every ``lease_s / 3`` (a background thread while held); a version whose server-side
    ``last_updated_timestamp`` is more than ``lease_s`` behind the server's time of our own latest touch
    belongs to a dead process and is deleted, which is how a killed holder's lease breaks (one clock: the
    server's). The holder renews once more right before it moves an alias (``Lease.check``): a holder whose
    lease was broken stops there with :class:`PromotionLeaseLost`. An account without EDIT on the lease
    model is refused with :class:`PromotionLeaseDenied` and can neither take nor block it.
    """
    from mlflow.exceptions import MlflowException

    mlc = mlc or client()
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    lease_s = LEASE_S if lease_s is None else lease_s
    lease_model = _lease_model(mlc, name)
    owner = f"{socket.gethostname()}:{os.getpid()}:{getpass.getuser()}"
    try:
        token = str(
            mlc.create_model_version(
                lease_model,
                LEASE_SOURCE,
                tags={"owner": owner, "lease_s": f"{lease_s:g}"},
                description="waiting",
                # A lease version has no files to wait for; MLflow would log "Waiting up to 300 seconds".
                await_creation_for=0,
            ).version
        )
    except MlflowException as e:
        if _error_code(e) == "PERMISSION_DENIED":
            who = os.environ.get("MLFLOW_TRACKING_USERNAME") or "this account"
            raise PromotionLeaseDenied(
                f"promotion of {name!r}: {who} may not take its lease {lease_model!r}; only the gate's "
                "account (SENTCL_GATE_USER) may promote or roll back"
            ) from None
        raise
    held = Lease(mlc, lease_model, token, lease_s)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            now_ms = held.renew()
            ahead = [
                v for v in mlc.search_model_versions(f"name='{lease_model}'") if int(v.version) < int(token)
            ]
            if not ahead:
                break
            for v in ahead:  # expired by its holder's own lease length, measured on the server's clock
                if int(v.last_updated_timestamp) + _lease_length(v, lease_s) * 1000 < now_ms:
                    try:
                        mlc.delete_model_version(lease_model, v.version)
                        print(
                            f"registry: broke the expired promotion lease {v.version} of "
                            f"{(v.tags or {}).get('owner', '?')} (not renewed for "
                            f"{_lease_length(v, lease_s):g}s)"
                        )
                    except MlflowException as e:
                        if _error_code(e) != "RESOURCE_DOES_NOT_EXIST":
                            raise
            if time.monotonic() > deadline:
                holder = (ahead[0].tags or {}).get("owner", "?")
                raise PromotionLockTimeout(
                    f"promotion of {name!r}: the lease {lease_model!r} is held by {holder}; waited {wait_s:g}s"
                )
            time.sleep(min(1.0, lease_s / 6) * (0.5 + random.random()))
    except BaseException as error:
        released = _release(held, error)
        _raise_unreachable(error, name, held, released, "while waiting for")
        raise
    stop = threading.Event()

    def keep_renewing() -> None:
        while not stop.wait(lease_s / 3):
            try:
                held.renew()
            except PromotionLeaseLost:
                return
            except Exception:  # noqa: BLE001 (a missed renewal; the next one or the fencing check decides)
                pass

    renewer = threading.Thread(target=keep_renewing, name="promotion-lease", daemon=True)
    renewer.start()
    try:
        # Every run started under the lease names it: one left RUNNING (its process or the server died)
        # is ended by the next holder (fail_orphaned_runs).
        with runs.context_tags({TAG_RUN_LEASE: lease_model, TAG_RUN_TOKEN: token}):
            yield held
    except BaseException as error:
        stop.set()
        renewer.join(10)
        released = _release(held, error)
        _raise_unreachable(error, name, held, released, "while holding")
        raise
    stop.set()
    renewer.join(10)
    _release(held)


def _raise_unreachable(error: BaseException, name: str, held: Lease, released: bool, when: str) -> None:
    """A connection failure under the lease becomes one TrackingUnavailableError (exit 75 in every entry
    point) that says what became of the lease."""
    if (
        not isinstance(error, Exception)
        or not unreachable(error)
        or isinstance(error, TrackingUnavailableError)
    ):
        return
    lease = (
        f"its lease version {held.token} was released"
        if released
        else f"its lease version {held.token} of {held.model!r} expires by itself {held.lease_s:g}s after "
        "its last renewal (SENTCL_PROMOTION_LEASE_S)"
    )
    raise TrackingUnavailableError(
        f"MLflow tracking server {tracking_uri()} stopped answering ({describe(error)}) {when} the promotion "
        f"lease of {name!r}; {lease}; a run it left RUNNING is ended as FAILED by the next registration"
    ) from error


def _lease_length(version, default: float) -> float:  # noqa: ANN001
    try:
        return float((version.tags or {}).get("lease_s", default))
    except ValueError:
        return default


def _release(held: Lease, error: BaseException | None = None) -> bool:
    """Delete our lease version; True when it is gone. After a connection failure (``error``) the server
    gets one short try: a dead one would cost the whole bounded timeout again, for a lease that expires on
    its own anyway; the caller's one line then says so instead of a line here."""
    from mlflow.exceptions import MlflowException

    quick = error is not None and isinstance(error, Exception) and unreachable(error)
    try:
        if quick:
            with quick_requests():
                held.mlc.delete_model_version(held.model, held.token)
        else:
            held.mlc.delete_model_version(held.model, held.token)
        return True
    except MlflowException as e:
        if _error_code(e) == "RESOURCE_DOES_NOT_EXIST":
            return True
        if quick or unreachable(e):
            return False
        print(f"registry: could not release the promotion lease {held.model} {held.token}: {e.message}")
    except Exception as e:  # noqa: BLE001 (the server is gone: the lease expires on its own)
        if quick:
            return False
        print(
            f"registry: could not release the promotion lease {held.model} {held.token} "
            f"({type(e).__name__}); it expires after {held.lease_s:g}s"
        )
    return False


# --------------------------------------------------------------------------------------------- versions


def _version_or_none(mlc: MlflowClient, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlc.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if unreachable(e):  # a dead server is not "no champion": that would gate as if first ever
            raise
        return None


def fail_orphaned_runs(mlc: MlflowClient, lease: Lease) -> list[str]:
    """Runs an earlier holder of this lease started and left RUNNING (its process, or the server, died
    mid-registration): ended as FAILED, tagged ``sentcl.failed_by``. Call with the lease held: every lower
    token is gone by then, so no live holder can still be writing those runs."""
    experiments = [e.experiment_id for e in mlc.search_experiments()]
    if not experiments:
        return []
    query = f"tags.`{TAG_RUN_LEASE}` = '{lease.model}' and attributes.status = 'RUNNING'"
    done = []
    for run in mlc.search_runs(experiments, filter_string=query, max_results=200):
        token = (run.data.tags or {}).get(TAG_RUN_TOKEN, "")
        if not token.isdigit() or int(token) >= int(lease.token):
            continue
        mlc.set_tag(
            run.info.run_id, "sentcl.failed_by", f"cleanup under lease {lease.token}: lease {token} ended"
        )
        mlc.set_terminated(run.info.run_id, "FAILED")
        print(f"registry: run {run.info.run_id} was left RUNNING under lease {token}; marked FAILED")
        done.append(run.info.run_id)
    return done


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
    manifest = registration_manifest(model_uri, weights_sha256)
    all_tags = {
        TAG_STSB_DEV: f"{float(stsb_dev):.6f}",
        TAG_STS: json_dumps({k: round(float(v), 6) for k, v in sts_all.items()}),
        **{k: str(v) for k, v in (tags or {}).items()},
        TAG_STATE: REGISTERING,
    }
    if weights_sha256:
        all_tags[TAG_WEIGHTS] = weights_sha256
    all_tags[TAG_MANIFEST] = json_dumps(manifest)
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


def registration_manifest(model_uri: str, weights_sha256: str | None) -> dict[str, str]:
    """The manifest of what ``model_uri`` holds now, read back from the store; its weights must still be the
    ones measured before the upload (``weights_sha256``), so a file swapped in between is not recorded."""
    import tempfile

    import mlflow

    with tempfile.TemporaryDirectory(prefix="sentcl-manifest-") as tmp:
        root = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=tmp))
        manifest = files_manifest(root) if root.is_dir() else {root.name: file_sha256(root)}
        if weights_sha256 and root.is_dir():
            try:
                folder = st_folder_in(root)
            except FileNotFoundError:
                folder = None
            digests = weight_file_digests(folder) if folder is not None else {}
            if digests and weights_fingerprint(digests) != weights_sha256:
                raise ModelTamperedError(
                    f"{model_uri}: the uploaded weights hash to {weights_fingerprint(digests)[:12]}..., "
                    f"not {weights_sha256[:12]}... measured before the upload; not registering them"
                )
    return manifest


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
    with promotion_lock(name, mlc=mlc) as lease:
        finish_unfinished(mlc, name)
        fail_orphaned_runs(mlc, lease)
        version, created = _register_locked(
            mlc, name, model_uri, stsb_dev, sts_all, weights_sha256, tags, run_id
        )
        result: dict[str, Any] = {"model": name, "version": version, "created": created}
        if gate:
            result["gate"] = _gate_locked(
                mlc, name, version, config, (caller_identity(), _note(actor)), domain, False, True, lease
            )
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
    caller: tuple[str, str | None],
    domain: Mapping[str, Any] | None,
    forced: bool,
    in_registration: bool,
    lease: Lease | None = None,
) -> dict[str, Any]:
    """``caller``: (the authenticated account, the caller's unverified ``--by`` note or None)."""
    started = time.time()
    identity, note = caller
    forced_by = _who(identity, note) if forced else None
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
        if lease is not None:  # fencing: a holder whose lease was broken stops before the alias moves
            lease.check()
            mlc.set_model_version_tag(name, cand.version, "gate.lease_token", lease.token)
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
        "gate.max_dev_drop": str(config.max_dev_drop),
        "gate.at": _now(),
        "gate.by": identity,  # the account the server authenticated, never free text
    }
    if note:
        gate_tags["gate.by_note"] = note  # --by: what the caller says, not verified
    if forced:
        gate_tags["gate.forced_by"] = identity
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
    lifts the rolled-back block, never the score rules. ``actor`` (``--by``) is recorded as a note
    (``gate.by_note``); who promoted is the authenticated account (``gate.by``, ``gate.forced_by``).
    """
    if force and not actor:
        raise ValueError("--force needs the name of the person forcing it (--by NAME)")
    config = gate_config(params)
    name = name or config.model_name
    mlc = client()
    with promotion_lock(name, mlc=mlc) as lease:
        finish_unfinished(mlc, name)
        caller = (caller_identity(), _note(actor))
        result = _gate_locked(mlc, name, version, config, caller, domain, force, False, lease)
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
            **{f"rolled_back{k}": v for k, v in by.items()},
            "rolled_back_reason": reason,
            "rolled_back_at": stamp,
        }.items():
            mlc.set_model_version_tag(name, champ.version, key, value)
        lease.check()
        mlc.set_registered_model_alias(name, CHAMPION, previous)
        challenger = _version_or_none(mlc, name, CHALLENGER)
        if challenger is not None and str(challenger.version) == str(champ.version):
            mlc.delete_registered_model_alias(name, CHALLENGER)
        restored = {
            **{f"restored{k}": v for k, v in by.items()},
            "restored_reason": reason,
            "restored_at": stamp,
        }
        for key, value in restored.items():
            mlc.set_model_version_tag(name, previous, key, value)
        after = _version_or_none(mlc, name, CHAMPION)
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


# --------------------------------------------------------------------------------------------- download


def alias_version(alias: str, name: str | None = None) -> str | None:
    mlc = client()
    version = _version_or_none(mlc, name or gate_config().model_name, alias)
    return version.version if version is not None else None


def champion_scores(name: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """(version, its scores as a row of metrics/sts.json) of the champion, or None when nothing is champion yet."""
    mlc = client()
    version = _version_or_none(mlc, name or gate_config().model_name, CHAMPION)
    return (str(version.version), sts_row_from_tags(version.tags)) if version is not None else None


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
    """The sentence-transformers folder inside a logged model (``models:/...``, ``runs:/...``); see
    :func:`download_verified` for what is checked before anything loads it."""
    return st_folder_in(download_verified(model_uri, dest))


def download_verified(model_uri: str, dest: Path) -> Path:
    """The whole logged model of ``model_uri``, downloaded into a fresh folder under ``dest``. For a registered
    version: every file must match the manifest recorded at registration (``sentcl.manifest``: weights,
    tokenizer, MLmodel, the serving code), else :class:`ModelTamperedError`; a version registered before
    manifests existed is checked on its weights' sha256 (:class:`WeightsMismatchError`)."""
    import json
    import tempfile

    import mlflow

    mlc = client()
    expected, manifest = None, None
    if model_uri.startswith("models:/"):
        ref = model_uri.removeprefix("models:/")
        name, _, rest = ref.partition("/") if "@" not in ref else ref.partition("@")
        mv = mlc.get_model_version_by_alias(name, rest) if "@" in ref else mlc.get_model_version(name, rest)
        tags = mv.tags or {}
        expected = version_weights(tags)
        manifest = json.loads(tags[TAG_MANIFEST]) if tags.get(TAG_MANIFEST) else None
        model_uri = f"models:/{name}/{mv.version}"
    dest.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix="model-", dir=dest))
    root = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(fresh)))
    if manifest is not None:
        check_manifest(root, manifest, model_uri)
    elif expected:
        actual = weights_fingerprint(weight_file_digests(st_folder_in(root)))
        if actual != expected:
            raise WeightsMismatchError(
                f"{model_uri}: downloaded weights hash to {actual[:12]}..., registered as {expected[:12]}...; "
                "refusing to load them"
            )
    return root


def st_folder_in(model_dir: Path) -> Path:
    """Find the sentence-transformers folder (the one with modules.json) inside a logged pyfunc model."""
    if (model_dir / "modules.json").exists():
        return model_dir
    for candidate in sorted(model_dir.rglob("modules.json")):
        return candidate.parent
    raise FileNotFoundError(f"no sentence-transformers folder (modules.json) under {model_dir}")
