"""A direct ``mlflow.pyfunc.load_model`` of a registered sentcl model checks its own files.

A tiny encoder is logged the way the export stage logs it (``runs.log_pyfunc_run``: sentcl_mlflow/pyfunc_encoder.py
with sentcl_mlflow/pyfunc_checks.py in its code/) and registered (the manifest is recorded), in the session's
scratch sqlite store. Then one file is changed, in a downloaded copy and in the store itself, and the model
is loaded by MLflow alone, as any caller would: refused, before the changed weights are read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sentcl.params import read_params
from sentcl.registry.rules import Registration
from sentcl_mlflow import pyfunc_checks, runs, store
from sentcl_mlflow.pyfunc_checks import ModelTamperedError
from sentcl_mlflow.registration import PYFUNC_MODEL
from sentcl_mlflow.registry.gate import register_candidate
from tests.services.test_registry import TABLE

NAME = "pyfunc-manifest"
ENCODER = "artifacts/tiny-bert"  # the artifact `encoder`, under its folder's name
SENTENCES = ["a man is playing a guitar", "a dog is running"]


def log_tiny_pyfunc(tiny_model: Path, example_output: object) -> tuple[str, str]:
    """``tiny_model`` logged the export stage's way (``runs.log_pyfunc_run``): (run id, model URI)."""
    store._configured = None
    # Python as a user's shell runs it, writing bytecode (PYTHONDONTWRITEBYTECODE, set here, hid a bug).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "dont_write_bytecode", False)
        model = runs.PyfuncModel(PYFUNC_MODEL, {"encoder": tiny_model}, SENTENCES, example_output, ["mlflow"])
        return runs.log_pyfunc_run("export", {"model": "tiny"}, model, runs.StageRecord({"stsb_dev": 1.0}))


def register_tiny_pyfunc(tiny_model: Path, name: str) -> tuple[str, object]:
    """``tiny_model`` logged (``log_tiny_pyfunc``) and registered as ``name`` in the store in use, its manifest
    recorded: (``models:/name/version``, the vectors of SENTENCES)."""
    from sentence_transformers import SentenceTransformer

    from sentcl.registry.rules import weight_file_digests, weights_fingerprint

    expected = SentenceTransformer(str(tiny_model), device="cpu").encode(SENTENCES)
    run_id, model_uri = log_tiny_pyfunc(tiny_model, expected)
    digests = weight_file_digests(tiny_model)
    version = register_candidate(
        Registration(
            model_uri,
            80.0,
            TABLE,
            name=name,
            tags={"weights_sha256": json.dumps(digests)},
            run_id=run_id,
            weights_sha256=weights_fingerprint(digests),
        ),
        read_params(),
    )
    return f"models:/{name}/{version}", expected


@pytest.fixture(scope="module")
def registered(tiny_model):
    import mlflow

    uri, expected = register_tiny_pyfunc(tiny_model, NAME)
    tags = mlflow.MlflowClient().get_model_version(NAME, uri.rsplit("/", 1)[1]).tags
    return {"uri": uri, "expected": expected, "manifest": json.loads(tags[pyfunc_checks.TAG_MANIFEST])}


def test_the_manifest_covers_the_checks_the_model_carries(registered):
    manifest = registered["manifest"]
    assert {"MLmodel", "pyfunc_encoder.py", "code/pyfunc_checks.py"} <= set(manifest)
    assert f"{ENCODER}/model.safetensors" in manifest
    # MLflow imports the code while logging it: no bytecode of that import is registered as the model's.
    assert not [name for name in manifest if "__pycache__" in name], manifest


def test_an_untouched_registered_model_loads_and_loads_again(registered):
    import mlflow
    import numpy as np

    for _ in range(2):  # the second load finds Python's __pycache__ from the first: not a changed file
        model = mlflow.pyfunc.load_model(registered["uri"])
        np.testing.assert_allclose(model.predict(SENTENCES), registered["expected"], atol=1e-6)


def test_a_changed_weight_file_in_a_downloaded_copy_is_refused_by_load_model(registered, tmp_path):
    import mlflow

    copy = Path(mlflow.artifacts.download_artifacts(registered["uri"], dst_path=str(tmp_path)))
    weights = copy / ENCODER / "model.safetensors"
    weights.write_bytes(b"not weights")  # loading these would fail in safetensors, not in the check
    with pytest.raises(pyfunc_checks.ModelTamperedError) as refused:
        mlflow.pyfunc.load_model(str(copy))
    message = str(refused.value)
    assert message == (
        f"{registered['uri']}: {ENCODER}/model.safetensors changed since registration "
        "(manifest sha256 mismatch); refusing to load it"
    )
    assert ModelTamperedError is pyfunc_checks.ModelTamperedError  # one error, whoever checks


