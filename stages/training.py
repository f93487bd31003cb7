"""What the training stages share: their config, data, the run itself and its records.

``run_stage`` trains a ``TrainConfig`` built from params.yaml (``sentcl.training.recipes``), writes the model folder, the
curves CSV and the metrics JSON (``sentcl.training.runs``), logs to the tracker and removes the resume state.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sentcl.data.domain import DomainTextError, read_domain_text
from sentcl.training import data as training_data
from sentcl.training import recipes
from sentcl.training import runs as training_runs
from sentcl.training.config import ConfigError, TrainConfig
from sentcl.training.runtime import dist_info
from sentcl_mlflow.runs import StageRecord, log_stage, preflight
from sentcl_mlflow.store import TrackingConfig, bound_requests, tracking_enabled
from stages.common import (
    CHECKPOINTS,
    METRICS,
    MODELS,
    PROCESSED,
    ROOT,
    SEEN,
    fail,
    offline_hub,
    params_arguments,
    params_label,
)

log = logging.getLogger("stages.training")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def load_pairs(processed: Path = PROCESSED) -> pd.DataFrame:
    return pd.read_parquet(Path(processed) / "pairs.parquet")


def load_nli(processed: Path = PROCESSED) -> pd.DataFrame:
    return pd.read_parquet(Path(processed) / "nli.parquet")


def transfer_texts(choice: str, pairs: pd.DataFrame, nli: pd.DataFrame, raw: Path) -> list[str]:
    """``sentcl.training.data.transfer_texts``; an unknown choice or a file without usable text: exit 2."""
    try:
        return training_data.transfer_texts(choice, pairs, nli, raw, log)
    except (training_data.TextChoiceError, DomainTextError) as exc:
        fail(str(exc))


def read_texts(path: Path) -> list[str]:
    """Domain sentences from a text file (one a line) or a folder of them, as the retraining flow reads its inbox
    (``sentcl.data.domain.read_domain_text``: unreadable files skipped with one warning each). Long lines are kept:
    the tokenizer truncates them. No usable text: one line, exit 2."""
    try:
        return read_domain_text(path, warn=log.warning).sentences
    except DomainTextError as exc:
        fail(str(exc))


def stage_config(
    params: dict[str, Any],
    section: str,
    overrides: dict[str, Any] | None = None,
    recipe: str | Sequence[str] | None = None,
    stage_keys: tuple[str, ...] = (),
) -> TrainConfig:
    """``train`` + the stage's section (+ its ``recipe`` subsections in order) + CLI overrides, less the
    ``stage_keys`` the stage reads itself (``sentcl.training.recipes.config_sections``)."""
    return build_config(params, recipes.config_sections(params, section, overrides, recipe, stage_keys))


def build_config(params: dict[str, Any], sections: recipes.Sections) -> TrainConfig:
    """The config of ``sections``; a key that is not a setting, or a value it refuses: one line, exit 2."""
    try:
        return TrainConfig.from_sections(sections)
    except ConfigError as exc:
        fail(f"{params_label(params)}: {exc}")


def stage_parser(description: str) -> argparse.ArgumentParser:
    """The options every training stage takes; the defaults are the pipeline's own paths."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", help="model folder (default: <models-dir>/<stage>)")
    parser.add_argument("--models-dir", default=str(MODELS), help="where base, nli and joint are read from")
    parser.add_argument(
        "--processed", default=str(PROCESSED), help="folder with pairs.parquet and nli.parquet"
    )
    params_arguments(parser)
    parser.add_argument(
        "--metrics-dir",
        help="where curves/ and train/ records go (default: metrics/, or <output>.records/ for an --output "
        "outside the models folder)",
    )
    parser.add_argument(
        "--checkpoints-dir",
        help="where resume state lives (default: checkpoints/, or <output>.records/checkpoints)",
    )
    parser.add_argument("--steps", type=int, help="override the section's steps")
    return parser


def records_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """(records, resume state) folders: metrics/ and checkpoints/, or beside an --output outside the models
    folder (``sentcl.training.runs.records_dirs``)."""
    return training_runs.records_dirs(
        args.output, args.models_dir, args.metrics_dir, args.checkpoints_dir, METRICS, CHECKPOINTS
    )


def seen_file(stage: str, metrics_dir: Path = METRICS) -> Path:
    """Where a stage records the sentences it trained on: ``data/seen/<stage>.txt`` for the pipeline (a DVC
    output: large, so cached rather than in git beside metrics/), else ``<records>/seen/<stage>.txt`` beside
    the run's other records, so a run by hand never overwrites the pipeline's."""
    pipeline = Path(metrics_dir).resolve() == METRICS.resolve()
    return (SEEN if pipeline else Path(metrics_dir) / "seen") / f"{stage}.txt"


def run_stage(
    stage: str,
    config: TrainConfig,
    init: str,
    examples: list[Any],
    dev_pairs: list[tuple[str, str, float]],
    output: Path,
    params: dict[str, Any],
    inputs: list[Path],
    metrics_dir: Path = METRICS,
    checkpoints_dir: Path = CHECKPOINTS,
    domain_dev: list[tuple[str, str, float]] | None = None,
    max_task_drop: float | None = None,
    summary: dict[str, Any] | None = None,
    teacher: Any = None,
) -> dict[str, Any]:
    """Train ``init`` on ``examples``, write ``output`` and the stage's records; return its final metrics.

    With ``domain_dev``, checkpoint selection uses it and STS-B dev may not fall more than ``max_task_drop``
    below the init (``sentcl.training.selection.selectable``). ``summary``: counts about the input (e.g.
    truncated lines) that join the metrics. ``teacher``: the teacher's stored vectors, for objective distill."""
    offline_hub()
    if config.steps == 0:  # not trained on this profile: the init is the output, and no sentence was seen
        training_data.write_seen(seen_file(stage, Path(metrics_dir)), [])
        return training_runs.write_untrained(log, stage, init, output, Path(metrics_dir), ROOT)
    training_runs.init_distributed()
    rank, _ = dist_info()
    if rank == 0 and tracking_enabled():
        bound_requests(TrackingConfig.from_params(params))  # its MLflow requests (params tracking:)
        preflight()  # an unreachable tracking server fails the stage now, not after the training
    log.info("%s: %s from %s on %d examples", stage, config.mode, init, len(examples))
    summary = {**(summary or {}), "trained": training_runs.training_facts(config, teacher)}
    checkpoints = Path(checkpoints_dir) / stage
    try:
        encoder, trainer, result, metrics = training_runs.fit(
            config, init, examples, dev_pairs, checkpoints, ROOT, domain_dev, max_task_drop, summary, teacher
        )
    except ConfigError as exc:  # a setting the model itself refuses (train.freeze naming none of its layers)
        fail(f"{params_label(params)}: {stage}: {exc}")
    if rank == 0:
        # What the evaluate stage splits the test pairs by (seen / unseen / mixed): never inside the model folder.
        sentences = training_data.example_sentences(examples)
        seen = training_data.write_seen(seen_file(stage, Path(metrics_dir)), sentences)
        log.info("%s: the %d sentences it trained on -> %s", stage, len(sentences), seen)
        records = (log, stage, encoder, output, result, metrics, Path(metrics_dir), max_task_drop)
        curves, numeric = training_runs.write_run(*records)
        # The weights stay in DVC's cache; the registry gets the exported model, not every stage's folder.
        record = StageRecord(numeric, curves, inputs)
        log_stage(stage, training_runs.tracked_params(params, config), record, params=params)
        trainer.finish()
    training_runs.leave_distributed()
    return metrics
