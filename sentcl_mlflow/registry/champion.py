"""The gate watches the champion it promoted, and puts back the previous verified one when its files change.

A production version's files are the gate's own upload, in a run only the gate's account can write; who holds
the admin account or the artifact store's keys can still change them. Every poll, the gate process compares what
is stored for ``champion`` with what it recorded (``champion_problem``): the list of files against the manifest,
each file's size against ``sentcl.sizes``, and the sha256 of every file up to ``SMALL_FILE`` bytes (the code,
``MLmodel``, the tokenizer and configs); a full download of every file is checked at the gate's start and at every
judgment. A champion that fails is tagged refused and ``champion`` moves back along ``previous_champion`` to the
first version whose files verify (``restore_verified_champion``), under the promotion lease, by the gate's own
account: no person needs to roll back, and loading ``@champion`` works again within one poll. With no verified
version left, ``champion`` is removed (a load then fails with "no champion", never on changed code).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentcl.registry.rules import REFUSED, TAG_ROLLED_BACK, TAG_STATE
from sentcl_mlflow.errors import GateRefusedError
from sentcl_mlflow.pyfunc_checks import DOWNLOAD_META, TAG_MANIFEST, compiled_from, file_sha256
from sentcl_mlflow.registry.measure import refuse, verified_download
from sentcl_mlflow.registry.names import CHAMPION, move_champion, utc_timestamp, version_or_none
from sentcl_mlflow.registry.owned import TAG_SIZES
from sentcl_mlflow.store import caller_identity

if TYPE_CHECKING:
    from mlflow import MlflowClient

SMALL_FILE = 1 << 20  # files up to this size are hashed at every poll; larger ones are compared by size


def _listing(mlc: MlflowClient, uri: str) -> dict[str, int]:
    """Every file stored under ``uri`` (an artifact location) with its size, recursively."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(uri)
    found: dict[str, int] = {}
    folders = [None]
    while folders:
        for info in repo.list_artifacts(folders.pop()):
            if info.is_dir:
                folders.append(info.path)
            else:
                found[info.path] = int(info.file_size or 0)
    return found


def champion_problem(
    mlc: MlflowClient, name: str, scratch: Path, full: bool = False
) -> tuple[Any, str] | None:
    """(the champion, one line saying which of its stored files differs from the gate's record), or None when it
    holds (or there is no champion, or it has no manifest to check against). ``full``: download every file."""
    champ = version_or_none(mlc, name, CHAMPION)
    if champ is None or not (champ.tags or {}).get(TAG_MANIFEST):
        return None
    what = f"models:/{name}/{champ.version}"
    if full:
        from sentcl_mlflow.pyfunc_checks import WeightsMismatchError
        from sentcl_mlflow.registry.download import download_verified

        try:
            with tempfile.TemporaryDirectory(prefix="sentcl-champion-", dir=scratch) as tmp:
                download_verified(what, Path(tmp))
        except WeightsMismatchError as e:  # a changed, missing or added file (not a registry that is down)
            return champ, str(e).splitlines()[0]
        return None
    manifest = json.loads(champ.tags[TAG_MANIFEST])
    sizes = json.loads((champ.tags or {}).get(TAG_SIZES) or "{}")
    location = mlc.get_model_version_download_uri(name, str(champ.version))
    stored = _listing(mlc, location)
    stored.pop(DOWNLOAD_META, None)  # MLflow's note where a client loaded a local store in place
    # Python's cache beside the code, where a model was loaded in place: allowed only as the compile of its
    # verified source (checked below, as a load checks it).
    bytecode = {rel for rel in stored.keys() - manifest.keys() if "__pycache__" in Path(rel).parts}
    for label, names in (
        ("missing", manifest.keys() - stored.keys()),
        ("added", stored.keys() - manifest.keys() - bytecode),
    ):
        if names:
            return champ, f"{what}: {sorted(names)[0]} {label} since registration; refusing to load it"
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(location)
    with tempfile.TemporaryDirectory(prefix="sentcl-champion-", dir=scratch) as tmp:
        for rel, digest in sorted(manifest.items()):
            if rel in sizes and sizes[rel] != stored[rel]:
                return champ, f"{what}: {rel} changed since registration (size); refusing to load it"
            if stored[rel] <= SMALL_FILE and file_sha256(Path(repo.download_artifacts(rel, tmp))) != digest:
                return (
                    champ,
                    f"{what}: {rel} changed since registration (manifest sha256 mismatch); refusing to load it",
                )
        for rel in sorted(bytecode):
            if not compiled_from(Path(repo.download_artifacts(rel, tmp))):
                return (
                    champ,
                    f"{what}: {rel} added since registration (bytecode that is not its verified source's)",
                )
    return None


def restore_verified_champion(mlc: MlflowClient, name: str, reason: str, lease: Any) -> str:
    """With the promotion lease held: the champion, whose files failed (``reason``), tagged refused, and
    ``champion`` moved to the newest earlier champion (along ``previous_champion``) whose files verify in full;
    removed when none does. Returns the line that says what was done."""
    champ = version_or_none(mlc, name, CHAMPION)
    if champ is None:
        return f"gate: {name} has no champion any more; nothing to restore"
    refuse(mlc, name, str(champ.version), reason)
    seen, previous = {str(champ.version)}, (champ.tags or {}).get("previous_champion")
    while previous and previous not in seen:
        seen.add(previous)
        version = mlc.get_model_version(name, previous)
        tags = version.tags or {}
        nxt = tags.get("previous_champion")
        if tags.get(TAG_STATE) == REFUSED or str(tags.get(TAG_ROLLED_BACK, "")).lower() == "true":
            previous = nxt
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="sentcl-restore-") as tmp:
                verified_download(mlc, name, previous, Path(tmp))  # a failure tags it refused too
        except GateRefusedError:
            previous = nxt
            continue
        move_champion(mlc, name, previous, lease)
        for key, value in {
            "restored_by": caller_identity(),  # the account the server authenticated: the gate's
            "restored_reason": f"champion {champ.version} failed verification: {reason}",
            "restored_at": utc_timestamp(),
        }.items():
            mlc.set_model_version_tag(name, previous, key, value)
        return (
            f"gate: champion {name} version {champ.version} failed verification ({reason}); restored version "
            f"{previous}, the previous verified champion"
        )
    lease.check()
    mlc.delete_registered_model_alias(name, CHAMPION)
    return (
        f"gate: champion {name} version {champ.version} failed verification ({reason}); no earlier champion "
        "verifies, so champion was removed (loading @champion now fails with no champion)"
    )
