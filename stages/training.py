"""What the training stages share: their config, data, the run itself and its records.

``run_stage`` builds a ``TrainConfig`` from params.yaml (``seed``, ``model.max_length``, the ``train`` section,
then the stage's own section, then CLI overrides), trains, writes the model folder, the curves CSV and the
metrics JSON, logs to the tracker and removes the resume state.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import torch

from sentcl.domain import DomainTextError, read_domain_text
from sentcl.encoder import Encoder
from sentcl.losses import NLI_LABEL_IDS
from sentcl.senteval import consert_corpus
from sentcl.texts import heldout_texts, inductive_texts
from sentcl.train import ConfigError, TrainConfig, Trainer, dist_info
from sentcl_mlflow.runs import log_stage, preflight
from stages.common import CHECKPOINTS, METRICS, MODELS, PROCESSED, ROOT, offline_hub, params_label

log = logging.getLogger("stages.training")

# Target text of the transfer stage by default (ConSERT's protocol): the seven STS test sets.
STS_TEST_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSb", "SICK-R")
INIT_NAMES = ("base", "nli", "joint")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def init_distributed() -> None:
    """Join the ``torchrun`` process group when there is one (NCCL on GPUs, gloo on CPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group(backend)


def load_pairs(processed: Path = PROCESSED) -> pd.DataFrame:
    return pd.read_parquet(Path(processed) / "pairs.parquet")


def load_nli(processed: Path = PROCESSED) -> pd.DataFrame:
    return pd.read_parquet(Path(processed) / "nli.parquet")


def stsb_dev(pairs: pd.DataFrame) -> list[tuple[str, str, float]]:
    dev = pairs[(pairs.task == "STSb") & (pairs.split == "dev")]
    return list(zip(dev.sentence1, dev.sentence2, dev.score.astype(float), strict=True))


def sts_test_sentences(pairs: pd.DataFrame) -> list[str]:
    """The unique sentences of STS12-16 and the STS-B and SICK-R test splits, sorted (a stable order)."""
    test = pairs[pairs.task.isin(STS_TEST_TASKS) & (pairs.split == "test")]
    return sorted(set(test.sentence1) | set(test.sentence2))


def _sentences(frame: pd.DataFrame) -> set[str]:
    return set(frame.sentence1) | set(frame.sentence2)


# transfer.texts: which unlabeled text the transfer stage trains on (README "Target text").
TEXT_CHOICES = ("heldout", "consert", "inductive")


def transfer_texts(
    choice: str, pairs: pd.DataFrame, nli: pd.DataFrame, raw: Path, tokenizer: Any, max_length: int
) -> list[str]:
    """``heldout``: the seven test sets' unique sentences without any sentence token-identical to a sentence of a
    dev split (STS-B dev, which selects checkpoints; SICK-R trial, which the promotion gate reads), so selection
    is independent of training. ``consert``: ConSERT's corpus (all
    STS/SICK lines, dev included). ``inductive``: STS-B train, SICK train and the NLI sentences, without any
    sentence token-identical to a sentence of a dev or test split. "Token-identical": the same ids under the
    model's ``tokenizer`` cut at ``max_length`` (``sentcl.texts``). Anything else is a ``.txt`` file or a folder
    of them."""
    if choice == "heldout":
        dev = _sentences(pairs[pairs.split == "dev"])
        selection = heldout_texts(sts_test_sentences(pairs), dev, tokenizer, max_length)
    elif choice == "inductive":
        evaluated = _sentences(pairs[pairs.split != "train"])
        train = _sentences(pairs[pairs.task.isin(("STSb", "SICK-R")) & (pairs.split == "train")])
        train |= set(nli.premise) | set(nli.hypothesis)
        selection = inductive_texts(train, evaluated, tokenizer, max_length)
    elif choice == "consert":
        return consert_corpus(raw)
    elif not Path(choice).exists():
        fail(f"transfer.texts: {choice!r} is neither one of {', '.join(TEXT_CHOICES)} nor a file or folder")
    else:
        return read_texts(Path(choice))
    log.info(
        "transfer.texts %s: %d of %d sentences kept, %d dropped as token-identical to an evaluated sentence",
        choice,
        len(selection.texts),
        selection.candidates,
        selection.dropped,
    )
    return selection.texts


def read_texts(path: Path) -> list[str]:
    """Domain sentences from a text file (one a line) or a folder of them, read as the retraining flow reads its
    inbox (``sentcl.domain.read_domain_text``: hidden, unfinished and non-UTF-8 files skipped with one warning
    line each; whitespace collapsed; repeats dropped). Long lines are kept: the tokenizer truncates them
    (``count_truncated`` counts them for the run's summary). No usable text: one line, exit 2."""
    try:
        return read_domain_text(path, warn=log.warning).sentences
    except DomainTextError as exc:
        fail(str(exc))


def count_truncated(texts: list[str], tokenizer: Any, max_length: int) -> int:
    """How many sentences are longer than ``max_length`` tokens (special tokens included): the tokenizer cuts
    them there, as every anchor does (SentenceTransformer's ``max_seq_length``, ConSERT's ``max_seq_length``)."""
    lengths = tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    return sum(len(ids) > max_length for ids in lengths)


def limit_texts(texts: list[str], max_texts: int | str | None, seed: int) -> list[str]:
    """Few-shot: a seeded sample of ``max_texts`` sentences (``all`` or None keeps every one)."""
    if max_texts in (None, "all") or int(max_texts) >= len(texts):
        return texts
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[i] for i in sorted(order[: int(max_texts)])]


