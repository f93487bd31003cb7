"""Turn the public NLI releases into SentEval's layout, with SentEval's own preprocessing.

SentEval's ``get_transfer_data.bash`` keeps the gold label, premise and hypothesis of every pair whose gold
label is not ``-`` and runs the sentences through ``tokenizer.sed`` (Penn Treebank tokenisation, case kept).
:func:`ptb_tokenize` is that sed script, rule for rule, so a download gives the same files as the mirror.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

# (pattern, replacement) in the order of tokenizer.sed; sed's `&` is \g<0> here.
_PTB_RULES: list[tuple[str, str]] = [
    (r'^"', "`` "),
    (r'([ (\[{<])"', r"\1 `` "),
    (r"\.\.\.", " ... "),
    (r"[,;:@#$%&]", r" \g<0> "),
    (r"([^.])([.])([\])}>\"']*)[ \t]*$", r"\1 \2\3 "),
    (r"[?!]", r" \g<0> "),
    (r"[\][(){}<>]", r" \g<0> "),
    (r"--", " -- "),
    (r"$", " "),
    (r"^", " "),
    (r'"', " '' "),
    (r"([^'])' ", r"\1 ' "),
    (r"'([sSmMdD]) ", r" '\1 "),
    (r"'ll ", " 'll "),
    (r"'re ", " 're "),
    (r"'ve ", " 've "),
    (r"n't ", " n't "),
    (r"'LL ", " 'LL "),
    (r"'RE ", " 'RE "),
    (r"'VE ", " 'VE "),
    (r"N'T ", " N'T "),
    (r" ([Cc])annot ", r" \1an not "),
    (r" ([Dd])'ye ", r" \1' ye "),
    (r" ([Gg])imme ", r" \1im me "),
    (r" ([Gg])onna ", r" \1on na "),
    (r" ([Gg])otta ", r" \1ot ta "),
    (r" ([Ll])emme ", r" \1em me "),
    (r" ([Mm])ore'n ", r" \1ore 'n "),
    (r" '([Tt])is ", r" '\1 is "),
    (r" '([Tt])was ", r" '\1 was "),
    (r" ([Ww])anna ", r" \1an na "),
    (r"  *", " "),
    (r"^ *", ""),
]
_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in _PTB_RULES]


def ptb_tokenize(text: str) -> str:
    """SentEval's tokenizer.sed on one line (it leaves one trailing space, as the mirror's files have)."""
    for pattern, replacement in _COMPILED:
        # sed applies `$` and `^` once per line; re.sub would also match the empty string after a final `$`.
        count = 1 if pattern.pattern in ("$", "^") else 0
        text = pattern.sub(replacement, text, count=count)
    return text


def nli_jsonl_to_senteval(lines: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """SNLI/MultiNLI ``*.jsonl`` lines -> (premises, hypotheses, labels), pairs without a gold label dropped."""
    premises, hypotheses, labels = [], [], []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record["gold_label"] == "-":
            continue
        premises.append(ptb_tokenize(record["sentence1"]))
        hypotheses.append(ptb_tokenize(record["sentence2"]))
        labels.append(record["gold_label"])
    return premises, hypotheses, labels


def write_senteval_nli(folder: Path, split: str, columns: tuple[list[str], list[str], list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, values in zip(("s1", "s2", "labels"), columns, strict=True):
        (folder / f"{name}.{split}").write_text("".join(v + "\n" for v in values), encoding="utf-8")
