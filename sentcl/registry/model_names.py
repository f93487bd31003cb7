"""One rule for registered-model names, so that no name can pass for another (no I/O, no MLflow).

``canonical_name`` is what a name looks like to a reader: Unicode NFKC (fullwidth and compatibility forms to
their plain letters), case folded, invisible format and control characters dropped, every Unicode dash or
hyphen (``‐ ‑ ‒ – — ― − ﹣ －`` ...) made ``-``, runs of whitespace one space, none at either end. A name is
acceptable only if it already is its canonical form and no other known name has the same canonical form
(``is_confusable``): ``Sentcl-Encoder``, ``sentcl-encoder `` and ``sentcl‐encoder`` (U+2010) are all refused
beside ``sentcl-encoder``.

Letters of other scripts that look like Latin ones survive NFKC (Cyrillic ``е`` for ``e``), so two names are
also compared by their ``skeleton``: the canonical form with every non-ASCII character that Unicode's
confusables table (UTS #39 data, from the ``confusable-homoglyphs`` package) lists as looking like one ASCII
letter or digit replaced by it. ``sеntcl-encoder`` with a Cyrillic ``е``, or ``ѕentcl-encoder`` with a Cyrillic
``ѕ``, has the skeleton ``sentcl-encoder`` and is refused beside it. A name that mixes scripts (Latin and
Cyrillic letters, say; digits, punctuation and combining marks belong to none) is refused outright, clash or
not: no reader can tell which letters are which. Lookalikes inside ASCII (``l`` and ``1``, ``O`` and ``0``) are
left as they are: they are the names people type. The MLflow server applies the rule to every request that
creates or names a model (``sentcl_mlflow.auth.name_guard``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from functools import lru_cache

from confusable_homoglyphs import categories, confusables

RULE = (
    "registered-model names must be in canonical form (NFKC, lower case, no invisible characters, '-' for "
    "every Unicode dash, single spaces, none at either end), in one script, and unlike any other name"
)
# Dashes that Unicode does not file under Pd (dash punctuation): the minus signs and the hyphen bullet.
_EXTRA_DASHES = frozenset("\u2212\u2043\u02d7\ufe63\uff0d\u2796")


def _dash(ch: str) -> bool:
    return ch in _EXTRA_DASHES or unicodedata.category(ch) == "Pd"


def _invisible(ch: str) -> bool:
    """A format character (zero-width space and joiners, soft hyphen, BOM, bidi marks) or a control character
    that is not whitespace: nothing a reader sees."""
    return unicodedata.category(ch) in ("Cf", "Cc") and not ch.isspace()


def canonical_name(name: str) -> str:
    """``name`` as the rule reads it (see the module). Idempotent: ``canonical_name(canonical_name(n))`` is
    ``canonical_name(n)``."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    kept = "".join("-" if _dash(ch) else ch for ch in folded if not _invisible(ch))
    return " ".join(kept.split())


# Scripts no letter belongs to: digits, punctuation, spaces (COMMON) and combining marks (INHERITED).
_NO_SCRIPT = frozenset({"COMMON", "INHERITED"})


@lru_cache(maxsize=4096)
def _ascii_lookalike(ch: str) -> str:
    """The one ASCII letter or digit that ``ch`` (non-ASCII) looks like in Unicode's confusables, else ``ch``."""
    for homoglyph in confusables.confusables_data.get(ch, ()):
        glyph = homoglyph["c"]
        if len(glyph) == 1 and glyph.isascii() and glyph.isalnum():
            return glyph.lower()
    return ch


def skeleton(name: str) -> str:
    """``name``'s canonical form with each non-ASCII lookalike of an ASCII letter or digit made that letter."""
    return "".join(ch if ch.isascii() else _ascii_lookalike(ch) for ch in canonical_name(name))


def scripts(name: str) -> set[str]:
    """The scripts of ``name``'s letters (``LATIN``, ``CYRILLIC``, ``GREEK``...), digits and punctuation aside."""
    return {categories.alias(ch) for ch in name if not ch.isascii() or ch.isalpha()} - _NO_SCRIPT


def is_confusable(name: str, other: str) -> bool:
    """True when two different names read the same: the same canonical form, or the same skeleton."""
    return name != other and (
        canonical_name(name) == canonical_name(other) or skeleton(name) == skeleton(other)
    )


def name_problem(name: str, known: Iterable[str]) -> str | None:
    """Why ``name`` may not be created or used, in one line, or None: it is not its own canonical form, it is
    confusable with one of ``known`` (the protected names and the names that exist), or it mixes scripts."""
    if not isinstance(name, str) or not name:
        return "a registered-model name must be a non-empty string"
    canonical = canonical_name(name)
    if not canonical:
        return f"{name!r} is not a usable name: {RULE}"
    if name != canonical:
        return f"{name!r} is not in canonical form ({canonical!r}): {RULE}"
    clash = next((other for other in known if is_confusable(name, other)), None)
    if clash is not None:
        return f"{name!r} reads the same as the existing or protected name {clash!r}: {RULE}"
    mixed = scripts(name)
    if len(mixed) > 1:
        return f"{name!r} mixes the scripts {', '.join(sorted(mixed))}: {RULE}"
    return None
