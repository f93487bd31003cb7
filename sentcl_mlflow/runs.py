"""What a stage run records in MLflow: params, metrics, curves, DVC hashes, tags; the pyfunc model run.

from sentcl_mlflow.runs import PyfuncModel, StageRecord, log_pyfunc_run, log_stage, preflight

A run's params come from its caller: the stage's ``params`` (the one ``Params`` its entry point read), never
read here. What a run records besides them is one :class:`StageRecord`; a pyfunc model, one :class:`PyfuncModel`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sentcl.digest import update_from_file
from sentcl_mlflow.store import (
    EXPERIMENT,
    client,
    experiment_id,
    git_commit,
    git_dirty,
    preflight,
    quick_requests,
    repo_root,
    tracking_enabled,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "StageRecord",
    "PyfuncModel",
    "log_stage",
    "preflight",
    "log_pyfunc_run",
    "stage_run",
    "flatten",
    "sts_metrics",
    "dvc_hashes",
]


@dataclass(frozen=True)
class StageRecord:
    """What one run records besides its params: ``metrics`` (logged at step 0), ``curves_csv`` (columns step,
    loss, lr, stsb_dev, ...: metrics by step named ``train/<column>``), ``inputs`` (data paths whose DVC hashes
    become ``dvc.<path>`` tags), ``artifacts`` (files or folders uploaded) and ``tags``."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    curves_csv: Path | None = None
    inputs: Sequence[Path] = ()
    artifacts: Sequence[Path] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PyfuncModel:
    """A "models from code" pyfunc: the code MLflow serves it with (``model_file``), the files it loads
    (``artifacts``, name -> path), an input and the output it gives (the signature is inferred from both) and
    the pinned requirements of its environment."""

    model_file: Path
    artifacts: Mapping[str, Path]
    input_example: list[str]
    example_output: Any
    pip_requirements: Sequence[str]


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"transfer": {"lr": 1e-5}}`` -> ``{"transfer.lr": "1e-05"}``; lists become JSON."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            text = json.dumps(value) if isinstance(value, list | tuple) else str(value)
            flat[name] = text[:6000]  # MLflow's param value limit
    return flat


