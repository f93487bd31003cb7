"""Evidence the gate trusts: domain dev pairs an operator approved, kept by their sha256 on the production model.

A candidate's registrant may bring domain dev pairs (``--domain-dev``, logged with its run). Their gold scores are
the registrant's to choose: 400 pairs whose gold is the candidate's own cosines score it 100. So the gate process
counts a candidate's domain pairs only when an operator approved exactly those bytes beforehand::

    python -m sentcl_mlflow.registry.evidence approve FILE --by NAME

run with the gate's MLflow account. The approval is a tag of the production registered model
(``sentcl.approved_domain_dev``: sha256 -> who, when, how many pairs), which only an account with EDIT on that
model can write (the gate's and the admin's under `make serve`; the registrar reads it). Pairs nobody approved are
scored and reported with the verdict, and never decide it: STS-B dev and SICK-R trial do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

TAG_APPROVED = "sentcl.approved_domain_dev"


def approved_digests(mlc: MlflowClient, name: str) -> dict[str, dict[str, Any]]:
    """The approved domain dev files of ``name`` (sha256 -> record); {} when none or the model does not exist."""
    from mlflow.exceptions import MlflowException

    from sentcl_mlflow.errors import unreachable

    try:
        tags = mlc.get_registered_model(name).tags or {}
    except MlflowException as e:
        if unreachable(e):
            raise
        return {}
    try:
        table = json.loads(tags.get(TAG_APPROVED) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in table.items() if isinstance(v, dict)} if isinstance(table, dict) else {}


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def approve(path: Path, actor: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Approve the domain dev pairs in ``path`` for the production model: read within params ``gate:``'s limits
    (one line if not), then their sha256 added to the model's approvals under its promotion lease."""
    from mlflow.exceptions import MlflowException

    from sentcl.registry.dev_sets import GateDevSetError, read_domain_pairs
    from sentcl.registry.rules import GateConfig, GateLimits, LeaseTimes
    from sentcl_mlflow.registry.lease import promotion_lock
    from sentcl_mlflow.store import caller_identity, client

    if not actor:
        raise ValueError("approving domain dev pairs needs the name of the person approving them (--by NAME)")
    name = GateConfig.from_params(params).model_name
    limits = GateLimits.from_params(params)
    path = Path(path)
    if not path.is_file():
        raise GateDevSetError(f"{path}: no such file")
    pairs = read_domain_pairs(path, limits, flag="approve")
    digest = file_digest(path)
    mlc = client()
    with promotion_lock(name, LeaseTimes.from_params(params), mlc):
        try:
            mlc.get_registered_model(name)
        except MlflowException:
            mlc.create_registered_model(name)
        table = approved_digests(mlc, name)
        record = {
            "by": caller_identity(),
            "by_note": actor,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "pairs": len(pairs),
            "file": path.name,
        }
        table[digest] = record
        mlc.set_registered_model_tag(name, TAG_APPROVED, json.dumps(table, sort_keys=True))
    return {"model": name, "sha256": digest, **record}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Approve a domain's dev pairs for the gate: only approved pairs count in its decisions."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    approving = commands.add_parser("approve", help="approve FILE (sentence1<TAB>sentence2<TAB>score lines)")
    approving.add_argument("file", type=Path)
    approving.add_argument("--by", required=True, help="who approves them (recorded beside the account)")
    approving.add_argument("--params", type=Path, help="params.yaml to read (default: the checkout's)")
    listing = commands.add_parser("list", help="the approved files of the production model")
    listing.add_argument("--params", type=Path, help="params.yaml to read (default: the checkout's)")
    args = parser.parse_args(argv)

    from sentcl.params import ParamsError, read_params
    from sentcl.registry.dev_sets import GateDevSetError
    from sentcl.registry.rules import GateConfig
    from sentcl_mlflow.errors import one_line
    from sentcl_mlflow.store import client

    try:
        params = read_params(args.params)
        from sentcl_mlflow.store import TrackingConfig, bound_requests

        bound_requests(TrackingConfig.from_params(params))
        if args.command == "list":
            table = approved_digests(client(), GateConfig.from_params(params).model_name)
            for digest, record in sorted(table.items()):
                print(f"{digest}  {record.get('pairs')} pairs  {record.get('file')}  by {record.get('by')}")
            print(f"approved domain dev files: {len(table)}")
            return 0
        done = approve(args.file, args.by, params)
    except (ParamsError, GateDevSetError, ValueError) as e:
        print(f"approve: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        known = one_line("approve", e)
        if known is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]
    print(
        f"approve: {done['file']} ({done['pairs']} pairs, sha256 {done['sha256'][:12]}) counts in "
        f"{done['model']}'s gate from now on; by {done['by']} (--by {done['by_note']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
