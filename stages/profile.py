"""Print a profile (a YAML file of params.yaml overrides) as ``dvc exp run`` flags: ``-S key=value`` per leaf.

dvc exp run -n paper $(python -m stages.profile profiles/paper.yaml)      # what `make exp PROFILE=paper` runs
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys; lists and scalars are leaves (DVC sets a list as a whole)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def set_flags(profile: Path) -> list[str]:
    overrides = flatten(yaml.safe_load(Path(profile).read_text()) or {})
    # JSON is valid YAML, so DVC parses lists, null and numbers back to what the profile says.
    return [f"-S={key}={json.dumps(value, separators=(',', ':'))}" for key, value in overrides.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", help="a profiles/<name>.yaml file")
    parser.add_argument("--run", action="store_true", help="run `dvc exp run` instead of printing it")
    parser.add_argument("--name", help="experiment name (default: the profile's file name)")
    args = parser.parse_args(argv)
    command = [
        "dvc",
        "exp",
        "run",
        "-n",
        args.name or Path(args.profile).stem,
        *set_flags(Path(args.profile)),
    ]
    print(" ".join(shlex.quote(part) for part in command))
    if args.run:
        raise SystemExit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
