"""One rule for registered-model names, so that no name can pass for another (no I/O, no MLflow).

``canonical_name`` is what a name looks like to a reader: Unicode NFKC (fullwidth and compatibility forms to
their plain letters), case folded, invisible format and control characters dropped, every Unicode dash or
hyphen (``‐ ‑ ‒ – — ― − ﹣ －`` ...) made ``-``, runs of whitespace one space, none at either end. A name is
acceptable only if it already is its canonical form and no other known name has the same canonical form
(``is_confusable``): ``Sentcl-Encoder``, ``sentcl-encoder `` and ``sentcl‐encoder`` (U+2010) are all refused
beside ``sentcl-encoder``. The MLflow server applies it to every request that creates or names a model
(``sentcl_mlflow.auth.name_guard``).

Not covered: letters of other scripts that look like Latin ones (Cyrillic ``е`` for ``e``) are kept as
they are by NFKC, so such a name is canonical and distinct.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

RULE = (
    "registered-model names must be in canonical form (NFKC, lower case, no invisible characters, '-' for "
    "every Unicode dash, single spaces, none at either end)"
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


def is_confusable(name: str, other: str) -> bool:
    """True when two different names read the same (the same canonical form)."""
    return name != other and canonical_name(name) == canonical_name(other)


def name_problem(name: str, known: Iterable[str]) -> str | None:
    """Why ``name`` may not be created or used, in one line, or None: it is not its own canonical form, or it
    is confusable with one of ``known`` (the protected names and the names that exist)."""
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
    return None
