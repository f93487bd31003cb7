"""STS benchmark of model folders: STS12-16, STS-B test, SICK-R test (Spearman x 100, protocols "all" and "mean"),
and the dev splits beside it: STS-B dev (``stsb_dev``) and SICK-R trial (``sick_dev``), which the gate reads.

    python -m stages.evaluate                                   # DVC stage: every checkpoint -> metrics/sts.{json,md}
                                                                #   + metrics/eval/<checkpoint>.json (DVC metrics)
    python -m stages.evaluate --model DIR [--output FILE.json]  # one model: the standalone JSON; logs nothing
    python -m stages.evaluate --model NAME=DIR ... --output F   # several: {NAME: standalone JSON}; logs nothing

``--data`` is a folder in SentEval layout (default: the pipeline's data/raw).

The stage also splits each checkpoint's seven tasks by what it saw in training (``seen_split`` in sts.json:
pairs whose two sentences, one or neither are in the text of the training stages of its lineage,
``data/seen/<stage>.txt``, matched by the one rule of ``sentcl.data.roles``) and scores the STS-B train and SICK-R train pairs that no stage
trained on and no evaluation reads (``unseen_sts``; ``sentcl.evaluation.seen.unseen_sts_subsets`` has the rule).
The standalone mode does neither.

Pooling, per model folder: ``--pooling`` when given, else the pooling the folder carries (``sentcl_pooling.json``,
written for a prompt-trained model), else params ``evaluate.pooling``. ``--pooling prompt`` takes its template,
denoising and final period from params ``evaluate.prompt``; ``--template``/``--denoise``/``--no-denoise`` override
those (also for a folder that carries a prompt).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from sentcl.evaluation import models as scoring
from sentcl.evaluation import seen as seen_split
from sentcl.evaluation.benchmark import Benchmark, load_benchmark
from sentcl.model.encoder import resolve_model_path
from sentcl.model.fast_encode import BACKENDS
from sentcl.model.pooling import POOLINGS
from sentcl.training.recipes import checkpoint_lineage, training_stages
from stages.common import (
    METRICS,
    MODELS,
    PROCESSED,
    RAW,
    SEEN,
    argument_parser,
    load_params,
    missing_model,
    offline_hub,
    params_arguments,
)

REFERENCE = "base"  # what every checkpoint's gain is read against, on the same pairs

log = logging.getLogger("stages.evaluate")


def run_pipeline(
    params: dict[str, Any],
    data: Path,
    pooling: str | None,
    backend: str | None,
    prompt_flags: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The DVC stage: every checkpoint under models/ -> metrics/sts.json + metrics/sts.md, logged as one run.
    Each checkpoint is scored with its own pooling (``model_pooling``) unless ``pooling`` is given."""
    from sentcl_mlflow.runs import StageRecord, log_stage, sts_metrics
    from sentcl_mlflow.store import TrackingConfig, bound_requests, tracking_enabled

    if tracking_enabled():
        bound_requests(TrackingConfig.from_params(params))  # the run's MLflow requests (params tracking:)

    settings = scoring.stage_settings(params)
    folders = {name: MODELS / name for name in settings["checkpoints"]}
    poolings = scoring.checkpoint_poolings(folders, settings, pooling, prompt_flags)
    pooling, backend = pooling or settings["pooling"], backend or settings["backend"]
    benchmark, more_scores, seen_files = split_scoring(load_benchmark(data), list(folders), PROCESSED, SEEN)
    results = scoring.score_checkpoints(
        folders,
        poolings,
        benchmark,
        backend,
        int(settings["max_tokens"]),
        on_result=lambda name, result: log.info(scoring.summary_line(name, result)),
        more_scores=more_scores,
    )
    artifacts = scoring.write_sts_outputs(results, METRICS, scoring.pooling_description(poolings, pooling))
    metrics = {f"{name}.{k}": v for name, row in results.items() for k, v in sts_metrics(row).items()}
    record = StageRecord(
        metrics, inputs=[data, PROCESSED, *seen_files, *folders.values()], artifacts=artifacts
    )
    log_stage(
        "evaluate", {"evaluate": settings | {"pooling": pooling, "backend": backend}}, record, params=params
    )
    return results