def test_a_file_changed_in_the_store_is_refused_by_a_direct_load(registered):
    """The artifact store itself (here the local one, loaded in place by MLflow): an added tokenizer file."""
    import mlflow

    source = Path(mlflow.artifacts.download_artifacts(registered["uri"]))  # the store's own folder
    planted = source / ENCODER / "added_tokens.json"
    planted.write_text('{"[BAD]": 0}')
    try:
        with pytest.raises(
            pyfunc_checks.ModelTamperedError, match="added_tokens.json added since registration"
        ):
            mlflow.pyfunc.load_model(registered["uri"])
    finally:
        planted.unlink()
    mlflow.pyfunc.load_model(registered["uri"])  # as registered again: loads


def test_a_model_loaded_without_this_repository_checks_itself_with_its_own_copy(registered, tmp_path):
    """A process that cannot import sentcl_mlflow (a consumer's machine) uses code/pyfunc_checks.py."""
    import mlflow

    copy = Path(mlflow.artifacts.download_artifacts(registered["uri"], dst_path=str(tmp_path)))
    (copy / ENCODER / "config.json").write_text("{}")
    probe = (
        "import sys; sys.modules['sentcl_mlflow'] = None; import mlflow\n"
        f"try: mlflow.pyfunc.load_model({str(copy)!r})\n"
        "except Exception as e: print(type(e).__module__, type(e).__name__, e)\n"
        "else: print('loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == (
        f"pyfunc_checks ModelTamperedError {registered['uri']}: {ENCODER}/config.json changed since "
        "registration (manifest sha256 mismatch); refusing to load it"
    )


def test_a_registered_copy_whose_registry_is_gone_is_not_loaded_unchecked(registered, tmp_path, monkeypatch):
    import mlflow

    copy = Path(mlflow.artifacts.download_artifacts(registered["uri"], dst_path=str(tmp_path / "m")))
    empty = tmp_path / "other.db"
    session_store = os.environ["MLFLOW_TRACKING_URI"]
    mlflow.set_tracking_uri(f"sqlite:///{empty}")  # MLflow exports it in MLFLOW_TRACKING_URI too
    mlflow.set_registry_uri(f"sqlite:///{empty}")
    try:
        with pytest.raises(pyfunc_checks.ManifestUnavailableError, match="refusing to load it unchecked"):
            mlflow.pyfunc.load_model(str(copy))
    finally:  # back to the session's store, for the tests after this one
        os.environ["MLFLOW_TRACKING_URI"] = session_store
        mlflow.set_tracking_uri(session_store)
        mlflow.set_registry_uri(session_store)
        store._configured = None
        store.client()
    shutil.rmtree(copy)


