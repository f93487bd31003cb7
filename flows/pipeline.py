"""The whole pipeline as a Prefect flow: one task per DVC stage, in dvc.yaml order.

    python -m flows.pipeline                 # every stage; DVC skips what is up to date
    python -m flows.pipeline --stage export  # that stage (and, through DVC, what it needs)
    python -m flows.pipeline --set flows.retries=0 --set flows.flow_timeout_s=3600

DVC decides what is up to date (no Prefect result cache on top); a task retries a stage only when it exits
75 (EX_TEMPFAIL: a server or lock did not answer). Every stage has a timeout (params.yaml ``flows``, read when
the run starts). The register task holds the promotion slot, so a pipeline and a retrain queue for the gate.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from prefect import flow

from flows.common import bounded, promotion_slot, retried, run_stage, stage_task
from sentcl.params import FlowConfig, ParamsError, parse_override, read_params
from sentcl.registry.rules import LeaseTimes
from stages.common import ROOT, argument_parser, fail

GATED_STAGES = {"register"}


def stage_names(repo: Path = ROOT) -> list[str]:
    with open(Path(repo) / "dvc.yaml") as f:
        return list((yaml.safe_load(f) or {}).get("stages") or {})


def flow_settings(overrides: Sequence[str] = ()) -> FlowConfig:
    """params.yaml ``flows:`` with ``overrides``: only ``flows.*`` keys, since the stages themselves read
    params.yaml through DVC (an experiment with other values: ``make exp SET=...``). A :class:`ParamsError`
    otherwise."""
    for override in overrides:
        key = parse_override(override)[0]
        if not key.startswith("flows."):
            raise ParamsError(
                f"pipeline: --set {override!r}: only flows.* keys (the stages read params.yaml through DVC; "
                "for an experiment with other values: make exp SET=...)"
            )
    return FlowConfig.from_params(read_params(None, overrides))


@stage_task(task_run_name="dvc repro {stage}")  # DVC is the cache; Prefect always asks it
def repro(
    stage: str, slot_wait_s: float, force: bool = False, repo: Path = ROOT, timeout_s: float = 0
) -> str:
    """``dvc repro stage``; a stage that gates (``GATED_STAGES``) inside the server's promotion slot, waited for
    at most ``slot_wait_s`` (params ``promotion.wait_s``)."""
    cmd = [sys.executable, "-m", "dvc", "repro", stage] + (["--force"] if force else [])
    if stage in GATED_STAGES:
        with promotion_slot(slot_wait_s):
            return run_stage(cmd, cwd=repo, timeout_s=timeout_s)
    return run_stage(cmd, cwd=repo, timeout_s=timeout_s)


@flow(name="sentcl-pipeline", log_prints=True)
def run_pipeline(
    stages: list[str] | None = None,
    force: bool = False,
    repo: str | None = None,
    overrides: list[str] | None = None,
) -> list[str]:
    """Reproduce ``stages`` (default all, in dvc.yaml order, which is topological for this project's file),
    each task with the retries and timeout of params.yaml ``flows:`` and ``overrides`` (``flows.*`` only).
    ``repo``: another DVC repository (tests: a scratch one)."""
    config = flow_settings(overrides or ())
    slot_wait_s = LeaseTimes.from_params(read_params(None, overrides or ())).wait_s  # the same one read
    root = Path(repo) if repo else ROOT
    order = stage_names(root)
    selected = [s for s in order if stages is None or s in stages]
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; dvc.yaml has {order}")
    run = retried(repro, config)
    for stage in selected:
        run(stage, slot_wait_s, force=force, repo=root, timeout_s=config.stage_timeout_s)
    return selected


def configured(config: FlowConfig) -> Any:
    """The pipeline flow bounded by ``config`` (``flows.flow_timeout_s``); its tasks' retries and timeouts
    come from the same params inside the run."""
    return bounded(run_pipeline, config)


@flow(name="sentcl-pipeline", log_prints=True)
def pipeline(
    stages: list[str] | None = None,
    force: bool = False,
    repo: str | None = None,
    overrides: list[str] | None = None,
) -> list[str]:
    """The deployments' entry point (infra/prefect.yaml): params.yaml ``flows:`` read when the run starts,
    then :func:`run_pipeline` bounded by them, as this run's subflow."""
    return configured(flow_settings(overrides or ()))(stages, force, repo, overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--stage", action="append", help="only these stages (repeatable)")
    parser.add_argument("--force", action="store_true", help="dvc repro --force for the selected stages")
    parser.add_argument(
        "--stage-timeout", type=float, help="seconds per stage (= --set flows.stage_timeout_s=N)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="flows.KEY=VALUE",
        help="a params.yaml flows: value for this run: timeouts, retries (flows.retries=0)",
    )
    args = parser.parse_args(argv)
    overrides = args.overrides + (
        [f"flows.stage_timeout_s={args.stage_timeout:g}"] if args.stage_timeout is not None else []
    )
    try:
        config = flow_settings(overrides)
    except ParamsError as e:
        fail(str(e))
    from flows.common import check_prefect_api, cli_errors

    with cli_errors("pipeline"):
        check_prefect_api()
        configured(config)(stages=args.stage, force=args.force, overrides=overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
