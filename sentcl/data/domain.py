"""New-domain text for retraining: read, check and fingerprint it before any training starts.

A file holds one sentence a line; a folder holds such files (every file below it but hidden ones; a ``.tsv``
first column is not special: every line is a sentence). A file that is not UTF-8 text (an image, a UTF-16
file) or an unfinished upload (``.part``) is skipped with one warning line naming it and never blocks the
others; text with nothing usable raises :class:`DomainTextError` with one line a person can act on. Lines
longer than the model's limit are kept and counted: the tokenizer truncates them, as every anchor does.

The inbox (:func:`new_inbox_files`, :func:`archive`): "new" means "not yet archived". A run reads the files of
the inbox outside ``processed/`` and, once it has finished, moves them to ``processed/<date>/``; no state store.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MIN_SENTENCES = 2  # in-batch negatives need at least two distinct sentences
UNFINISHED_SUFFIXES = (".part", ".partial", ".crdownload", ".tmp")  # an upload or download still going
PROCESSED_DIR = "processed"  # inbox/processed/<date>/: what earlier runs have read
log = logging.getLogger("sentcl.data.domain")


class DomainTextError(ValueError):
    """Domain text that cannot be trained on; the message names the file and the rule."""


@dataclass
class DomainText:
    sentences: list[str]
    files: list[Path]  # the files read (skipped ones are not in it)
    sha256: str
    lines_read: int
    duplicates: int
    skipped: dict[str, str] = field(default_factory=dict)  # file -> why it was not read
    too_long: list[int] = field(default_factory=list)  # 0-based indices into ``sentences``

    def summary(self) -> dict[str, object]:
        return {
            "files": [str(p) for p in self.files],
            "skipped": dict(self.skipped),
            "sha256": self.sha256,
            "lines_read": self.lines_read,
            "sentences": len(self.sentences),
            "duplicates": self.duplicates,
            "truncated": len(self.too_long),
        }


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
    if path.is_file():
        return [path]
    raise DomainTextError(f"{path}: no such file or folder")


def skip_reason(path: Path, data: bytes | None = None) -> str | None:
    """Why ``path`` is not text to read (None: it is): unfinished, binary or UTF-16, not UTF-8."""
    if path.name.lower().endswith(UNFINISHED_SUFFIXES):
        return f"an unfinished upload or download ({path.suffix})"
    data = path.read_bytes() if data is None else data
    if b"\x00" in data:
        return "not UTF-8 text (NUL bytes: binary, or UTF-16)"
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start}: {e.reason})"
    return None


def _decode(path: Path, data: bytes) -> str:
    reason = skip_reason(path, data)
    if reason is not None:
        raise DomainTextError(f"{path}: {reason}; expected UTF-8 text")
    return data.decode("utf-8-sig")


def read_domain_text(
    path: Path | str,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
    files: Sequence[Path | str] | None = None,
    warn: Callable[[str], object] | None = None,
) -> DomainText:
    """Sentences of ``path`` (file or folder; or just ``files``, e.g. an inbox's new ones), stripped and
    deduplicated in first-seen order.

    A file that is not UTF-8 text or is unfinished is skipped with one warning line (``skipped`` says why),
    given to ``warn`` (default: this module's logger; a flow passes its run logger's).
    ``sha256`` covers the name and bytes of every file read, in order: the same text, the same fingerprint.
    With ``count_tokens`` and ``max_tokens``, sentences over the limit are counted (``too_long``): the
    tokenizer truncates them there, as every anchor does; they are not refused.
    """
    path = Path(path)
    digest = hashlib.sha256()
    seen: dict[str, None] = {}
    lines = 0
    candidates = [Path(f) for f in files] if files is not None else _files(path)
    read: list[Path] = []
    skipped: dict[str, str] = {}
    for file in candidates:
        data = file.read_bytes() if not file.name.lower().endswith(UNFINISHED_SUFFIXES) else b""
        reason = skip_reason(file, data)
        if reason is not None:
            (warn or log.warning)(f"{file}: skipped, {reason}")
            skipped[str(file)] = reason
            continue
        read.append(file)
        digest.update(file.name.encode() + b"\0" + data)
        for line in data.decode("utf-8-sig").splitlines():
            sentence = " ".join(line.split())
            if sentence:
                lines += 1
                seen.setdefault(sentence, None)
    sentences = list(seen)
    if not sentences:
        why = "; ".join(f"{Path(f).name}: {r}" for f, r in list(skipped.items())[:3])
        raise DomainTextError(
            f"{path}: no usable text ({len(candidates)} file(s) seen"
            + (f"; skipped {why}" if why else "; empty or whitespace only, no sentences")
            + ")"
        )
    if len(sentences) < MIN_SENTENCES:
        raise DomainTextError(
            f"{path}: {lines} line(s) but only {len(sentences)} distinct sentence(s) after deduplication; "
            f"contrastive training needs at least {MIN_SENTENCES}"
        )
    text = DomainText(sentences, read, digest.hexdigest(), lines, lines - len(sentences), skipped)
    if count_tokens is not None and max_tokens is not None:
        text.too_long = [i for i, s in enumerate(sentences) if count_tokens(s) > max_tokens]
    return text


# --- the inbox ----------------------------------------------------------------------------------------------


def in_inbox(path: Path | str, box: Path | str) -> bool:
    """``path`` is the inbox or inside it, and not inside its archive (``processed/``)."""
    path, box = Path(path).resolve(), Path(box).resolve()
    if path != box and box not in path.parents:
        return False
    archive_root = box / PROCESSED_DIR
    return path != archive_root and archive_root not in path.parents


def new_inbox_files(path: Path | str, box: Path | str) -> list[Path]:
    """The files under ``path`` (the inbox, or a file or folder inside it) that no run has archived yet:
    outside ``processed/``, not hidden, not an upload still going (``.part``, ``.tmp``: left for later).
    A path that no longer exists (an earlier run archived it) has none."""
    path, box = Path(path).resolve(), Path(box).resolve()
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return []
    archive_root = box / PROCESSED_DIR
    return [
        p
        for p in candidates
        if archive_root not in p.parents
        and not _hidden(p.relative_to(box))
        and not p.name.lower().endswith(UNFINISHED_SUFFIXES)
    ]


# Runs started by an event or a schedule read domain text only from the inbox (the watcher's folder).
TRIGGERED = ("event", "schedule")


def check_inside_inbox(domain_text: str, trigger: str, box: Path) -> None:
    """An event or schedule names a path; only paths inside the configured inbox ``box`` are accepted (an
    event payload is data from whoever can emit events, not a licence to read any file the worker can)."""
    if trigger not in TRIGGERED:
        return
    path = Path(domain_text).resolve()
    if path != box and box not in path.parents:
        raise DomainTextError(
            f"{domain_text}: outside the inbox {box} (SENTCL_INBOX); a {trigger}-triggered retrain reads only there"
        )


def new_files(domain_text: str, box: Path, trigger: str = "manual") -> list[Path] | None:
    """The inbox's files under ``domain_text`` that no run has archived yet; None when ``domain_text`` is not
    in the inbox (a person's own file or folder: read as it is, never moved). An event or schedule naming
    something already archived has nothing new; a person may name an archived folder to train on it again."""
    path = Path(domain_text).resolve()
    if in_inbox(path, box) or (trigger in TRIGGERED and (path == box or box in path.parents)):
        return new_inbox_files(path, box)
    return None


def check_retrain_input(domain_text: str, domain_dev: str | None, files: list[Path] | None) -> None:
    """What a retrain reads, checked before anything waits for a Prefect server to start: the domain text
    (``files``: the inbox's new ones; its warnings are the run's to give) and the ``--domain-dev`` pairs."""
    read_domain_text(domain_text, files=files, warn=lambda _: None)
    if domain_dev:
        if not Path(domain_dev).is_file():
            raise DomainTextError(f"--domain-dev {domain_dev}: no such file")
        read_scored_pairs(domain_dev)


def archive(files: Sequence[Path | str], box: Path | str, date: str) -> list[Path]:
    """Move ``files`` (inside ``box``) to ``box/processed/<date>/``, keeping their folders below the inbox;
    a name already there gets a numbered suffix, so nothing archived earlier is overwritten."""
    box = Path(box).resolve()
    moved = []
    for file in files:
        file = Path(file).resolve()
        target = box / PROCESSED_DIR / date / file.relative_to(box)
        target.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while target.exists():
            target = target.with_name(f"{file.stem}.{n}{file.suffix}")
            n += 1
        shutil.move(str(file), str(target))
        moved.append(target)
    return moved


def read_scored_pairs(path: Path | str) -> list[tuple[str, str, float]]:
    """A domain dev set: tab-separated ``sentence1, sentence2, score`` (a header line is allowed)."""
    path = Path(path)
    text = _decode(path, path.read_bytes())
    pairs: list[tuple[str, str, float]] = []
    header: str | None = None  # line 1 with a score that is not a number: a header, if scored lines follow
    for number, row in enumerate(csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE), 1):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < 3:
            raise DomainTextError(f"{path}:{number}: expected sentence1<TAB>sentence2<TAB>score")
        try:
            score = float(row[2])
        except ValueError:
            if number == 1:
                header = row[2]
                continue
            raise DomainTextError(f"{path}:{number}: score {row[2]!r} is not a number") from None
        pairs.append((row[0].strip(), row[1].strip(), score))
    if not pairs and header is not None:
        raise DomainTextError(f"{path}:1: score {header!r} is not a number (and no scored line follows it)")
    if len(pairs) < 3:
        raise DomainTextError(f"{path}: {len(pairs)} scored pair(s); a Spearman needs at least 3")
    if len({p[2] for p in pairs}) < 2:
        raise DomainTextError(f"{path}: every pair has the same score; Spearman is undefined")
    return pairs


def read_flag_pairs(path: Path | str, flag: str = "--domain-dev") -> list[tuple[str, str, float]]:
    """``read_scored_pairs`` of a file a command-line ``flag`` names; a missing file or a bad line is a
    ``DomainTextError`` naming the flag, the file (and line)."""
    if not Path(path).is_file():
        raise DomainTextError(f"{flag} {path}: no such file")
    try:
        return read_scored_pairs(path)
    except DomainTextError as exc:
        raise DomainTextError(f"{flag} {exc}") from None


def write_sentences(sentences: Sequence[str], path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    return path
