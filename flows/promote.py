"""The promotion gate alone, and rollback.

    python -m flows.promote                        # gate the `challenger` against the `champion`
    python -m flows.promote --version 7            # gate a given version
    python -m flows.promote --rollback --reason "bad answers on support tickets" [--by alice]

With ``PREFECT_API_URL`` set (a Prefect server, as under `make serve`) the gate runs as a flow that holds the
server-wide promotion slot; without it, it runs directly under the file lock beside the tracking store, so a
hand-run gate does not wait for a temporary Prefect server. Both re-read the champion after taking the lock.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from prefect import flow

from flows.common import promotion_slot
from stages import tracking


@flow(name="sentcl-promote", log_prints=True)
def promote_flow(
    version: str | None = None, actor: str | None = None, model: str | None = None
) -> dict[str, Any]:
    with promotion_slot():
        return tracking.promote(model, version=version, actor=actor)


@flow(name="sentcl-rollback", log_prints=True)
def rollback_flow(reason: str, actor: str | None = None, model: str | None = None) -> dict[str, Any]:
    with promotion_slot():
        return tracking.rollback(model, actor=actor, reason=reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the promotion gate, or roll the champion back.")
    parser.add_argument("--version", help="version to gate (default: the challenger alias)")
    parser.add_argument("--model", help="registered model (default: params registry.model_name)")
    parser.add_argument("--rollback", action="store_true", help="give champion back to the previous champion")
    parser.add_argument("--reason", default="manual rollback", help="why (recorded on both versions)")
    parser.add_argument("--by", default=None, help="who (default: $SENTCL_ACTOR or the login name)")
    args = parser.parse_args(argv)
    orchestrated = bool(os.environ.get("PREFECT_API_URL"))
    try:
        if args.rollback:
            if orchestrated:
                rollback_flow(args.reason, args.by, args.model)
            else:
                tracking.rollback(args.model, actor=args.by, reason=args.reason)
        elif orchestrated:
            promote_flow(args.version, args.by, args.model)
        else:
            tracking.promote(args.model, version=args.version, actor=args.by)
    except (LookupError, tracking.TrackingUnavailableError) as e:
        print(f"promote: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
