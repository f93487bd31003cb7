"""A team's second clone gets the pipeline's outputs from a DVC remote and reruns nothing whose inputs did not
change: one clone runs stages and pushes to a local remote folder, a fresh `git clone` of it pulls and finds every
pulled stage up to date (`dvc status`, `dvc repro`), with the same bytes. The real dvc.yaml and params.yaml, the
SentEval mirror and the bundled model; the stages whose outputs are data (fetch) and a checkpoint (base)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

MIRROR = Path(os.environ.get("SENTEVAL_MIRROR") or ROOT.parent / "shared" / "senteval")
STAGES = ("fetch", "base")  # data/raw (the mirror's files) and models/base (a model folder)
pytestmark = pytest.mark.skipif(not (MIRROR / "STS").is_dir(), reason="needs the SentEval mirror")


def run(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # dvc.yaml's `python`: this venv's
        SENTEVAL_MIRROR=str(MIRROR),
        SENTCL_MLFLOW="0",
        DVC_NO_ANALYTICS="1",
    )
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def dvc(cwd: Path, *args: str) -> str:
    return run(cwd, sys.executable, "-m", "dvc", *args)


def digests(clone: Path) -> dict[str, str]:
    """Every output file of the pulled stages, by path: its md5 as DVC computes it."""
    import hashlib

    folders = (clone / "data" / "raw", clone / "models" / "base")
    files = [p for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()]
    return {str(p.relative_to(clone)): hashlib.md5(p.read_bytes()).hexdigest() for p in files}


def test_a_second_clone_pulls_the_outputs_and_reruns_nothing(tmp_path):
    remote, first, second = tmp_path / "remote", tmp_path / "first", tmp_path / "second"
    run(tmp_path, "git", "clone", "-q", str(ROOT), str(first))
    dvc(first, "remote", "add", "--local", "-d", "team", str(remote))
    out = dvc(first, "repro", *STAGES)
    assert all(f"Running stage '{stage}'" in out for stage in STAGES), out
    dvc(first, "push")
    author = ("-c", "user.name=t", "-c", "user.email=t@t")
    # --allow-empty: the committed dvc.lock may already hold these very outputs (a run of the same code and data)
    run(first, "git", *author, "commit", "--allow-empty", "-qam", "outputs of fetch and base")

    run(tmp_path, "git", "clone", "-q", str(first), str(second))
    dvc(second, "remote", "add", "--local", "-d", "team", str(remote))
    dvc(second, "pull", *STAGES)
    assert digests(second) == digests(first) and digests(second)
    assert "up to date" in dvc(second, "status", *STAGES)
    out = dvc(second, "repro", *STAGES)
    assert "Running stage" not in out and all(f"'{stage}' didn't change" in out for stage in STAGES), out