def metric_key(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


def sts_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """One checkpoint's row of metrics/sts.json as MLflow metrics: ``sts_<task>``, ``sts_avg``, ``stsb_dev``.

    The "all" protocol is the headline, as in the papers; "mean" is kept as ``sts_mean_<task>``.
    """
    out: dict[str, float] = {}
    for protocol, prefix in (("all", "sts_"), ("mean", "sts_mean_")):
        table = row.get(protocol) or {}
        for task, value in table.items():
            if isinstance(value, int | float):
                out[prefix + task.lower().replace("-", "_")] = float(value)
    for key, value in row.items():
        if key not in ("all", "mean") and isinstance(value, int | float) and not isinstance(value, bool):
            out[metric_key(key)] = float(value)
    return out


def _lock_hashes(root: Path) -> dict[str, str]:
    """path -> hash of every stage output and dependency recorded in dvc.lock."""
    lock = root / "dvc.lock"
    if not lock.exists():
        return {}
    with open(lock) as f:
        data = yaml.safe_load(f) or {}
    found: dict[str, str] = {}
    for stage in (data.get("stages") or {}).values():
        for entry in (stage.get("deps") or []) + (stage.get("outs") or []):
            digest = entry.get("md5") or entry.get("hash") or entry.get("etag") or entry.get("checksum")
            if entry.get("path") and digest:
                found[os.path.normpath(entry["path"])] = str(digest)
    return found


def _content_hash(path: Path) -> str:
    """A fallback for paths dvc.lock does not know yet: sha256 over relative names and file bytes."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        update_from_file(h, p)
    return "sha256:" + h.hexdigest()


def dvc_hashes(inputs: list[Path]) -> dict[str, str]:
    """The DVC hash of each data input (from dvc.lock, as DVC recorded it), else a content hash."""
    root = repo_root()
    # A stage runs in the workspace that DVC checked out, which is not the store's root in a temp experiment.
    here = Path.cwd()
    recorded = _lock_hashes(here) or _lock_hashes(root)
    out: dict[str, str] = {}
    for path in inputs:
        path = Path(path)
        absolute = path if path.is_absolute() else here / path
        try:
            rel = os.path.normpath(absolute.resolve().relative_to(here.resolve()))
        except ValueError:
            rel = str(absolute)
        if rel in recorded:
            out[rel] = recorded[rel]
        elif absolute.exists():
            out[rel] = _content_hash(absolute)
    return out


def _read_curves(path: Path) -> list[tuple[str, float, int]]:
    """(train/<column>, value, step) for every numeric cell of a curves CSV whose ``step`` column indexes the rows."""
    rows: list[tuple[str, float, int]] = []
    with open(path, newline="") as f:
        for i, record in enumerate(csv.DictReader(f)):
            try:
                step = int(float(record.get("step") or i))
            except ValueError:
                step = i
            for key, value in record.items():
                if key in (None, "step") or value in (None, ""):
                    continue
                try:
                    number = float(value)
                except ValueError:
                    continue
                if math.isfinite(number):
                    # train/ keeps the curve apart from the final metric of the same name (stsb_dev).
                    rows.append((f"train/{metric_key(key)}", number, step))
    return rows


# --------------------------------------------------------------------------------------------- log


def run_tags(stage: str) -> dict[str, str]:
    tags = {"sentcl.stage": stage, "mlflow.runName": stage}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git_commit"] = commit
        tags["git_dirty"] = str(git_dirty()).lower()
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_exp_name"] = os.environ["DVC_EXP_NAME"]
        tags["mlflow.runName"] = f"{stage}@{os.environ['DVC_EXP_NAME']}"
    if os.environ.get("DVC_EXP_BASELINE_REV"):
        tags["dvc_exp_baseline_rev"] = os.environ["DVC_EXP_BASELINE_REV"]
    # A flow passes its context (flow run id, domain text sha256, ...) to the stages it starts this way.
    try:
        tags.update(
            {str(k): str(v) for k, v in json.loads(os.environ.get("SENTCL_RUN_TAGS") or "{}").items()}
        )
    except ValueError:
        pass
    tags.update(_context)
    return tags


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def log_stage(
    stage: str,
    resolved: Mapping[str, Any],
    record: StageRecord | None = None,
    *,
    params: Mapping[str, Any],
) -> str | None:
    """Log one finished stage as one MLflow run and return its run id.

    Every run carries the whole of ``params`` (the process's params.yaml, as its entry point read it), so runs
    of different stages compare on the same keys; ``resolved``, the stage's own (resolved) values, win where
    they overlap. Both are flattened. ``record``: its metrics, curves, inputs, artifacts and tags.
    Returns None when tracking is switched off (``SENTCL_MLFLOW=0``). Raises :class:`TrackingUnavailableError`
    after bounded retries when a tracking server does not answer.
    """
    if not tracking_enabled():
        return None
    from mlflow.entities import Param

    record = record or StageRecord()
    mlc = client()
    flat_params = flatten(params)
    flat_params.update(flatten(resolved))
    all_tags = _record_tags(stage, record)
    run = mlc.create_run(experiment_id(mlc), run_name=all_tags["mlflow.runName"], tags=all_tags)
    run_id = run.info.run_id
    try:
        for chunk in _chunks([Param(k, v) for k, v in flat_params.items()], 100):
            mlc.log_batch(run_id, params=chunk)
        _log_record(mlc, run_id, record)
    except Exception as error:
        _terminate(mlc, run_id, "FAILED", error)
        raise
    mlc.set_terminated(run_id, "FINISHED")
    return run_id


def _record_tags(stage: str, record: StageRecord) -> dict[str, str]:
    """The run's tags (``run_tags``), the DVC hash of each input, then the record's own tags."""
    all_tags = run_tags(stage)
    for path, digest in dvc_hashes(list(record.inputs)).items():
        all_tags[f"dvc.{path}"] = digest
    all_tags.update({k: str(v) for k, v in record.tags.items()})
    return all_tags


def _log_record(mlc: MlflowClient, run_id: str, record: StageRecord) -> None:
    """The record's metrics and curves, then its artifacts, into the open run ``run_id``."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    series = [Metric(metric_key(k), float(v), now, 0) for k, v in record.metrics.items() if _finite(v)]
    if record.curves_csv and Path(record.curves_csv).exists():
        series += [Metric(k, v, now, step) for k, v, step in _read_curves(Path(record.curves_csv))]
    for chunk in _chunks(series, 1000):
        mlc.log_batch(run_id, metrics=chunk)
    for path in record.artifacts:
        path = Path(path)
        if path.is_dir():
            mlc.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.exists():
            mlc.log_artifact(run_id, str(path))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _terminate(mlc: MlflowClient, run_id: str, status: str, error: BaseException | None = None) -> None:
    """End a run the block it belongs to broke off. After a connection failure the server gets one short
    try (``store.quick_requests``): a dead one would otherwise cost the whole bounded timeout again, and a
    run left RUNNING by a dead server is ended by the next holder of its promotion lease, if it had one
    (``registry.versions.fail_orphaned_runs``)."""
    from sentcl_mlflow.errors import unreachable

    try:
        if error is not None and unreachable(error):
            with quick_requests():
                mlc.set_terminated(run_id, status)
        else:
            mlc.set_terminated(run_id, status)
    except Exception:  # noqa: BLE001 (the original error is the one worth reporting)
        pass


# Tags every run this process creates carries while set (``context_tags``): the promotion lease a
# registration holds, so a run it leaves RUNNING can be found and ended once that lease is gone.
_context: dict[str, str] = {}


@contextmanager
def context_tags(tags: Mapping[str, str]) -> Iterator[None]:
    saved = dict(_context)
    _context.update(tags)
    try:
        yield
    finally:
        _context.clear()
        _context.update(saved)


@contextmanager
def stage_run(stage: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> Iterator[str | None]:
    """A run open for the length of a block (for stages that log as they go); FAILED if the block raises."""
    if not tracking_enabled():
        yield None
        return
    from mlflow.entities import Param

    mlc = client()
    all_tags = {**run_tags(stage), **(tags or {})}
    run_id = mlc.create_run(
        experiment_id(mlc), run_name=all_tags["mlflow.runName"], tags=all_tags
    ).info.run_id
    try:
        for chunk in _chunks([Param(k, v) for k, v in flatten(params).items()], 100):
            mlc.log_batch(run_id, params=chunk)
        yield run_id
    except BaseException as error:
        _terminate(mlc, run_id, "FAILED", error)
        raise
    mlc.set_terminated(run_id, "FINISHED")


def log_pyfunc_run(
    stage: str,
    params: Mapping[str, Any],
    model: PyfuncModel,
    record: StageRecord | None = None,
    experiment: str | None = None,
) -> tuple[str, str]:
    """One run that logs ``model`` with a signature inferred from its input example and its output, with
    ``params`` (flattened) and ``record``; returns (run id, model URI). The run is FAILED if logging fails.
    The model carries ``pyfunc_checks.py`` in its ``code/``: the checks it runs on itself when it loads.
    ``experiment``: where the run goes (default the shared one; ``registry.names.run_experiment`` names it)."""
    import mlflow
    import numpy as np
    from mlflow.entities import Param
    from mlflow.models import infer_signature

    record = record or StageRecord()
    mlc = client()
    all_tags = _record_tags(stage, record)
    # The params a caller may pass to predict: batch size, and torch or the release's int8 graph.
    signature = infer_signature(
        model.input_example,
        np.asarray(model.example_output, dtype=np.float32),
        params={"batch_size": 64, "backend": "torch"},
    )
    # Not `with mlflow.start_run()`: on an error its exit ends the run with MLflow's full request retries,
    # which against a dead server doubles the wait; _end_active_run gives it one short try instead.
    run = mlflow.start_run(
        experiment_id=experiment_id(mlc, experiment or EXPERIMENT),
        run_name=all_tags["mlflow.runName"],
        tags=all_tags,
    )
    run_id = run.info.run_id
    try:
        for chunk in _chunks([Param(k, v) for k, v in flatten(params).items()], 100):
            mlc.log_batch(run_id, params=chunk)
        _log_record(mlc, run_id, record)
        with no_bytecode():
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(model.model_file),
                code_paths=[str(Path(__file__).with_name("pyfunc_checks.py"))],
                artifacts={k: str(v) for k, v in model.artifacts.items()},
                signature=signature,
                input_example=model.input_example,
                pip_requirements=list(model.pip_requirements),
            )
    except BaseException as error:
        _end_active_run(error)
        raise
    mlflow.end_run("FINISHED")
    return run_id, info.model_uri


@contextmanager
def no_bytecode() -> Iterator[None]:
    """No ``__pycache__`` written meanwhile. MLflow checks the input example by importing the model's code
    where it logged it: in a local artifact store that wrote Python's bytecode into the model itself, which
    then became part of its registered manifest (and a file a later load could be handed)."""
    import sys

    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def _end_active_run(error: BaseException) -> None:
    """``mlflow.end_run("FAILED")``, with one short try after a connection failure. MLflow takes the run off
    its stack before the request, so its own exit hook (``atexit`` ends the active run) does not wait on a
    dead server once more even when this request fails."""
    import mlflow

    from sentcl_mlflow.errors import unreachable

    try:
        if unreachable(error):
            with quick_requests():
                mlflow.end_run("FAILED")
        else:
            mlflow.end_run("FAILED")
    except Exception:  # noqa: BLE001 (the original error is the one worth reporting)
        pass
