"""A real ``kill -9`` of a training stage mid-run, then a second run that resumes and ends where an
uninterrupted run ends: same curves (every step's loss and STS-B dev) and the same final weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests import paths
from tests.tiny import make_tiny_encoder, write_tiny_processed

ROOT = str(paths.ROOT)


def stage_command(tmp_path, run: str) -> list[str]:
    return [
        sys.executable, "-m", "stages.transfer", "--init", str(tmp_path / "model"),
        "--params", str(tmp_path / "params.yaml"), "--processed", str(tmp_path / "processed"),
        "--output", str(tmp_path / run / "out"), "--metrics-dir", str(tmp_path / run / "metrics"),
        "--checkpoints-dir", str(tmp_path / run / "checkpoints"),
    ]  # fmt: skip


def run_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}


@pytest.fixture
def setup(tmp_path):
    make_tiny_encoder(tmp_path, name="model")
    write_tiny_processed(tmp_path / "processed")
    params = yaml.safe_load(open(os.path.join(ROOT, "params.yaml")))  # the real defaults, shortened
    params["seed"], params["model"] = 3, {"name": "unused", "max_length": 32}
    # A pull toward the init (L2-SP) as well: a resumed run must pull toward the init, not the resumed weights.
    params["train"].update(eval_steps=40, save_steps=10, patience=1000, device="cpu", init_decay=20.0)
    params["transfer"].update(steps=120, batch_size=16, lr=2e-3, eval_steps=40)
    params["transfer"]["base"]["views"] = ["shuffle", "token_cutoff"]
    params["transfer"]["base"]["objective"] = "contrastive"  # the recipe distils by default; no teacher here
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def test_kill_and_resume_matches_an_uninterrupted_run(setup):
    tmp_path = setup
    state = tmp_path / "killed" / "checkpoints" / "transfer-custom" / "state.pt"
    process = subprocess.Popen(stage_command(tmp_path, "killed"), cwd=ROOT, env=run_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 120
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)  # let it run on past the checkpoint, so the resumed run must discard work
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert state.exists(), "the run finished or never checkpointed before the kill"
    assert not (tmp_path / "killed" / "out").exists()
    killed_at = torch.load(state, weights_only=True)["step"]  # no pickled code in resume state
    assert 0 < killed_at < 120

    # The resumed and the uninterrupted runs go in-process (one thread, like the killed one): only the kill
    # needs a process of its own, and every interpreter start costs seconds.
    from stages import transfer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float sums depend on the thread count; the killed process ran on one
    try:
        transfer.main(stage_command(tmp_path, "killed")[3:])
        transfer.main(stage_command(tmp_path, "whole")[3:])
    finally:
        torch.set_num_threads(threads)

    assert not state.parent.exists()  # resume state removed on completion
    curves = [
        (tmp_path / run / "metrics" / "curves" / "transfer-custom.csv").read_text()
        for run in ("killed", "whole")
    ]
    assert curves[0] == curves[1] and len(curves[0].splitlines()) == 122
    a, b = (load_file(tmp_path / run / "out" / "model.safetensors") for run in ("killed", "whole"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
