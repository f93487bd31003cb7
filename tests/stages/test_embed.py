"""`python -m stages.embed`: the output format follows the suffix, vectors equal sentence-transformers', and every
refusal is one line with exit code 2 that happens before a model is loaded and loses nothing."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from sentcl.model.embedding_io import fast_settings
from stages import embed
from tests.tiny import make_tiny_encoder

LINES = ["a man is playing guitar", "two dogs", "", "a man is playing guitar", "the girl is eating food"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("embed"), "tiny", max_length=16)


@pytest.fixture(scope="module")
def expected(tiny):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny), device="cpu").encode(LINES)


def text_file(path, lines=LINES):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def refused(capsys, argv) -> str:
    """Run the command, expect exit 2 and exactly one line on stderr; return it."""
    assert embed.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("embed: ")
    return lines[0]


def read_output(path, dim):
    suffix = path.suffix
    if suffix == ".npy":
        return None, np.load(path)
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r["sentence"] for r in rows], np.array([r["embedding"] for r in rows], dtype=np.float32)
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["sentence", *(f"e{i}" for i in range(dim))]
        return [r[0] for r in rows[1:]], np.array(
            [[float(x) for x in r[1:]] for r in rows[1:]], dtype=np.float32
        )
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column_names == ["sentence", "embedding"]
    return table["sentence"].to_pylist(), np.array(table["embedding"].to_pylist(), dtype=np.float32)


@pytest.mark.parametrize("suffix", [".npy", ".jsonl", ".csv", ".parquet"])
def test_output_format_follows_the_suffix_one_row_per_line(tmp_path, tiny, expected, suffix, capsys):
    output = tmp_path / "out" / f"vectors{suffix}"
    assert (
        embed.main(
            ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(output), "--model", str(tiny)]
        )
        == 0
    )
    sentences, vectors = read_output(output, expected.shape[1])
    assert vectors.shape == (len(LINES), expected.shape[1])
    if sentences is not None:
        assert sentences == LINES  # duplicates and the empty line keep their rows, in input order
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert f"{len(LINES)} lines (4 distinct)" in capsys.readouterr().out
    assert [p.name for p in output.parent.iterdir()] == [output.name]  # no temporary file left behind


@pytest.mark.parametrize("name", ["vectors.txt", "vectors.NPZ", "vectors"])
def test_an_unsupported_suffix_is_refused_and_the_existing_file_kept(tmp_path, capsys, name):
    output = tmp_path / name
    output.write_bytes(b"keep me")
    line = refused(capsys, ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(output)])
    assert "unsupported output suffix" in line and ".npy" in line and ".parquet" in line
    assert output.read_bytes() == b"keep me"


def test_an_output_folder_is_refused(tmp_path, capsys):
    (tmp_path / "out.npy").mkdir()
    line = refused(
        capsys, ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(tmp_path / "out.npy")]
    )
    assert "is a folder" in line


# The default model is the registry's champion, and the test's scratch MLflow store has none: a command that
# reached the model step would say so ("has no version with alias"). These refusals name the input instead.
def test_a_missing_input_is_refused_before_the_model(tmp_path, capsys):
    line = refused(capsys, ["--input", str(tmp_path / "nope.txt"), "--output", str(tmp_path / "v.npy")])
    assert line == f"embed: {tmp_path / 'nope.txt'}: no such file"
    assert not (tmp_path / "v.npy").exists()


def test_a_folder_as_input_is_refused(tmp_path, capsys):
    line = refused(capsys, ["--input", str(tmp_path), "--output", str(tmp_path / "v.npy")])
    assert "is a folder" in line and str(tmp_path) in line


def test_a_binary_input_is_refused_naming_the_line(tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(b"one\ntwo\nthr\x00ee\n")
    line = refused(capsys, ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.npy")])
    assert line.startswith(f"embed: {tmp_path / 'in.txt'}:3: binary data")


def test_a_non_utf8_input_is_refused_naming_the_line(tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes("one\ncaf\u00e9\n".encode("latin-1"))
    line = refused(capsys, ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.npy")])
    assert line.startswith(f"embed: {tmp_path / 'in.txt'}:2: not UTF-8")


def test_an_empty_input_is_refused(tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(b"")
    line = refused(capsys, ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.npy")])
    assert "is empty" in line


def test_a_missing_model_folder_is_refused(tmp_path, capsys):
    argv = ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(tmp_path / "v.npy")]
    line = refused(capsys, [*argv, "--model", str(tmp_path / "no-model")])
    assert "no such model folder" in line


def test_no_champion_in_the_registry_is_one_line(tmp_path, capsys):
    argv = ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(tmp_path / "v.npy")]
    assert embed.main(argv) == 2
    # MLflow may log its own lines while it creates the scratch store; ours is the last.
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "embed: sentcl-encoder has no version with alias 'champion'; pass --model FOLDER or a models:/ URI"
    )
    assert not (tmp_path / "v.npy").exists()


def test_long_lines_are_truncated_like_sentence_transformers_and_counted(tmp_path, tiny, capsys):
    from sentence_transformers import SentenceTransformer

    long_line = " ".join(["a man is playing guitar"] * 10)  # ~50 tokens against the tiny model's 16
    lines = ["two dogs", long_line, long_line + " on the street", "the girl"]
    output = tmp_path / "v.npy"
    assert (
        embed.main(
            [
                "--input",
                str(text_file(tmp_path / "in.txt", lines)),
                "--output",
                str(output),
                "--model",
                str(tiny),
            ]
        )
        == 0
    )
    assert "2 truncated to the model's limit" in capsys.readouterr().out
    expected = SentenceTransformer(str(tiny), device="cpu").encode(lines)
    np.testing.assert_allclose(np.load(output), expected, atol=1e-5)


def test_a_normalize_module_is_applied(tmp_path, tiny):
    """A folder ending in Normalize (like the bundled all-MiniLM-L6-v2) gives unit vectors, as sentence-transformers does."""
    import shutil

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    folder = tmp_path / "normalized"
    shutil.copytree(tiny, folder)
    model = SentenceTransformer(str(folder), device="cpu")
    model.append(Normalize())
    model.save(str(folder))
    assert fast_settings(folder) == ("last-avg", True)
    output = tmp_path / "v.npy"
    assert (
        embed.main(
            ["--input", str(text_file(tmp_path / "in.txt")), "--output", str(output), "--model", str(folder)]
        )
        == 0
    )
    np.testing.assert_allclose(
        np.load(output), SentenceTransformer(str(folder), device="cpu").encode(LINES), atol=1e-5
    )
