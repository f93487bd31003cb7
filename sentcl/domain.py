"""New-domain text for retraining: read, check and fingerprint it before any training starts.

A file holds one sentence a line; a folder holds such files (``*.txt``, ``*.tsv`` first column is not
special: every line is a sentence). Bad input raises :class:`DomainTextError` with a message a person can act
on, so a retrain on empty, binary or all-duplicate text stops before it costs a GPU hour.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MIN_SENTENCES = 2  # in-batch negatives need at least two distinct sentences


class DomainTextError(ValueError):
    """Domain text that cannot be trained on; the message names the file and the rule."""


@dataclass
class DomainText:
    sentences: list[str]
    files: list[Path]
    sha256: str
    lines_read: int
    duplicates: int
    too_long: list[int] = field(default_factory=list)  # 0-based indices into ``sentences``

    def summary(self) -> dict[str, object]:
        return {
            "files": [str(p) for p in self.files],
            "sha256": self.sha256,
            "lines_read": self.lines_read,
            "sentences": len(self.sentences),
            "duplicates": self.duplicates,
        }


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DomainTextError(f"{path}: folder has no files")
        return files
    if path.is_file():
        return [path]
    raise DomainTextError(f"{path}: no such file or folder")


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data:
        raise DomainTextError(f"{path}: binary file (NUL bytes); expected UTF-8 text, one sentence a line")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DomainTextError(f"{path}: not UTF-8 (byte {e.start}: {e.reason}); re-encode it as UTF-8") from e


def read_domain_text(
    path: Path | str,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
) -> DomainText:
    """Sentences of ``path`` (file or folder), stripped and deduplicated in first-seen order.

    ``sha256`` covers the bytes of every file in name order, so the same text gives the same fingerprint.
    With ``count_tokens`` and ``max_tokens``, a sentence longer than the tokenizer's limit is an error: the
    encoder would silently truncate it, and a truncated sentence teaches the wrong similarity.
    """
    path = Path(path)
    digest = hashlib.sha256()
    seen: dict[str, None] = {}
    lines = 0
    files = _files(path)
    for file in files:
        data = file.read_bytes()
        digest.update(file.name.encode() + b"\0" + data)
        for line in _decode(file, data).splitlines():
            sentence = " ".join(line.split())
            if sentence:
                lines += 1
                seen.setdefault(sentence, None)
    sentences = list(seen)
    if not sentences:
        raise DomainTextError(f"{path}: no sentences (empty or whitespace only)")
    if len(sentences) < MIN_SENTENCES:
        raise DomainTextError(
            f"{path}: {lines} line(s) but only {len(sentences)} distinct sentence(s) after deduplication; "
            f"contrastive training needs at least {MIN_SENTENCES}"
        )
    text = DomainText(sentences, files, digest.hexdigest(), lines, lines - len(sentences))
    if count_tokens is not None and max_tokens is not None:
        text.too_long = [i for i, s in enumerate(sentences) if count_tokens(s) > max_tokens]
        if text.too_long:
            first = sentences[text.too_long[0]]
            raise DomainTextError(
                f"{path}: {len(text.too_long)} sentence(s) exceed the tokenizer limit of {max_tokens} tokens, "
                f"e.g. {first[:80]!r}...; split them into sentences or raise model.max_length"
            )
    return text


def read_scored_pairs(path: Path | str) -> list[tuple[str, str, float]]:
    """A domain dev set: tab-separated ``sentence1, sentence2, score`` (a header line is allowed)."""
    path = Path(path)
    text = _decode(path, path.read_bytes())
    pairs: list[tuple[str, str, float]] = []
    for number, row in enumerate(csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE), 1):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < 3:
            raise DomainTextError(f"{path}:{number}: expected sentence1<TAB>sentence2<TAB>score")
        try:
            score = float(row[2])
        except ValueError:
            if number == 1:  # a header
                continue
            raise DomainTextError(f"{path}:{number}: score {row[2]!r} is not a number") from None
        pairs.append((row[0].strip(), row[1].strip(), score))
    if len(pairs) < 3:
        raise DomainTextError(f"{path}: {len(pairs)} scored pair(s); a Spearman needs at least 3")
    if len({p[2] for p in pairs}) < 2:
        raise DomainTextError(f"{path}: every pair has the same score; Spearman is undefined")
    return pairs


def write_sentences(sentences: Sequence[str], path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    return path
