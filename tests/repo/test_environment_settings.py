"""The one table of environment settings (docs/deployment.md) names every ``SENTCL_*`` variable the code reads, and
nothing else: a new variable without a row, or a row for one no code reads any more, fails here."""

from __future__ import annotations

import re

from tests.paths import ROOT

NAME = re.compile(r"\bSENTCL_[A-Z0-9_]*[A-Z0-9]\b")
CODE = ("sentcl", "sentcl_mlflow", "sentcl_cli", "sentcl_gx", "flows", "stages", "infra", "benchmarks")
SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".example", ""}


def code_names() -> set[str]:
    found = set(NAME.findall((ROOT / "Makefile").read_text()))
    for folder in CODE:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                found |= set(NAME.findall(path.read_text(errors="replace")))
    return found


def table_names() -> set[str]:
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("## Environment settings", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `SENTCL_")]
    return {name for row in rows for name in NAME.findall(row.split("|")[1])}


def test_every_environment_variable_the_code_reads_has_a_row_and_every_row_a_reader():
    code, table = code_names(), table_names()
    assert code - table == set(), f"read by the code, missing from the table: {sorted(code - table)}"
    assert table - code == set(), f"in the table, read by no code: {sorted(table - code)}"


def test_the_promotion_lease_is_tuned_in_params_yaml_not_the_environment():
    assert "SENTCL_PROMOTION" not in " ".join(sorted(code_names()))
    assert "promotion:" in (ROOT / "params.yaml").read_text()
