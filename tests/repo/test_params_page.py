"""params.yaml is a page of values a newcomer reads: each key with at most a short comment (what it is, its
unit), no line over 120 characters, and no result figure, date or commit id (those live in docs/results.md,
which a comment may name)."""

from __future__ import annotations

import re

import pytest

from tests.paths import ROOT

MAX_WIDTH = 120
MAX_COMMENT_LINES = 2  # a section's own note, at most; anything longer belongs in the docs
DATE = re.compile(
    r"\b(19|20)\d\d-[01]\d(-[0-3]\d)?\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w* (19|20)\d\d\b"
)
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# A result figure: a signed number (+0.82, -1.43), a score with two decimals (79.70), a percentage or a ratio (4.2x).
RESULT = re.compile(r"(?<![\w.=-])[+-]\d+(\.\d+)?\b|\b\d+\.\d\d\b|\d%|\b\d+(\.\d+)?x\b")


def comments(text: str) -> list[tuple[int, str]]:
    """(line number, comment) for every comment of a YAML page: after a value, or a line of its own. A '#' inside
    a quoted value (a prompt template) is not one."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        quoted, quote = False, ""
        for i, char in enumerate(line):
            if char in "'\"" and (not quoted or char == quote):
                quoted, quote = not quoted, char
            elif char == "#" and not quoted and (i == 0 or line[i - 1] == " "):
                found.append((number, line[i + 1 :].strip()))
                break
    return found


def violations(text: str) -> list[str]:
    bad = [
        f"line {n}: {len(line)} characters"
        for n, line in enumerate(text.splitlines(), 1)
        if len(line) > MAX_WIDTH
    ]
    for number, comment in comments(text):
        for rule, pattern in (("a date", DATE), ("a commit id", COMMIT), ("a result figure", RESULT)):
            if match := pattern.search(comment):
                bad.append(
                    f"line {number}: {rule} ({match.group(0)!r}) in a comment: docs/results.md holds those"
                )
    run = 0
    for number, line in enumerate(text.splitlines(), 1):
        run = run + 1 if line.lstrip().startswith("#") else 0
        if run == MAX_COMMENT_LINES + 1:
            bad.append(
                f"line {number}: more than {MAX_COMMENT_LINES} comment lines in a row: say it in the docs"
            )
    return bad


def test_params_yaml_is_a_page_of_values():
    assert violations((ROOT / "params.yaml").read_text()) == []


@pytest.mark.parametrize(
    "line,rule",
    [
        ("  steps: 30   # with lr 2e-5: avg 79.70 (SICK-R -1.43)", "a result figure ('79.70')"),
        ("  lr: 2.0e-4  # 1e-4: STS-B dev +0.56 against +0.87", "a result figure ('+0.56')"),
        ("  min_delta: 0.10  # measured 2026-11-30", "a date ('2026-11-30')"),
        ("  steps: 30  # in the 7b3ff84 run 60 steps never beat the init", "a commit id ('7b3ff84')"),
        ("  compile: false  # 4.2x slower on 2 cores", "a result figure ('4.2x')"),
        ("  share: 0.1  # 10% of the text", "a result figure ('0%')"),
        ("x: 1  " + "#" * 120, "characters"),
    ],
)
def test_the_page_rules_catch_what_a_lab_notebook_writes(line, rule):
    assert any(rule in v for v in violations(line + "\n")), violations(line + "\n")


def test_the_page_rules_leave_units_choices_and_templates_alone():
    page = (
        "# a note\n# and its second line\n"
        "x:\n"
        "  lr: 2.0e-5            # dvc exp run -S transfer.lr=1e-5 sets it\n"
        "  eps: 0.01             # per-token norm; ConSERT's 5e-7 is for raw BERT\n"
        "  t: 'This sentence : \"[X]\" means [MASK] .'  # '#' in a template is no comment\n"
        "  timeout_s: 14400      # seconds; 4 h (TSDAE paper, Wang et al. 2021)\n"
    )
    assert violations(page) == []
    assert "more than 2 comment lines" in " ".join(violations("# a\n# b\n# c\nx: 1\n"))
