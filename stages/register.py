"""Stage `register`: the release folder of `export` becomes a `challenger` version, then the gate runs.

    python -m stages.register                      # DVC stage: models/export -> the registry, metrics/registry.json

Kept apart from `export` because DVC may restore `export` from its run-cache without running it: a
restored folder must not pretend it was registered. Its output, ``metrics/registry.json``, is a receipt that
git ignores and DVC never restores from its run-cache (``persist``): a fresh clone always registers, and a
clone that did is clean in ``dvc status``. ``make register`` forces a run; it is cheap to repeat: weights already registered (same sha256) are found, not
registered again, and the gate on them is idempotent. Inside ``dvc exp run`` / ``make exp`` it registers
into ``registry.experiment_model_name``; ``SENTCL_REGISTER_PRODUCTION=1`` asks for the production model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sentcl.registry.rules import GateConfig
from sentcl_mlflow.release import PYFUNC_MODEL
from stages.cli import BadInput, run_cli
from stages.common import METRICS, PROCESSED, load_params, offline_hub, params_arguments
from stages.export import OUTPUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", type=Path, default=OUTPUT, help="folder written by stages.export")
    parser.add_argument("--summary", type=Path, default=METRICS / "registry.json")
    parser.add_argument(
        "--no-gate", action="store_true", help="register the challenger, leave champion alone"
    )
    parser.add_argument("--by", help="who runs the gate (default: $SENTCL_ACTOR or the login name)")
    parser.add_argument(
        "--processed",
        type=Path,
        default=PROCESSED,
        help="folder with the validate stage's pairs.parquet: the gate scores both models on its dev splits",
    )
    params_arguments(parser)
    args = parser.parse_args(argv)
    offline_hub()
    from sentcl_mlflow import store
    from sentcl_mlflow.registry.names import target_model_name
    from sentcl_mlflow.release import Release, log_and_register, registry_summary

    params = load_params(args.params, args.overrides)
    config = GateConfig.from_params(params)
    info_file = args.release / "export.json"
    if not info_file.is_file():
        raise BadInput(
            f"{info_file}: no release here; run `dvc repro export` (python -m stages.export) first"
        )
    info = json.loads(info_file.read_text())
    info["model_name"] = target_model_name(config)  # decided now: a cached export may come from an experiment
    if not store.tracking_enabled():
        print("register: tracking is off (SENTCL_MLFLOW=0); nothing registered")
        summary = {"registered_version": None}
    else:
        store.bound_requests(store.TrackingConfig.from_params(params))  # its MLflow requests (tracking:)
        release = Release(args.release, info, info["sts_row"], PYFUNC_MODEL, [args.release])
        result = log_and_register(
            release, params, not args.no_gate, args.by, dev_pairs=args.processed / "pairs.parquet"
        )
        summary = {"checkpoint": info["checkpoint"], **registry_summary(result)}
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli("register", main))
