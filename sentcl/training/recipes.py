"""Which params.yaml sections a training run's settings come from, and in which order: the one resolver that the
training stages build their ``TrainConfig`` from and that the report reads to say what a checkpoint trained with,
so the two cannot disagree. Pure: mappings in, mappings out; no setting is checked here (``TrainConfig`` does).

A transfer run's objective is the command line's, else its recipe's (``transfer.<init>.objective``; not when a
preset is asked for on the command line: a preset is a published contrastive recipe), else the section's
(``transfer.objective``). Objective ``tsdae`` adds ``transfer.tsdae`` over the recipe, ``distill`` adds
``transfer.distillation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sentcl.params import merge

INIT_NAMES = ("base", "nli", "joint")
# The transfer section's own keys that the stage reads itself (its text, and the recipe subsections).
TRANSFER_KEYS = ("texts", "max_texts", *INIT_NAMES, "tsdae", "distillation")
# The subsection an objective adds over the init's recipe.
OVERLAYS = {"tsdae": "tsdae", "distill": "distillation"}
# The checkpoints of the stages that are not ``transfer``: their section, and the mode they train in.
STAGE_SECTIONS = {"nli": ("pretrain_nli", "nli"), "joint": ("joint", "joint")}

# A preset is a published recipe's loss, views, temperature and dropout; it overrides those keys of its section.
PRESETS: dict[str, dict[str, Any]] = {
    # princeton-nlp/SimCSE run_unsup_example.sh: dropout as the only view, one-way InfoNCE, temperature 0.05.
    "simcse": {
        "loss": "info_nce",
        "views": ("none", "none"),
        "temperature": 0.05,
        "encoder_dropout": True,
        "alpha": 1.0,
    },
    # caskcsg/sentemb ESimCSE/run.sh (bert-base): word repetition as view 2, momentum queue of 160, 0.995.
    "esimcse": {
        "loss": "info_nce",
        "views": ("none", "word_repetition"),
        "temperature": 0.05,
        "encoder_dropout": True,
        "alpha": 1.0,
        "queue_size": 160,
        "momentum": 0.995,
    },
    # kongds/Prompt-BERT run.sh unsup-bert (transfer mode only): the two views of a sentence are the sentence
    # under the two templates of ``prompt.templates``, each denoised by its own delta (``prompt.denoise``;
    # --mask_embedding_sentence_delta), the training-only MLP head (--mlp_only_train), InfoNCE at --temp 0.05,
    # BERT's dropout on (HF Trainer's train mode). The folder is saved with ``prompt.saved`` pooling.
    "promptbert": {
        "objective": "promptbert",
        "loss": "info_nce",
        "views": ("none", "none"),
        "temperature": 0.05,
        "encoder_dropout": True,
        "alpha": 1.0,
        "projection": True,
        "queue_size": 0,
    },
}

Sections = list[tuple[str, dict[str, Any]]]


def config_sections(
    params: dict[str, Any],
    section: str,
    overrides: dict[str, Any] | None,
    recipe: str | Sequence[str] | None,
    stage_keys: tuple[str, ...],
) -> Sections:
    """``TrainConfig.from_sections``'s input, in order: the top-level ``seed`` and ``model.max_length``,
    ``train``, the stage's section without its ``stage_keys``, its ``recipe`` subsections, the CLI overrides."""
    own = {k: v for k, v in (params.get(section) or {}).items() if k not in stage_keys}
    sections = [
        ("top level", {"seed": params["seed"], "max_length": params["model"]["max_length"]}),
        ("train", params.get("train") or {}),
        (section, own),
    ]
    for name in [recipe] if isinstance(recipe, str) else recipe or ():
        sections.append((f"{section}.{name}", (params.get(section) or {}).get(name) or {}))
    sections.append(("command line", {k: v for k, v in (overrides or {}).items() if v is not None}))
    return sections


