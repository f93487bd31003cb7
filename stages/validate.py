"""DVC stage `validate`: parse data/raw into tidy parquet tables and prove them clean with Great Expectations.

Writes data/processed/pairs.parquet (task, subset, split, sentence1, sentence2, score, source, line) and
data/processed/nli.parquet (dataset, split, premise, hypothesis, label, source, line), and the report
reports/validation.json (an uncached output), with metrics/validate.json (pairs, violations) as the DVC metric.
On any violation it prints one line per violation (file:line: rule), exits non-zero and
leaves the previous data/processed untouched: the new tables are written to a temporary folder and swapped in
only on success. The tables and report are ``sentcl.data.validation``; the expectations, ``sentcl_gx.validation``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sentcl.data.senteval import DataFormatError
from sentcl.data.validation import (
    Violation,
    build_report,
    checked_tables,
    parse,
    publish,
    summary,
    violation_lines,
)
from sentcl_gx.validation import run_expectations
from stages.common import METRICS, PROCESSED, RAW, REPORTS, ROOT

SHOWN_PER_RULE = 20  # the report holds every violation; the terminal gets this many per rule


def validate(
    raw: Path = RAW, processed: Path = PROCESSED, report_path: Path = REPORTS / "validation.json"
) -> dict:
    """Parse, check and (only if clean) publish. Returns the report that is also written to ``report_path``."""
    problems: list[DataFormatError] = []
    pairs, nli, unscored = parse(raw, problems)
    violations = [Violation(p.path, p.line, p.rule, p.detail) for p in problems]
    summaries, expectation_violations = run_expectations(checked_tables(pairs, nli), raw)
    violations += expectation_violations
    # "raw" is tracked in git: no machine's absolute path
    report = build_report(repo_relative(raw), problems, summaries, violations, pairs, nli, unscored)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if not violations:
        publish(processed, {"pairs.parquet": pairs, "nli.parquet": nli})
    return report


def repo_relative(path: Path) -> str:
    resolved = Path(path).resolve()
    return resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(path)


def main() -> None:
    started = time.perf_counter()
    report = validate()
    seconds = time.perf_counter() - started
    METRICS.mkdir(parents=True, exist_ok=True)
    (METRICS / "validate.json").write_text(json.dumps(summary(report), indent=2) + "\n")
    violations = [Violation(**v) for v in report["violations"]]
    if violations:
        for line in violation_lines(violations, SHOWN_PER_RULE, REPORTS / "validation.json"):
            print(line, file=sys.stderr)
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
