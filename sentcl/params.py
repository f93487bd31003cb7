"""params.yaml, read once a process, and the one way every section of it is checked.

:func:`read_params` is the one reader: the file (``ROOT/params.yaml`` or ``--params``) with a command line's
``--set key=value`` overrides applied, into a read-only :class:`Params` that remembers both, so that a stage the
process starts gets the same file and the same overrides (:meth:`Params.command`, the one builder of those
command lines). Every entry point reads them once and passes them down: no code falls back on a process-wide
copy. :func:`merge` is the one
merge of settings (sections over sections, overrides over values).

PyYAML follows YAML 1.1, where a float needs a dot: ``1e-05`` is the *string* "1e-05". DVC (ruamel, YAML 1.2)
writes exactly that for ``dvc exp run -S transfer.lr=1e-5``, so with ``yaml.safe_load`` an experiment's learning
rate would arrive as text. This loader is PyYAML's safe loader with YAML 1.2's float rule added.

``FlowConfig`` is the ``flows:`` section: read here, below both the flows that use it and the stage
``check_params`` that checks it (stages never import flows).
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
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


class InputError(Exception):
    """Input a person must fix (a file another step wrote, a value): its message is one line naming it, and every
    entry point exits 2 on it (``sentcl_mlflow.errors.BAD_INPUT``). Raised by pure code outside ``params.yaml``
    (``sentcl.registry.dev_sets.GateDevSetError``)."""


class ParamsError(ValueError):
    """A params.yaml value that breaks a rule. The message is one line naming the file, the key and the rule:
    ``params.yaml: teacher.max_tokens must be a whole number >= 1, got 0``."""


FILE = "params.yaml"


class Params(Mapping[str, Any]):
    """params.yaml as one process read it: the values (the command line's overrides applied), the file they came
    from and those overrides, so that a stage subprocess is given the same file and the same overrides
    (:meth:`command`). Read-only; a mapping of sections, as the typed configs' ``from_params`` take it."""

    def __init__(self, values: Mapping[str, Any], file: Path, label: str, overrides: Sequence[str] = ()):
        self._values, self.file, self.label, self.overrides = dict(values), file, label, tuple(overrides)
        self.stamp: tuple[int, int, int] | None = None  # the file as read (read_params: not read twice)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self.label!r}, overrides={list(self.overrides)!r})"

    def relabel(self, message: str) -> str:
        """A config error says ``params.yaml: ...``; name the file actually read instead."""
        return self.label + message[len(FILE) :] if message.startswith(FILE + ":") else message

    def overlaid(self, overrides: Sequence[str]) -> Params:
        """These params with more ``key=value`` overrides after this process's own (a retrain's overlay)."""
        values = apply_overrides(self._values, overrides, self.label)
        return Params(values, self.file, self.label, [*self.overrides, *overrides])

    def command(self, module: str, options: Mapping[str, Any] | None = None) -> list[str]:
        """The one way a process starts another entry point (``python -m module``) with the same params: the
        file (unless it is the checkout's params.yaml) and every override, then ``options``: a flag with None
        or False is left out, True is the flag alone, a list repeats the flag, anything else is its text."""
        cmd = [sys.executable, "-m", module]
        cmd += ["--params", str(self.file)] if self.file.resolve() != (ROOT / FILE).resolve() else []
        cmd += [part for override in self.overrides for part in ("--set", override)]
        for flag, value in (options or {}).items():
            values = value if isinstance(value, list | tuple) else [value]
            for item in values:
                if item is None or item is False:
                    continue
                cmd += [flag] if item is True else [flag, str(item)]
        return cmd


# Params dump as the mapping they are (a model card's params.yaml, a sweep cell's params file).
yaml.SafeDumper.add_representer(Params, lambda dumper, params: dumper.represent_dict(dict(params)))


def read_params(path: Path | str | None = None, overrides: Sequence[str] = ()) -> Params:
    """The one reader of params.yaml (or ``path``), with ``overrides`` (``key=value``, DVC's ``-S`` syntax; a key
    params.yaml lacks needs ``+key=value``) applied. A missing, unreadable or malformed file, or an override that
    names no key, is a :class:`ParamsError`: one line naming the file (and line), for exit code 2. Asked again
    for the same file, unchanged since, and the same overrides (a flow's command line checks them, then its flow runs in the same process), they are not read again."""
    global _process
    file = Path(path) if path else ROOT / FILE
    label = str(path) if path else FILE
    if _process is not None and (_process.file.resolve(), _process.overrides) == (
        file.resolve(),
        tuple(overrides),
    ):
        if _process.stamp is not None and _process.stamp == _stamp(file):
            return _process
    try:
        with open(file) as f:
            values = load_yaml(f)
    except FileNotFoundError:
        raise ParamsError(f"{label}: no such params file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{label}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f":{where.line + 1}" if where is not None else ""
        raise ParamsError(f"{label}{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(values, dict):
        raise ParamsError(f"{label}: must be a mapping of sections, got {type(values).__name__}")
    _process = Params(apply_overrides(values, overrides, label), file, label, overrides)
    _process.stamp = _stamp(file)
    return _process


def _stamp(file: Path) -> tuple[int, int, int] | None:
    try:
        stat = file.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def write_params(values: Mapping[str, Any], path: Path) -> Params:
    """``values`` as a params file of their own at ``path`` (a sweep cell, a tuning variant: what its stage run
    reads, kept beside its results); the :class:`Params` that stands for it, for :meth:`Params.command`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(values), sort_keys=False))
    return Params(values, path, str(path))


_process: Params | None = None


def forget_process_params() -> None:
    """Tests only: the next :func:`read_params` reads the file again, whatever it read before."""
    global _process
    _process = None


def apply_overrides(values: Mapping[str, Any], overrides: Sequence[str], label: str = FILE) -> dict[str, Any]:
    """``values`` with each ``key=value`` (a dotted key; the value read as YAML 1.2, as DVC's ``-S`` reads it)
    set; ``+key=value`` may add a key, a plain ``key=value`` must name one that exists."""
    out = merge(values, {})
    for override in overrides:
        key, value, adds = parse_override(override, label)
        *parents, last = key.split(".")
        node: Any = out
        for depth, part in enumerate(parents):
            if not isinstance(node.get(part), dict):
                if not adds:
                    missing = ".".join(parents[: depth + 1])
                    raise ParamsError(f"{label}: override {override!r}: no key {missing!r}")
                node[part] = {}
            node = node[part]
        if last not in node and not adds:
            raise ParamsError(f"{label}: override {override!r}: no key {key!r} (+{key}=... adds one)")
        node[last] = value
    return out


def parse_override(override: str, label: str = FILE) -> tuple[str, Any, bool]:
    """``key=value`` as (dotted key, value read as YAML 1.2, whether it may add the key: ``+key=value``)."""
    key, sep, text = override.partition("=")
    adds = key.startswith("+")
    key = key.removeprefix("+")
    if not sep or not key:
        raise ParamsError(f"{label}: override {override!r} is not key=value")
    return key, load_yaml(text), adds


def dotted(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists, scalars and empty mappings are leaves (DVC sets a list whole)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(dotted(value, name + "."))
        else:
            flat[name] = value
    return flat


def as_overrides(values: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """Nested ``values`` as ``key=value`` overrides of ``params`` (``+key=value`` for a key it lacks), each value
    JSON, which YAML reads back as written (lists, null, numbers): what ``--set`` and ``dvc exp run -S`` take."""
    existing = dotted(params)
    return [
        f"{'' if key in existing else '+'}{key}={json.dumps(value, separators=(',', ':'))}"
        for key, value in dotted(values).items()
    ]


def merge(base: Mapping[str, Any], over: Mapping[str, Any] | None) -> dict[str, Any]:
    """The one merge of settings: ``base`` with ``over`` applied key by key. A mapping over a mapping merges the
    same way, None over a mapping leaves it (a section that says nothing of it), anything else replaces. Neither
    input is changed; the result shares no mapping or list with them."""
    out = copy.deepcopy(dict(base))
    for key, value in (over or {}).items():
        old = out.get(key)
        if isinstance(old, Mapping) and (value is None or isinstance(value, Mapping)):
            out[key] = merge(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


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
