"""A tiny BERT + WordPiece tokenizer saved as a sentence-transformers folder: the test stand-in for a real model.

Built from a config and a local vocabulary (no downloads), small enough that a training step takes milliseconds.
Any lower-case ASCII text tokenizes without [UNK] floods because every letter is in the vocabulary, both as a
word start and as a ``##`` continuation.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

# Tiny models spend their time in thread hand-offs, not arithmetic: on a shared 2-core machine one thread is
# ~15x faster. Importing this module is a test's way of asking for a tiny model, so set it here.
torch.set_num_threads(1)

WORDS = (
    "a man woman dog cat is the of and on in with playing guitar eating food riding horse running "
    "street people two three children girl boy sitting walking ball red blue car water"
).split()


def tiny_vocab() -> list[str]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    # dict.fromkeys: "a" is both a letter and a word, and a vocabulary lists each token once.
    return list(
        dict.fromkeys(specials + chars + ["##" + c for c in string.ascii_lowercase + string.digits] + WORDS)
    )


def make_tiny_encoder(
    tmp_path: Path | str,
    name: str = "tiny-bert",
    seed: int = 0,
    max_length: int = 32,
    dropout: float = 0.1,
    layers: int = 2,
) -> Path:
    """Save a randomly initialised ``layers``-layer, 32-wide BERT with its tokenizer under ``tmp_path/name``; return the folder.

    The folder is a sentence-transformers model (mean pooling) that also loads with ``AutoModel.from_pretrained``.
    ``dropout=0`` makes training deterministic across batch layouts (for equivalence tests).
    """
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from sentcl.model.encoder import Encoder

    folder = Path(tmp_path) / name
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(tiny_vocab()) + "\n")
    # transformers 5 ignores ``vocab_file=`` here (leaving only the special tokens); ``vocab=`` takes the file.
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=32,
        num_hidden_layers=layers,  # the pipeline's distillation freezes layers 0-1: a run of its recipe needs 3
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    Encoder(BertModel(config), tokenizer, max_length=max_length).save(folder)
    return folder


def tiny_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct random sentences over the tiny vocabulary's words."""
    import random

    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))] = None
    return list(out)


def write_tiny_processed(folder: Path | str, seed: int = 0) -> Path:
    """``pairs.parquet`` and ``nli.parquet`` in the validate stage's layout, from random tiny sentences."""
    import random

    import pandas as pd

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    sentences = tiny_sentences(400, seed)
    rows = []
    for task, split, count in [
        ("STSb", "dev", 40),
        ("STSb", "test", 20),
        ("STS12", "test", 20),
        ("SICK-R", "test", 20),
    ]:
        for i in range(count):
            a, b = rng.sample(sentences, 2)
            rows.append((task, split, split, a, b, round(rng.uniform(0, 5), 2), "tiny", i + 1))
    pairs = pd.DataFrame(
        rows, columns=["task", "subset", "split", "sentence1", "sentence2", "score", "source", "line"]
    )
    pairs.to_parquet(folder / "pairs.parquet")
    nli_rows = []
    for i, premise in enumerate(sentences[:60]):
        for label in ("entailment", "neutral", "contradiction"):
            nli_rows.append(("SNLI", "dev", premise, rng.choice(sentences[60:]), label, "tiny", 3 * i + 1))
    nli = pd.DataFrame(
        nli_rows, columns=["dataset", "split", "premise", "hypothesis", "label", "source", "line"]
    )
    nli.to_parquet(folder / "nli.parquet")
    return folder


def train_config(mode: str = "transfer", recipe: str | None = "base", **overrides):
    """A ``TrainConfig`` as the stage builds it from the project's params.yaml, with ``overrides`` on top (so a
    test runs the real defaults, which live only in params.yaml). ``recipe`` picks ``transfer.<init>``;
    ``objective="tsdae"`` adds ``transfer.tsdae``."""
    from stages.common import load_params
    from stages.training import stage_config

    values = {"mode": mode, "device": "cpu", **overrides}
    if mode == "transfer":  # objective tsdae adds transfer.tsdae, as the stage does
        # params.yaml's base recipe distils; the tiny tests exercise the contrastive recipe unless they ask
        values.setdefault("objective", "contrastive")
        from stages.transfer import transfer_config

        return transfer_config(load_params(), recipe, values)
    section = {"nli": "pretrain_nli", "joint": "joint"}[mode]
    return stage_config(load_params(), section, values)
