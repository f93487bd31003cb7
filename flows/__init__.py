"""Prefect flows that compose the DVC stages; they run stages, never re-implement them."""

import os
from pathlib import Path

import stages  # noqa: F401  (telemetry off for every entry point, before Prefect is imported)
from sentcl.params import ROOT

# Without PREFECT_API_URL a flow starts a temporary server; on a busy 2-core machine that takes longer than
# Prefect's 20 s default, and the run would fail before doing anything.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _served_api_url(run_dir: Path) -> str | None:
    """The API of the Prefect server `make serve` started for this checkout, if it is still running."""
    try:
        pid = int((run_dir / "prefect-server.pid").read_text())
        url = (run_dir / "prefect-api-url").read_text().strip()
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return url or None


# One Prefect home for flows started by hand and for `make serve`: this checkout's .prefect/, not ~/.prefect.
# While `make serve` runs, a flow started by hand talks to its server (so the run shows in its UI and shares
# the promotion limit); otherwise its temporary server keeps the runs in the same .prefect/prefect.db, which
# the served UI shows once started.
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
if not os.environ.get("PREFECT_API_URL"):
    _url = _served_api_url(Path(os.environ.get("SENTCL_RUN_DIR") or ROOT / ".run"))
    if _url:
        os.environ["PREFECT_API_URL"] = _url
