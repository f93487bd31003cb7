"""The rules of params.yaml's sections that no config class holds: the top level, ``model``, ``evaluate`` and the
transfer stage's text. Each check raises ``ParamsError`` (one line naming the key and the rule); the stage
``check_params`` runs them beside the configs' own (``TrainConfig``, ``TeacherConfig``, ``GateConfig``, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentcl.evaluation.models import DEFAULTS as EVALUATE_DEFAULTS
from sentcl.model.fast_encode import EXACT_BACKENDS
from sentcl.model.pooling import POOLINGS, PromptSettings
from sentcl.params import ParamsError, one_of, read_section, text, whole_number
from sentcl.training.data import TEXT_CHOICES

SECTIONS = (
    "seed",
    "model",
    "data",
    "train",
    "pretrain_nli",
    "joint",
    "transfer",
    "teacher",
    "retrain",
    "evaluate",
    "export",
    "registry",
    "gate",
    "promotion",
    "flows",
    "tracking",
    "serve",
)
EVALUATE_KEYS = ("pooling", "prompt", "backend", "max_tokens", "checkpoints")


def check_top(params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]!r} (known: {', '.join(SECTIONS)})")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise ParamsError(f"params.yaml: section {missing[0]!r} is missing")
    whole_number(params["seed"], "seed")


def check_model(params: dict[str, Any]) -> None:
    model = read_section(params, "model", ("name", "max_length"))
    text(model["name"], "model.name", "a model id or folder")
    whole_number(model["max_length"], "model.max_length", minimum=2)


def check_transfer_text(params: dict[str, Any]) -> None:
    """``transfer.texts`` and ``transfer.max_texts``, which the transfer stage reads itself."""
    section = params["transfer"]
    texts = section.get("texts")
    if texts not in TEXT_CHOICES and not (isinstance(texts, str) and Path(texts).exists()):
        raise ParamsError(
            f"params.yaml: transfer.texts {texts!r} is neither one of {', '.join(TEXT_CHOICES)} nor a file or folder"
        )
    limit = section.get("max_texts")
    if limit not in (None, "all"):
        whole_number(limit, "transfer.max_texts (or all)", minimum=1)


def check_evaluate(params: dict[str, Any]) -> None:
    section = read_section(params, "evaluate", EVALUATE_KEYS, optional=EVALUATE_KEYS)
    settings = EVALUATE_DEFAULTS | section
    one_of(settings["pooling"], "evaluate.pooling", POOLINGS)
    one_of(
        settings["backend"], "evaluate.backend", EXACT_BACKENDS
    )  # checkpoints have no int8 graph; a release does
    whole_number(settings["max_tokens"], "evaluate.max_tokens", minimum=1)
    checkpoints = section.get("checkpoints", [])
    if not isinstance(checkpoints, list) or not all(isinstance(c, str) for c in checkpoints):
        raise ParamsError(f"params.yaml: evaluate.checkpoints must be a list of names, got {checkpoints!r}")
    if "prompt" in section:
        try:
            PromptSettings(**(section["prompt"] or {}))
        except (TypeError, ValueError) as exc:
            raise ParamsError(f"params.yaml: evaluate.prompt: {exc}") from exc
