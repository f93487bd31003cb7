"""Stage ``transfer``: unsupervised training on target-domain text -> models/transfer-<init>.

ConSERT's three settings are one stage run from three inits (dvc.yaml ``foreach``): ``base`` (unsup),
``nli`` (sup-unsup) and ``joint`` (joint-unsup). A retraining flow runs it on any model folder and text::

    python -m stages.transfer --init base|nli|joint|PATH --texts FILE_OR_FOLDER --output DIR [--max-texts N]
                              [--domain-dev PAIRS.tsv] [--objective contrastive|tsdae] [--preset promptbert]

The text is ``transfer.texts`` (``--texts``): ``heldout`` (default: the seven STS test sets' sentences
without any sentence token-identical to an STS-B dev or SICK-R trial sentence), ``consert`` (ConSERT's corpus), ``inductive``
(no sentence token-identical to a dev or test sentence; ``sentcl.texts``), or a
``*.txt`` file (one sentence a line) or a folder of them. Each init has its own recipe (``transfer.base``,
``transfer.nli``, ``transfer.joint`` in params.yaml: views, their rates and encoder dropout, as ConSERT's three
scripts differ); a model folder uses ``--recipe`` (default ``base``).

``--objective`` (default ``transfer.objective``): ``contrastive`` trains on two views of each sentence;
``tsdae`` (denoising auto-encoder, ``sentcl.objectives.TSDAE``) adds the ``transfer.tsdae`` recipe over the
init's. TSDAE then contrastive is two runs, the second with ``--init`` the first's output.

``--preset`` (default ``transfer.preset``): a published recipe over the init's (``sentcl.train.PRESETS``);
``--preset promptbert`` is PromptBERT's unsupervised training (two templates, each denoised, InfoNCE at 0.05,
params ``train.prompt``), and the output folder carries its prompt pooling (``sentcl_pooling.json``).

``--objective distill`` (``sentcl.distill``, settings ``train.distill``) learns from the teacher's vectors of the
same text, stored by the teacher stage (``--teacher-vectors``, default data/teacher).

``--domain-dev`` (tab-separated sentence1, sentence2, score): checkpoint selection uses the domain's own dev
set, and STS-B dev becomes a guard that may not fall by more than ``registry.max_dev_drop`` below the init.
Lines longer than ``model.max_length`` tokens are truncated, as the tokenizer does everywhere, and counted
(``texts_truncated`` in the stage's metrics).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sentcl.distill import neighbour_pairs
from sentcl.encoder import resolve_model_path
from sentcl.texts import text_pairs
from sentcl.train import PRESETS, TRANSFER_OBJECTIVES, TrainConfig
from sentcl.training_data import INIT_NAMES, count_truncated, limit_texts, resolve_init, stsb_dev
from stages.common import DATA, RAW, load_params, missing_model, offline_hub
from stages.training import (
    fail,
    load_nli,
    load_pairs,
    records_dirs,
    run_stage,
    setup_logging,
    stage_config,
    stage_parser,
    transfer_texts,
)

STAGE_KEYS = ("texts", "max_texts", *INIT_NAMES, "tsdae", "distillation")
TEACHER_VECTORS = DATA / "teacher"  # stages.teacher
log = logging.getLogger("stages.transfer")


def transfer_config(params: dict[str, Any], recipe: str | None, overrides: dict[str, Any]) -> TrainConfig:
    """``train`` + ``transfer`` + ``transfer.<recipe>`` (+ ``transfer.tsdae`` or ``transfer.distillation`` for
    that objective) + overrides. The objective is the override's, else the recipe's, else the section's."""
    section = params.get("transfer") or {}
    own = (section.get(recipe) or {}) if recipe else {}
    # A preset asked for is a published contrastive recipe: the recipe's own objective does not apply to it.
    recipe_objective = None if overrides.get("preset") else own.get("objective")
    objective = overrides.get("objective") or recipe_objective or section.get("objective")
    overlay = {"tsdae": ["tsdae"], "distill": ["distillation"]}.get(objective, [])
    recipes = ([recipe] if recipe else []) + overlay
    values = {"mode": "transfer", **overrides, "objective": objective}
    return stage_config(params, "transfer", values, recipes, STAGE_KEYS)


def read_domain_dev(path: str, flag: str = "--domain-dev") -> list[tuple[str, str, float]]:
    """Scored pairs (the domain dev set; bench-domain's --dev and --test too), or one line naming the flag,
    the file (and line) and exit 2."""
    from sentcl.domain import DomainTextError, read_scored_pairs

    if not Path(path).is_file():
        fail(f"{flag} {path}: no such file")
    try:
        return read_scored_pairs(path)
    except DomainTextError as exc:
        fail(f"{flag} {exc}")


