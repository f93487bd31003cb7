"""Prefect flows that compose the DVC stages; they run stages, never re-implement them."""

import os

# Without PREFECT_API_URL a flow starts a temporary server; on a busy 2-core machine that takes longer than
# Prefect's 20 s default, and the run would fail before doing anything.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
