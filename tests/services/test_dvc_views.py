"""The DVC views a person reads (issue 14): the project's dvc.yaml, in a scratch git + DVC repository, with metric
files written by the stages' own writers, gives a `dvc metrics show` that fits 240 columns and holds no wall time
and no path, and a `dvc plots show` that warns about nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT

CHECKPOINTS = ("base", "nli", "joint", "transfer-base", "transfer-nli", "transfer-joint")
TRAINING = ("nli", "joint", "transfer-base", "transfer-nli", "transfer-joint")


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, check=True
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    from sentcl.data.validation import summary
    from sentcl.evaluation.models import write_summaries

    repo = tmp_path_factory.mktemp("views")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    dvc(repo, "init", "-q")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "plots", repo / "plots")
    shutil.copytree(ROOT / "metrics" / "analysis", repo / "metrics" / "analysis")
    (repo / "metrics" / "curves").mkdir(parents=True)
    for stage in TRAINING:
        (repo / "metrics" / "curves" / f"{stage}.csv").write_text(
            "step,loss,lr,stsb_dev\n0,,,86.7\n30,1.2,3e-06,86.9\n"
        )
    # Unrounded scores as evaluate computes them, wall times and paths included: the writers must drop them.
    results = {
        name: {
            "all": {"STS12": 72.36903312975754, "avg": 78.87158009009308 + i / 7},
            "stsb_dev": 86.71698778026186 + i / 3,
            "seconds": 61.98,
            "model": f"/tmp/somewhere/models/{name}",
        }
        for i, name in enumerate(CHECKPOINTS)
    }
    write_summaries(results, repo / "metrics" / "eval")
    report = {"pairs": {"STS12 test": 3108}, "nli_pairs": {"SNLI dev": 9842}, "violations": []}
    (repo / "metrics" / "validate.json").write_text(json.dumps(summary(report)))
    # The training record as stages/training.py writes it (its writer needs a whole training run).
    record = {
        "stsb_dev_step0": 86.72,
        "stsb_dev_best": 87.13,
        "best_step": 60,
        "beat_init": True,
        "steps": 60,
        "stopped_early": False,
        "init": "models/joint",
        "examples": 26289,
        "precision": "bf16",
    }
    (repo / "metrics" / "train").mkdir()
    for stage in TRAINING:
        (repo / "metrics" / "train" / f"{stage}.json").write_text(json.dumps(record))
    return repo


def test_metrics_are_the_small_files_only():
    declared = []
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        for entry in (stage.get("do") or stage).get("metrics", []):
            declared.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    assert "metrics/sts.json" not in declared and "reports/validation.json" not in declared
    assert "metrics/export.json" not in declared
    assert {f"metrics/eval/{name}.json" for name in CHECKPOINTS} <= set(declared)


def test_metrics_show_fits_240_columns_without_times_or_paths(repo):
    shown = dvc(repo, "metrics", "show").stdout
    assert max(len(line) for line in shown.splitlines()) <= 240, shown
    assert "seconds" not in shown and "/tmp" not in shown
    assert "78.87" in shown and "86.72" in shown and "78.8715" not in shown  # two decimals
    assert len(shown.splitlines()) == 1 + 1 + len(TRAINING) + len(CHECKPOINTS)


def test_plots_show_warns_about_nothing(repo, tmp_path):
    result = dvc(repo, "plots", "show", "-o", str(tmp_path / "out"))
    assert "warning" not in (result.stdout + result.stderr).lower(), result.stderr
    assert (tmp_path / "out" / "index.html").is_file()


REGISTER_SCRIPT = """
import json, pathlib
calls = pathlib.Path("calls.log")
calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
receipt = pathlib.Path({receipt!r})
receipt.parent.mkdir(parents=True, exist_ok=True)
receipt.write_text(json.dumps({{"registered_version": str(len(calls.read_text()))}}))
"""


def test_register_runs_on_a_fresh_clone_never_from_run_cache_and_is_clean_after(tmp_path):
    """dvc.yaml's own `register` outputs, in a scratch repository with a counting command in place of the stage:
    `dvc status` is clean after it ran (issue 14), yet a clone without the receipt registers (issue 12)."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["register"]
    assert not stage.get("always_changed")  # would keep `dvc status` from ever being clean
    receipt = next(iter(stage["outs"][0]))
    # Git ignores the receipt, so it never travels with a clone: a fresh clone has an empty registry to fill.
    assert subprocess.run(["git", "check-ignore", "-q", receipt], cwd=ROOT).returncode == 0
    repo = tmp_path
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    dvc(repo, "init", "-q")
    (repo / "export.txt").write_text("weights v1")
    script = repo / "register.py"
    script.write_text(REGISTER_SCRIPT.format(receipt=receipt))
    scratch = {"cmd": f"{sys.executable} register.py", "deps": ["export.txt"], "outs": stage["outs"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"register": scratch}}))

    def calls() -> int:
        return len((repo / "calls.log").read_text())

    def clean() -> bool:
        return json.loads(dvc(repo, "status", "--json").stdout or "{}") == {}

    dvc(repo, "repro")
    assert calls() == 1 and clean()
    dvc(repo, "repro")
    assert calls() == 1  # nothing changed: not registered again
    (repo / receipt).unlink()  # a clone without the receipt (the run-cache holds this very run)
    dvc(repo, "repro")
    assert calls() == 2 and clean()
    (repo / "export.txt").write_text("weights v2")
    dvc(repo, "repro")
    assert calls() == 3 and clean()
