"""The whole pipeline as a Prefect flow: one task per DVC stage, in dvc.yaml order.

    python -m flows.pipeline                 # every stage; DVC skips what is up to date
    python -m flows.pipeline --stage export  # that stage (and, through DVC, what it needs)

DVC decides what is up to date (no Prefect result cache on top); a task retries a stage only when its failure
looks transient (a lock, a network or a server). The export task holds the promotion slot, so a pipeline and a
retrain cannot run the gate at the same moment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import promotion_slot, retry_if_transient, run_stage
from stages.common import ROOT

GATED_STAGES = {"export"}


def stage_names(repo: Path = ROOT) -> list[str]:
    with open(Path(repo) / "dvc.yaml") as f:
        return list((yaml.safe_load(f) or {}).get("stages") or {})


@task(
    task_run_name="dvc repro {stage}",
    retries=2,
    retry_delay_seconds=[15, 60],
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,  # DVC is the cache; Prefect must always ask it
)
def repro(stage: str, force: bool = False, repo: Path = ROOT) -> str:
    cmd = [sys.executable, "-m", "dvc", "repro", stage] + (["--force"] if force else [])
    if stage in GATED_STAGES:
        with promotion_slot():
            return run_stage(cmd, cwd=repo)
    return run_stage(cmd, cwd=repo)


@flow(name="sentcl-pipeline", log_prints=True)
def pipeline(
    stages: list[str] | None = None,
    force: bool = False,
    repo: str | None = None,
    retry_delay_s: float | None = None,
) -> list[str]:
    """Reproduce ``stages`` (default all, in dvc.yaml order, which is topological for this project's file).

    ``repo`` and ``retry_delay_s`` exist for tests (a scratch DVC repository, no waiting between retries).
    """
    root = Path(repo) if repo else ROOT
    order = stage_names(root)
    selected = [s for s in order if stages is None or s in stages]
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; dvc.yaml has {order}")
    run = repro if retry_delay_s is None else repro.with_options(retry_delay_seconds=retry_delay_s)
    for stage in selected:
        run(stage, force=force, repo=root)
    return selected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the DVC pipeline as a Prefect flow.")
    parser.add_argument("--stage", action="append", help="only these stages (repeatable)")
    parser.add_argument("--force", action="store_true", help="dvc repro --force for the selected stages")
    args = parser.parse_args(argv)
    pipeline(stages=args.stage, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
