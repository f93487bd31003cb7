"""What a training stage's run needs around ``sentcl.training.trainer``: the process group, the config's
sections, and the records it leaves (model folder, curves CSV, metrics JSON)."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from sentcl.model.encoder import Encoder
from sentcl.training.config import TrainConfig
from sentcl.training.selection import TrainResult
from sentcl.training.trainer import Trainer


def init_distributed() -> None:
    """Join the ``torchrun`` process group when there is one (NCCL on GPUs, gloo on CPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group(backend)


def leave_distributed() -> None:
    """Wait for every rank, then leave the process group (a no-op outside ``torchrun``)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def fit(
    config: TrainConfig,
    init: str,
    examples: list[Any],
    dev_pairs: list[tuple[str, str, float]],
    checkpoints: Path,
    root: Path,
    domain_dev: list[tuple[str, str, float]] | None = None,
    max_task_drop: float | None = None,
    summary: dict[str, Any] | None = None,
    teacher: Any = None,
) -> tuple[Encoder, Trainer, TrainResult, dict[str, Any]]:
    """Train ``init`` on ``examples`` (resume state in ``checkpoints``); the encoder, the trainer, its result and
    the run's final metrics (``run_metrics``)."""
    encoder = Encoder.from_pretrained(init, max_length=config.max_length)
    trainer = Trainer(
        encoder,
        config,
        examples,
        dev_pairs,
        checkpoints,
        domain_dev=domain_dev,
        max_task_drop=max_task_drop,
        teacher=teacher,
    )
    result = trainer.fit()
    metrics = run_metrics(result, init, root, len(examples), trainer.autocast, summary)
    return encoder, trainer, result, metrics


def tracked_params(params: dict[str, Any], config: TrainConfig) -> dict[str, Any]:
    """What the tracker records as a training run's params: ``seed``, ``model`` and the whole config (``views``
    a list, as YAML and JSON hold it)."""
    values = asdict(config)
    values["views"] = list(values["views"])
    return {"seed": params["seed"], "model": params["model"], "train": values}


def run_metrics(
    result: TrainResult,
    init: str,
    root: Path,
    examples: int,
    autocast: bool,
    summary: dict[str, Any] | None,
) -> dict[str, Any]:
    """A run's final metrics, with what trained it: the init (relative to ``root``), the number of examples, the
    arithmetic, and ``summary``'s counts about the input."""
    # precision: which arithmetic trained it (bf16 on CPUs with native bf16, fp32 elsewhere; sentcl.training.precision),
    # so a score that differs between machines in the second decimal says why.
    return {
        **result.metrics(),
        "init": repo_label(init, root),
        "examples": examples,
        "precision": "bf16" if autocast else "fp32",
        **(summary or {}),
    }


def write_untrained(
    log: logging.Logger, stage: str, init: str, output: Path, metrics_dir: Path, root: Path
) -> dict[str, Any]:
    """A stage whose params give it 0 steps: its output is its init, saved as a trained folder would be, and its
    records say it was not trained (the report says so); nothing is tracked. Returns its metrics."""
    encoder = Encoder.from_pretrained(init)
    save_encoder(encoder, output)
    metrics = {
        "steps": 0,
        "best_step": 0,
        "beat_init": False,
        "init": repo_label(init, root),
        "examples": 0,
        "trained": None,
        "not_trained": "steps 0 on this profile (params.yaml); profiles/paper.yaml trains ConSERT's recipe",
    }
    write_records(stage, [], metrics, metrics_dir)
    log.info("%s: not trained (steps 0 in params.yaml): output = init %s -> %s", stage, init, output)
    return metrics


def training_facts(config: TrainConfig, teacher: Any = None) -> dict[str, Any]:
    """What a run trained with, for its record and the model card: the objective and its main settings, and for
    distillation the teacher it learned from (name, licence, weights sha256, as the teacher stage recorded)."""
    facts: dict[str, Any] = {
        "mode": config.mode,
        "objective": config.objective,
        "steps": config.steps,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "freeze": list(config.freeze),
    }
    if config.objective == "distill":
        d = config.distill
        facts["distill"] = {
            "loss": d.loss,
            "examples": d.examples,
            "neighbours": d.neighbours,
            "group_weight": d.group_weight,
            "keep_hardest": d.keep_hardest,
        }
        meta = getattr(teacher, "meta", None) or {}
        facts["teacher"] = {k: meta.get(k) for k in ("model", "source", "licence", "weights_sha256")}
    elif config.mode != "nli" or config.objective != "ce":
        facts["views"] = list(config.views)
    return facts


def repo_label(path: str, root: Path) -> str:
    """``path`` relative to ``root`` when inside it: a git-tracked record must not name one machine's paths."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else path


def save_encoder(encoder: Encoder, output: Path) -> None:
    """Save beside ``output`` and swap it in, so a crash while saving never leaves half a model folder."""
    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder.cpu().save(tmp)
    shutil.rmtree(output, ignore_errors=True)
    tmp.rename(output)


def write_curves(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        domain = any(row.get("domain_dev") is not None for row in rows)
        writer = csv.DictWriter(f, fieldnames=["step", "loss", "lr", "stsb_dev"] + ["domain_dev"] * domain)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in writer.fieldnames})


def write_metrics(metrics: dict[str, Any], path: Path) -> None:
    """A DVC metric: scores to 2 decimals of Spearman x 100, no wall time (seconds: the log line and MLflow)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {k: round(v, 2) if isinstance(v, float) else v for k, v in metrics.items() if k != "seconds"}
    path.write_text(json.dumps(record, indent=2) + "\n")


def write_records(stage: str, rows: list[dict[str, Any]], metrics: dict[str, Any], metrics_dir: Path) -> Path:
    """``<metrics_dir>/curves/<stage>.csv`` and ``<metrics_dir>/train/<stage>.json``; returns the curves file."""
    curves = metrics_dir / "curves" / f"{stage}.csv"
    write_curves(rows, curves)
    write_metrics(metrics, metrics_dir / "train" / f"{stage}.json")
    return curves


def log_result(
    log: logging.Logger,
    stage: str,
    output: Path,
    metrics_dir: Path,
    result: TrainResult,
    max_task_drop: float | None,
) -> None:
    """Where the run's records went and what it selected, on the stage's own logger."""
    metrics_path, curves = metrics_dir / "train" / f"{stage}.json", metrics_dir / "curves" / f"{stage}.csv"
    log.info("%s: model -> %s; records -> %s, %s", stage, output, metrics_path, curves)
    verdict = f"best at step {result.best_step}" if result.beat_init else "never beat its init: output = init"
    log.info(
        "%s: STS-B dev %.2f at step 0, %.2f selected (%s), %d steps, %.0f s",
        *(stage, result.init_score, result.best_score, verdict, result.steps, result.seconds),
    )
    if result.domain_init is not None:
        log.info(
            "%s: selected on the domain dev set: %.2f at step 0, %.2f selected (STS-B guard: -%s)",
            *(stage, result.domain_init, result.domain_best, max_task_drop),
        )


def write_run(
    log: logging.Logger,
    stage: str,
    encoder: Encoder,
    output: Path,
    result: TrainResult,
    metrics: dict[str, Any],
    metrics_dir: Path,
    max_task_drop: float | None,
) -> tuple[Path, dict[str, float]]:
    """A finished run's outputs: the model folder, the curves and metrics records, the log lines; returns the
    curves file and the numeric metrics (what the tracker records)."""
    save_encoder(encoder, output)
    curves = write_records(stage, result.rows, metrics, metrics_dir)
    log_result(log, stage, output, metrics_dir, result, max_task_drop)
    return curves, {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def records_dirs(
    output: str | None,
    models_dir: str,
    metrics_dir: str | None,
    checkpoints_dir: str | None,
    pipeline_metrics: Path,
    pipeline_checkpoints: Path,
) -> tuple[Path, Path]:
    """Where a run's records (curves, metrics) and resume state go: the pipeline's folders, unless ``output``
    is outside ``models_dir`` and no ``metrics_dir``/``checkpoints_dir`` is given: then beside the output, in
    ``<output>.records/``, so a run by hand never overwrites the pipeline's git-tracked records (or resumes
    from its state)."""
    outside = output and not Path(output).resolve().is_relative_to(Path(models_dir).resolve())
    beside = Path(output).with_name(Path(output).name + ".records") if outside else None
    metrics = Path(metrics_dir) if metrics_dir else (beside or pipeline_metrics)
    checkpoints = (
        Path(checkpoints_dir)
        if checkpoints_dir
        else (beside / "checkpoints" if beside else pipeline_checkpoints)
    )
    return metrics, checkpoints
