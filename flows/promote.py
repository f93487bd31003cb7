"""The promotion gate alone, and rollback.

    python -m flows.promote                        # gate the `challenger` against the `champion`
    python -m flows.promote --version 7            # gate a given version
    python -m flows.promote --rollback --reason "bad answers on support tickets" [--by alice]
    python -m flows.promote --version 7 --force --by alice   # a rolled-back version (or its weights) again
    python -m flows.promote --version 7 --domain-dev pairs.tsv  # a retrain's version, on its domain too
    python -m flows.promote --set flows.stage_timeout_s=600     # the run's timeout (params.yaml flows:)

Before ``champion`` moves the gate downloads the candidate and the champion, checks every file against the
manifest recorded at registration (a changed file: one line, exit 2, the version tagged refused) and scores
both itself on STS-B dev and SICK-R trial (``--processed``: the validate stage's pairs.parquet) and on the
``--domain-dev`` pairs when given; it compares those numbers, never the score tags of a registration.

Only a person runs this, with the gate's MLflow account in their own environment
(``MLFLOW_TRACKING_USERNAME/_PASSWORD``): no deployment runs it, and under `make serve` the worker and its
flow runs hold the registrar's account, which cannot take the production lease or move ``champion`` (a
deployment pointed at ``promote_flow`` by the holder of the Prefect auth string fails there). `make serve`'s
gate process judges the flows' candidates on its own (``sentcl_mlflow.registry.gatekeeper``).

With ``PREFECT_API_URL`` set (a Prefect server, as under `make serve`) the gate runs as a flow that holds the
server-wide promotion slot; without it, it runs directly. Either way the gate takes the promotion lease in
the registry (sentcl_mlflow.registry.lease.promotion_lock), which serialises it against every other machine, and
re-reads the champion after taking it. Exit 0 when the gate ran (promoted or not); 2 with one line when it
could not (no such version, credentials refused, an account other than the gate's); 75 with one line when
trying again later may work (the lease is busy or was lost, the tracking server did not answer).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import bounded, check_prefect_api, cli_errors, promotion_slot
from sentcl.params import FlowConfig, ParamsError
from sentcl.registry.rules import LeaseTimes
from sentcl.registry.verdict import Override
from sentcl_mlflow.errors import PromotionLockTimeout
from sentcl_mlflow.exit_codes import EXIT_TRANSIENT
from sentcl_mlflow.pyfunc_checks import WeightsMismatchError
from sentcl_mlflow.registry.gate import promote, rollback
from sentcl_mlflow.registry.lease import PromotionLeaseDenied, PromotionLeaseLost
from sentcl_mlflow.registry.measure import Evidence
from sentcl_mlflow.store import TrackingConfig, bound_requests
from stages.common import PROCESSED, argument_parser, fail, load_params, params_arguments

# The error an in-process flow run of main() ended on. Prefect logs a flow's exception with its traceback
# before re-raising it; for an error a person acts on the flow returns a Failed state instead (its message
# is the error), and main() raises the error kept here, which ends in one line like the direct path.
_ended_on: list[BaseException] = []


def _expected(error: BaseException) -> bool:
    from flows.common import prefect_unreachable
    from sentcl_mlflow.errors import one_line

    if prefect_unreachable(error) is not None:  # the Prefect server died mid-run: one line, exit 75
        return True
    return isinstance(error, LookupError | WeightsMismatchError) or (
        isinstance(error, Exception) and one_line("promote", error) is not None
    )


def _quietly(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:
        if not _expected(error):
            raise
        from prefect.states import Failed

        _ended_on.append(error)
        return Failed(message=f"{type(error).__name__}: {error}")


def _evidence(processed: str | None, domain_dev: str | None) -> Evidence:
    """The gate's dev pairs: the validate stage's pairs.parquet (``processed``: another folder), a domain's."""
    return Evidence(Path(processed or PROCESSED) / "pairs.parquet", Path(domain_dev) if domain_dev else None)


