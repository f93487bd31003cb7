"""The codebase's plan, checked: imports point one way (lazy imports included), no import circle, no module over
500 lines. The layers and what each may import are the module map of docs/development.md."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("sentcl", "sentcl_mlflow", "sentcl_gx", "stages", "flows", "benchmarks", "sentcl_cli")
MAX_LINES = 500

# A layer may import itself and the layers listed for it, nothing else of the project.
MAY_IMPORT = {
    "sentcl.params": set(),
    "sentcl.digest": set(),
    "sentcl.data": {"sentcl.params", "sentcl.digest"},
    "sentcl.model": {"sentcl.params", "sentcl.digest", "sentcl.data"},
    "sentcl.evaluation": {"sentcl.params", "sentcl.digest", "sentcl.data", "sentcl.model"},
    "sentcl.training": {"sentcl.params", "sentcl.digest", "sentcl.data", "sentcl.model", "sentcl.evaluation"},
    "sentcl.registry": {
        "sentcl.params",
        "sentcl.digest",
        "sentcl.data",
        "sentcl.model",
        "sentcl.evaluation",
        "sentcl.training",
    },
    "sentcl.retrain": {
        "sentcl.params",
        "sentcl.digest",
        "sentcl.data",
        "sentcl.model",
        "sentcl.evaluation",
        "sentcl.training",
        "sentcl.registry",
    },
    "sentcl.params_check": {"sentcl"},
    "sentcl.report": {"sentcl"},
    "sentcl_gx": {"sentcl"},
    "sentcl_mlflow": {"sentcl"},
    "stages": {"sentcl", "sentcl_gx", "sentcl_mlflow"},
    "flows": {"sentcl", "sentcl_gx", "sentcl_mlflow", "stages"},
    "benchmarks": {"sentcl", "sentcl_gx", "sentcl_mlflow", "stages"},
    "sentcl_cli": {"sentcl", "sentcl_gx", "sentcl_mlflow", "stages", "flows"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports anywhere in its body (a ``from pkg import mod`` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known] or [
                base
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a.b.name -> a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def layer(name: str) -> str:
    return max((key for key in MAY_IMPORT if name == key or name.startswith(key + ".")), key=len, default="")


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, name, known) for name, path in known.items()}


def test_every_module_is_in_a_layer():
    assert [name for name in graph() if name != "sentcl" and not layer(name)] == []


def test_imports_point_one_way():
    wrong = []
    for name, targets in graph().items():
        own = layer(name)
        if not own:
            continue
        for target in targets:
            if target == "sentcl" or layer(target) == own:
                continue
            allowed = MAY_IMPORT[own]
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                wrong.append(f"{name} -> {target}")
    assert wrong == [], "imports against the module map (docs/development.md):\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    edges = graph()
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert circles == [], "import circles:\n" + "\n".join(circles)


def test_no_module_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
