"""sentcl.registry.model_names: the one rule for registered-model names, on names written out by hand."""

from __future__ import annotations

import pytest

from sentcl.registry.model_names import canonical_name, is_confusable, name_problem, skeleton

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


# Letters of other scripts that Unicode's confusables table lists as looking like a Latin one; NFKC keeps them.
CYRILLIC_LOOKALIKES = [
    "s\u0435ntcl-encoder",  # CYRILLIC SMALL LETTER IE for e
    "\u0455entcl-encoder",  # CYRILLIC SMALL LETTER DZE for s
    "sentcl-en\u0441\u043ed\u0435r",  # CYRILLIC ES, O, IE
    "S\u0415NTCL-ENCODER",  # CYRILLIC CAPITAL IE: case folded first, then compared
    "sentcl-enc\u03bfder",  # GREEK SMALL LETTER OMICRON
]


@pytest.mark.parametrize("name", CYRILLIC_LOOKALIKES)
def test_a_name_with_letters_of_another_script_that_look_latin_is_refused(name):
    assert canonical_name(name) != "sentcl-encoder"  # NFKC alone lets them through
    assert skeleton(name) == "sentcl-encoder"
    assert is_confusable(name, "sentcl-encoder")
    problem = name_problem(canonical_name(name), PROTECTED)
    assert problem is not None and "\n" not in problem, problem


def test_a_whole_script_lookalike_is_refused_beside_the_name_it_copies_and_only_there():
    cyrillic_cope = "\u0441\u043e\u0440\u0435"  # ES, O, ER, IE: all Cyrillic, reads "cope"
    assert skeleton(cyrillic_cope) == "cope"
    problem = name_problem(cyrillic_cope, ["cope", "sentcl-encoder"])
    assert problem is not None and "reads the same as the existing or protected name 'cope'" in problem
    assert name_problem(cyrillic_cope, PROTECTED) is None  # one script, no name it copies


def test_a_mixed_script_name_is_refused_even_without_a_clash():
    problem = name_problem("my-\u043c\u043e\u0434\u0435\u043b\u044c", PROTECTED)  # Latin "my-", Cyrillic
    assert problem is not None and "mixes the scripts CYRILLIC, LATIN" in problem, problem
    assert name_problem("\u043c\u043e\u0434\u0435\u043b\u044c-2", PROTECTED) is None  # one script, digits
    assert name_problem("mod\u00e8le", PROTECTED) is None  # an accented Latin letter is Latin


def test_lookalikes_inside_ascii_stay_distinct():
    # l and 1, O and 0 are what people type: the rule leaves ASCII names as they are.
    assert skeleton("sentc1-encoder") == "sentc1-encoder"
    assert name_problem("sentc1-encoder", PROTECTED) is None
