"""Reading params.yaml as DVC writes it, and the one way every section of it is checked.

PyYAML follows YAML 1.1, where a float needs a dot: ``1e-05`` is the *string* "1e-05". DVC (ruamel, YAML 1.2)
writes exactly that for ``dvc exp run -S transfer.lr=1e-5``, so with ``yaml.safe_load`` an experiment's learning
rate would arrive as text. This loader is PyYAML's safe loader with YAML 1.2's float rule added.

``FlowConfig`` is the ``flows:`` section: read here, below both the flows that use it and the stage
``check_params`` that checks it (stages never import flows).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

import yaml

# The checkout this code runs from: params.yaml, data/, models/ (in a DVC temporary workspace, that workspace).
ROOT = Path(__file__).resolve().parent.parent


class ParamsLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-05``, ``1E5`` and ``-2e+3`` as floats (YAML 1.2)."""


ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(stream: str | bytes | IO[str]) -> Any:
    """``yaml.safe_load`` with YAML 1.2 floats."""
    return yaml.load(stream, Loader=ParamsLoader)  # noqa: S506 - a SafeLoader subclass


class ParamsError(ValueError):
    """A params.yaml value that breaks a rule. The message is one line naming the file, the key and the rule:
    ``params.yaml: teacher.max_tokens must be a whole number >= 1, got 0``."""


FILE = "params.yaml"


def read_section(
    params: Mapping[str, Any], name: str, keys: Sequence[str], optional: Sequence[str] = ()
) -> dict[str, Any]:
    """``params[name]`` checked the same way for every section: a mapping, no key outside ``keys``, every key of
    ``keys`` present except those in ``optional``."""
    section = params.get(name) if isinstance(params, Mapping) else None
    if not isinstance(section, Mapping):
        raise ParamsError(f"{FILE}: section {name!r} is missing or not a mapping")
    unknown = sorted(set(section) - set(keys), key=str)
    if unknown:
        raise ParamsError(
            f"{FILE}: unknown key {unknown[0]!r} in section {name!r} (known: {', '.join(keys)})"
        )
    missing = [k for k in keys if k not in section and k not in optional]
    if missing:
        raise ParamsError(f"{FILE}: {name}.{missing[0]} is missing")
    return dict(section)


def whole_number(value: Any, key: str, minimum: int | None = None) -> int:
    """An int that is not a bool (YAML's ``true`` is an int to Python), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        rule = "a whole number" + (f" >= {minimum}" if minimum is not None else "")
        raise ParamsError(f"{FILE}: {key} must be {rule}, got {value!r}")
    return value


def real_number(value: Any, key: str, minimum: float | None = None, above: float | None = None) -> float:
    """A finite int or float that is not a bool, at least ``minimum`` or strictly above ``above``."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value >= minimum
    if ok and above is not None:
        ok = value > above
    if not ok:
        rule = (
            "a number"
            + (f" >= {minimum}" if minimum is not None else "")
            + (f" > {above}" if above is not None else "")
        )
        raise ParamsError(f"{FILE}: {key} must be {rule}, got {value!r}")
    return float(value)


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ParamsError(f"{FILE}: {key} must be true or false, got {value!r}")
    return value


def text(value: Any, key: str, what: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ParamsError(f"{FILE}: {key} must be {what}, got {value!r}")
    return value


def one_of(value: Any, key: str, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ParamsError(f"{FILE}: {key} {value!r} is not one of {', '.join(map(str, choices))}")
    return value


@dataclass(frozen=True)
class FlowConfig:
    """params.yaml ``flows:``: how long anything may run, and how often a transient failure is retried."""

    stage_timeout_s: float  # one stage subprocess (a `dvc repro <stage>`, a retrain step)
    flow_timeout_s: float  # a whole flow run
    retries: int  # of a stage that exited EXIT_TRANSIENT
    retry_delay_s: float
    gate_wait_s: float  # how long a flow waits for the gate process's verdict on its candidate

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> FlowConfig:
        raw = read_section(params, "flows", [f.name for f in fields(cls)])
        values = {name: real_number(value, f"flows.{name}", minimum=0) for name, value in raw.items()}
        return cls(
            values["stage_timeout_s"],
            values["flow_timeout_s"],
            int(values["retries"]),
            values["retry_delay_s"],
            values["gate_wait_s"],
        )
