"""The validate stage's expectations, run by Great Expectations on the tables of ``sentcl.data.validation``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sentcl.data.senteval import NLI_LABELS, SCORE_RANGE
from sentcl.data.validation import Violation


@dataclass(frozen=True)
class Check:
    """One expectation on one table; ``name`` is the rule as people read it in the report."""

    name: str
    table: str
    make: Callable[[], object]  # builds the GX expectation (GX is imported lazily)
    # A table row keeps the file its sentences came from; a score or label lives in the sibling file.
    file_of: Callable[[str], str] = str


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
