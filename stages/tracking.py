"""MLflow tracking, registry and the promotion gate: the one module that talks to MLflow.

Used by the stages and the flows alike; sentcl never imports it. MLflow is imported lazily so that a stage
that only reads the helpers (``tracking_uri``, ``flatten``) does not pay for it.

Where runs go: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<repo root>/mlflow.db`` with artifacts in
``<repo root>/mlartifacts``. The root comes from DVC (``DVC_ROOT`` names the parent repository for queued and
``--temp`` experiments) or git, so every copy of the workspace writes to the one store.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from mlflow import MlflowClient

# One run per stage: a Hugging Face Trainer, if a stage ever uses one, would otherwise open a second run.
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")

EXPERIMENT = os.environ.get("SENTCL_MLFLOW_EXPERIMENT", "sentcl")
# A reachability probe of a tracking server: attempts x timeout bounds how long a stage waits for it.
CONNECT_ATTEMPTS = int(os.environ.get("SENTCL_MLFLOW_CONNECT_ATTEMPTS", "3"))
CONNECT_TIMEOUT_S = float(os.environ.get("SENTCL_MLFLOW_CONNECT_TIMEOUT_S", "3"))


class TrackingUnavailableError(RuntimeError):
    """The tracking server did not answer after bounded retries; nothing was logged or registered."""


# --------------------------------------------------------------------------------------------- where


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def _outside_dvc_tmp(path: Path) -> Path:
    """A DVC temp/queued experiment runs in ``<repo>/.dvc/tmp/exps/<tmpdir>``, a git repo of its own."""
    parts = path.parts
    for i in range(len(parts) - 3):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return path


def repo_root(start: Path | None = None) -> Path:
    """The repository whose ``mlflow.db`` this process should write to."""
    if os.environ.get("DVC_ROOT"):
        return _outside_dvc_tmp(Path(os.environ["DVC_ROOT"]).resolve())
    start = start or Path.cwd()
    # --git-common-dir, not --show-toplevel: a linked worktree shares the main checkout's store.
    common = _git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=start)
    if common:
        return _outside_dvc_tmp(Path(common).parent.resolve())
    from stages.common import ROOT

    return _outside_dvc_tmp(ROOT)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def artifact_root() -> Path:
    return repo_root() / "mlartifacts"


def tracking_enabled() -> bool:
    """``SENTCL_MLFLOW=0`` switches tracking off, for unit tests of stages that do not test tracking."""
    return os.environ.get("SENTCL_MLFLOW", "1").lower() not in ("0", "false", "off", "no")


def _probe_http(uri: str) -> None:
    url = uri.rstrip("/") + "/health"
    last: Exception | None = None
    for attempt in range(CONNECT_ATTEMPTS):
        try:
            with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S) as response:
                if response.status < 500:
                    return
        except urllib.error.HTTPError as e:  # a server that answers at all, even 404 behind a proxy, is up
            if e.code < 500:
                return
            last = e
        except (OSError, urllib.error.URLError) as e:
            last = e
        if attempt + 1 < CONNECT_ATTEMPTS:
            time.sleep(min(2**attempt, 4))
    raise TrackingUnavailableError(
        f"MLflow tracking server {uri} is unreachable after {CONNECT_ATTEMPTS} attempts "
        f"({CONNECT_TIMEOUT_S:g}s timeout each): {last}. Start it, fix MLFLOW_TRACKING_URI, or unset it to "
        f"use the local store sqlite:///<repo>/mlflow.db. Nothing was logged or registered."
    )


_configured: str | None = None


def client() -> MlflowClient:
    """An MlflowClient on the resolved store, after a bounded reachability check of a remote server."""
    global _configured
    uri = tracking_uri()
    if _configured != uri:
        # MLflow's own HTTP retries default to minutes (7 retries, factor 2, 120 s timeout); keep a dead
        # server from stalling a stage, while still riding out a short blip.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        if uri.startswith(("http://", "https://")):
            _probe_http(uri)
        elif uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        import mlflow

        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        _configured = uri
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def preflight() -> None:
    """Call at the start of a long stage: an unreachable tracking server then fails it before the work, not
    after it (``log_stage`` at the end would raise the same error)."""
    if tracking_enabled():
        client()


def experiment_id(mlc: MlflowClient, name: str = EXPERIMENT) -> str:
    exp = mlc.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        # Beside the database, not in ./mlruns of whatever folder the stage happened to run in.
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    try:
        return mlc.create_experiment(name, artifact_location=location)
    except Exception:  # another stage created it meanwhile
        exp = mlc.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# --------------------------------------------------------------------------------------------- what


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


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD", cwd=repo_root())


def git_dirty() -> bool:
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=repo_root())
    return bool(status)


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
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
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
    return tags


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def log_stage(
    stage: str,
    params: dict[str, Any],
    metrics: dict[str, float] | None = None,
    curves_csv: Path | None = None,
    inputs: list[Path] | None = None,
    artifacts: list[Path] | None = None,
    tags: dict[str, str] | None = None,
) -> str | None:
    """Log one finished stage as one MLflow run and return its run id.

    ``params`` is flattened; ``curves_csv`` (columns step, loss, lr, stsb_dev, ...) becomes metrics by step
    named ``train/<column>``;
    ``inputs`` are data paths whose DVC hashes are recorded; ``artifacts`` are uploaded files or folders.
    Returns None when tracking is switched off (``SENTCL_MLFLOW=0``). Raises :class:`TrackingUnavailableError`
    after bounded retries when a tracking server does not answer.
    """
    if not tracking_enabled():
        return None
    from mlflow.entities import Metric, Param

    mlc = client()
    # Every run carries the whole params.yaml, so runs of different stages compare on the same keys; the
    # stage's own (resolved) values win where they overlap.
    try:
        flat_params = flatten(load_params_file())
    except (OSError, ValueError):
        flat_params = {}
    flat_params.update(flatten(params))
    all_tags = run_tags(stage)
    for path, digest in dvc_hashes(list(inputs or [])).items():
        all_tags[f"dvc.{path}"] = digest
    all_tags.update({k: str(v) for k, v in (tags or {}).items()})

    now = int(time.time() * 1000)
    series = [Metric(metric_key(k), float(v), now, 0) for k, v in (metrics or {}).items() if _finite(v)]
    if curves_csv and Path(curves_csv).exists():
        series += [Metric(k, v, now, step) for k, v, step in _read_curves(Path(curves_csv))]

    run = mlc.create_run(experiment_id(mlc), run_name=all_tags["mlflow.runName"], tags=all_tags)
    run_id = run.info.run_id
    try:
        for chunk in _chunks([Param(k, v) for k, v in flat_params.items()], 100):
            mlc.log_batch(run_id, params=chunk)
        for chunk in _chunks(series, 1000):
            mlc.log_batch(run_id, metrics=chunk)
        for path in artifacts or []:
            path = Path(path)
            if path.is_dir():
                mlc.log_artifacts(run_id, str(path), artifact_path=path.name)
            elif path.exists():
                mlc.log_artifact(run_id, str(path))
    except Exception:
        _terminate(mlc, run_id, "FAILED")
        raise
    mlc.set_terminated(run_id, "FINISHED")
    return run_id


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _terminate(mlc: MlflowClient, run_id: str, status: str) -> None:
    try:
        mlc.set_terminated(run_id, status)
    except Exception:  # the original error is the one worth reporting
        pass


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
    except BaseException:
        _terminate(mlc, run_id, "FAILED")
        raise
    mlc.set_terminated(run_id, "FINISHED")


def log_pyfunc_run(
    stage: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    model_file: Path,
    artifacts: dict[str, Path],
    input_example: list[str],
    example_output: Any,
    pip_requirements: list[str],
    inputs: list[Path] | None = None,
    tags: dict[str, str] | None = None,
) -> tuple[str, str]:
    """One run that logs a "models from code" pyfunc (``model_file``) with a signature inferred from the input
    example and its output; returns (run id, model URI). The run is FAILED if logging the model fails."""
    import mlflow
    import numpy as np
    from mlflow.entities import Metric, Param
    from mlflow.models import infer_signature

    mlc = client()
    all_tags = run_tags(stage)
    all_tags.update({f"dvc.{k}": v for k, v in dvc_hashes(list(inputs or [])).items()})
    all_tags.update({k: str(v) for k, v in (tags or {}).items()})
    signature = infer_signature(input_example, np.asarray(example_output, dtype=np.float32))
    with mlflow.start_run(
        experiment_id=experiment_id(mlc), run_name=all_tags["mlflow.runName"], tags=all_tags
    ) as run:
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        for chunk in _chunks([Param(k, v) for k, v in flatten(params).items()], 100):
            mlc.log_batch(run_id, params=chunk)
        series = [Metric(metric_key(k), float(v), now, 0) for k, v in metrics.items() if _finite(v)]
        for chunk in _chunks(series, 1000):
            mlc.log_batch(run_id, metrics=chunk)
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(model_file),
            artifacts={k: str(v) for k, v in artifacts.items()},
            signature=signature,
            input_example=input_example,
            pip_requirements=pip_requirements,
        )
    return run_id, info.model_uri


# --------------------------------------------------------------------------------------------- registry

CHALLENGER, CHAMPION = "challenger", "champion"
# Tags on a model version that the gate reads: its scores, as registered.
TAG_STSB_DEV, TAG_STS, TAG_DOMAIN = "stsb_dev", "sts_all", "domain_spearman"


def registry_params(params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if params is None:
        from stages.common import load_params

        params = load_params()
    section = dict(params.get("registry") or {})
    section.setdefault("model_name", "sentcl-encoder")
    section.setdefault("min_delta", 0.5)
    section.setdefault("max_task_drop", 1.0)
    section.setdefault("min_domain_delta", section["min_delta"])
    for key in ("min_delta", "max_task_drop", "min_domain_delta"):
        section[key] = float(section[key])
        if section[key] < 0:
            raise ValueError(f"registry.{key} must be >= 0 (a negative margin could promote a worse model)")
    return section


def promotion_lock_path() -> Path:
    """The file lock that serialises promotions: beside the sqlite store, else in the repository."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///") + ".promote.lock")
    return repo_root() / ".mlflow-promote.lock"


