"""Readers for the SentEval layout (``data/downstream`` of facebookresearch/SentEval).

Every reader turns a file into plain records and reports bad input as a :class:`DataFormatError` that names
the file, the line and the rule. Readers either raise on the first problem (``problems=None``) or, for the
validate stage, append every problem to a list and carry on with the lines that parsed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# SentEval's own subset lists (senteval/sts.py); the order is the one SentEval reports in.
STS_TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "STS12": (
        "STS12-en-test",
        ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    ),
    "STS13": ("STS13-en-test", ("FNWN", "headlines", "OnWN")),
    "STS14": (
        "STS14-en-test",
        ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    ),
    "STS15": (
        "STS15-en-test",
        ("answers-forums", "answers-students", "belief", "headlines", "images"),
    ),
    "STS16": (
        "STS16-en-test",
        ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    ),
}
# The seven tasks of the benchmark, in the order every table reports them.
TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSb", "SICK-R")
STSB_SPLITS = ("train", "dev", "test")
SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SNLI_SPLITS = ("dev", "test")
NLI_LABELS = ("entailment", "neutral", "contradiction")

# Pair counts SentEval reports; the validate stage holds the data to them.
EXPECTED_PAIRS = {
    ("STS12", "test"): 3108,
    ("STS13", "test"): 1500,
    ("STS14", "test"): 3750,
    ("STS15", "test"): 3000,
    ("STS16", "test"): 1186,
    ("STSb", "train"): 5749,
    ("STSb", "dev"): 1500,
    ("STSb", "test"): 1379,
    ("SICK-R", "test"): 4927,
}
EXPECTED_NLI = {("SNLI", "dev"): 9842, ("SNLI", "test"): 9824}
SCORE_RANGE = {"STS": (0.0, 5.0), "SICK": (1.0, 5.0)}


class DataFormatError(ValueError):
    """A file that does not follow the SentEval layout. ``line`` is 1-based, or None for a whole-file rule."""

    def __init__(self, path: Path | str, line: int | None, rule: str, detail: str = "") -> None:
        self.path, self.line, self.rule, self.detail = str(path), line, rule, detail
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {rule}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class ScoredPair:
    task: str  # STS12..STS16, STSb, SICK-R
    subset: str  # e.g. MSRpar; the split name for STS-B and SICK
    split: str  # train / dev / test
    sentence1: str
    sentence2: str
    score: float
    source: str  # file the sentences came from
    line: int  # 1-based line in that file


@dataclass(frozen=True)
class NLIPair:
    dataset: str  # SNLI, MultiNLI
    split: str
    premise: str
    hypothesis: str
    label: str
    source: str
    line: int


def _report(problems: list[DataFormatError] | None, error: DataFormatError) -> None:
    if problems is None:
        raise error
    problems.append(error)


def read_lines(path: Path, problems: list[DataFormatError] | None = None) -> list[str]:
    """The lines of a UTF-8 text file without their line ends. A missing file or bad bytes is reported."""
    path = Path(path)
    if not path.is_file():
        _report(problems, DataFormatError(path, None, "file exists", "missing"))
        return []
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        _report(problems, DataFormatError(path, line, "text is UTF-8", f"byte 0x{raw[exc.start]:02x}"))
        text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _score(value: str, path: Path, line: int, problems: list[DataFormatError] | None) -> float | None:
    try:
        return float(value)
    except ValueError:
        _report(problems, DataFormatError(path, line, "score is a number", repr(value)))
        return None


def read_sts_subset(
    folder: Path, task: str, subset: str, problems: list[DataFormatError] | None = None
) -> tuple[list[ScoredPair], int]:
    """One STS12-16 subset: ``STS.input.<subset>.txt`` + ``STS.gs.<subset>.txt``.

    Returns the scored pairs and the number of unscored pairs (an empty gold line), which SentEval skips.
    """
    input_path = Path(folder) / f"STS.input.{subset}.txt"
    gold_path = Path(folder) / f"STS.gs.{subset}.txt"
    inputs, golds = read_lines(input_path, problems), read_lines(gold_path, problems)
    if inputs and golds and len(inputs) != len(golds):
        shorter = input_path if len(inputs) < len(golds) else gold_path
        _report(
            problems,
            DataFormatError(
                shorter,
                min(len(inputs), len(golds)) + 1,
                ".input and .gs have the same number of lines",
                f"{len(inputs)} input lines, {len(golds)} gold lines",
            ),
        )
    pairs, unscored = [], 0
    for number, (text, gold) in enumerate(zip(inputs, golds, strict=False), start=1):
        if gold.strip() == "":
            unscored += 1
            continue
        columns = text.split("\t")
        if len(columns) < 2:
            _report(problems, DataFormatError(input_path, number, "two tab-separated sentences"))
            continue
        score = _score(gold.strip(), gold_path, number, problems)
        if score is None:
            continue
        pairs.append(ScoredPair(task, subset, "test", columns[0], columns[1], score, str(input_path), number))
    return pairs, unscored


def read_stsb(folder: Path, split: str, problems: list[DataFormatError] | None = None) -> list[ScoredPair]:
    """STS-B ``sts-<split>.csv``: score in column 5, sentences in 6 and 7; extra trailing columns are ignored."""
    path = Path(folder) / f"sts-{split}.csv"
    pairs = []
    for number, text in enumerate(read_lines(path, problems), start=1):
        columns = text.split("\t")
        if len(columns) < 7:
            _report(
                problems,
                DataFormatError(path, number, "at least 7 tab-separated columns", f"found {len(columns)}"),
            )
            continue
        score = _score(columns[4], path, number, problems)
        if score is not None:
            pairs.append(ScoredPair("STSb", split, split, columns[5], columns[6], score, str(path), number))
    return pairs


def read_sick(folder: Path, split: str, problems: list[DataFormatError] | None = None) -> list[ScoredPair]:
    """SICK relatedness: a header line, then ``pair_ID, sentence_A, sentence_B, relatedness_score, judgment``."""
    path = Path(folder) / SICK_FILES[split]
    lines = read_lines(path, problems)
    pairs = []
    for number, text in enumerate(lines[1:], start=2):
        columns = text.split("\t")
        if len(columns) < 4:
            _report(
                problems,
                DataFormatError(path, number, "at least 4 tab-separated columns", f"found {len(columns)}"),
            )
            continue
        score = _score(columns[3], path, number, problems)
        if score is not None:
            pairs.append(ScoredPair("SICK-R", split, split, columns[1], columns[2], score, str(path), number))
    return pairs


def read_snli(
    folder: Path, split: str, problems: list[DataFormatError] | None = None, dataset: str = "SNLI"
) -> list[NLIPair]:
    """SentEval's NLI layout: ``s1.<split>``, ``s2.<split>``, ``labels.<split>``, one item a line.

    Labels are checked by the validate stage (as an expectation), so any label string is kept here.
    """
    folder = Path(folder)
    paths = [folder / f"{name}.{split}" for name in ("s1", "s2", "labels")]
    premises, hypotheses, labels = (read_lines(path, problems) for path in paths)
    counts = [len(premises), len(hypotheses), len(labels)]
    if all(counts) and len(set(counts)) > 1:
        shortest = paths[counts.index(min(counts))]
        _report(
            problems,
            DataFormatError(
                shortest,
                min(counts) + 1,
                "s1, s2 and labels have the same number of lines",
                "s1 {}, s2 {}, labels {}".format(*counts),
            ),
        )
    return [
        NLIPair(dataset, split, p.strip(), h.strip(), label.strip(), str(paths[0]), number)
        for number, (p, h, label) in enumerate(zip(premises, hypotheses, labels, strict=False), start=1)
    ]


def iter_sts_tasks(root: Path) -> Iterator[tuple[str, str, Path]]:
    """(task, subset, folder) for every STS12-16 subset under ``root`` (a SentEval ``downstream`` folder)."""
    for task, (folder, subsets) in STS_TASKS.items():
        for subset in subsets:
            yield task, subset, Path(root) / "STS" / folder


def read_all_pairs(
    root: Path, problems: list[DataFormatError] | None = None
) -> tuple[list[ScoredPair], dict[str, int]]:
    """Every scored pair of STS12-16, STS-B (all splits) and SICK-R (all splits), plus unscored counts by task."""
    root = Path(root)
    pairs: list[ScoredPair] = []
    unscored: dict[str, int] = {}
    for task, subset, folder in iter_sts_tasks(root):
        subset_pairs, skipped = read_sts_subset(folder, task, subset, problems)
        pairs += subset_pairs
        unscored[task] = unscored.get(task, 0) + skipped
    for split in STSB_SPLITS:
        pairs += read_stsb(root / "STS" / "STSBenchmark", split, problems)
    for split in SICK_FILES:
        pairs += read_sick(root / "SICK", split, problems)
    return pairs, unscored


def read_all_nli(root: Path, problems: list[DataFormatError] | None = None) -> list[NLIPair]:
    """SNLI dev and test, plus the train split of SNLI and MultiNLI when the fetch stage brought them."""
    root = Path(root)
    pairs = []
    for split in SNLI_SPLITS:
        pairs += read_snli(root / "SNLI", split, problems)
    if (root / "SNLI" / "s1.train").exists():
        pairs += read_snli(root / "SNLI", "train", problems)
    multinli = root / "MultiNLI"
    if multinli.is_dir():
        for split in ("train", "dev.matched", "dev.mismatched"):
            if (multinli / f"s1.{split}").exists():
                pairs += read_snli(multinli, split, problems, dataset="MultiNLI")
    return pairs


def consert_corpus(root: Path) -> list[str]:
    """ConSERT's unlabeled STS corpus (yym6472/ConSERT ``main.py --train_data stssick``, ``data_utils.load_datasets``
    with ``use_all_unsupervised_texts``): both sentences of every line of STS12-16 (unscored lines included),
    STS-B train/dev/test and SICK train/trial/test, repeats kept: 89,192 sentences on SentEval's files."""
    root = Path(root)
    sentences: list[str] = []
    for _task, subset, folder in iter_sts_tasks(root):
        for line in read_lines(Path(folder) / f"STS.input.{subset}.txt"):
            columns = line.split("\t")
            sentences += columns[:2]
    for split in STSB_SPLITS:
        sentences += [
            s for p in read_stsb(root / "STS" / "STSBenchmark", split) for s in (p.sentence1, p.sentence2)
        ]
    for split in SICK_FILES:
        sentences += [s for p in read_sick(root / "SICK", split) for s in (p.sentence1, p.sentence2)]
    return sentences
