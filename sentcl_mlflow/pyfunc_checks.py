"""What a logged sentcl model checks for itself when it loads: its files, and the sentences it is given.

This file travels inside every logged model (``code/pyfunc_checks.py``, MLflow's ``code_paths``;
``runs.log_pyfunc_run`` adds it) and ``sentcl_mlflow/pyfunc_encoder.py`` imports it, so a direct
``mlflow.pyfunc.load_model("models:/sentcl-encoder@champion")``, with or without this repository, compares
every file of the model with the manifest the gate recorded at registration (the version's tag
``sentcl.manifest``) before the weights load. It imports nothing of this repository (the standard library
and MLflow only); ``sentcl_mlflow.registry.download`` uses the same functions for its checked downloads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TAG_MANIFEST = "sentcl.manifest"  # {relative path: sha256} of every file, written by the gate
TAG_WEIGHT_FILES = "weights_sha256"  # {weight file: sha256}: all a version registered before manifests has
# What MLflow itself writes beside a downloaded registered version (its name and version), not the model's.
DOWNLOAD_META = "registered_model_meta"


class WeightsMismatchError(RuntimeError):
    """A downloaded version's weights do not hash to the sha256 recorded when it was registered."""


class ModelTamperedError(WeightsMismatchError):
    """A version's files (any of them: weights, tokenizer, MLmodel, the serving code) differ from the
    manifest recorded when it was registered; nothing of it is loaded."""


