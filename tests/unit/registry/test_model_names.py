"""sentcl.registry.model_names: the one rule for registered-model names, on names written out by hand."""

from __future__ import annotations

import pytest

from sentcl.registry.model_names import canonical_name, is_confusable, name_problem

PROTECTED = ("sentcl-encoder", "sentcl-encoder-candidates", "sentcl-encoder-experiments")

# Each reads as sentcl-encoder: case, spaces, a Unicode hyphen or dash, fullwidth letters, invisible characters.
LOOKALIKES = [
    "Sentcl-Encoder",
    "SENTCL-ENCODER",
    "sentcl-encoder ",
    " sentcl-encoder",
    "sentcl-encoder\t",
    "sentcl\u2010encoder",  # HYPHEN
    "sentcl\u2011encoder",  # NON-BREAKING HYPHEN
    "sentcl\u2012encoder",  # FIGURE DASH
    "sentcl\u2013encoder",  # EN DASH
    "sentcl\u2014encoder",  # EM DASH
    "sentcl\u2212encoder",  # MINUS SIGN
    "sentcl\ufe63encoder",  # SMALL HYPHEN-MINUS
    "sentcl\uff0dencoder",  # FULLWIDTH HYPHEN-MINUS
    "\uff53entcl-encoder",  # FULLWIDTH s
    "\uff33\uff25\uff2e\uff34\uff23\uff2c-encoder",  # FULLWIDTH SENTCL
    "sentcl-encoder\u200b",  # ZERO WIDTH SPACE
    "sent\u00adcl-encoder",  # SOFT HYPHEN
    "\ufeffsentcl-encoder",  # BOM
    "sentcl-encode\u0280",  # not confusable: LATIN LETTER SMALL CAPITAL R stays itself (see below)
]


@pytest.mark.parametrize("name", [n for n in LOOKALIKES if "\u0280" not in n])
def test_every_lookalike_has_the_canonical_form_of_the_production_name_and_is_refused(name):
    assert canonical_name(name) == "sentcl-encoder"
    assert is_confusable(name, "sentcl-encoder")
    problem = name_problem(name, PROTECTED)
    assert problem is not None and "canonical form" in problem and "\n" not in problem, problem


def test_a_canonical_name_that_reads_like_a_protected_one_is_refused_only_for_the_clash():
    # "sentcl-encoder" itself was created before the rule as "Sentcl-Encoder": the canonical one clashes.
    problem = name_problem("sentcl-encoder", ["Sentcl-Encoder"])
    assert (
        problem is not None and "reads the same as the existing or protected name 'Sentcl-Encoder'" in problem
    )
    assert (
        name_problem("sentcl-encoder", PROTECTED) is None
    )  # itself is no clash: creating it again is MLflow's
    assert not is_confusable("sentcl-encoder", "sentcl-encoder")


@pytest.mark.parametrize(
    "name",
    [
        "sentcl-encoder-v2",
        "team.sentcl-encoder.promotion-lease",
        "my model",
        "sentcl_encoder",
        "sentcl-encode\u0280",
    ],
)
def test_distinct_canonical_names_pass(name):
    assert canonical_name(name) == name
    assert name_problem(name, PROTECTED) is None


@pytest.mark.parametrize("name", ["", "   ", "\u200b", 5, None])
def test_empty_blank_invisible_or_non_string_names_are_refused(name):
    assert name_problem(name, PROTECTED) is not None


def test_whitespace_runs_become_one_space_and_the_rule_is_idempotent():
    assert canonical_name("  My \t\n  Model  ") == "my model"
    assert name_problem("my  model", ()) is not None  # two spaces: not canonical
    for name in LOOKALIKES + ["Ǆ ﬁ ẞ Ⅻ ㍱"]:
        once = canonical_name(name)
        assert canonical_name(once) == once, name


def test_case_folding_goes_beyond_lower():
    assert canonical_name("STRASSE") == canonical_name("straße") == "strasse"
    assert is_confusable("Straße", "strasse")