def transfer_objective(
    params: dict[str, Any], recipe: str | None, overrides: dict[str, Any] | None = None
) -> str | None:
    """The objective a transfer run from ``recipe`` trains with: the override's, else the recipe's (unless a
    preset is asked for), else ``transfer.objective``."""
    overrides = overrides or {}
    section = params.get("transfer") or {}
    own = (section.get(recipe) or {}) if recipe else {}
    recipe_objective = None if overrides.get("preset") else own.get("objective")
    return overrides.get("objective") or recipe_objective or section.get("objective")


def transfer_sections(
    params: dict[str, Any], recipe: str | None, overrides: dict[str, Any] | None = None
) -> Sections:
    """``train`` + ``transfer`` + ``transfer.<recipe>`` (+ ``transfer.tsdae`` or ``transfer.distillation`` for
    that objective) + ``overrides`` (mode ``transfer`` and the resolved objective among them)."""
    objective = transfer_objective(params, recipe, overrides)
    recipes = ([recipe] if recipe else []) + ([OVERLAYS[objective]] if objective in OVERLAYS else [])
    values = {"mode": "transfer", **(overrides or {}), "objective": objective}
    return config_sections(params, "transfer", values, recipes, TRANSFER_KEYS)


def transfer_run(init: str, stage: str | None = None, recipe: str | None = None) -> tuple[str, str]:
    """The stage name (curves, metrics, resume state) and recipe of a transfer from ``init``, unless given:
    ``transfer-<init>`` and ``<init>`` for the pipeline's inits; for a model folder from elsewhere (e.g. the
    registry) ``transfer-custom``, which never overwrites the pipeline's own records, and ``base``."""
    own = init in INIT_NAMES
    return stage or (f"transfer-{init}" if own else "transfer-custom"), recipe or (init if own else "base")


def checkpoint_sections(params: dict[str, Any], checkpoint: str) -> Sections:
    """The sections the pipeline's stage that writes ``checkpoint`` (nli, joint, transfer-<init>) trains from,
    as params.yaml alone resolves them (no command-line override; a transfer from a folder uses ``base``)."""
    if checkpoint in STAGE_SECTIONS:
        section, mode = STAGE_SECTIONS[checkpoint]
        return config_sections(params, section, {"mode": mode}, None, ())
    return transfer_sections(params, transfer_run(checkpoint.removeprefix("transfer-"))[1])


def merged(sections: Sections) -> dict[str, Any]:
    """The settings the sections give, later ones winning (``sentcl.params.merge``: ``view``, ``prompt`` and
    ``distill`` key by key), with a preset's values over them as ``TrainConfig`` applies it. Unknown keys are kept,
    not refused."""
    values: dict[str, Any] = {}
    for _, items in sections:
        values = merge(values, items)
    values.update(PRESETS.get(values.get("preset") or "", {}))
    return values


def checkpoint_settings(params: dict[str, Any], checkpoint: str) -> dict[str, Any]:
    """What ``checkpoint`` trained with as params.yaml resolves it: ``merged(checkpoint_sections(...))``."""
    return merged(checkpoint_sections(params, checkpoint))


def checkpoint_lineage(checkpoint: str) -> tuple[str, ...]:
    """The training stages whose text ``checkpoint`` learned from, init first: ``base`` none (the pretrained
    model), ``nli``/``joint`` their own (both start from base), ``transfer-<init>`` its init's and its own
    (``transfer_run``: transfer-nli starts from nli). The one place the evaluate stage's "seen" sets come from."""
    if checkpoint == "base":
        return ()
    if checkpoint in STAGE_SECTIONS:
        return (checkpoint,)
    init = checkpoint.removeprefix("transfer-")
    if checkpoint.startswith("transfer-") and init in INIT_NAMES:
        return (*checkpoint_lineage(init), checkpoint)
    raise ValueError(
        f"{checkpoint!r} is not a checkpoint of the pipeline (base, nli, joint, transfer-<init>)"
    )


def training_stages() -> tuple[str, ...]:
    """Every training stage of the pipeline, by the checkpoint it writes (each records its seen text)."""
    return (*STAGE_SECTIONS, *(f"transfer-{init}" for init in INIT_NAMES))