@contextmanager
def promotion_lock(timeout_s: float = 600) -> Iterator[None]:
    """MLflow has no compare-and-set on aliases: one promotion at a time per store (and per machine for a
    remote store; the flows add a Prefect global concurrency limit, which spans machines)."""
    from filelock import FileLock

    path = promotion_lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path), timeout=timeout_s):
        yield


def _version_or_none(mlc: MlflowClient, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return mlc.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def version_scores(version) -> tuple[float | None, dict[str, float], float | None]:
    tags = version.tags or {}
    stsb = float(tags[TAG_STSB_DEV]) if TAG_STSB_DEV in tags else None
    table = json.loads(tags.get(TAG_STS) or "{}")
    domain = float(tags[TAG_DOMAIN]) if tags.get(TAG_DOMAIN) not in (None, "") else None
    return stsb, {k: float(v) for k, v in table.items()}, domain


def register_candidate(
    model_uri: str,
    stsb_dev: float,
    sts_all: Mapping[str, float],
    name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    run_id: str | None = None,
) -> str:
    """Register ``model_uri`` as a new version with its scores as tags, then point ``challenger`` at it.

    A version is created with all its tags in one call; if anything after that fails, the version is deleted
    again so that no half-registered version (without scores or alias) is left for the gate to trip on.
    """
    import mlflow

    mlc = client()
    name = name or registry_params()["model_name"]
    all_tags = {
        TAG_STSB_DEV: f"{float(stsb_dev):.6f}",
        TAG_STS: json.dumps({k: round(float(v), 6) for k, v in sts_all.items()}, sort_keys=True),
        **{k: str(v) for k, v in (tags or {}).items()},
    }
    commit = git_commit()
    if commit:
        all_tags.setdefault("git_commit", commit)
    if model_uri.startswith(("runs:/", "models:/")):
        version = mlflow.register_model(model_uri, name, tags=all_tags).version
    else:  # an artifact location of a run (the server wants the run that holds it)
        from mlflow.exceptions import MlflowException

        try:
            mlc.create_registered_model(name)
        except MlflowException:  # exists already
            pass
        version = mlc.create_model_version(name, model_uri, run_id=run_id, tags=all_tags).version
    try:
        mlc.set_registered_model_alias(name, CHALLENGER, version)
        if run_id:
            mlc.set_tag(run_id, "registered_version", f"{name}/{version}")
    except BaseException:
        try:
            mlc.delete_model_version(name, version)
        except Exception:
            pass
        raise
    return str(version)


def gate_decision(
    challenger: tuple[float | None, dict[str, float], float | None],
    champion: tuple[float | None, dict[str, float], float | None] | None,
    min_delta: float,
    max_task_drop: float,
    min_domain_delta: float | None = None,
) -> tuple[bool, list[str]]:
    """Pure rule: (promote?, reasons). Scores are Spearman x 100.

    - no champion yet: promote (the first model ever registered);
    - STS-B dev must beat the champion's by ``min_delta`` -- or, when both carry a domain score, the domain
      Spearman must beat the champion's by ``min_domain_delta`` while STS-B dev does not fall by more than
      ``max_task_drop``;
    - no STS task (and no domain score) may drop by more than ``max_task_drop``.
    """
    c_stsb, c_table, c_domain = challenger
    if c_stsb is None:
        return False, ["challenger has no stsb_dev score"]
    if champion is None:
        return True, [f"no champion yet: the first model becomes champion (stsb_dev {c_stsb:.2f})"]
    k_stsb, k_table, k_domain = champion
    if k_stsb is None:
        return True, ["champion has no stsb_dev score recorded; any scored challenger replaces it"]
    reasons: list[str] = []
    delta = c_stsb - k_stsb
    stsb_ok = delta >= min_delta
    reasons.append(
        f"stsb_dev {c_stsb:.2f} vs champion {k_stsb:.2f}: delta {delta:+.2f} "
        f"{'>=' if stsb_ok else '<'} min_delta {min_delta:.2f}"
    )
    gain_ok = stsb_ok
    if c_domain is not None and k_domain is not None and min_domain_delta is not None:
        d_delta = c_domain - k_domain
        domain_ok = d_delta >= min_domain_delta
        reasons.append(
            f"domain spearman {c_domain:.2f} vs champion {k_domain:.2f}: delta {d_delta:+.2f} "
            f"{'>=' if domain_ok else '<'} min_domain_delta {min_domain_delta:.2f}"
        )
        if -d_delta > max_task_drop:
            reasons.append(f"domain spearman drops {-d_delta:.2f} > max_task_drop {max_task_drop:.2f}")
            return False, reasons
        if domain_ok and not stsb_ok:
            if -delta > max_task_drop:
                reasons.append(f"stsb_dev drops {-delta:.2f} > max_task_drop {max_task_drop:.2f}")
                return False, reasons
            reasons.append("domain gain accepted: general STS holds within max_task_drop")
            gain_ok = True
    drops = {
        task: k_table[task] - c_table[task]
        for task in sorted(set(c_table) & set(k_table))
        if task != "avg" and k_table[task] - c_table[task] > max_task_drop
    }
    for task, drop in drops.items():
        reasons.append(f"{task} drops {drop:.2f} > max_task_drop {max_task_drop:.2f}")
    if not drops:
        reasons.append(f"no STS task drops more than {max_task_drop:.2f}")
    return gain_ok and not drops, reasons


def promote(
    name: str | None = None,
    version: str | None = None,
    actor: str | None = None,
    params: Mapping[str, Any] | None = None,
    domain: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the gate on ``version`` (default: the ``challenger`` alias) against ``champion``; print and tag.

    The champion is read after the lock is taken, so two gates cannot both promote against a stale champion.
    ``domain`` = ``{"challenger": x, "champion": y, "champion_version": v}``: both models scored on the same
    domain dev set; it only counts while ``v`` is still the champion.
    """
    import getpass

    settings = registry_params(params)
    name = name or settings["model_name"]
    actor = actor or os.environ.get("SENTCL_ACTOR") or getpass.getuser()
    mlc = client()
    started = time.time()
    with promotion_lock():
        cand = mlc.get_model_version(name, version) if version else _version_or_none(mlc, name, CHALLENGER)
        if cand is None:
            raise LookupError(f"no {CHALLENGER!r} version of {name!r} to gate; run the export stage first")
        champ = _version_or_none(mlc, name, CHAMPION)
        if champ is not None and champ.version == cand.version:
            promoted, reasons = False, [f"version {cand.version} is already champion"]
        else:
            cand_scores = version_scores(cand)
            champ_scores = version_scores(champ) if champ is not None else None
            stale = False
            if domain is not None and champ is not None:
                if str(domain.get("champion_version")) == str(champ.version):
                    cand_scores = (cand_scores[0], cand_scores[1], float(domain["challenger"]))
                    champ_scores = (champ_scores[0], champ_scores[1], float(domain["champion"]))
                else:
                    stale = True
            elif champ_scores is not None:  # domain scores from different dev sets are not comparable
                cand_scores, champ_scores = cand_scores[:2] + (None,), champ_scores[:2] + (None,)
            if stale:
                promoted, reasons = (
                    False,
                    [
                        f"champion changed to version {champ.version} since the domain scores were computed "
                        f"against version {domain.get('champion_version')}; re-run the retrain"
                    ],
                )
            else:
                promoted, reasons = gate_decision(
                    cand_scores,
                    champ_scores,
                    settings["min_delta"],
                    settings["max_task_drop"],
                    settings["min_domain_delta"],
                )
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        decision = "promoted" if promoted else "rejected"
        gate_tags = {
            "gate.decision": decision,
            "gate.reasons": "; ".join(reasons),
            "gate.champion_before": champ.version if champ is not None else "",
            "gate.min_delta": str(settings["min_delta"]),
            "gate.max_task_drop": str(settings["max_task_drop"]),
            "gate.at": stamp,
            "gate.by": actor,
        }
        for key, value in gate_tags.items():
            mlc.set_model_version_tag(name, cand.version, key, value)
        if promoted:
            if champ is not None:
                mlc.set_model_version_tag(name, cand.version, "previous_champion", champ.version)
            mlc.set_registered_model_alias(name, CHAMPION, cand.version)
    result = {
        "model": name,
        "version": str(cand.version),
        "decision": decision,
        "promoted": promoted,
        "champion_before": str(champ.version) if champ is not None else None,
        "champion_after": str(cand.version)
        if promoted
        else (str(champ.version) if champ is not None else None),
        "reasons": reasons,
        "seconds": round(time.time() - started, 2),
    }
    print(format_decision(result))
    return result


def format_decision(result: Mapping[str, Any]) -> str:
    lines = [
        f"gate: {result['model']} version {result['version']} {result['decision'].upper()}"
        f" (champion {result['champion_before'] or '-'} -> {result['champion_after'] or '-'})"
    ]
    lines += [f"  - {reason}" for reason in result["reasons"]]
    return "\n".join(lines)


def rollback(
    name: str | None = None, actor: str | None = None, reason: str = "manual rollback"
) -> dict[str, Any]:
    """Give ``champion`` back to the version it replaced; the demoted and restored versions say who and why."""
    import getpass

    name = name or registry_params()["model_name"]
    actor = actor or os.environ.get("SENTCL_ACTOR") or getpass.getuser()
    mlc = client()
    with promotion_lock():
        champ = _version_or_none(mlc, name, CHAMPION)
        if champ is None:
            raise LookupError(f"{name!r} has no champion to roll back")
        previous = (champ.tags or {}).get("previous_champion")
        if not previous:
            raise LookupError(f"champion version {champ.version} has no previous champion to roll back to")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        mlc.set_registered_model_alias(name, CHAMPION, previous)
        for key, value in {
            "rolled_back_by": actor,
            "rolled_back_reason": reason,
            "rolled_back_at": stamp,
        }.items():
            mlc.set_model_version_tag(name, champ.version, key, value)
        for key, value in {"restored_by": actor, "restored_reason": reason, "restored_at": stamp}.items():
            mlc.set_model_version_tag(name, previous, key, value)
    print(f"rollback: {name} champion {champ.version} -> {previous} by {actor}: {reason}")
    return {"model": name, "from": champ.version, "to": previous, "by": actor, "reason": reason}


def alias_version(alias: str, name: str | None = None) -> str | None:
    mlc = client()
    version = _version_or_none(mlc, name or registry_params()["model_name"], alias)
    return version.version if version is not None else None


def download_alias(alias: str, dest: Path, name: str | None = None) -> Path:
    """The sentence-transformers folder inside the version that ``alias`` points at, downloaded to ``dest``."""
    name = name or registry_params()["model_name"]
    return download_model(f"models:/{name}@{alias}", dest)


def download_model(model_uri: str, dest: Path) -> Path:
    """The sentence-transformers folder inside a logged model (``models:/...``, ``runs:/...``)."""
    import mlflow

    client()
    dest.mkdir(parents=True, exist_ok=True)
    return st_folder_in(Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(dest))))


def st_folder_in(model_dir: Path) -> Path:
    """Find the sentence-transformers folder (the one with modules.json) inside a logged pyfunc model."""
    if (model_dir / "modules.json").exists():
        return model_dir
    for candidate in sorted(model_dir.rglob("modules.json")):
        return candidate.parent
    raise FileNotFoundError(f"no sentence-transformers folder (modules.json) under {model_dir}")


def load_params_file() -> dict[str, Any]:
    from stages.common import load_params

    return load_params()


if __name__ == "__main__":  # `python -m stages.tracking` prints where runs go
    print(tracking_uri())
