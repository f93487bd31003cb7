"""DVC stage `validate`: parse data/raw into tidy parquet tables and prove them clean with Great Expectations.

Writes data/processed/pairs.parquet (task, subset, split, sentence1, sentence2, score, source, line) and
data/processed/nli.parquet (dataset, split, premise, hypothesis, label, source, line), and the report
reports/validation.json (an uncached output), with metrics/validate.json (pairs, violations) as the DVC metric.
On any violation it prints one line per violation (file:line: rule), exits non-zero and
leaves the previous data/processed untouched: the new tables are written to a temporary folder and swapped in
only on success.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from sentcl.senteval import (
    EXPECTED_NLI,
    EXPECTED_PAIRS,
    NLI_LABELS,
    SCORE_RANGE,
    DataFormatError,
    read_all_nli,
    read_all_pairs,
)
from stages.common import METRICS, PROCESSED, RAW, REPORTS, ROOT

SHOWN_PER_RULE = 20  # the report holds every violation; the terminal gets this many per rule


@dataclass(frozen=True)
class Violation:
    file: str
    line: int | None
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.rule}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Check:
    """One expectation on one table; ``name`` is the rule as people read it in the report."""

    name: str
    table: str
    make: Callable[[], object]  # builds the GX expectation (GX is imported lazily)
    # A table row keeps the file its sentences came from; a score or label lives in the sibling file.
    file_of: Callable[[str], str] = str


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


PAIR_COLUMNS = ("task", "subset", "split", "sentence1", "sentence2", "score", "source", "line")
NLI_COLUMNS = ("dataset", "split", "premise", "hypothesis", "label", "source", "line")


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


def checks() -> list[Check]:
    import great_expectations as gx

    e = gx.expectations
    sts_low, sts_high = SCORE_RANGE["STS"]
    sick_low, sick_high = SCORE_RANGE["SICK"]
    return [
        *(
            Check(
                f"no empty sentence ({column})",
                table,
                lambda c=column: e.ExpectColumnValueLengthsToBeBetween(column=c, min_value=1),
            )
            for table, columns in (
                ("sts", ("sentence1", "sentence2")),
                ("sick", ("sentence1", "sentence2")),
                ("nli", ("premise", "hypothesis")),
            )
            for column in columns
        ),
        Check(
            f"STS score within {sts_low:g}-{sts_high:g}",
            "sts",
            lambda: e.ExpectColumnValuesToBeBetween(column="score", min_value=sts_low, max_value=sts_high),
            lambda source: source.replace("STS.input.", "STS.gs."),
        ),
        Check(
            f"SICK score within {sick_low:g}-{sick_high:g}",
            "sick",
            lambda: e.ExpectColumnValuesToBeBetween(column="score", min_value=sick_low, max_value=sick_high),
        ),
        Check(
            "NLI label in {" + ", ".join(NLI_LABELS) + "}",
            "nli",
            lambda: e.ExpectColumnValuesToBeInSet(column="label", value_set=list(NLI_LABELS)),
            lambda source: str(Path(source).with_name("labels" + Path(source).suffix)),
        ),
        Check(
            "pair count equals SentEval's",
            "counts",
            lambda: e.ExpectColumnPairValuesToBeEqual(column_A="found", column_B="expected"),
        ),
    ]


def run_expectations(tables: dict[str, pd.DataFrame], raw: Path) -> tuple[list[dict], list[Violation]]:
    """Validate each table with GX (ephemeral context, analytics off); return summaries and violations."""
    os.environ["GX_ANALYTICS_ENABLED"] = "False"
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)  # one summary line is enough
    source = context.data_sources.add_pandas("senteval")
    summaries, violations = [], []
    for check in checks():
        df = tables[check.table].reset_index(drop=True)
        if df.empty:
            summaries.append({"name": check.name, "table": check.table, "success": True, "unexpected": 0})
            continue
        asset_name = f"{check.table}-{len(summaries)}"
        batch = source.add_dataframe_asset(asset_name).add_batch_definition_whole_dataframe("all")
        result = batch.get_batch(batch_parameters={"dataframe": df}).validate(
            check.make(), result_format={"result_format": "COMPLETE"}
        )
        unexpected_rows = result.result.get("unexpected_index_list") or []
        summaries.append(
            {
                "name": check.name,
                "table": check.table,
                "success": bool(result.success),
                "unexpected": len(unexpected_rows),
            }
        )
        for index in unexpected_rows:
            row = df.loc[index]
            line = None if pd.isna(row["line"]) else int(row["line"])
            detail = describe(check, row)
            file = check.file_of(str(row["source"]))
            file = file if check.table == "counts" else str(raw / file)
            violations.append(Violation(file, line, check.name, detail))
    return summaries, violations


def describe(check: Check, row: pd.Series) -> str:
    if check.table == "counts":
        return f"found {row['found']}, expected {row['expected']}"
    if "score" in check.name:
        return f"score {row['score']:g}"
    if "label" in check.name:
        return f"label {row['label']!r}"
    return ""


def validate(
    raw: Path = RAW, processed: Path = PROCESSED, report_path: Path = REPORTS / "validation.json"
) -> dict:
    """Parse, check and (only if clean) publish. Returns the report that is also written to ``report_path``."""
    problems: list[DataFormatError] = []
    if not raw.is_dir() or not any(raw.iterdir()):
        problems.append(DataFormatError(raw, None, "data folder is not empty", "run the fetch stage first"))
        pairs, nli, unscored = pd.DataFrame(columns=PAIR_COLUMNS), pd.DataFrame(columns=NLI_COLUMNS), {}
    else:
        pairs, nli, unscored = load_tables(raw, problems)
    violations = [Violation(p.path, p.line, p.rule, p.detail) for p in problems]
    tables = {
        "sts": pairs[pairs["task"] != "SICK-R"],
        "sick": pairs[pairs["task"] == "SICK-R"],
        "nli": nli,
        "counts": count_table(pairs, nli),
    }
    summaries, expectation_violations = run_expectations(tables, raw)
    violations += expectation_violations
    report = {
        "success": not violations,
        "raw": repo_relative(raw),  # tracked in git: no machine's absolute path
        "parse_problems": len(problems),
        "expectations": summaries,
        "violations": [asdict(v) for v in violations],
        "pairs": {f"{t} {s}": int(n) for (t, s), n in pairs.groupby(["task", "split"]).size().items()},
        "nli_pairs": {f"{d} {s}": int(n) for (d, s), n in nli.groupby(["dataset", "split"]).size().items()},
        "unscored_pairs_skipped": unscored,
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if not violations:
        publish(processed, {"pairs.parquet": pairs, "nli.parquet": nli})
    return report


def repo_relative(path: Path) -> str:
    resolved = Path(path).resolve()
    return resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(path)


def summary(report: dict) -> dict:
    """The DVC metric: two numbers (the full report is an output, not a metric)."""
    pairs = sum(report["pairs"].values()) + sum(report["nli_pairs"].values())
    return {"pairs": pairs, "violations": len(report["violations"])}


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


def main() -> None:
    started = time.perf_counter()
    report = validate()
    seconds = time.perf_counter() - started
    METRICS.mkdir(parents=True, exist_ok=True)
    (METRICS / "validate.json").write_text(json.dumps(summary(report), indent=2) + "\n")
    violations = [Violation(**v) for v in report["violations"]]
    if violations:
        by_rule: dict[str, int] = {}
        for violation in violations:
            by_rule[violation.rule] = by_rule.get(violation.rule, 0) + 1
            if by_rule[violation.rule] <= SHOWN_PER_RULE:
                print(violation, file=sys.stderr)
        for rule, count in by_rule.items():
            if count > SHOWN_PER_RULE:
                print(
                    f"... and {count - SHOWN_PER_RULE} more '{rule}' (see {REPORTS / 'validation.json'})",
                    file=sys.stderr,
                )
        print(
            f"validate: {len(violations)} violations; {PROCESSED} was left as it was "
            "(under `dvc repro` the previous version stays in the DVC cache: `dvc checkout data/processed` restores it)",
            file=sys.stderr,
        )
        sys.exit(1)
    total = sum(report["pairs"].values()) + sum(report["nli_pairs"].values())
    skipped = sum(report["unscored_pairs_skipped"].values())
    print(
        f"validate: {total} pairs clean ({skipped} unscored STS pairs skipped) in {seconds:.1f} s -> {PROCESSED}"
    )


if __name__ == "__main__":
    main()
