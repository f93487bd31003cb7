"""Every dvc.yaml stage lists, as deps, every project module its command imports (transitively), so a code
change always reruns what it affects. The imports are read from the source (ast), lazy ones included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from tests.paths import ROOT

PACKAGES = ("sentcl", "sentcl_mlflow", "sentcl_gx", "stages", "flows")


def module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def imported_modules(path: Path, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # `from pkg import submodule`
    return {m for m in found if m.split(".")[0] in PACKAGES and module_file(m) is not None}


def closure(module: str) -> set[Path]:
    files: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or path in files:
            continue
        files.add(path)
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b runs a/__init__.py
            parent = module_file(".".join(parts[:i]))
            if parent is not None and parent not in files:
                todo.append(".".join(parts[:i]))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo.extend(imported_modules(path, package))
    return files


def docstring_only(path: Path) -> bool:
    """A package marker: a docstring and constants (``__version__``), no imports, no code."""
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr | ast.Assign) and isinstance(n.value, ast.Constant) for n in body)


def stages_with_modules() -> dict[str, tuple[str, list[str]]]:
    with open(ROOT / "dvc.yaml") as f:
        stages = yaml.safe_load(f)["stages"]
    out = {}
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        match = re.search(r"python -m ([\w.]+)", stage["cmd"])
        if match:
            out[name] = (match.group(1), [str(d) for d in stage.get("deps") or []])
    return out


def test_every_stage_lists_the_modules_it_imports():
    missing = {}
    for stage, (module, deps) in stages_with_modules().items():
        covered = [ROOT / d.replace("${item}", "x") for d in deps]
        for path in sorted(closure(module)):
            if path.name == "__init__.py" and docstring_only(path):
                continue  # a package marker with no code changes nothing a stage computes
            if not any(path == dep or dep in path.parents for dep in covered):
                missing.setdefault(stage, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"dvc.yaml deps lack modules their stage imports: {missing}"


def test_the_import_walk_sees_lazy_and_package_imports():
    """The checker itself: register imports sentcl_mlflow lazily inside functions, and sentcl.registry.rules."""
    files = {str(p.relative_to(ROOT)) for p in closure("stages.register")}
    assert {
        "stages/register.py",
        "sentcl_mlflow/registration.py",
        "sentcl/registry/rules.py",
        "sentcl_mlflow/registry/names.py",
        "stages/common.py",
    } <= files
