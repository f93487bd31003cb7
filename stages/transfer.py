"""Stage ``transfer``: unsupervised contrastive training on target-domain text -> models/transfer-<init>.

ConSERT's three settings are one stage run from three inits (dvc.yaml ``foreach``): ``base`` (unsup),
``nli`` (sup-unsup) and ``joint`` (joint-unsup). A retraining flow runs it on any model folder and text::

    python -m stages.transfer --init base|nli|joint|PATH --texts FILE_OR_FOLDER --output DIR [--max-texts N]

By default the text is the unique sentences of the seven STS test sets; a ``*.txt`` file (one sentence a
line) or a folder of them replaces it.
"""

from __future__ import annotations

from pathlib import Path

from stages.common import load_params
from stages.training import (
    INIT_NAMES,
    limit_texts,
    load_pairs,
    read_texts,
    resolve_init,
    run_stage,
    setup_logging,
    stage_config,
    stage_parser,
    sts_test_sentences,
    stsb_dev,
)


def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--init", default="base", help="base, nli, joint, or a model folder")
    parser.add_argument(
        "--texts", help="file or folder of sentences (default: params transfer.texts, else STS tests)"
    )
    parser.add_argument(
        "--stage",
        help="name for curves, metrics and resume state (default: transfer-<init>, or transfer-custom for a folder)",
    )
    parser.add_argument(
        "--max-texts", help="few-shot: 1, 10, 100, ... or all (default: params transfer.max_texts)"
    )
    args = parser.parse_args(argv)
    setup_logging()
    params = load_params(Path(args.params) if args.params else None)
    section = params.get("transfer", {})
    # A model folder from elsewhere (e.g. the registry) must not overwrite the pipeline's own records.
    stage = args.stage or (f"transfer-{args.init}" if args.init in INIT_NAMES else "transfer-custom")
    output = Path(args.output) if args.output else Path(args.models_dir) / stage
    pairs = load_pairs(Path(args.processed))
    texts_path = args.texts or section.get("texts")
    texts = read_texts(Path(texts_path)) if texts_path else sts_test_sentences(pairs)
    max_texts = args.max_texts if args.max_texts is not None else section.get("max_texts", "all")
    texts = limit_texts(texts, max_texts, params["seed"])
    config = stage_config(params, "transfer", {"mode": "transfer", "steps": args.steps})
    inputs = [Path(args.processed)] + ([Path(texts_path)] if texts_path else [])
    run_stage(
        stage,
        config,
        resolve_init(args.init, Path(args.models_dir)),
        texts,
        stsb_dev(pairs),
        output,
        params,
        inputs,
        Path(args.metrics_dir),
        Path(args.checkpoints_dir),
    )


if __name__ == "__main__":
    main()