class ManifestUnavailableError(RuntimeError):
    """The registry did not give the manifest to check a registered version against: not loaded unchecked."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_manifest(root: Path, bytecode: bool = True) -> dict[str, str]:
    """sha256 of every file under ``root``, by its path relative to it. ``bytecode=False`` leaves out
    ``__pycache__``: what Python wrote while importing the model's code, before ``load_context`` ran."""
    found = {}
    for p in sorted(Path(root).rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.as_posix() != DOWNLOAD_META and (bytecode or "__pycache__" not in rel.parts):
            found[rel.as_posix()] = file_sha256(p)
    return found


def check_manifest(root: Path, expected: Mapping[str, str], what: str, bytecode: bool = True) -> None:
    """Raise :class:`ModelTamperedError` unless the files under ``root`` are exactly ``expected``
    (``bytecode=False``: ``__pycache__`` left out on both sides)."""
    actual = files_manifest(root, bytecode)
    if not bytecode:
        expected = {k: v for k, v in expected.items() if "__pycache__" not in Path(k).parts}
    changed = sorted(k for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    for label, names in (("changed", changed), ("missing", missing), ("added", extra)):
        if names:
            more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
            raise ModelTamperedError(
                f"{what}: {names[0]}{more} {label} since registration (manifest sha256 mismatch); "
                "refusing to load it"
            )


def compiled_from(pyc: Path) -> bool:
    """Whether ``pyc`` (a file in a ``__pycache__``) holds exactly what Python compiles from the source beside
    its folder. Python may run a ``.pyc`` instead of its source (an unchecked hash-based one without looking at
    the source at all), so a cache file is the verified source's, or it is a foreign file."""
    import importlib.util
    import marshal

    stem, _, rest = pyc.name.partition(".")
    source = pyc.parent.parent / f"{stem}.py"
    level = rest.split("opt-")[1][:1] if "opt-" in rest else "0"
    try:
        data, code = pyc.read_bytes(), source.read_bytes()
        if data[:4] != importlib.util.MAGIC_NUMBER or not level.isdigit():
            return False
        if int.from_bytes(data[4:8], "little") & 1 and data[8:16] != importlib.util.source_hash(code):
            return False
        compiled = compile(code, str(source), "exec", dont_inherit=True, optimize=int(level))
        return marshal.loads(data[16:]) == compiled
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        return False


def check_bytecode(root: Path, expected: Mapping[str, str], what: str) -> None:
    """Every ``__pycache__`` file under ``root`` must be as the manifest lists it or the compile of its verified
    source (``compiled_from``): Python writes them beside a model loaded in place (a local store)."""
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and "__pycache__" in path.relative_to(root).parts:
            if expected.get(rel) != file_sha256(path) and not compiled_from(path):
                raise ModelTamperedError(
                    f"{what}: {rel} added since registration (bytecode that is not its verified source's); "
                    "refusing to load it"
                )


def model_root(path: str | Path) -> Path | None:
    """The logged model's own folder (the one with ``MLmodel``) that ``path`` lies in, if any."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if (folder / "MLmodel").is_file():
            return folder
    return None


def registered_version(root: Path) -> tuple[str, str] | None:
    """(name, version) when MLflow loaded ``root`` from the registry (``models:/...``): it writes the file
    ``registered_model_meta`` into every registered model it downloads. None for a run's or a folder's."""
    meta = root / DOWNLOAD_META
    if not meta.is_file():
        return None
    import yaml  # MLflow's own dependency, which writes the file

    data = yaml.safe_load(meta.read_text()) or {}
    return str(data["model_name"]), str(data["model_version"])


def verify_loaded_model(path: str | Path) -> str | None:
    """Called by the pyfunc's ``load_context`` with an artifact path, before any weight is read: the model
    it belongs to must match its registered version's manifest, read from the registry the caller uses.
    Returns what was checked (``models:/name/version``), or None for a model not loaded from the registry
    (a run's model, a folder of one's own: there is no registration to check it against).

    Where this repository is installed, a ``models:/`` download has been checked already, before MLflow read
    its ``MLmodel`` or imported any of its code (``sentcl_mlflow.verified_models``, MLflow's ``models``
    artifact repository in its place). Elsewhere this is the model's own check: ``pyfunc_encoder.py`` and this
    file have run by then (Python compiled them into ``__pycache__``, left out here)."""
    root = model_root(path)
    registered = registered_version(root) if root is not None else None
    if registered is None:
        return None
    name, version = registered
    return verify_registered(root, name, version, bytecode=False)


def verify_registered(
    root: Path,
    name: str,
    version: str,
    bytecode: bool = True,
    below: str = "",
    registry_uri: str | None = None,
) -> str:
    """The files under ``root`` (the logged model of ``name`` version ``version``, or its part ``below``) must be
    those its registration recorded (``sentcl.manifest``; a version registered before manifests: its weight
    files). Raises :class:`ModelTamperedError` or :class:`ManifestUnavailableError` (one line each); a version
    with neither record is not a sentcl model and passes. ``bytecode=False``: ``__pycache__`` left out (after the
    import, which wrote it); otherwise a cache file must be the compile of its verified source."""
    what = f"models:/{name}/{version}"
    try:
        import mlflow

        client = mlflow.MlflowClient(registry_uri=registry_uri)
        tags = client.get_model_version(name, version).tags or {}
    except Exception as e:  # noqa: BLE001 (any failure to read the record means: not checked, not loaded)
        first = (str(getattr(e, "message", "")) or str(e) or type(e).__name__).splitlines()[0]
        raise ManifestUnavailableError(
            f"{what}: cannot read its manifest from the registry ({type(e).__name__}: {first}); "
            "refusing to load it unchecked"
        ) from None
    below = below.strip("/")
    if tags.get(TAG_MANIFEST):
        expected = json.loads(tags[TAG_MANIFEST])
        if below:  # a part of the model: the files the manifest lists under it
            if root.is_file():
                if expected.get(below) != file_sha256(root):
                    raise ModelTamperedError(
                        f"{what}: {below} changed since registration (manifest sha256 mismatch); "
                        "refusing to load it"
                    )
                return what
            prefix = below + "/"
            expected = {k[len(prefix) :]: v for k, v in expected.items() if k.startswith(prefix)}
        check_manifest(root, expected, what, bytecode=False)
        if bytecode:  # before any import: a cache file is the verified source's, or it is refused
            check_bytecode(root, expected, what)
    elif tags.get(TAG_WEIGHT_FILES) and not below:  # registered before manifests: its weight files, by name
        check_weight_files(root, json.loads(tags[TAG_WEIGHT_FILES]), what)
    return what


def check_weight_files(root: Path, expected: Mapping[str, str], what: str) -> None:
    folders = [p.parent for p in sorted(root.rglob("modules.json"))] or [root]
    for name, digest in expected.items():
        path = folders[0] / name
        if not path.is_file() or file_sha256(path) != digest:
            raise WeightsMismatchError(
                f"{what}: {name} does not hash to the sha256 recorded at registration; refusing to load it"
            )


def sentences(model_input: Any) -> list[str]:
    """``mlflow models serve`` hands a DataFrame; ``predict`` in Python may get a list, an array or one string.

    Every item that reaches the model must be a string: ``predict([123, None])`` is refused with an
    INVALID_PARAMETER_VALUE error (HTTP 400), never turned into the vectors of "123" and "None". Over HTTP,
    ``mlflow models serve`` parses a request against the logged string signature before the model sees it
    (``infer_and_parse_data`` turns ``[123, null]`` into strings), so serve with ``python -m
    sentcl_mlflow.serve``: the same rule checked on the JSON body before MLflow parses it (400 + message)."""
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "iloc") and hasattr(model_input, "columns"):  # pandas without importing it
        column = "sentence" if "sentence" in model_input.columns else model_input.columns[0]
        values = model_input[column].tolist()
    elif isinstance(model_input, dict):
        values = model_input.get("sentence", next(iter(model_input.values())))
        values = [values] if isinstance(values, str) else list(values)
    else:
        import numpy as np

        values = np.asarray(model_input, dtype=object).reshape(-1).tolist()
    bad = [(i, v) for i, v in enumerate(values) if not isinstance(v, str)]
    if bad:
        from mlflow.exceptions import INVALID_PARAMETER_VALUE, MlflowException

        i, v = bad[0]
        raise MlflowException(
            f"input {i} is {type(v).__name__} {v!r}, not a string: send a list of sentences "
            f"({len(bad)} of {len(values)} inputs are not strings)",
            error_code=INVALID_PARAMETER_VALUE,
        )
    return values
