"""What a failure means for the command that met it: try again (exit 75) or a person must act (exit 2).

The one table of error -> exit code for every stage and flow entry point: :data:`TRANSIENT` and
:data:`BAD_INPUT` by type (:func:`typed_exit`, which ``stages.cli.run_cli`` and ``flows.common.cli_errors``
use with their own bad-input types), and a failed MLflow call (:func:`one_line`, also ``run_main``'s): one line
on stderr and a typed exit code instead of a traceback. The flows retry a stage only on exit 75
(``flows.common``), so a tracking server that died or hung mid-stage is retried, and a refusal is not. Decided
by the error's type (and MLflow's error code), never by its message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from sentcl.params import InputError, ParamsError
from sentcl_mlflow.exit_codes import EXIT_BAD_INPUT, EXIT_TRANSIENT
from sentcl_mlflow.pyfunc_checks import WeightsMismatchError
from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError, tracking_uri

EXIT_REFUSED = EXIT_BAD_INPUT  # a person must act (credentials, permissions)
REFUSED_CODES = ("PERMISSION_DENIED", "UNAUTHENTICATED")


class NoChampionError(LookupError):
    """Nothing is registered as champion (yet)."""


class GateRefusedError(WeightsMismatchError):
    """The gate refused a version before moving ``champion``: a file differs from the manifest recorded at
    registration, or the download holds no model it can score. The version is tagged refused; nothing moved."""


class PromotionLockTimeout(TimeoutError):
    """Another promotion held the lease for longer than this gate was willing to wait."""


# The table, by type. Exit 75, try again: the tracking server did not answer, the promotion lease stayed busy
# or was lost (PromotionLeaseLost is a PromotionLockTimeout).
TRANSIENT = (TrackingUnavailableError, PromotionLockTimeout)
# Exit 2, the error's message is the line: what a person must fix or ask for (PromotionLeaseDenied is a
# TrackingAuthError). A caller adds its own (a stage's BadInput, a flow's ServiceUnavailable).
BAD_INPUT = (ParamsError, InputError, TrackingAuthError, NoChampionError, WeightsMismatchError)


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
        # The server answered only 5xx/429 until MLflow's retries ran out ("too many 503 error responses"): its
        # database or artifact store is down behind it (a 503 is MLflow's TEMPORARILY_UNAVAILABLE, a SQLAlchemy
        # OperationalError). MLflow's client re-raises it as a plain MlflowException, this as __context__.
        requests.exceptions.RetryError,
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
    """``ConnectionRefusedError`` / ``ReadTimeout``: the innermost network error's name, for the one line; with
    its message for a server that answered only 5xx (``ResponseError: too many 503 error responses``)."""
    cause = network_cause(error) or error
    inner = cause
    seen: set[int] = set()
    while id(inner) not in seen:  # requests wraps urllib3, which wraps the socket error
        seen.add(id(inner))
        reason = getattr(inner, "reason", None) or (inner.args[0] if inner.args else None)
        if not isinstance(reason, BaseException):
            break
        inner = reason
    import urllib3

    # It did answer, with 5xx until the retries ran out.
    if isinstance(inner, urllib3.exceptions.ResponseError):
        return f"{type(inner).__name__}: {inner}"  # "ResponseError: too many 503 error responses"
    return type(inner).__name__


def one_line(name: str, error: BaseException) -> tuple[int, str] | None:
    """(exit code, the line to print) for a failure of MLflow or of the promotion lease; None for others."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, TRANSIENT):  # a lease busy or lost: a retry takes a fresh one
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


def typed_exit(
    name: str,
    error: BaseException,
    bad_input: tuple[type[BaseException], ...] = (),
    transient_note: str = f"exit {EXIT_TRANSIENT}: try again",
    missing_is_bad_input: bool = False,
) -> tuple[int, str] | None:
    """(exit code, line) for an error the table knows by type: :data:`TRANSIENT`, :data:`BAD_INPUT` and the
    caller's own ``bad_input``; with ``missing_is_bad_input``, MLflow's RESOURCE_DOES_NOT_EXIST (a ``--version``
    that is not there) too. None for anything else: the caller then asks :func:`one_line`."""
    if isinstance(error, TRANSIENT):
        return EXIT_TRANSIENT, f"{name}: {error} ({transient_note})"
    if isinstance(error, BAD_INPUT + bad_input):
        return EXIT_BAD_INPUT, f"{name}: {error}"
    if missing_is_bad_input:
        from mlflow.exceptions import MlflowException

        if isinstance(error, MlflowException) and error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return EXIT_BAD_INPUT, f"{name}: {error.message}"
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
