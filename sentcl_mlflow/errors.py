"""What a failed MLflow call means for the command that made it: try again (exit 75) or refused (exit 2).

Every stage and flow entry point that talks to MLflow ends through :func:`one_line`: one line on stderr and
a typed exit code instead of a traceback. The flows retry a stage only on exit 75 (``flows.common``), so a
tracking server that died or hung mid-stage is retried, and a refusal is not. Decided by the error's type
(and MLflow's error code), never by its message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError, tracking_uri

EXIT_TRANSIENT = os.EX_TEMPFAIL  # 75, as stages.common.EXIT_TRANSIENT: "try again later"
EXIT_REFUSED = 2  # as stages.common.EXIT_BAD_INPUT: a person must act (credentials, permissions)
REFUSED_CODES = ("PERMISSION_DENIED", "UNAUTHENTICATED")


def _network_types() -> tuple[type[BaseException], ...]:
    import http.client

    import requests
    import urllib3.exceptions

    return (
        requests.exceptions.ConnectionError,
        # A server killed while it sends a response: "Connection broken: IncompleteRead" (requests raises it
        # inside an except block, so its urllib3 ProtocolError is only __context__).
        requests.exceptions.ChunkedEncodingError,
        http.client.IncompleteRead,
        requests.exceptions.Timeout,
        urllib3.exceptions.MaxRetryError,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.TimeoutError,
    )


def network_cause(error: BaseException | None) -> BaseException | None:
    """The connection failure (refused, reset, timed out) behind ``error``, or None.

    MLflow's REST client re-raises a requests error as a plain ``MlflowException`` (INTERNAL_ERROR), with
    the requests error only as ``__cause__`` (timeouts) or ``__context__`` (everything else, raised without
    ``from``): so the chain is followed, ``__context__`` only out of an MlflowException."""
    from mlflow.exceptions import MlflowException

    from sentcl_mlflow.registry.lease import PromotionLockTimeout

    network = _network_types()
    # A socket's own errors count only behind an HTTP client's: a bare TimeoutError is also what a busy
    # lease (PromotionLockTimeout) or Prefect's concurrency slot raises, with the server answering all along.
    sockets = (ConnectionError, TimeoutError)
    seen: set[int] = set()
    first = error
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, network) or (
            error is not first and isinstance(error, sockets) and not isinstance(error, PromotionLockTimeout)
        ):
            return error
        nxt = error.__cause__
        if nxt is None and isinstance(error, MlflowException):
            nxt = error.__context__
        error = nxt
    return None


def unreachable(error: BaseException) -> bool:
    """The tracking server (or its artifact proxy) did not answer: refused, reset or timed out."""
    return isinstance(error, TrackingUnavailableError) or network_cause(error) is not None


def describe(error: BaseException) -> str:
    """``ConnectionRefusedError`` / ``ReadTimeout``: the innermost network error's name, for the one line."""
    cause = network_cause(error) or error
    inner = cause
    seen: set[int] = set()
    while id(inner) not in seen:  # requests wraps urllib3, which wraps the socket error
        seen.add(id(inner))
        reason = getattr(inner, "reason", None) or (inner.args[0] if inner.args else None)
        if not isinstance(reason, BaseException):
            break
        inner = reason
    return type(inner).__name__


def one_line(name: str, error: BaseException) -> tuple[int, str] | None:
    """(exit code, the line to print) for a failure of MLflow or of the promotion lease; None for others."""
    from mlflow.exceptions import MlflowException

    from sentcl_mlflow.registry.lease import PromotionLockTimeout

    if isinstance(error, TrackingUnavailableError):
        return EXIT_TRANSIENT, f"{name}: {error} (exit {EXIT_TRANSIENT}: try again)"
    if isinstance(error, PromotionLockTimeout):  # busy or lost: a retry takes a fresh lease
        return EXIT_TRANSIENT, f"{name}: {error} (exit {EXIT_TRANSIENT}: try again)"
    if unreachable(error):
        return EXIT_TRANSIENT, (
            f"{name}: MLflow tracking server {tracking_uri()} stopped answering ({describe(error)}); "
            f"nothing more was written (exit {EXIT_TRANSIENT}: try again)"
        )
    if isinstance(error, TrackingAuthError):  # PromotionLeaseDenied too
        return EXIT_REFUSED, f"{name}: {error}"
    if isinstance(error, MlflowException) and str(error.error_code) in REFUSED_CODES:
        who = os.environ.get("MLFLOW_TRACKING_USERNAME") or "no account"
        return EXIT_REFUSED, f"{name}: MLflow refused {who}: {error.message.splitlines()[0]}"
    return None


def run_main(name: str, main: Callable[..., Any], *args: Any) -> int:
    """``sys.exit(run_main("transfer", main))``: main's own exit code, or one line and 75 / 2 for what
    :func:`one_line` knows. Anything else is a bug and keeps its traceback."""
    try:
        code = main(*args)
    except Exception as error:  # noqa: BLE001 (classified by type; re-raised when unknown)
        known = one_line(name, error)
        if known is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]
    return int(code or 0)
