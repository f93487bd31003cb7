"""A saved model folder's bytes depend on the model, not on how the process that saved it was started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

SAVE = """
import sys
from sentcl.model.encoder import Encoder
Encoder.from_pretrained(sys.argv[1]).save(sys.argv[2])
"""


def _save_copy(source: Path, target: Path, offline: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if offline:  # what `make` exports; a bare `dvc repro` or a flow's subprocess may not
        env["HF_HUB_OFFLINE"] = "1"
    subprocess.run(
        [sys.executable, "-c", SAVE, str(source), str(target)], cwd=ROOT, env=env, check=True, timeout=300
    )


def test_a_folder_saved_offline_and_online_is_byte_identical(tiny_model, tmp_path):
    """transformers records the hub's offline flag of the loading process in tokenizer_config.json
    (``local_files_only``); left in, the same weights written under `make run` and under a bare `dvc repro`
    differed by that one word, so DVC saw a new model and reran everything downstream."""
    offline, online = tmp_path / "offline", tmp_path / "online"
    _save_copy(tiny_model, offline, offline=True)
    _save_copy(tiny_model, online, offline=False)
    names = sorted(p.relative_to(offline) for p in offline.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(online) for p in online.rglob("*") if p.is_file())
    for name in names:
        assert (offline / name).read_bytes() == (online / name).read_bytes(), name
    assert "local_files_only" not in (offline / "tokenizer_config.json").read_text()
