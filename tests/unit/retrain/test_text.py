"""The text a retrain trains on (sentcl.retrain.text): deduplicated into one file, long lines counted, kept."""

from __future__ import annotations

from sentcl.retrain.text import prepare_text


def test_the_domain_text_is_deduplicated_and_long_lines_are_counted_not_refused(tiny_model, tmp_path):
    short, long = "a man is eating", " ".join(["dog"] * 30)  # 6 and 32 tokens with [CLS] and [SEP]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(f"{short}\n{long}\n  {short}  \n")
    (tmp_path / "in" / "b.txt").write_text(f"{long}\nthe cat sleeps\n")
    said: list[str] = []
    summary = prepare_text(
        str(tmp_path / "in"), None, str(tiny_model), 31, tmp_path / "texts.txt", said.append
    )
    assert (tmp_path / "texts.txt").read_text().splitlines() == [short, long, "the cat sleeps"]
    assert summary["path"] == str(tmp_path / "texts.txt")
    assert (summary["sentences"], summary["duplicates"], summary["truncated"]) == (3, 2, 1)
    assert said == ["1 of 3 sentences are longer than model.max_length 31 tokens: truncated there"]
    only = prepare_text(
        str(tmp_path / "in"), [tmp_path / "in" / "b.txt"], str(tiny_model), 32, tmp_path / "b", said.append
    )
    assert (tmp_path / "b").read_text().splitlines() == [long, "the cat sleeps"] and only["truncated"] == 0
