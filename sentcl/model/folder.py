"""What a model folder says about itself, read from its JSON files without loading torch or the weights: where the
Hugging Face model sits, how many tokens it reads, whether it normalises; and how many sentences its tokenizer cuts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def transformer_folder(path: str | Path) -> Path:
    """The folder holding the Hugging Face model: the root, or the Transformer module's folder of an
    older sentence-transformers layout (``0_Transformer/``)."""
    path = Path(path)
    modules = path / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Transformer") and module.get("path"):
                return path / module["path"]
    return path


def model_max_length(path: str | Path) -> int:
    """The truncation length ``SentenceTransformer(path).max_seq_length`` would use: ``max_seq_length`` from
    sentence_bert_config.json when present, else the smaller of the position-embedding count and the
    tokenizer's ``model_max_length``; 512 when a folder says nothing."""
    path = Path(path)
    for folder in (path, transformer_folder(path)):
        config = folder / "sentence_bert_config.json"
        if config.is_file():
            value = json.loads(config.read_text()).get("max_seq_length")
            if value:
                return int(value)
    limits = []
    folder = transformer_folder(path)
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        if (folder / name).is_file():
            value = json.loads((folder / name).read_text()).get(key)
            if isinstance(value, int | float) and 0 < value < 1e6:
                limits.append(int(value))
    return min(limits) if limits else 512


def count_truncated(tokenizer, sentences: Sequence[str], max_length: int) -> int:
    """How many ``sentences`` have more than ``max_length`` tokens (special tokens included), i.e. lose their
    end to truncation. Only the sentences that reach the limit when truncated are tokenized again in full."""
    ids = tokenizer([str(s).strip() for s in sentences], truncation=True, max_length=max_length)["input_ids"]
    return count_over_limit(tokenizer, sentences, ids, max_length)


def count_over_limit(
    tokenizer, sentences: Sequence[str], truncated_ids: list[list[int]], max_length: int
) -> int:
    """``count_truncated`` given the ids already tokenized with truncation at ``max_length``."""
    at_limit = [str(sentences[i]).strip() for i, x in enumerate(truncated_ids) if len(x) >= max_length]
    if not at_limit:
        return 0
    full = tokenizer(at_limit, truncation=False, verbose=False)["input_ids"]
    return sum(len(x) > max_length for x in full)


def has_normalize(folder: str | Path) -> bool:
    """Whether a sentence-transformers folder's pipeline (``modules.json``) has a ``Normalize`` module."""
    modules = Path(folder) / "modules.json"
    if not modules.is_file():
        return False
    return any(str(m.get("type", "")).endswith("Normalize") for m in json.loads(modules.read_text()))