def split_scoring(
    benchmark: Benchmark,
    checkpoints: list[str],
    processed: Path,
    seen_dir: Path,
) -> tuple[Benchmark, Callable[[str, dict[str, Any]], dict[str, Any]], list[Path]]:
    """What splits each checkpoint's scores by what it saw (``sentcl.evaluation.seen``): the benchmark with the
    unseen-STS pairs added (encoded with it), the scorer of a checkpoint's cosines, and the seen-text files
    read. Sentences match by ``sentcl.data.roles.normalise``. A training stage's text missing: setup error."""
    texts: dict[str, list[str]] = {}
    for stage in training_stages():
        path = seen_dir / f"{stage}.txt"
        if not path.is_file():
            raise scoring.EvaluationSetupError(
                f"{path} is missing: run the training stages first (dvc repro)"
            )
        texts[stage] = path.read_text(encoding="utf-8").splitlines()
    every_text = {s for lines in texts.values() for s in lines}
    unseen = seen_split.unseen_sts_subsets(pd.read_parquet(processed / "pairs.parquet"), every_text)
    benchmark = replace(benchmark, extra=unseen)

    lineages = {name: checkpoint_lineage(name) for name in checkpoints}
    seen_sets = {
        name: seen_split.seen_keys([s for stage in stages for s in texts[stage]])
        for name, stages in lineages.items()
    }

    # The base model's cosines (scored first: CHECKPOINTS order), so that each later checkpoint's split also
    # carries the base's Spearman on the very same pairs: a gain is only ever read on one set of pairs.
    reference: dict[str, Any] = {}

    def more_scores(name: str, cosines: dict[str, Any]) -> dict[str, Any]:
        split = seen_split.split_scores(benchmark.subsets, cosines["subsets"], seen_sets[name])
        split |= {"trained_on": [f"data/seen/{stage}.txt" for stage in lineages[name]]}
        if name == REFERENCE:
            reference["subsets"] = cosines["subsets"]
        elif "subsets" in reference:
            same = seen_split.split_scores(benchmark.subsets, reference["subsets"], seen_sets[name])
            split[seen_split.BASE_SAME_PAIRS] = same["avg"]
        unseen_scores = seen_split.unseen_sts_scores(benchmark.extra, cosines["extra"])
        return {
            "seen_split": split,
            seen_split.UNSEEN_STS: unseen_scores | {"from": seen_split.UNSEEN_DESCRIPTION},
        }

    log.info(
        "unseen STS: %d scored pairs no stage trained on (%s)",
        sum(len(s) for s in unseen),
        ", ".join(f"{s.task} {s.name} {len(s)}" for s in unseen),
    )
    return benchmark, more_scores, [seen_dir / f"{stage}.txt" for stage in texts]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--model", action="append", default=[], help="DIR, or NAME=DIR (repeatable)")
    parser.add_argument("--data", type=Path, default=RAW, help="SentEval layout folder (default data/raw)")
    parser.add_argument("--output", type=Path, help="JSON file (standalone mode; default: stdout)")
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        help="for every model; default: the folder's own (sentcl_pooling.json), else params evaluate.pooling",
    )
    parser.add_argument(
        "--template", help="prompt pooling's template, e.g. 'This sentence : \"[X]\" means [MASK] .'"
    )
    parser.add_argument(
        "--denoise",
        action=argparse.BooleanOptionalAction,
        help="prompt pooling: subtract the template's delta (default params evaluate.prompt.denoise)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="onnx (default) or torch, same numbers; int8: a release folder's onnx/model_int8.onnx",
    )
    parser.add_argument("--max-length", type=int, help="truncation; default the model's own max_seq_length")
    parser.add_argument(
        "--no-dev",
        action="store_true",
        help="skip the dev splits (stsb_dev, sick_dev: null): the seven test tasks only",
    )
    parser.add_argument("--no-progress", action="store_true")
    params_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offline_hub()
    prompt_flags = {"template": args.template, "denoise": args.denoise}
    if not (args.data / "STS").is_dir():
        raise SystemExit(f"evaluate: {args.data} is not in SentEval layout (no STS/ folder)")
    params = load_params(args.params, args.overrides)
    try:
        if args.model:
            return run_standalone(args, params, prompt_flags)
        if args.output:
            raise SystemExit("evaluate: --output is for --model; the stage writes metrics/sts.json")
        run_pipeline(params, args.data, args.pooling, args.backend, prompt_flags)
    except scoring.EvaluationSetupError as error:
        raise SystemExit(f"evaluate: {error}") from None
    return 0


def run_standalone(args: argparse.Namespace, params: dict[str, Any], prompt_flags: dict[str, Any]) -> int:
    """``--model``: the standalone JSON of each model (a mapping for NAME=DIR), to --output or stdout."""
    settings = scoring.stage_settings(params)
    models, as_mapping = scoring.parse_models(args.model)
    for folder in models.values():
        problem = scoring.not_a_model_folder(folder) or missing_model(resolve_model_path(folder))
        if problem:
            print(f"evaluate: --model {problem}", file=sys.stderr)
            return 2
    benchmark = load_benchmark(args.data, with_dev=not args.no_dev)
    flags = (args.pooling, prompt_flags, args.backend, args.max_length, not args.no_progress)
    results = scoring.score_models(models, benchmark, settings, *flags, log)
    text = json.dumps(results if as_mapping else next(iter(results.values())), indent=2) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung while logging: one line, exit 75

    raise SystemExit(run_main("evaluate", main))
