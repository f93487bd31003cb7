"""How the export and register stages end: one line and a typed exit code, never a traceback, for what a
person or a flow acts on (the table of ``sentcl_mlflow.errors``: EXIT_BAD_INPUT, EXIT_TRANSIENT)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from sentcl_mlflow.exit_codes import EXIT_TRANSIENT


class BadInput(Exception):
    """Input a person must fix: one line, exit 2."""


def run_cli(name: str, main_fn: Callable[[], int]) -> int:
    """``main_fn()``; a tracking server or lock that did not answer exits EXIT_TRANSIENT (a flow retries),
    input a person must fix exits EXIT_BAD_INPUT, each with one line on stderr."""
    from sentcl_mlflow.errors import one_line, typed_exit

    try:
        return main_fn()
    except Exception as e:  # classified by the table (sentcl_mlflow.errors); re-raised when unknown
        known = typed_exit(
            name,
            e,
            (BadInput, FileNotFoundError),
            transient_note=f"transient: exit {EXIT_TRANSIENT}, try again",
        ) or one_line(name, e)  # MLflow died, hung or refused mid-stage: one line, 75 or 2
        if known is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]
