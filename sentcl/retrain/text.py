"""The domain text a retrain trains on: deduplicated into one file, lines over the model's token limit counted
(the tokenizer truncates them there, as every anchor does), not refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sentcl.data.domain import read_domain_text, write_sentences
from sentcl.model.encoder import resolve_model_path


def prepare_text(
    domain_text: str,
    files: Sequence[Path] | None,
    model: str,
    max_tokens: int,
    output: Path,
    say: Callable[[str], object] = print,
) -> dict[str, Any]:
    """``domain_text`` (or only ``files`` of it) deduplicated into ``output``; its summary and ``path``. Sentences
    longer than ``max_tokens`` tokens of ``model``'s tokenizer are counted and said."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))

    def count(sentence: str) -> int:
        return len(tokenizer(sentence, add_special_tokens=True, verbose=False)["input_ids"])

    text = read_domain_text(domain_text, count, max_tokens, files=files, warn=lambda _line: None)
    if text.too_long:
        say(
            f"{len(text.too_long)} of {len(text.sentences)} sentences are longer than model.max_length "
            f"{max_tokens} tokens: truncated there"
        )
    return {**text.summary(), "path": str(write_sentences(text.sentences, output))}
