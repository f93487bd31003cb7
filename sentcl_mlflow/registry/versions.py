"""Registered versions: register a candidate once per weights, its manifest, and what an interrupted run left."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import (
    READY,
    REFUSED,
    REGISTERING,
    TAG_ROLLED_BACK,
    TAG_STATE,
    Registration,
    version_weights,
    weight_file_digests,
    weights_fingerprint,
)
from sentcl_mlflow.pyfunc_checks import TAG_MANIFEST, ModelTamperedError, file_sha256, files_manifest
from sentcl_mlflow.registry.download import st_folder_in
from sentcl_mlflow.registry.lease import TAG_RUN_LEASE, TAG_RUN_TOKEN, Lease
from sentcl_mlflow.registry.names import (
    CHALLENGER,
    CHAMPION,
    mlflow_error_code,
    utc_timestamp,
    version_or_none,
)
from sentcl_mlflow.registry.owned import TAG_SIZES
from sentcl_mlflow.store import git_commit

if TYPE_CHECKING:
    from mlflow import MlflowClient


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


def _all_versions(mlc: MlflowClient, name: str) -> list:
    return list(mlc.search_model_versions(f"name='{name}'"))


def finish_unfinished(mlc: MlflowClient, name: str) -> list[str]:
    """Versions an interrupted run left at ``registering``: finished if ``champion`` already moved to them
    (the gate had decided), deleted otherwise. Call with the lease held."""
    champ = version_or_none(mlc, name, CHAMPION)
    done = []
    for version in _all_versions(mlc, name):
        if (version.tags or {}).get(TAG_STATE) != REGISTERING:
            continue
        if champ is not None and str(champ.version) == str(version.version):
            mlc.set_model_version_tag(name, version.version, "gate.finished_by_cleanup", utc_timestamp())
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
        # A refused version (its files changed after registration) is not these weights any more: register anew.
        if tags.get(TAG_STATE) not in (REGISTERING, REFUSED) and version_weights(tags) == digest:
            return version
    return None


def rolled_back_weight_digests(mlc: MlflowClient, name: str) -> set[str]:
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
        if mlflow_error_code(e) != "RESOURCE_ALREADY_EXISTS":
            raise
    return str(mlc.create_model_version(name, model_uri, run_id=run_id, tags=tags).version)


def register_locked(mlc: MlflowClient, name: str, registration: Registration) -> tuple[str, bool]:
    """(version, created?). With the lease held. A version with the same weights is reused, never doubled."""
    model_uri, run_id, weights_sha256 = (
        registration.model_uri,
        registration.run_id,
        registration.weights_sha256,
    )
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
    manifest, sizes = registration_manifest(model_uri, weights_sha256)
    all_tags = registration.record(run_id, git_commit())
    all_tags |= {TAG_MANIFEST: json_dumps(manifest), TAG_SIZES: json_dumps(sizes)}
    version = _create_version(mlc, name, model_uri, run_id, all_tags)
    mlc.set_registered_model_alias(name, CHALLENGER, version)
    if run_id:
        mlc.set_tag(run_id, "registered_version", f"{name}/{version}")
    return version, True


def registration_manifest(
    model_uri: str, weights_sha256: str | None
) -> tuple[dict[str, str], dict[str, int]]:
    """The manifest of what ``model_uri`` holds now, read back from the store, and each file's size; its weights
    must still be the ones measured before the upload (``weights_sha256``), so a file swapped in between is not
    recorded."""
    import tempfile

    import mlflow

    with tempfile.TemporaryDirectory(prefix="sentcl-manifest-") as tmp:
        root = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=tmp))
        manifest = files_manifest(root) if root.is_dir() else {root.name: file_sha256(root)}
        sizes = {rel: (root / rel if root.is_dir() else root).stat().st_size for rel in manifest}
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
    return manifest, sizes


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)
