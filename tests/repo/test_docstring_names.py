"""Docstrings and comments name code that exists: every dotted ``sentcl...`` name they mention imports (a module,
or an attribute of one). MLflow tag keys such as ``sentcl.manifest`` are not code: a name the code itself uses as a
string is left alone."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize

from tests.paths import ROOT

PACKAGES = ("sentcl", "sentcl_mlflow", "sentcl_cli", "stages", "flows", "benchmarks", "infra")
DOTTED = re.compile(r"\bsentcl(?:_mlflow|_cli)?(?:\.[A-Za-z_]\w*)+")


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _prose(source: str) -> list[str]:
    """The docstrings and comments of one file."""
    tree = ast.parse(source)
    texts = [
        ast.get_docstring(node, clean=False) or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return texts + [t.string for t in tokens if t.type == tokenize.COMMENT]


def _strings_in_code(source: str) -> set[str]:
    """String constants starting with ``sentcl.`` that the code uses as values (tag keys and the like)."""
    return {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value)
    }


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                found = getattr(found, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_sentcl_name_a_docstring_or_comment_mentions_exists():
    sources = {path: path.read_text() for path in _sources()}
    values = set().union(*(_strings_in_code(source) for source in sources.values()))
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path, source in sources.items()
        for text in _prose(source)
        for name in {match.rstrip(".") for match in DOTTED.findall(text)}
        if not any(name == value or name.startswith(value + ".") for value in values) and not _resolves(name)
    )
    assert not missing, "docstrings or comments name code that does not exist:\n" + "\n".join(missing)
