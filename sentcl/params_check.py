"""The rules of params.yaml's sections that no config class holds: the top level, ``model``, ``evaluate`` and the
transfer stage's text. Each check raises ``ParamsError`` (one line naming the key and the rule); the stage
``check_params`` runs them beside the configs' own (``TrainConfig``, ``TeacherConfig``, ``GateConfig``, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentcl.evaluation.models import DEFAULTS as EVALUATE_DEFAULTS
from sentcl.model.fast_encode import EXACT_BACKENDS
from sentcl.model.pooling import POOLINGS, PromptSettings
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
    "flows",
    "tracking",
)
EVALUATE_KEYS = ("pooling", "prompt", "backend", "max_tokens", "checkpoints")


class ParamsError(ValueError):
    """One line naming the key and the rule."""


def check_top(params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]!r} (known: {', '.join(SECTIONS)})")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise ParamsError(f"params.yaml: section {missing[0]!r} is missing")
    if isinstance(params["seed"], bool) or not isinstance(params["seed"], int):
        raise ParamsError(f"params.yaml: seed must be an integer, got {params['seed']!r}")


def check_model(params: dict[str, Any]) -> None:
    model = params["model"]
    if not isinstance(model, dict) or sorted(model) != ["max_length", "name"]:
        keys = sorted(model) if isinstance(model, dict) else model
        raise ParamsError(f"params.yaml: model must have exactly the keys name and max_length, got {keys!r}")
    if not isinstance(model["name"], str) or not model["name"].strip():
        raise ParamsError(f"params.yaml: model.name must be a model id or folder, got {model['name']!r}")
    length = model["max_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ParamsError(f"params.yaml: model.max_length must be an integer >= 2, got {length!r}")


def check_transfer_text(params: dict[str, Any]) -> None:
    """``transfer.texts`` and ``transfer.max_texts``, which the transfer stage reads itself."""
    section = params["transfer"]
    texts = section.get("texts")
    if texts not in TEXT_CHOICES and not (isinstance(texts, str) and Path(texts).exists()):
        raise ParamsError(
            f"params.yaml: transfer.texts {texts!r} is neither one of {', '.join(TEXT_CHOICES)} nor a file or folder"
        )
    limit = section.get("max_texts")
    if limit not in (None, "all") and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ParamsError(f"params.yaml: transfer.max_texts must be a positive integer or all, got {limit!r}")


def check_evaluate(params: dict[str, Any]) -> None:
    section = params["evaluate"]
    if not isinstance(section, dict):
        raise ParamsError("params.yaml: section 'evaluate' is not a mapping")
    unknown = sorted(set(section) - set(EVALUATE_KEYS))
    if unknown:
        raise ParamsError(
            f"params.yaml: unknown key {unknown[0]!r} in section 'evaluate' (known: {', '.join(EVALUATE_KEYS)})"
        )
    settings = EVALUATE_DEFAULTS | section
    if settings["pooling"] not in POOLINGS:
        raise ParamsError(
            f"params.yaml: evaluate.pooling {section['pooling']!r} is not one of {', '.join(POOLINGS)}"
        )
    if (
        settings["backend"] not in EXACT_BACKENDS
    ):  # checkpoints have no int8 graph; only a release folder does
        raise ParamsError(
            f"params.yaml: evaluate.backend {section['backend']!r} is not one of {', '.join(EXACT_BACKENDS)}"
        )
    tokens = settings["max_tokens"]
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ParamsError(f"params.yaml: evaluate.max_tokens must be a positive integer, got {tokens!r}")
    checkpoints = section.get("checkpoints", [])
    if not isinstance(checkpoints, list) or not all(isinstance(c, str) for c in checkpoints):
        raise ParamsError(f"params.yaml: evaluate.checkpoints must be a list of names, got {checkpoints!r}")
    if "prompt" in section:
        try:
            PromptSettings(**(section["prompt"] or {}))
        except (TypeError, ValueError) as exc:
            raise ParamsError(f"params.yaml: evaluate.prompt: {exc}") from exc
