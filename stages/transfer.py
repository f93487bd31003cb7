"""Stage ``transfer``: unsupervised contrastive training on target-domain text -> models/transfer-<init>.

ConSERT's three settings are one stage run from three inits (dvc.yaml ``foreach``): ``base`` (unsup),
``nli`` (sup-unsup) and ``joint`` (joint-unsup). A retraining flow runs it on any model folder and text::

    python -m stages.transfer --init base|nli|joint|PATH --texts FILE_OR_FOLDER --output DIR [--max-texts N]

The text is ``transfer.texts`` (``--texts``): ``heldout`` (default: the seven STS test sets' sentences
without any STS-B dev sentence), ``consert`` (ConSERT's corpus), ``inductive`` (no dev or test sentence), or a
``*.txt`` file (one sentence a line) or a folder of them. Each init has its own recipe (``transfer.base``,
``transfer.nli``, ``transfer.joint`` in params.yaml: views, their rates and encoder dropout, as ConSERT's three
scripts differ); a model folder uses ``--recipe`` (default ``base``).
"""

from __future__ import annotations

from pathlib import Path

from stages.common import RAW, load_params
from stages.training import (
    INIT_NAMES,
    limit_texts,
    load_nli,
    load_pairs,
    resolve_init,
    run_stage,
    setup_logging,
    stage_config,
    stage_parser,
    stsb_dev,
    transfer_texts,
)

STAGE_KEYS = ("texts", "max_texts", *INIT_NAMES)


def main(argv: list[str] | None = None) -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("--init", default="base", help="base, nli, joint, or a model folder")
    parser.add_argument(
        "--texts",
        help="heldout, consert, inductive, or a file or folder of sentences (default: transfer.texts)",
    )
    parser.add_argument(
        "--recipe", choices=INIT_NAMES, help="which transfer.<init> recipe (default: the init's)"
    )
    parser.add_argument("--raw", default=str(RAW), help="SentEval folder (for --texts consert)")
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
    recipe = args.recipe or (args.init if args.init in INIT_NAMES else "base")
    config = stage_config(params, "transfer", {"mode": "transfer", "steps": args.steps}, recipe, STAGE_KEYS)
    pairs = load_pairs(Path(args.processed))
    choice = args.texts or section["texts"]
    texts = transfer_texts(choice, pairs, load_nli(Path(args.processed)), Path(args.raw))
    max_texts = args.max_texts if args.max_texts is not None else section["max_texts"]
    texts = limit_texts(texts, max_texts, params["seed"])
    inputs = [Path(args.processed)] + ([Path(choice)] if Path(choice).exists() else [])
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
