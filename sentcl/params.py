"""Reading params.yaml as DVC writes it.

PyYAML follows YAML 1.1, where a float needs a dot: ``1e-05`` is the *string* "1e-05". DVC (ruamel, YAML 1.2)
writes exactly that for ``dvc exp run -S transfer.lr=1e-5``, so with ``yaml.safe_load`` an experiment's learning
rate would arrive as text. This loader is PyYAML's safe loader with YAML 1.2's float rule added.
"""

from __future__ import annotations

import re
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