def _load_in_a_process(uri: str, cwd: Path) -> str:
    """``mlflow.pyfunc.load_model(uri)`` as any caller runs it, in a process of its own (writing bytecode, as
    Python does by default): its last line, the error's type and message or 'loaded'."""
    probe = (
        "import sys; sys.dont_write_bytecode = False\nimport mlflow\n"
        f"try: mlflow.pyfunc.load_model({uri!r})\n"
        "except Exception as e: print(type(e).__name__, e)\n"
        "else: print('loaded')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_changed_serving_code_in_the_store_never_runs_on_a_direct_load(registered, tmp_path):
    """The model's own code changed where it is stored: `mlflow.pyfunc.load_model("models:/...")` refuses it
    before MLflow imports it (sentcl_mlflow.verified_models checks the download), so it never runs: the
    marker it would write stays absent, and the error is one line."""
    import mlflow

    source = Path(mlflow.artifacts.download_artifacts(registered["uri"]))  # the store's own folder
    code = source / "pyfunc_encoder.py"
    original = code.read_bytes()
    marker = tmp_path / "the-changed-code-ran"
    code.write_bytes(original + f"\nopen({str(marker)!r}, 'w').write('ran')\n".encode())  # runs on import
    try:
        last = _load_in_a_process(registered["uri"], tmp_path)
    finally:
        code.write_bytes(original)
    assert not marker.exists()
    assert last == (
        f"ModelTamperedError {registered['uri']}: pyfunc_encoder.py changed since registration "
        "(manifest sha256 mismatch); refusing to load it"
    )
    assert _load_in_a_process(registered["uri"], tmp_path) == "loaded"  # as registered: loads


@pytest.mark.slow  # a process of its own that loads MLflow and torch
def test_planted_bytecode_beside_the_serving_code_never_runs(registered, tmp_path):
    """A ``.pyc`` that Python would run instead of the verified source (an unchecked hash-based one is never
    compared with its source): refused before the import, the marker stays absent."""
    import importlib.util
    import py_compile

    import mlflow

    source = Path(mlflow.artifacts.download_artifacts(registered["uri"]))
    marker = tmp_path / "the-planted-bytecode-ran"
    evil = tmp_path / "pyfunc_encoder.py"
    evil.write_bytes(
        (source / "pyfunc_encoder.py").read_bytes() + f"\nopen({str(marker)!r}, 'w').write('ran')\n".encode()
    )
    cache = Path(importlib.util.cache_from_source(str(source / "pyfunc_encoder.py")))
    kept = cache.read_bytes() if cache.exists() else None
    py_compile.compile(
        str(evil), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    try:
        last = _load_in_a_process(registered["uri"], tmp_path)
    finally:
        if kept is None:
            cache.unlink()
        else:
            cache.write_bytes(kept)
    assert not marker.exists()
    assert last.startswith(f"ModelTamperedError {registered['uri']}: __pycache__/pyfunc_encoder.") and (
        "added since registration (bytecode that is not its verified source's)" in last
    ), last


@pytest.mark.slow  # a process of its own that loads MLflow and torch
def test_the_gates_watch_of_the_champion_tells_a_load_in_place_from_a_change(registered, tmp_path):
    """The gate process's check of the champion's stored files (``registry.champion.champion_problem``), on a local
    store that a load in place wrote Python's cache and MLflow's note into: no false alarm; a changed serving
    file, or foreign bytecode beside it, is found by the quick check as by the full one."""
    import importlib.util
    import py_compile

    import mlflow

    from sentcl_mlflow.registry.champion import champion_problem

    mlc = mlflow.MlflowClient()
    name, version = registered["uri"].removeprefix("models:/").split("/")
    mlc.set_registered_model_alias(name, "champion", version)
    assert _load_in_a_process(registered["uri"], tmp_path) == "loaded"  # writes __pycache__ into the store
    source = Path(mlflow.artifacts.download_artifacts(registered["uri"]))
    assert list(source.rglob("__pycache__")) and (source / "registered_model_meta").exists()
    for full in (False, True):
        assert champion_problem(mlc, name, tmp_path, full=full) is None, full
    code = source / "pyfunc_encoder.py"
    original = code.read_bytes()
    cache = Path(importlib.util.cache_from_source(str(code)))
    cached = cache.read_bytes()
    try:
        changed = original.replace(b"one vector per sentence", b"one vector per SENTENCE", 1)
        assert len(changed) == len(original) and changed != original  # same size: only the hash tells
        code.write_bytes(changed)
        for full in (False, True):
            found = champion_problem(mlc, name, tmp_path, full=full)
            assert found is not None and "pyfunc_encoder.py changed since registration" in found[1], (
                full,
                found,
            )
        code.write_bytes(original)
        evil = tmp_path / "pyfunc_encoder.py"
        evil.write_bytes(original + b"\nimport os\n")
        py_compile.compile(
            str(evil), cfile=str(cache), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
        found = champion_problem(mlc, name, tmp_path)
        assert found is not None and "bytecode that is not its verified source's" in found[1], found
    finally:
        code.write_bytes(original)
        cache.write_bytes(cached)
        mlc.delete_registered_model_alias(name, "champion")


def test_a_model_past_the_gates_size_limit_is_refused_after_download_before_any_check(registered, tmp_path):
    """``gate.max_model_mb`` (the gate's ``download_verified(..., max_bytes)``): a version whose files together
    hold more is refused in one line naming the limit; the same version within it downloads and verifies."""
    from sentcl_mlflow.registry.download import download_verified

    root = download_verified(registered["uri"], tmp_path / "within", max_bytes=10 * 2**30)
    total = sum(p.lstat().st_size for p in root.rglob("*") if not p.is_dir())
    assert (root / ENCODER / "model.safetensors").is_file() and total > 0
    with pytest.raises(OverflowError) as refused:
        download_verified(registered["uri"], tmp_path / "past", max_bytes=total - 1)
    message = str(refused.value)
    assert "more than gate.max_model_mb" in message and "\n" not in message, message
