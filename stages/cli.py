"""How the export and register stages end: one line and a typed exit code, never a traceback, for what a
person or a flow acts on (stages.common: EXIT_BAD_INPUT, EXIT_TRANSIENT)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from stages.common import EXIT_BAD_INPUT, EXIT_TRANSIENT


class BadInput(Exception):
    """Input a person must fix: one line, exit 2."""


def run_cli(name: str, main_fn: Callable[[], int]) -> int:
    """``main_fn()``; a tracking server or lock that did not answer exits EXIT_TRANSIENT (a flow retries),
    input a person must fix exits EXIT_BAD_INPUT, each with one line on stderr."""
    from sentcl.registry.rules import RegistryConfigError
    from sentcl_mlflow.pyfunc_checks import WeightsMismatchError
    from sentcl_mlflow.registry.lease import PromotionLockTimeout
    from sentcl_mlflow.registry.names import NoChampionError
    from sentcl_mlflow.store import TrackingAuthError, TrackingUnavailableError

    try:
        return main_fn()
    except (TrackingUnavailableError, PromotionLockTimeout) as e:
        print(f"{name}: {e} (transient: exit {EXIT_TRANSIENT}, try again)", file=sys.stderr)
        return EXIT_TRANSIENT
    except (
        BadInput,
        RegistryConfigError,
        TrackingAuthError,
        NoChampionError,
        WeightsMismatchError,
        FileNotFoundError,
    ) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # MLflow died, hung or refused mid-stage: one line, 75 or 2 (sentcl_mlflow.errors)
        from sentcl_mlflow.errors import one_line

        if (known := one_line(name, e)) is None:
            raise
        print(known[1], file=sys.stderr)
        return known[0]
