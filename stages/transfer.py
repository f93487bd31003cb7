"""Stage ``transfer``: unsupervised training on target-domain text -> models/transfer-<init>.

ConSERT's three settings are one stage run from three inits (dvc.yaml ``foreach``): ``base`` (unsup),
``nli`` (sup-unsup) and ``joint`` (joint-unsup). A retraining flow runs it on any model folder and text::

    python -m stages.transfer --init base|nli|joint|PATH --texts FILE_OR_FOLDER --output DIR [--max-texts N]
                              [--domain-dev PAIRS.tsv] [--objective contrastive|tsdae|distill] [--preset promptbert]

The text is ``transfer.texts`` (``--texts``): ``heldout`` (default: the seven STS test sets' sentences without
any STS-B dev or SICK-R trial sentence), ``consert`` (ConSERT's corpus), ``inductive`` (no dev or test sentence;
"the same sentence" by ``sentcl.data.roles``, ``sentcl.data.texts``), or a ``*.txt`` file (one
sentence a line) or a folder of them. Each init has its own recipe (``transfer.base``, ``transfer.nli``,
``transfer.joint`` in params.yaml: views, their rates and encoder dropout, as ConSERT's three scripts differ); a
model folder uses ``--recipe`` (default ``base``).

``--objective`` (default: the recipe's, ``sentcl.training.recipes``): ``contrastive`` (two views of each sentence), ``tsdae``
(``transfer.tsdae`` over the init's recipe) or ``distill`` (``transfer.distillation`` over it).

``--preset`` (default ``transfer.preset``): a published recipe over the init's (``sentcl.training.recipes.PRESETS``);
``--preset promptbert`` is PromptBERT's unsupervised training (two templates, each denoised, InfoNCE at 0.05,
params ``train.prompt``), and the output folder carries its prompt pooling (``sentcl_pooling.json``).

``distill`` learns from the teacher stage's vectors of the same text (``--teacher-vectors``, default data/teacher).

``--domain-dev`` (tab-separated sentence1, sentence2, score): checkpoint selection uses the domain's own dev
set, and STS-B dev becomes a guard that may not fall by more than ``registry.max_dev_drop`` below the init.
``--agreement`` (the teacher stage's ``agreement.tsv``: pairs among a held-out share of the domain text, scored by
the teacher): selection as with ``--domain-dev``, on the student's Spearman agreement with the teacher; the
record says ``selected_on: teacher_agreement`` and how many pairs and held-out sentences. A retrain without
scored pairs uses it (flows/retrain.py). Lines longer than ``model.max_length`` tokens are truncated, as the
tokenizer does everywhere, and counted (``texts_truncated`` in the stage's metrics).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sentcl.data.domain import DomainTextError, read_flag_pairs
from sentcl.model.encoder import resolve_model_path
from sentcl.model.teacher import TeacherError, TeacherVectors
from sentcl.retrain.agreement import agreement_summary
from sentcl.training import data as training_data
from sentcl.training import recipes
from sentcl.training.config import TRANSFER_OBJECTIVES, TrainConfig
from sentcl.training.data import INIT_NAMES
from sentcl.training.recipes import PRESETS
from stages import training
from stages.common import DATA, RAW, fail, load_params, missing_model, offline_hub

STAGE_KEYS = recipes.TRANSFER_KEYS
TEACHER_VECTORS = DATA / "teacher"  # stages.teacher
log = logging.getLogger("stages.transfer")


def transfer_config(params: dict[str, Any], recipe: str | None, overrides: dict[str, Any]) -> TrainConfig:
    """``train`` + ``transfer`` + ``transfer.<recipe>`` (+ the objective's subsection) + overrides, as
    ``sentcl.training.recipes.transfer_sections`` resolves them (the report reads the same)."""
    return training.build_config(params, recipes.transfer_sections(params, recipe, overrides))


def read_domain_dev(path: str, flag: str = "--domain-dev") -> list[tuple[str, str, float]]:
    """Scored pairs (the domain dev set; bench-domain's --dev and --test too), or one line naming the flag,
    the file (and line) and exit 2."""
    try:
        return read_flag_pairs(path, flag)
    except DomainTextError as exc:
        fail(str(exc))


def load_teacher(folder: Path, texts: list[str]):
    """The teacher stage's vectors, checked to cover every training sentence, or one line and exit 2."""
    try:
        teacher = TeacherVectors.load_covering(folder, texts)
    except TeacherError as exc:
        fail(f"transfer.objective distill: {exc}")
    log.info("distill: teacher %s (%d-d), %d sentences", teacher.meta.get("model"), teacher.dim, len(texts))
    return teacher


def main(argv: list[str] | None = None) -> None:
    parser = training.stage_parser(__doc__)
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
    parser.add_argument(
        "--agreement",
        help="teacher-scored pairs among held-out text (agreement.tsv): select on them, STS-B dev as a guard",
    )
    args = parser.parse_args(argv)
    if args.domain_dev and args.agreement:
        fail("transfer: --domain-dev and --agreement: give one (scored pairs win; the flow passes one)")
    training.setup_logging()
    params = load_params(args.params, args.overrides)
    section = params.get("transfer", {})
    stage, recipe = recipes.transfer_run(args.init, args.stage, args.recipe)
    output = Path(args.output) if args.output else Path(args.models_dir) / stage
    overrides = {"steps": args.steps, "objective": args.objective, "preset": args.preset}
    config = transfer_config(params, recipe, overrides)
    init = training_data.resolve_init(args.init, Path(args.models_dir))
    offline_hub()
    if problem := missing_model(resolve_model_path(init)):
        fail(f"transfer: --init {problem}")
    dev_file = args.domain_dev or args.agreement
    domain_dev = (
        read_domain_dev(dev_file, "--domain-dev" if args.domain_dev else "--agreement") if dev_file else None
    )
    summary = agreement_summary(domain_dev) if args.agreement else {}
    processed, raw, choice = Path(args.processed), Path(args.raw), args.texts or section["texts"]
    pairs, nli = training.load_pairs(processed), training.load_nli(processed)
    max_texts = args.max_texts if args.max_texts is not None else section["max_texts"]
    try:
        texts, truncated = training_data.training_text(choice, pairs, nli, raw, init, config, max_texts, log)
        teacher = load_teacher(Path(args.teacher_vectors), texts) if config.objective == "distill" else None
        student = None
        if config.objective == "distill" and config.distill.keep_hardest < 1:
            from sentcl.model.fast_encode import FastEncoder

            student = FastEncoder(init, backend=params["evaluate"]["backend"])
        examples = training_data.distill_examples(
            config.distill, choice, texts, teacher, pairs, nli, log, student
        )
    except (training_data.TextChoiceError, DomainTextError) as exc:
        fail(str(exc))
    inputs = [processed] + ([Path(choice)] if Path(choice).exists() else [])
    inputs += [Path(dev_file)] if dev_file else []
    training.run_stage(
        stage,
        config,
        init,
        examples,
        training_data.stsb_dev(pairs),
        output,
        params,
        inputs,
        *training.records_dirs(args),
        domain_dev=domain_dev,
        max_task_drop=float(params["registry"]["max_dev_drop"]) if domain_dev else None,
        summary={"texts_truncated": truncated, **summary},
        teacher=teacher,
    )


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung mid-stage: one line, exit 75

    raise SystemExit(run_main("transfer", main))
