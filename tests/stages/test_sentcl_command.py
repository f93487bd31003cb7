"""The installed ``sentcl`` command, run as a user runs it: a real process of the environment's console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import make_tiny_encoder

SENTCL = Path(sys.executable).parent / "sentcl"
COMMANDS = [
    "run",
    "pipeline",
    "embed",
    "evaluate",
    "export",
    "register",
    "retrain",
    "promote",
    "rollback",
    "serve",
    "stop",
]

pytestmark = pytest.mark.skipif(not SENTCL.exists(), reason="no console script: pip install -e . installs it")


def sentcl(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SENTCL), *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_help_lists_every_subcommand_with_what_it_does():
    done = sentcl("--help")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.split("commands:\n")[1].splitlines() if line.strip()]
    assert listed == COMMANDS
    assert "retrain the champion on new domain text" in done.stdout


@pytest.mark.parametrize(
    "command, says",
    [
        ("embed", "Embed a file of sentences"),
        ("retrain", "Retrain the champion on new domain text"),
        ("rollback", "Roll the champion back"),
        ("pipeline", "one task per DVC stage"),
        ("run", "Reproduce complete or partial pipelines"),  # dvc repro's own help
        ("stop", "stop what serve started"),
        ("register", "Stage `register`: the release folder"),
        ("export", "Stage `export`: the best checkpoint"),
    ],
)
def test_a_subcommands_help_is_its_entry_points_own(command, says):
    done = sentcl(command, "--help")
    assert done.returncode == 0, done.stderr
    assert says in done.stdout
    if command != "run":
        assert done.stdout.startswith(f"usage: sentcl {command} ")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["embed", "--input", "a.txt", "--output", "b.npy", "--bogus"], "unrecognized arguments: --bogus"),
        (["rollback", "--version", "3"], "unrecognized arguments: --version 3"),  # a promote-only option
        (["pipeline", "--set", "transfer.lr=1e-5"], "only flows.* keys"),
        (["nonsense"], "no command 'nonsense'"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(argv, says):
    done = sentcl(*argv)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr


def test_bad_input_reaches_the_entry_point_and_is_refused_there(tmp_path):
    done = sentcl("embed", "--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "v.npy"))
    assert done.returncode == 2
    assert done.stderr.startswith("embed: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "v.npy").exists()


def test_embed_writes_vectors_with_a_given_model(tmp_path):
    model = make_tiny_encoder(tmp_path, "tiny", max_length=16)
    lines = ["a man is playing guitar", "two dogs", "a man is playing guitar"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "v.npy"
    argv = ["--input", "in.txt", "--output", "v.npy", "--model", str(model), "--no-progress"]
    done = sentcl("embed", *argv, "--backend", "sentence-transformers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    vectors = np.load(out)
    assert (
        vectors.shape[0] == 3
        and np.allclose(vectors[0], vectors[2])
        and not np.allclose(vectors[0], vectors[1])
    )
