"""Resume state (``sentcl.training.resume``): a real ``kill -9`` of a training stage mid-run, then a second run that
resumes and ends where an uninterrupted run ends (same curves, every step's loss and STS-B dev, and the same final
weights); what the fingerprint covers; a state of another run or an unreadable one."""

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

from sentcl.training.resume import ResumeState, fingerprint, inputs_digest
from tests import paths
from tests.tiny import make_tiny_encoder, train_config, write_tiny_processed

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


def parts(seed: int, steps: int) -> tuple[dict, torch.Generator]:
    """A model, its optimizer and scheduler after ``steps`` steps, and a views generator, all from ``seed``."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step(), scheduler.step()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}, torch.Generator().manual_seed(
        seed
    )


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_saved_state_restores_the_parts_and_the_random_state(tmp_path):
    saved, generator = parts(1, steps=2)
    state = ResumeState(tmp_path / "run", "f1", saved, None, generator, torch.device("cpu"))
    state.save({"step": 7, "rows": [{"step": 7}]})
    expected = [torch.rand(3), torch.rand(3, generator=generator)]  # the draws after the save

    fresh, other = parts(2, steps=1)
    assert not same(fresh["model"].parameters(), saved["model"].parameters())
    progress = ResumeState(tmp_path / "run", "f1", fresh, None, other, torch.device("cpu")).load()
    assert progress["step"] == 7 and progress["rows"] == [{"step": 7}]
    assert same(fresh["model"].parameters(), saved["model"].parameters())
    assert fresh["scheduler"].get_last_lr() == saved["scheduler"].get_last_lr() == [0.1 / 3]
    moments = [fresh["optimizer"].state[p]["exp_avg"] for p in fresh["model"].parameters()]
    assert same(moments, [saved["optimizer"].state[p]["exp_avg"] for p in saved["model"].parameters()])
    assert torch.equal(torch.rand(3), expected[0]) and torch.equal(
        torch.rand(3, generator=other), expected[1]
    )


def test_a_state_of_another_fingerprint_starts_afresh_and_an_unreadable_one_names_its_folder(
    tmp_path, caplog
):
    saved, generator = parts(1, steps=1)
    ResumeState(tmp_path / "run", "f1", saved, None, generator, torch.device("cpu")).save({"step": 3})
    fresh, other = parts(2, steps=1)
    before = [p.detach().clone() for p in fresh["model"].parameters()]
    assert ResumeState(tmp_path / "run", "f2", fresh, None, other, torch.device("cpu")).load() is None
    assert "belongs to another config or data set: starting afresh" in caplog.text
    assert same(before, fresh["model"].parameters())  # nothing loaded

    (tmp_path / "run" / "state.pt").write_bytes(b"half a file")
    with pytest.raises(
        RuntimeError, match=f"unreadable resume state .*; delete {tmp_path / 'run'} to start afresh"
    ):
        ResumeState(tmp_path / "run", "f1", fresh, None, other, torch.device("cpu")).load()


def test_the_fingerprint_covers_config_data_init_weights_and_selection_but_not_the_device():
    config = train_config(lr=1e-3, device="cpu")
    model = torch.nn.Linear(4, 3)
    data = inputs_digest(["a man", "a dog"], model)
    base = fingerprint(config, 1, data, [], None)
    assert (
        fingerprint(train_config(lr=1e-3, device="auto"), 1, data, [], None) == base
    )  # another machine resumes
    assert fingerprint(train_config(lr=2e-3, device="cpu"), 1, data, [], None) != base
    assert fingerprint(config, 2, data, [], None) != base  # another world size splits batches otherwise
    assert fingerprint(config, 1, inputs_digest(["a man", "a cat"], model), [], None) != base
    with torch.no_grad():
        model.bias[0] += 1e-6
    assert fingerprint(config, 1, inputs_digest(["a man", "a dog"], model), [], None) != base
    assert fingerprint(config, 1, data, [("a", "b", 1.0)], 2.0) != base  # selection on a domain dev set
