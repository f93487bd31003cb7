"""Checked downloads: a registered version (or an alias's) whose files must match what was registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentcl.registry.rules import sts_row_from_tags, version_weights, weight_file_digests, weights_fingerprint
from sentcl_mlflow.errors import NoChampionError
from sentcl_mlflow.pyfunc_checks import TAG_MANIFEST, WeightsMismatchError, check_bytecode, check_manifest
from sentcl_mlflow.registry.names import CHAMPION, version_or_none
from sentcl_mlflow.store import client


def alias_version(alias: str, name: str) -> str | None:
    mlc = client()
    version = version_or_none(mlc, name, alias)
    return version.version if version is not None else None


def champion_scores(name: str) -> tuple[str, dict[str, Any]] | None:
    """(version, its scores as a row of metrics/sts.json) of the champion, or None when nothing is champion yet."""
    mlc = client()
    version = version_or_none(mlc, name, CHAMPION)
    return (str(version.version), sts_row_from_tags(version.tags)) if version is not None else None


def download_alias(alias: str, dest: Path, name: str) -> Path:
    """The sentence-transformers folder of the version ``alias`` points at, its weights checked against the
    sha256 recorded at registration. Raises :class:`NoChampionError` when the alias is unset."""
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


def download_verified(model_uri: str, dest: Path, max_bytes: int | None = None) -> Path:
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
    if max_bytes is not None:
        total = sum(p.lstat().st_size for p in root.rglob("*") if not p.is_dir())
        if total > max_bytes:
            raise OverflowError(
                f"its files hold {total / 2**20:.0f} MiB, more than gate.max_model_mb ({max_bytes / 2**20:g} MiB)"
            )
    if (
        manifest is not None
    ):  # Python's cache counts as its source's compile or not at all (as a load checks it)
        check_manifest(root, manifest, model_uri, bytecode=False)
        check_bytecode(root, manifest, model_uri)
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
