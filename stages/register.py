"""Stage `register`: the release folder of `export` becomes a `challenger` version, then the gate runs.

    python -m stages.register                      # DVC stage: models/export -> the registry, metrics/registry.json
    python -m stages.register --release DIR --domain-dev FILE --tag KEY=VALUE ...   # the retrain flow's candidate

The one entry point of registration (``sentcl_mlflow.registration``): `export` builds the folder, this stage
registers it as ``challenger`` and runs the gate (or, for the candidates of `make serve`'s flows, asks the gate
process and waits for its verdict).

Kept apart from `export` because DVC may restore `export` from its run-cache without running it: a
restored folder must not pretend it was registered. Its output, ``metrics/registry.json``, is a receipt that
git ignores and DVC never restores from its run-cache (``persist``): a fresh clone always registers, and a
clone that did is clean in ``dvc status``. ``make register`` forces a run; it is cheap to repeat: weights already registered (same sha256) are found, not
registered again, and the gate on them is idempotent. Inside ``dvc exp run`` / ``make exp`` it registers
into ``registry.experiment_model_name``; ``SENTCL_REGISTER_PRODUCTION=1`` asks for the production model.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from sentcl.registry.rules import GateConfig
from sentcl_mlflow.registration import PYFUNC_MODEL
from stages.cli import BadInput, run_cli
from stages.common import (
    METRICS,
    PROCESSED,
    argument_parser,
    load_params,
    offline_hub,
    params_arguments,
)
from stages.export import OUTPUT


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--release", type=Path, default=OUTPUT, help="folder written by stages.export")
    parser.add_argument("--summary", type=Path, default=METRICS / "registry.json")
    parser.add_argument(
        "--no-gate", action="store_true", help="register the challenger, leave champion alone"
    )
    parser.add_argument("--by", help="who runs the gate (default: $SENTCL_ACTOR or the login name)")
    parser.add_argument(
        "--domain-dev",
        type=Path,
        help="scored pairs (s1<TAB>s2<TAB>score) of the new domain: the gate scores both models on them",
    )
    parser.add_argument("--tag", action="append", default=[], help="KEY=VALUE on the run and the version")
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
    from sentcl_mlflow.registration import Release, log_and_register, registry_summary
    from sentcl_mlflow.registry.names import target_model_name

    params = load_params(args.params, args.overrides)
    config = GateConfig.from_params(params)
    info_file = args.release / "export.json"
    if not info_file.is_file():
        raise BadInput(
            f"{info_file}: no release here; run `dvc repro export` (python -m stages.export) first"
        )
    if args.domain_dev is not None and not args.domain_dev.is_file():
        raise BadInput(f"{args.domain_dev}: --domain-dev: no such file")
    info = json.loads(info_file.read_text())
    info["model_name"] = target_model_name(config)  # decided now: a cached export may come from an experiment
    if not store.tracking_enabled():
        print("register: tracking is off (SENTCL_MLFLOW=0); nothing registered")
        summary = {"registered_version": None}
    else:
        store.bound_requests(store.TrackingConfig.from_params(params))  # its MLflow requests (tracking:)
        tags = dict(value.partition("=")[::2] for value in args.tag)
        inputs = [args.release]
        if args.domain_dev:
            tags["domain_dev_sha256"] = hashlib.sha256(args.domain_dev.read_bytes()).hexdigest()
            inputs.append(args.domain_dev)
        release = Release(args.release, info, info["sts_row"], PYFUNC_MODEL, inputs, tags)
        result = log_and_register(
            release,
            params,
            not args.no_gate,
            args.by,
            dev_pairs=args.processed / "pairs.parquet",
            domain_dev=args.domain_dev,  # the gate scores the candidate and the champion on it itself
        )
        summary = {"checkpoint": info["checkpoint"], **registry_summary(result)}
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli("register", main))
