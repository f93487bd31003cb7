"""Stage ``pretrain_nli``: supervised training on NLI (SBERT's classifier CE, supervised SimCSE, or PromptBERT's
supervised variant: objective promptbert) -> models/nli."""

from __future__ import annotations

from pathlib import Path

from sentcl.model.encoder import resolve_model_path
from sentcl.training.config import TRIPLET_OBJECTIVES
from sentcl.training.data import nli_pairs, nli_triplets, resolve_init, stsb_dev
from stages.common import load_params, missing_model, offline_hub
from stages.training import (
    fail,
    load_nli,
    load_pairs,
    records_dirs,
    run_stage,
    setup_logging,
    stage_config,
    stage_parser,
)


def main(
    argv: list[str] | None = None, section: str = "pretrain_nli", stage: str = "nli", mode: str = "nli"
) -> None:
    parser = stage_parser(
        __doc__ if mode == "nli" else f"Stage {section}: {mode} training on NLI -> models/{stage}."
    )
    parser.add_argument("--init", default="base", help="base, or a model folder or id")
    args = parser.parse_args(argv)
    setup_logging()
    params = load_params(args.params, args.overrides)
    config = stage_config(params, section, {"mode": mode, "steps": args.steps})
    init = resolve_init(args.init, Path(args.models_dir))
    offline_hub()
    problem = missing_model(resolve_model_path(init))
    if problem:
        fail(f"{stage}: --init {problem}")
    processed = Path(args.processed)
    nli = load_nli(processed)
    examples = (
        nli_triplets(nli)
        if config.mode == "nli" and config.objective in TRIPLET_OBJECTIVES
        else nli_pairs(nli)
    )
    run_stage(
        stage,
        config,
        init,
        examples,
        stsb_dev(load_pairs(processed)),
        Path(args.output) if args.output else Path(args.models_dir) / stage,
        params,
        [processed],
        *records_dirs(args),
    )


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung mid-stage: one line, exit 75

    raise SystemExit(run_main("nli", main))
