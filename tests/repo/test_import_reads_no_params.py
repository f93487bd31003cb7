"""Importing an entry point reads no params file: settings are read where a process starts (its main(), a
flow run), after the command line, so ``--params``/``--set`` reach them. Checked in a fresh interpreter whose
audit hook refuses any open of a file named params.yaml (however the code would reach it)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import ROOT

GUARD = """
import importlib, sys

def refuse(event, args):
    if event == "open" and str(args[0]).endswith("params.yaml"):
        raise RuntimeError(f"params read at import: {args[0]}")

sys.addaudithook(refuse)
for name in sys.argv[1:]:
    importlib.import_module(name)
print("imported", len(sys.argv) - 1)
"""


def entry_modules() -> list[str]:
    names = []
    for package in ("stages", "flows", "sentcl_cli"):
        for path in sorted((ROOT / package).glob("*.py")):
            if path.stem == "__main__":  # running it is its purpose
                continue
            names.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return names


def imports(*names: str, code: str = GUARD) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_importing_every_stage_and_flow_module_reads_no_params():
    names = entry_modules()
    assert {"flows.retrain", "flows.pipeline", "flows.promote", "stages.embed"} <= set(names)
    done = imports(*names)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"imported {len(names)}"


def test_the_guard_catches_a_read():
    """The same hook on a module that reads params.yaml when imported: refused, so the test above can fail."""
    code = GUARD.replace(
        "for name in sys.argv[1:]:", "from sentcl.params import read_params\nread_params()\nfor name in []:"
    )
    done = imports(code=code)
    assert done.returncode != 0 and "params read at import" in done.stderr
