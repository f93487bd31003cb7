"""Stage ``check_params``: every section of params.yaml read through the config that uses it, before any other
stage runs.

DVC deletes a stage's outputs before it runs the stage, so a wrong value found by the stage itself
(``dvc exp run -S transfer.lr=fast``) would cost the outputs it replaces. Every other stage depends on this
stage's small output, so DVC runs this first and stops at its one line (exit 2) with nothing deleted::

    python -m stages.check_params [--params FILE] [--output metrics/params_ok.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flows.common import FlowConfig
from sentcl.domain import retrain_method
from sentcl.fast_encode import BACKENDS
from sentcl.fetching import FetchConfig
from sentcl.model_pooling import POOLINGS, PromptSettings
from sentcl.registry import GateConfig
from sentcl.teacher import TeacherConfig
from sentcl.training_data import INIT_NAMES, TEXT_CHOICES
from sentcl_mlflow.store import TrackingConfig
from stages.common import EXIT_BAD_INPUT, METRICS, load_params, params_label, relabel
from stages.training import stage_config
from stages.transfer import transfer_config

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
    "registry",
    "flows",
    "tracking",
)
EVALUATE_KEYS = ("pooling", "prompt", "backend", "max_tokens", "checkpoints")


class ParamsError(ValueError):
    """One line naming the key and the rule."""


def _check_top(params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]!r} (known: {', '.join(SECTIONS)})")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise ParamsError(f"params.yaml: section {missing[0]!r} is missing")
    if isinstance(params["seed"], bool) or not isinstance(params["seed"], int):
        raise ParamsError(f"params.yaml: seed must be an integer, got {params['seed']!r}")


def _check_model(params: dict[str, Any]) -> None:
    model = params["model"]
    if not isinstance(model, dict) or sorted(model) != ["max_length", "name"]:
        keys = sorted(model) if isinstance(model, dict) else model
        raise ParamsError(f"params.yaml: model must have exactly the keys name and max_length, got {keys!r}")
    if not isinstance(model["name"], str) or not model["name"].strip():
        raise ParamsError(f"params.yaml: model.name must be a model id or folder, got {model['name']!r}")
    length = model["max_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ParamsError(f"params.yaml: model.max_length must be an integer >= 2, got {length!r}")


def _check_training(params: dict[str, Any]) -> None:
    """The three training stages' configs as they build them (stage_config stops with one line itself)."""
    stage_config(params, "pretrain_nli", {"mode": "nli"})
    stage_config(params, "joint", {"mode": "joint"})
    for recipe in INIT_NAMES:
        transfer_config(params, recipe, {})
    transfer_config(params, "base", {"objective": "tsdae"})  # the retrain flow's TSDAE runs
    section = params["transfer"]
    texts = section.get("texts")
    if texts not in TEXT_CHOICES and not (isinstance(texts, str) and Path(texts).exists()):
        raise ParamsError(
            f"params.yaml: transfer.texts {texts!r} is neither one of {', '.join(TEXT_CHOICES)} nor a file or folder"
        )
    limit = section.get("max_texts")
    if limit not in (None, "all") and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ParamsError(f"params.yaml: transfer.max_texts must be a positive integer or all, got {limit!r}")


def _check_evaluate(params: dict[str, Any]) -> None:
    section = params["evaluate"]
    if not isinstance(section, dict):
        raise ParamsError("params.yaml: section 'evaluate' is not a mapping")
    unknown = sorted(set(section) - set(EVALUATE_KEYS))
    if unknown:
        raise ParamsError(
            f"params.yaml: unknown key {unknown[0]!r} in section 'evaluate' (known: {', '.join(EVALUATE_KEYS)})"
        )
    if section.get("pooling", "last-avg") not in POOLINGS:
        raise ParamsError(
            f"params.yaml: evaluate.pooling {section['pooling']!r} is not one of {', '.join(POOLINGS)}"
        )
    if section.get("backend", "onnx") not in BACKENDS:
        raise ParamsError(
            f"params.yaml: evaluate.backend {section['backend']!r} is not one of {', '.join(BACKENDS)}"
        )
    tokens = section.get("max_tokens", 512)
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


CHECKS: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("top level", _check_top),
    ("model", _check_model),
    ("data", FetchConfig.from_params),
    ("training", _check_training),
    ("teacher", TeacherConfig.from_params),
    ("retrain", retrain_method),
    ("evaluate", _check_evaluate),
    ("registry", GateConfig.from_params),
    ("flows", FlowConfig.from_params),
    ("tracking", TrackingConfig.from_params),
)


def check(params: dict[str, Any]) -> None:
    """Raise a ``ValueError`` (one line, naming the key) for the first section that its config refuses."""
    for _, checker in CHECKS:
        checker(params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", type=Path, help="params file (default: params.yaml)")
    parser.add_argument("--output", type=Path, default=METRICS / "params_ok.json")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    try:
        check(params)
    except ValueError as exc:
        print(relabel(str(exc), params_label(params)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # the training stages' own check has printed its one line
        return int(exc.code or EXIT_BAD_INPUT)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    # Constant content: a parameter change must not make every stage stale through this file.
    args.output.write_text(json.dumps({"params": "valid"}) + "\n")
    print(f"check_params: {params_label(params)} is valid ({len(SECTIONS)} sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
