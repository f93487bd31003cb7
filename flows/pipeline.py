"""The whole pipeline as a Prefect flow: one task per DVC stage, in dvc.yaml order.

    python -m flows.pipeline                 # every stage; DVC skips what is up to date
    python -m flows.pipeline --stage export  # that stage (and, through DVC, what it needs)

DVC decides what is up to date (no Prefect result cache on top); a task retries a stage only when it exits
75 (EX_TEMPFAIL: a server or lock did not answer). Every stage has a timeout (params.yaml ``flows``). The
register task holds the promotion slot, so a pipeline and a retrain queue for the gate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from prefect import flow

from flows.common import flow_config, promotion_slot, run_stage, stage_task
from stages.common import ROOT

GATED_STAGES = {"register"}
SETTINGS = flow_config()


def stage_names(repo: Path = ROOT) -> list[str]:
    with open(Path(repo) / "dvc.yaml") as f:
        return list((yaml.safe_load(f) or {}).get("stages") or {})


@stage_task(SETTINGS, task_run_name="dvc repro {stage}")  # DVC is the cache; Prefect always asks it
def repro(stage: str, force: bool = False, repo: Path = ROOT, timeout_s: float | None = None) -> str:
    cmd = [sys.executable, "-m", "dvc", "repro", stage] + (["--force"] if force else [])
    if stage in GATED_STAGES:
        with promotion_slot():
            return run_stage(cmd, cwd=repo, timeout_s=timeout_s)
    return run_stage(cmd, cwd=repo, timeout_s=timeout_s)


@flow(name="sentcl-pipeline", log_prints=True, timeout_seconds=SETTINGS.flow_timeout_s or None)
def pipeline(
    stages: list[str] | None = None,
    force: bool = False,
    repo: str | None = None,
    retry_delay_s: float | None = None,
    stage_timeout_s: float | None = None,
) -> list[str]:
    """Reproduce ``stages`` (default all, in dvc.yaml order, which is topological for this project's file).

    ``repo`` and ``retry_delay_s`` exist for tests (a scratch DVC repository, no waiting between retries);
    ``stage_timeout_s`` overrides params.yaml ``flows.stage_timeout_s``.
    """
    root = Path(repo) if repo else ROOT
    order = stage_names(root)
    selected = [s for s in order if stages is None or s in stages]
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; dvc.yaml has {order}")
    run = repro if retry_delay_s is None else repro.with_options(retry_delay_seconds=retry_delay_s)
    for stage in selected:
        run(stage, force=force, repo=root, timeout_s=stage_timeout_s)
    return selected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the DVC pipeline as a Prefect flow.")
    parser.add_argument("--stage", action="append", help="only these stages (repeatable)")
    parser.add_argument("--force", action="store_true", help="dvc repro --force for the selected stages")
    parser.add_argument(
        "--stage-timeout", type=float, help="seconds per stage (default flows.stage_timeout_s)"
    )
    args = parser.parse_args(argv)
    from flows.common import check_prefect_api, cli_errors

    with cli_errors("pipeline"):
        check_prefect_api()
        pipeline(stages=args.stage, force=args.force, stage_timeout_s=args.stage_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