def nli_pairs(nli: pd.DataFrame) -> list[tuple[str, str, int]]:
    return [
        (p, h, NLI_LABEL_IDS[lab]) for p, h, lab in zip(nli.premise, nli.hypothesis, nli.label, strict=True)
    ]


def nli_triplets(nli: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(premise, entailment hypothesis, contradiction hypothesis) for supervised SimCSE, matched in file order."""
    triplets = []
    for premise, group in nli.groupby("premise", sort=True):
        entailed = group[group.label == "entailment"].hypothesis.tolist()
        contradicted = group[group.label == "contradiction"].hypothesis.tolist()
        triplets.extend((premise, e, c) for e, c in zip(entailed, contradicted, strict=False))
    return triplets


def resolve_init(init: str, models_dir: Path = MODELS) -> str:
    """``base``/``nli``/``joint`` name the pipeline's own checkpoints; anything else is a model folder or id."""
    if init in INIT_NAMES:
        return str(Path(models_dir) / init)
    return init


def stage_config(
    params: dict[str, Any],
    section: str,
    overrides: dict[str, Any] | None = None,
    recipe: str | Sequence[str] | None = None,
    stage_keys: tuple[str, ...] = (),
) -> TrainConfig:
    """``train`` + the stage's section (+ its ``recipe`` subsections in order, e.g. ``transfer.nli``, then
    ``transfer.tsdae``) + CLI overrides.

    ``stage_keys`` are the section's own settings that the stage reads itself (``texts``, ``max_texts``, the
    recipe subsections); any other key that is not a training setting is an error naming it.
    """
    own = {k: v for k, v in (params.get(section) or {}).items() if k not in stage_keys}
    sections = [
        ("top level", {"seed": params["seed"], "max_length": params["model"]["max_length"]}),
        ("train", params.get("train") or {}),
        (section, own),
    ]
    for name in [recipe] if isinstance(recipe, str) else recipe or ():
        sections.append((f"{section}.{name}", (params.get(section) or {}).get(name) or {}))
    sections.append(("command line", {k: v for k, v in (overrides or {}).items() if v is not None}))
    try:
        return TrainConfig.from_sections(sections)
    except ConfigError as exc:
        fail(f"{params_label(params)}: {exc}")


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit code 2, before any training."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def write_curves(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        domain = any(row.get("domain_dev") is not None for row in rows)
        writer = csv.DictWriter(f, fieldnames=["step", "loss", "lr", "stsb_dev"] + ["domain_dev"] * domain)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in writer.fieldnames})


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
    parser.add_argument("--params", default=None, help="params file (default: params.yaml)")
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
    """Where a run's records (curves, metrics) and resume state go: the pipeline's metrics/ and checkpoints/,
    unless ``--output`` is outside the models folder and no ``--metrics-dir``/``--checkpoints-dir`` is given:
    then beside the output, in ``<output>.records/``, so a run by hand never overwrites the pipeline's
    git-tracked records (or resumes from its state)."""
    outside = args.output and not Path(args.output).resolve().is_relative_to(Path(args.models_dir).resolve())
    beside = Path(args.output).with_name(Path(args.output).name + ".records") if outside else None
    metrics = Path(args.metrics_dir) if args.metrics_dir else (beside or METRICS)
    checkpoints = (
        Path(args.checkpoints_dir)
        if args.checkpoints_dir
        else (beside / "checkpoints" if beside else CHECKPOINTS)
    )
    return metrics, checkpoints


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
    below the init (``sentcl.train.selectable``). ``summary``: counts about the input (e.g. truncated lines)
    that join the metrics. ``teacher``: the teacher's stored vectors, for objective distill."""
    offline_hub()
    init_distributed()
    rank, _ = dist_info()
    if rank == 0:
        preflight()  # an unreachable tracking server fails the stage now, not after the training
    log.info("%s: %s from %s on %d examples", stage, config.mode, init, len(examples))
    encoder = Encoder.from_pretrained(init, max_length=config.max_length)
    trainer = Trainer(
        encoder,
        config,
        examples,
        dev_pairs,
        Path(checkpoints_dir) / stage,
        domain_dev=domain_dev,
        max_task_drop=max_task_drop,
        teacher=teacher,
    )
    result = trainer.fit()
    # Relative inside the repository: the metrics file is tracked in git and must not name one machine's paths.
    label = Path(init).resolve()
    label = str(label.relative_to(ROOT)) if label.is_relative_to(ROOT) else init
    # precision: which arithmetic trained it (bf16 on CPUs with native bf16, fp32 elsewhere; sentcl.precision),
    # so a score that differs between machines in the second decimal says why.
    precision = "bf16" if trainer.autocast else "fp32"
    metrics = {
        **result.metrics(),
        "init": label,
        "examples": len(examples),
        "precision": precision,
        **(summary or {}),
    }
    if rank == 0:
        tmp = output.with_name(output.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        encoder.cpu().save(tmp)
        shutil.rmtree(output, ignore_errors=True)
        tmp.rename(output)
        curves = Path(metrics_dir) / "curves" / f"{stage}.csv"
        write_curves(result.rows, curves)
        metrics_path = Path(metrics_dir) / "train" / f"{stage}.json"
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        # A DVC metric: scores to 2 decimals of Spearman x 100, no wall time (seconds: the log line and MLflow).
        record = {k: round(v, 2) if isinstance(v, float) else v for k, v in metrics.items() if k != "seconds"}
        metrics_path.write_text(json.dumps(record, indent=2) + "\n")
        log.info("%s: model -> %s; records -> %s, %s", stage, output, metrics_path, curves)
        verdict = (
            f"best at step {result.best_step}" if result.beat_init else "never beat its init: output = init"
        )
        log.info(
            "%s: STS-B dev %.2f at step 0, %.2f selected (%s), %d steps, %.0f s",
            stage,
            result.init_score,
            result.best_score,
            verdict,
            result.steps,
            result.seconds,
        )
        if result.domain_init is not None:
            log.info(
                "%s: selected on the domain dev set: %.2f at step 0, %.2f selected (STS-B guard: -%s)",
                stage,
                result.domain_init,
                result.domain_best,
                max_task_drop,
            )
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        log_stage(
            stage,
            {"seed": params["seed"], "model": params["model"], **_config_params(config)},
            numeric,
            curves,
            inputs,
            # The weights stay in DVC's cache; the registry gets the exported model, not every stage's folder.
        )
        trainer.finish()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return metrics


def _config_params(config: TrainConfig) -> dict[str, Any]:
    from dataclasses import asdict

    values = asdict(config)
    values["views"] = list(values["views"])
    return {"train": values}
