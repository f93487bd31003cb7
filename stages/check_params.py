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

from sentcl import params_check as rules
from sentcl.data.fetching import FetchConfig
from sentcl.model.quantize import QuantizeConfig
from sentcl.model.teacher import TeacherConfig
from sentcl.params import FlowConfig, ParamsError, apply_overrides
from sentcl.params_check import SECTIONS
from sentcl.registry.rules import GateConfig, GateLimits, LeaseTimes
from sentcl.retrain.config import RetrainConfig
from sentcl.training import recipes
from sentcl.training.config import ConfigError, TrainConfig
from sentcl.training.data import INIT_NAMES
from sentcl_mlflow.exit_codes import EXIT_BAD_INPUT
from sentcl_mlflow.serve import ServeLimits
from sentcl_mlflow.store import TrackingConfig
from stages.common import METRICS, load_params, params_arguments
from stages.training import stage_config
from stages.transfer import transfer_config


def _check_training(params: dict[str, Any]) -> None:
    """The three training stages' configs as they build them (stage_config stops with one line itself)."""
    stage_config(params, "pretrain_nli", {"mode": "nli"})
    stage_config(params, "joint", {"mode": "joint"})
    for recipe in INIT_NAMES:
        transfer_config(params, recipe, {})
    rules.check_transfer_text(params)


def _check_retrain_runs(params: dict[str, Any]) -> None:
    """A retrain's runs as the flow builds them: each objective ``retrain.method`` trains, from a model folder
    (recipe base), with ``retrain.transfer`` over ``transfer:``."""
    config = RetrainConfig.from_params(params)
    overlaid = apply_overrides(params, config.overrides)
    for objective in config.objectives:
        try:
            run = TrainConfig.from_sections(
                recipes.transfer_sections(overlaid, "base", {"objective": objective})
            )
        except ConfigError as exc:
            raise ParamsError(f"params.yaml: retrain.transfer: {exc}") from None
        if run.steps < 1:  # a pipeline stage may be left untrained (steps 0); a retrain exists to train
            raise ParamsError(
                f"params.yaml: retrain.transfer: steps: at least 1 for a retrain's {objective} run, got 0"
            )


CHECKS: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("top level", rules.check_top),
    ("model", rules.check_model),
    ("data", FetchConfig.from_params),
    ("training", _check_training),
    ("teacher", TeacherConfig.from_params),
    ("retrain", RetrainConfig.from_params),
    ("retrain runs", _check_retrain_runs),
    ("evaluate", rules.check_evaluate),
    ("export", QuantizeConfig.from_params),
    ("registry", GateConfig.from_params),
    ("gate", GateLimits.from_params),
    ("promotion", LeaseTimes.from_params),
    ("flows", FlowConfig.from_params),
    ("tracking", TrackingConfig.from_params),
    ("serve", ServeLimits.from_params),
)


def check(params: dict[str, Any]) -> None:
    """Raise a ``ValueError`` (one line, naming the key) for the first section that its config refuses."""
    for _, checker in CHECKS:
        checker(params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    params_arguments(parser)
    parser.add_argument("--output", type=Path, default=METRICS / "params_ok.json")
    args = parser.parse_args(argv)
    params = load_params(args.params, args.overrides)
    try:
        check(params)
    except ValueError as exc:
        print(params.relabel(str(exc)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # the training stages' own check has printed its one line
        return int(exc.code or EXIT_BAD_INPUT)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    # Constant content: a parameter change must not make every stage stale through this file.
    args.output.write_text(json.dumps({"params": "valid"}) + "\n")
    print(f"check_params: {params.label} is valid ({len(SECTIONS)} sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
