"""The validate stage's tables and report: data/raw parsed into tidy pairs and NLI tables, the counts SentEval
fixes, the violations found, and the atomic publication of clean tables.

The expectations themselves run in Great Expectations (``sentcl_gx.validation``); this module knows nothing of
it, so the rules' inputs and outputs can be tested and read without it.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sentcl.data.senteval import EXPECTED_NLI, EXPECTED_PAIRS, DataFormatError, read_all_nli, read_all_pairs

PAIR_COLUMNS = ("task", "subset", "split", "sentence1", "sentence2", "score", "source", "line")
NLI_COLUMNS = ("dataset", "split", "premise", "hypothesis", "label", "source", "line")


@dataclass(frozen=True)
class Violation:
    file: str
    line: int | None
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.rule}" + (f" ({self.detail})" if self.detail else "")


def load_tables(
    raw: Path, problems: list[DataFormatError]
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    pairs, unscored = read_all_pairs(raw, problems)
    nli = read_all_nli(raw, problems)
    pairs_df = pd.DataFrame([asdict(p) for p in pairs], columns=list(PAIR_COLUMNS))
    nli_df = pd.DataFrame([asdict(p) for p in nli], columns=list(NLI_COLUMNS))
    for df, columns in ((pairs_df, ("sentence1", "sentence2")), (nli_df, ("premise", "hypothesis"))):
        for column in columns:
            df[column] = df[column].str.strip()
        # Relative to the raw folder: the parquet files are DVC outputs, and an absolute path would make them
        # differ between two clones of the same data. Violation messages join it back onto `raw`.
        df["source"] = df["source"].map(lambda source: _relative_to(source, raw))
    return pairs_df, nli_df, unscored


def _relative_to(source: str, raw: Path) -> str:
    path = Path(source)
    return path.relative_to(raw).as_posix() if path.is_relative_to(raw) else source


def parse(raw: Path, problems: list[DataFormatError]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """``load_tables``, or empty tables and one problem when ``raw`` is missing or empty."""
    if not raw.is_dir() or not any(raw.iterdir()):
        problems.append(DataFormatError(raw, None, "data folder is not empty", "run the fetch stage first"))
        return pd.DataFrame(columns=PAIR_COLUMNS), pd.DataFrame(columns=NLI_COLUMNS), {}
    return load_tables(raw, problems)


def count_table(pairs: pd.DataFrame, nli: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, split) that SentEval fixes the size of: found vs expected pairs."""
    found = (
        pairs.groupby(["task", "split"]).size().to_dict() | nli.groupby(["dataset", "split"]).size().to_dict()
    )
    rows = [
        {
            "source": f"{name} {split}",
            "line": None,
            "found": int(found.get((name, split), 0)),
            "expected": expected,
        }
        for (name, split), expected in (EXPECTED_PAIRS | EXPECTED_NLI).items()
    ]
    return pd.DataFrame(rows)


def checked_tables(pairs: pd.DataFrame, nli: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The tables the expectations read, by the name a rule names its table with."""
    return {
        "sts": pairs[pairs["task"] != "SICK-R"],
        "sick": pairs[pairs["task"] == "SICK-R"],
        "nli": nli,
        "counts": count_table(pairs, nli),
    }


def build_report(
    raw_label: str,
    problems: list[DataFormatError],
    summaries: list[dict],
    violations: list[Violation],
    pairs: pd.DataFrame,
    nli: pd.DataFrame,
    unscored: dict[str, int],
) -> dict[str, Any]:
    """reports/validation.json: every violation, each expectation's outcome and the pair counts."""
    return {
        "success": not violations,
        "raw": raw_label,
        "parse_problems": len(problems),
        "expectations": summaries,
        "violations": [asdict(v) for v in violations],
        "pairs": {f"{t} {s}": int(n) for (t, s), n in pairs.groupby(["task", "split"]).size().items()},
        "nli_pairs": {f"{d} {s}": int(n) for (d, s), n in nli.groupby(["dataset", "split"]).size().items()},
        "unscored_pairs_skipped": unscored,
    }


def summary(report: dict) -> dict:
    """The DVC metric: two numbers (the full report is an output, not a metric)."""
    pairs = sum(report["pairs"].values()) + sum(report["nli_pairs"].values())
    return {"pairs": pairs, "violations": len(report["violations"])}


def violation_lines(violations: list[Violation], shown_per_rule: int, report_path: Path) -> list[str]:
    """What the terminal gets: each violation up to ``shown_per_rule`` per rule, then a count of the rest."""
    by_rule: dict[str, int] = {}
    lines = []
    for violation in violations:
        by_rule[violation.rule] = by_rule.get(violation.rule, 0) + 1
        if by_rule[violation.rule] <= shown_per_rule:
            lines.append(str(violation))
    for rule, count in by_rule.items():
        if count > shown_per_rule:
            lines.append(f"... and {count - shown_per_rule} more '{rule}' (see {report_path})")
    return lines


def publish(processed: Path, tables: dict[str, pd.DataFrame]) -> None:
    """Write into a temporary sibling folder, then swap it in, so a crash never leaves half a folder."""
    processed.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=processed.parent, prefix=f".{processed.name}-"))
    staging.chmod(0o755)
    for name, df in tables.items():
        df.to_parquet(staging / name, index=False)
    if processed.exists():
        old = processed.with_name(f".{processed.name}-old")
        shutil.rmtree(old, ignore_errors=True)
        processed.rename(old)
        staging.rename(processed)
        shutil.rmtree(old)
    else:
        staging.rename(processed)
