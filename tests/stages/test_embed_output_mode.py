"""`stages.embed` writes its output as any program that honours the umask would (not mkstemp's 0600), and a small
embed prints its two lines and no progress bar of model loading."""

from __future__ import annotations

import os
import stat

import pytest

from stages import embed
from tests.tiny import make_tiny_encoder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_the_output_honours_the_umask(tiny, tmp_path, mask):
    text = tmp_path / "in.txt"
    text.write_text("a man plays\na woman sings\n")
    previous = os.umask(mask)
    try:
        assert (
            embed.main(["--input", str(text), "--output", str(tmp_path / "v.npy"), "--model", str(tiny)]) == 0
        )
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "v.npy").stat().st_mode) == 0o666 & ~mask


def test_a_small_embed_shows_no_loading_bar(tiny, tmp_path, capfd):
    text = tmp_path / "in.txt"
    text.write_text("\n".join(f"sentence {i}" for i in range(5)) + "\n")
    assert (
        embed.main(["--input", str(text), "--output", str(tmp_path / "v.jsonl"), "--model", str(tiny)]) == 0
    )
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and "%|" not in err, err
    assert [line.split(":")[0] for line in out.strip().splitlines()] == ["embed", "embed"]