@flow(name="sentcl-promote", log_prints=True)
def promote_flow(
    version: str | None = None,
    actor: str | None = None,
    model: str | None = None,
    force: bool = False,
    processed: str | None = None,
    domain_dev: str | None = None,
    params_file: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    params = load_params(params_file, overrides or [])  # a deployment's run: this process's one read
    bound_requests(TrackingConfig.from_params(params))
    with promotion_slot(LeaseTimes.from_params(params).wait_s):
        return promote(params, model, version, _evidence(processed, domain_dev), Override(actor, force))


@flow(name="sentcl-promote", log_prints=True)
def _promote_cli_flow(
    version: str | None = None,
    actor: str | None = None,
    model: str | None = None,
    force: bool = False,
    processed: str | None = None,
    domain_dev: str | None = None,
    params_file: str | None = None,
    overrides: list[str] | None = None,
) -> Any:
    flow_args = (version, actor, model, force, processed, domain_dev, params_file, overrides)
    return _quietly(lambda: promote_flow.fn(*flow_args))


@flow(name="sentcl-rollback", log_prints=True)
def rollback_flow(
    reason: str,
    actor: str | None = None,
    model: str | None = None,
    params_file: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    params = load_params(params_file, overrides or [])  # a deployment's run: this process's one read
    bound_requests(TrackingConfig.from_params(params))
    with promotion_slot(LeaseTimes.from_params(params).wait_s):
        return rollback(params, model, actor=actor, reason=reason)


@flow(name="sentcl-rollback", log_prints=True)
def _rollback_cli_flow(
    reason: str,
    actor: str | None = None,
    model: str | None = None,
    params_file: str | None = None,
    overrides: list[str] | None = None,
) -> Any:
    return _quietly(lambda: rollback_flow.fn(reason, actor, model, params_file, overrides))


def _run_flow(state) -> None:  # noqa: ANN001 (a Prefect State)
    """Re-raise what the flow run ended on (one line below); an unexpected failure keeps its traceback."""
    if _ended_on:
        raise _ended_on.pop()
    state.result()


def configured(config: FlowConfig, rollback: bool) -> Any:
    """The flow main() runs with a Prefect server, the gate's or the rollback's, bounded like one stage:
    params.yaml ``flows.stage_timeout_s`` of the run's params (0 = none)."""
    return bounded(_rollback_cli_flow if rollback else _promote_cli_flow, config, config.stage_timeout_s)


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="registered model (default: params registry.model_name)")
    parser.add_argument(
        "--by",
        default=None,
        help="a note of who asked (default $SENTCL_ACTOR), recorded as *_by_note and not verified; who acted is "
        "recorded from the MLflow account the server authenticated",
    )
    params_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("Run the promotion gate, or roll the champion back.")
    parser.add_argument("--version", help="version to gate (default: the challenger alias)")
    parser.add_argument("--rollback", action="store_true", help="give champion back to the previous champion")
    parser.add_argument("--reason", default="manual rollback", help="why (recorded on both versions)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="gate a rolled-back version (or the same weights) anyway; needs --by NAME. Score rules still apply",
    )
    parser.add_argument(
        "--processed", help="folder with the validate stage's pairs.parquet (default data/processed)"
    )
    parser.add_argument(
        "--domain-dev", help="scored pairs (s1<TAB>s2<TAB>score): the gate scores both models on them too"
    )
    parser.add_argument(
        "--allow-pipeline-change",
        action="store_true",
        help="promote a candidate whose served pipeline (modules, vector size, normalisation) differs from the "
        "champion's, on its scores; needs --by NAME; in-process only (no PREFECT_API_URL)",
    )
    _common_arguments(parser)
    return _execute(parser.parse_args(argv))


def rollback_main(argv: list[str] | None = None) -> int:
    """``python -m flows.promote --rollback`` with only the options a rollback reads."""
    parser = argument_parser("Roll the champion back to the previous champion, with a reason.")
    parser.add_argument("--reason", default="manual rollback", help="why (recorded on both versions)")
    _common_arguments(parser)
    parser.set_defaults(rollback=True, version=None, force=False, processed=None, domain_dev=None)
    return _execute(parser.parse_args(argv))


def _execute(args: argparse.Namespace) -> int:
    if args.force and not args.by:
        print("promote: --force needs the name of the person forcing it: --by NAME", file=sys.stderr)
        return 2
    if getattr(args, "allow_pipeline_change", False) and (not args.by or os.environ.get("PREFECT_API_URL")):
        print(
            "promote: --allow-pipeline-change needs --by NAME and an in-process run (unset PREFECT_API_URL)",
            file=sys.stderr,
        )
        return 2
    settings = load_params(args.params, args.overrides)  # the process's params: the gate reads them too
    try:
        config = FlowConfig.from_params(settings)
        bound_requests(TrackingConfig.from_params(settings))  # this process's MLflow requests
    except ParamsError as e:
        fail(settings.relabel(str(e)))
    promote_run, rollback_run = configured(config, rollback=False), configured(config, rollback=True)
    orchestrated = bool(os.environ.get("PREFECT_API_URL"))
    from mlflow.exceptions import MlflowException

    def run() -> None:
        if orchestrated:
            check_prefect_api()
        read = (str(args.params) if args.params else None, list(args.overrides or []))
        if args.rollback:
            if orchestrated:
                _run_flow(rollback_run(args.reason, args.by, args.model, *read, return_state=True))
            else:
                rollback(settings, args.model, actor=args.by, reason=args.reason)
        elif orchestrated:
            flow_args = (args.version, args.by, args.model, args.force, args.processed, args.domain_dev)
            _run_flow(promote_run(*flow_args, *read, return_state=True))
        else:
            allow = getattr(args, "allow_pipeline_change", False)
            override = Override(args.by, args.force, allow)
            promote(settings, args.model, args.version, _evidence(args.processed, args.domain_dev), override)

    with cli_errors("promote"):
        try:
            run()
        except (LookupError, PromotionLeaseDenied) as e:
            print(f"promote: {e}", file=sys.stderr)
            return 2
        except (PromotionLockTimeout, PromotionLeaseLost) as e:
            print(f"promote: {e}", file=sys.stderr)
            return EXIT_TRANSIENT
        except MlflowException as e:
            if e.error_code not in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
                raise
            who = os.environ.get("MLFLOW_TRACKING_USERNAME") or "no account"
            print(f"promote: MLflow refused {who}: {e.message.splitlines()[0]}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
