"""What a Prefect server holds beyond infra/prefect.yaml: its deployments and work pools, listed by name.

    python -m flows.inventory [--prefect-file infra/prefect.yaml] [--pool NAME]

``make serve`` runs it after ``prefect deploy``: every deployment whose name prefect.yaml does not define, and
every work pool that neither prefect.yaml nor ``--pool`` names, is one warning line on stdout (a stale
deployment still runs its flow with the worker's MLflow account; a foreign pool can take a worker's runs).
Nothing is removed: it may be a teammate's, and deleting is one ``prefect`` command the line names. Exit 0
when the server answered (with or without warnings), 1 when it could not be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from sentcl.params import ROOT


def defined(prefect_file: Path) -> tuple[set[str], set[str]]:
    """(deployment names, work pool names) that ``prefect_file`` defines."""
    raw = yaml.safe_load(prefect_file.read_text()) or {}
    deployments = raw.get("deployments") or []
    names = {d["name"] for d in deployments}
    pools = {(d.get("work_pool") or {}).get("name") for d in deployments}
    pools |= {p.get("name") for p in ((raw.get("definitions") or {}).get("work_pools") or {}).values()}
    return names, {p for p in pools if p}


def unknown(prefect_file: Path, pools: set[str]) -> list[str]:
    """One warning line per deployment and work pool on the server that ``prefect_file`` does not define."""
    from prefect.client.orchestration import get_client

    names, known_pools = defined(prefect_file)
    known_pools |= pools
    lines = []
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in _all(client.read_flows)}
        for d in _all(client.read_deployments):
            if d.name not in names:
                full = f"{flows.get(d.flow_id, d.flow_id)}/{d.name}"
                lines.append(
                    f"warning: deployment {full} (pool {d.work_pool_name}) is not defined in "
                    f"{prefect_file.name}; remove it if nobody needs it: prefect deployment delete '{full}'"
                )
        for pool in _all(client.read_work_pools):
            if pool.name not in known_pools:
                lines.append(
                    f"warning: work pool {pool.name} (type {pool.type}) is not defined in {prefect_file.name}; "
                    f"remove it if nobody needs it: prefect work-pool delete '{pool.name}'"
                )
    return lines


def _all(read, page: int = 200) -> list:  # noqa: ANN001 (a client's read_* method that takes limit/offset)
    found, offset = [], 0
    while True:
        batch = read(limit=page, offset=offset)
        found.extend(batch)
        if len(batch) < page:
            return found
        offset += page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List what a Prefect server holds beyond prefect.yaml.")
    parser.add_argument("--prefect-file", type=Path, default=ROOT / "infra" / "prefect.yaml")
    parser.add_argument("--pool", action="append", default=[], help="a pool that is known too (repeatable)")
    args = parser.parse_args(argv)
    try:
        lines = unknown(args.prefect_file, set(args.pool))
    except Exception as e:  # noqa: BLE001 (a warning only: make serve goes on, saying it could not check)
        first = (str(e) or type(e).__name__).splitlines()[0]
        print(f"inventory: could not read the Prefect server ({type(e).__name__}: {first})", file=sys.stderr)
        return 1
    for line in lines:
        print(f"serve: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