def load_teacher(folder: Path, texts: list[str]):
    """The teacher stage's vectors, checked to cover every training sentence, or one line and exit 2."""
    from sentcl.teacher import TeacherError, TeacherVectors

    try:
        teacher = TeacherVectors.load(folder)
        if teacher.meta.get("model") == "none":
            fail(f"transfer.objective distill: {folder} holds no teacher (teacher.model is none)")
        teacher.lookup(texts)
    except TeacherError as exc:
        fail(f"transfer.objective distill: {exc}")
    log.info("distill: teacher %s (%d-d), %d sentences", teacher.meta.get("model"), teacher.dim, len(texts))
    return teacher


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
    parser.add_argument("--objective", choices=TRANSFER_OBJECTIVES, help="default: params transfer.objective")
    parser.add_argument("--preset", choices=list(PRESETS), help="default: params transfer.preset")
    parser.add_argument(
        "--teacher-vectors",
        default=str(TEACHER_VECTORS),
        help="objective distill: the teacher stage's output (default data/teacher)",
    )
    parser.add_argument(
        "--domain-dev",
        help="scored pairs sentence1<TAB>sentence2<TAB>score: select on them, STS-B dev as a guard",
    )
    args = parser.parse_args(argv)
    setup_logging()
    params = load_params(Path(args.params) if args.params else None)
    section = params.get("transfer", {})
    # A model folder from elsewhere (e.g. the registry) must not overwrite the pipeline's own records.
    stage = args.stage or (f"transfer-{args.init}" if args.init in INIT_NAMES else "transfer-custom")
    output = Path(args.output) if args.output else Path(args.models_dir) / stage
    recipe = args.recipe or (args.init if args.init in INIT_NAMES else "base")
    overrides = {"steps": args.steps, "objective": args.objective, "preset": args.preset}
    config = transfer_config(params, recipe, overrides)
    init = resolve_init(args.init, Path(args.models_dir))
    offline_hub()
    problem = missing_model(resolve_model_path(init))
    if problem:
        fail(f"transfer: --init {problem}")
    domain_dev = read_domain_dev(args.domain_dev) if args.domain_dev else None
    pairs = load_pairs(Path(args.processed))
    choice = args.texts or section["texts"]
    tokenizer, max_length = _sentence_room(init, config)
    texts = transfer_texts(
        choice, pairs, load_nli(Path(args.processed)), Path(args.raw), tokenizer, max_length
    )
    max_texts = args.max_texts if args.max_texts is not None else section["max_texts"]
    texts = limit_texts(texts, max_texts, params["seed"])
    inputs = [Path(args.processed)] + ([Path(choice)] if Path(choice).exists() else [])
    inputs += [Path(args.domain_dev)] if args.domain_dev else []
    teacher = load_teacher(Path(args.teacher_vectors), texts) if config.objective == "distill" else None
    truncated = _truncated(texts, tokenizer, max_length, config)
    examples: list[Any] = texts
    if teacher is not None and config.distill.examples == "neighbours":
        examples = neighbour_pairs(texts, teacher)
        log.info("distill: %d (sentence, nearest teacher neighbour) pairs", len(examples))
    elif teacher is not None and config.distill.examples == "pairs":
        try:
            examples = text_pairs(choice, pairs, load_nli(Path(args.processed)), texts)
        except ValueError as exc:
            fail(f"train.distill.examples pairs: {exc}")
        log.info("distill: %d unlabeled pairs of the %s text (scores never read)", len(examples), choice)
    run_stage(
        stage,
        config,
        init,
        examples,
        stsb_dev(pairs),
        output,
        params,
        inputs,
        *records_dirs(args),
        domain_dev=domain_dev,
        max_task_drop=float(params["registry"]["max_dev_drop"]) if domain_dev else None,
        summary={"texts_truncated": truncated},
        teacher=teacher,
    )


def _sentence_room(init: str, config: TrainConfig) -> tuple[Any, int]:
    """The init's tokenizer, and how many tokens (special tokens included) of a sentence the model reads:
    ``model.max_length``, or inside PromptBERT's longest template the room the template leaves (the sentence is
    cut, never the template)."""
    from transformers import AutoTokenizer

    from sentcl.encoder import resolve_model_path

    offline_hub()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(init))
    max_length = config.max_length
    if config.objective == "promptbert":
        from sentcl.prompt import template_ids

        # count_truncated counts [CLS] and [SEP]; the template holds them, and the sentence gets the rest.
        template = max(template_ids(tokenizer, t).length for t in config.prompt.templates)
        max_length = config.max_length - template + 2
    return tokenizer, max_length


def _truncated(texts: list[str], tokenizer: Any, max_length: int, config: TrainConfig) -> int:
    """Count (and say) how many sentences the tokenizer will cut at ``max_length`` tokens (``_sentence_room``)."""
    truncated = count_truncated(texts, tokenizer, max_length)
    if truncated:
        log.info(
            "%d of %d sentences are longer than %d tokens (model.max_length %d%s): truncated there, as the "
            "tokenizer does everywhere",
            truncated,
            len(texts),
            max_length,
            config.max_length,
            ", less the prompt template" if config.objective == "promptbert" else "",
        )
    return truncated


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung mid-stage: one line, exit 75

    raise SystemExit(run_main("transfer", main))
