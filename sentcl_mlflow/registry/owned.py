"""The gate owns what it promotes: one download, its own manifest, and a production version of exactly those bytes.

The candidate's files live in its registrant's run, which the registrar (and, in the shared experiment, a teammate)
can overwrite at any moment, and its tags are the registrant's to edit. So the gate downloads the candidate once
(``own_download``): the files are checked against the manifest recorded at registration (a change since then is a
refusal), and from then on the gate's own copy is the only source: the manifest it computes from those files, the
weights fingerprint it hashes from them, the scores it measures on them. On "promoted" the production version is
registered from the gate's own upload of exactly those files (``register_owned``), into a run of the production
experiment, which only the gate's account can write (``sentcl_mlflow.auth setup``), tagged with the gate's manifest
and weights; it is downloaded and checked once more before ``champion`` points at it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import (
    REGISTERING,
    TAG_STATE,
    TAG_WEIGHTS,
    GateLimits,
    version_weights,
    weight_file_digests,
    weights_fingerprint,
)
from sentcl_mlflow.pyfunc_checks import (
    DOWNLOAD_META,
    TAG_MANIFEST,
    TAG_WEIGHT_FILES,
    check_manifest,
    files_manifest,
)
from sentcl_mlflow.registry.download import st_folder_in
from sentcl_mlflow.registry.measure import refusal, unscorable, verified_download
from sentcl_mlflow.registry.names import production_experiment

if TYPE_CHECKING:
    from mlflow import MlflowClient

# Never copied from a candidate onto the production version: what the gate states itself (its hashes, its state,
# its verdicts) and what names the candidate's own run. The rest (scores claimed, checkpoint, commit) is the
# registrant's record, copied as such.
NOT_COPIED = ("sentcl.", "gate.", "mlflow.", "rolled_back", "restored", "previous_champion")
NOT_COPIED_KEYS = (TAG_WEIGHTS, TAG_WEIGHT_FILES, "run_id", "registered_version")
TAG_SIZES = (
    "sentcl.sizes"  # {relative path: bytes} of every file, beside the gate's manifest (registry.champion)
)


@dataclass(frozen=True)
class Owned:
    """The gate's own copy of a version: the folder it downloaded, the manifest and weights it computed there."""

    root: Path
    manifest: dict[str, str]
    digests: dict[str, str]  # weight file -> sha256
    weights: str  # weights_fingerprint(digests); "" when the folder holds no sentence-transformers weights


def own_download(
    mlc: MlflowClient,
    name: str,
    version: Any,
    dest: Path,
    weights_tag: bool,
    limits: GateLimits | None = None,
) -> Owned:
    """``version`` (a ModelVersion of ``name``) downloaded once under ``dest`` and checked against its registration
    manifest (``verified_download``); the manifest and weights are then computed from those files. With
    ``weights_tag`` (a candidate, whose registrar may edit its tags), its weights tag must name those weights:
    "already champion" and the rolled-back block compare weights. A mismatch, or no weights to hash: tagged
    refused, :class:`GateRefusedError` in one line. ``limits``: its files together within ``gate.max_model_mb``."""
    number = str(version.version)
    root = verified_download(mlc, name, number, dest, limits)
    (root / DOWNLOAD_META).unlink(missing_ok=True)  # MLflow's note of where it came from: not the model's
    try:
        digests = weight_file_digests(st_folder_in(root))
        weights = weights_fingerprint(digests)
    except (OSError, ValueError) as e:  # no sentence-transformers folder, no weight file in it
        if weights_tag:
            raise refusal(mlc, name, number, unscorable(e)) from None
        digests, weights = {}, ""  # a version of the model itself: its scorer says whether it can be scored
    if weights_tag:
        claimed = version_weights(version.tags or {}) or ""
        if claimed != weights:
            reason = f"its weights hash to {weights[:12]}, not {claimed[:12] or 'nothing'} (its weights tag)"
            raise refusal(mlc, name, number, reason)
    return Owned(root, files_manifest(root), digests, weights)


def register_owned(mlc: MlflowClient, name: str, source: str, candidate: Any, owned: Owned) -> str:
    """A version of ``name`` made from the gate's own upload of ``owned`` (``source`` version ``candidate``,
    judged): a run of the production experiment holds the files, the version's manifest and weights are the
    gate's, and it is downloaded and checked against them before this returns its number. It is left
    ``registering`` (an interrupted promotion's version is cleaned up by the next gate); the caller marks it ready
    once ``champion`` points at it."""
    import tempfile

    from sentcl_mlflow.store import experiment_id

    what = f"the gate's copy of {source} version {candidate.version}"
    check_manifest(owned.root, owned.manifest, what)  # still exactly the bytes it scored: nothing added since
    run = mlc.create_run(
        experiment_id(mlc, production_experiment()),
        run_name=f"gate-{source}-{candidate.version}",
        tags={
            "gate.candidate": f"{source}/{candidate.version}",
            "gate.candidate_run": candidate.run_id or "",
        },
    )
    run_id = run.info.run_id
    mlc.log_artifacts(run_id, str(owned.root), "model")
    mlc.set_terminated(run_id)
    record = {
        k: v
        for k, v in (candidate.tags or {}).items()
        if not k.startswith(NOT_COPIED) and k not in NOT_COPIED_KEYS
    }
    tags = {
        **record,
        TAG_MANIFEST: json.dumps(owned.manifest, sort_keys=True),
        TAG_WEIGHTS: owned.weights,
        TAG_WEIGHT_FILES: json.dumps(owned.digests, sort_keys=True),
        TAG_SIZES: json.dumps(
            {rel: (owned.root / rel).stat().st_size for rel in owned.manifest}, sort_keys=True
        ),
        TAG_STATE: REGISTERING,
        "run_id": run_id,
        "gate.candidate": f"{source}/{candidate.version}",
    }
    # await_creation_for=0: the files are stored already (MLflow would log "Waiting up to 300 seconds").
    created = mlc.create_model_version(
        name, f"{run.info.artifact_uri}/model", run_id=run_id, tags=tags, await_creation_for=0
    )
    version = str(created.version)
    with tempfile.TemporaryDirectory(prefix="sentcl-owned-") as tmp:
        verified_download(mlc, name, version, Path(tmp))
    return version
