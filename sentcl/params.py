"""Reading params.yaml as DVC writes it.

PyYAML follows YAML 1.1, where a float needs a dot: ``1e-05`` is the *string* "1e-05". DVC (ruamel, YAML 1.2)
writes exactly that for ``dvc exp run -S transfer.lr=1e-5``, so with ``yaml.safe_load`` an experiment's learning
rate would arrive as text. This loader is PyYAML's safe loader with YAML 1.2's float rule added.

``FlowConfig`` is the ``flows:`` section: read here, below both the flows that use it and the stage
``check_params`` that checks it (stages never import flows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import IO, Any

import yaml


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


@dataclass(frozen=True)
class FlowConfig:
    """params.yaml ``flows:``: how long anything may run, and how often a transient failure is retried."""

    stage_timeout_s: float  # one stage subprocess (a `dvc repro <stage>`, a retrain step)
    flow_timeout_s: float  # a whole flow run
    retries: int  # of a stage that exited EXIT_TRANSIENT
    retry_delay_s: float

    @classmethod
    def from_params(cls, params: dict) -> FlowConfig:
        raw = params.get("flows")
        if not isinstance(raw, dict):
            raise ValueError("params.yaml: section 'flows' is missing or not a mapping")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(
                f"params.yaml: unknown key {unknown[0]!r} in section 'flows' (known: {', '.join(names)})"
            )
        missing = [n for n in names if n not in raw]
        if missing:
            raise ValueError(f"params.yaml: flows.{missing[0]} is missing")
        for name in names:
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"params.yaml: flows.{name} must be a number >= 0, got {value!r}")
        return cls(
            float(raw["stage_timeout_s"]),
            float(raw["flow_timeout_s"]),
            int(raw["retries"]),
            float(raw["retry_delay_s"]),
        )
