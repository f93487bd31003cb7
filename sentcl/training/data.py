"""What the training stages train and select on, taken from the validate stage's tables (pairs, nli).

``transfer_texts`` is the transfer stage's target text (README "Target text"); the token-identity rules that
keep it apart from the selection and test sentences are ``sentcl.data.texts``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from sentcl.data.domain import read_domain_text
from sentcl.data.senteval import TASKS, consert_corpus
from sentcl.data.texts import heldout_texts, inductive_texts, text_pairs
from sentcl.model.folder import count_truncated
from sentcl.training.losses import NLI_LABEL_IDS
from sentcl.training.recipes import INIT_NAMES

if TYPE_CHECKING:  # typing only: sentcl.training.objectives.distill is imported where distillation runs
    from sentcl.training.objectives.distill import DistillConfig

# Target text of the transfer stage by default (ConSERT's protocol): the seven STS test sets.
# transfer.texts: which unlabeled text the transfer stage trains on (README "Target text").
TEXT_CHOICES = ("heldout", "consert", "inductive")


class TextChoiceError(ValueError):
    """A ``transfer.texts`` that is neither a built-in choice nor a file or folder."""


def stsb_dev(pairs: pd.DataFrame) -> list[tuple[str, str, float]]:
    dev = pairs[(pairs.task == "STSb") & (pairs.split == "dev")]
    return list(zip(dev.sentence1, dev.sentence2, dev.score.astype(float), strict=True))


def sts_test_sentences(pairs: pd.DataFrame) -> list[str]:
    """The unique sentences of STS12-16 and the STS-B and SICK-R test splits, sorted (a stable order)."""
    test = pairs[pairs.task.isin(TASKS) & (pairs.split == "test")]
    return sorted(set(test.sentence1) | set(test.sentence2))


def _sentences(frame: pd.DataFrame) -> set[str]:
    return set(frame.sentence1) | set(frame.sentence2)


def transfer_texts(
    choice: str,
    pairs: pd.DataFrame,
    nli: pd.DataFrame,
    raw: Path,
    log: logging.Logger,
) -> list[str]:
    """``heldout``: the seven test sets' unique sentences without any sentence of a dev split (STS-B dev, which
    selects checkpoints; SICK-R trial, which the promotion gate reads), so selection is independent of training.
    ``consert``: ConSERT's corpus (all STS/SICK lines, dev included). ``inductive``: STS-B train, SICK train and
    the NLI sentences, without any sentence of a dev or test split. "The same sentence" is the project's one rule
    (``sentcl.data.roles.normalise``), and each sentence is in the text once (``sentcl.data.texts``). Anything else
    is a ``.txt`` file or a folder of them (``sentcl.data.domain.read_domain_text``, whose skipped files are warnings on
    ``log``).

    An unknown choice raises ``TextChoiceError``; a file or folder without usable text, ``DomainTextError``."""
    if choice == "heldout":
        dev = _sentences(pairs[pairs.split == "dev"])
        selection = heldout_texts(sts_test_sentences(pairs), dev)
    elif choice == "inductive":
        evaluated = _sentences(pairs[pairs.split != "train"])
        train = _sentences(pairs[pairs.task.isin(("STSb", "SICK-R")) & (pairs.split == "train")])
        train |= set(nli.premise) | set(nli.hypothesis)
        selection = inductive_texts(train, evaluated)
    elif choice == "consert":
        return consert_corpus(raw)
    elif not Path(choice).exists():
        raise TextChoiceError(
            f"transfer.texts: {choice!r} is neither one of {', '.join(TEXT_CHOICES)} nor a file or folder"
        )
    else:
        return read_domain_text(Path(choice), warn=log.warning).sentences
    log.info(
        "transfer.texts %s: %d of %d sentences kept, %d dropped as an evaluated sentence, %d as a twin of a kept one",
        choice,
        len(selection.texts),
        selection.candidates,
        selection.dropped,
        selection.twins,
    )
    return selection.texts


def sentence_room(tokenizer: Any, config: Any) -> int:
    """How many tokens (special tokens included) of a sentence the model reads: ``config.max_length``, or inside
    PromptBERT's longest template the room the template leaves (the sentence is cut, never the template)."""
    if config.objective != "promptbert":
        return config.max_length
    from sentcl.model.prompt import template_ids

    # count_truncated counts [CLS] and [SEP]; the template holds them, and the sentence gets the rest.
    template = max(template_ids(tokenizer, t).length for t in config.prompt.templates)
    return config.max_length - template + 2


def say_truncated(texts: list[str], tokenizer: Any, max_length: int, config: Any, log: logging.Logger) -> int:
    """Count (and say on ``log``) how many sentences the tokenizer will cut at ``max_length`` tokens
    (``sentence_room``)."""
    truncated = count_truncated(tokenizer, texts, max_length)
    if truncated:
        log.info(
            "%d of %d sentences are longer than %d tokens (model.max_length %d%s): truncated there, as the "
            "tokenizer does everywhere",
            truncated,
            len(texts),
            max_length,
            config.max_length,
            ", less the prompt template" if config.objective == "promptbert" else "",
        )
    return truncated


def training_text(
    choice: str,
    pairs: pd.DataFrame,
    nli: pd.DataFrame,
    raw: Path,
    init: str,
    config: Any,
    max_texts: int | str | None,
    log: logging.Logger,
) -> tuple[list[str], int]:
    """A transfer run's text: ``transfer_texts``, the few-shot sample of ``max_texts`` (seeded by
    ``config.seed``), and how many of it ``init``'s tokenizer cuts (within the model's ``sentence_room``)."""
    from transformers import AutoTokenizer

    from sentcl.model.encoder import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(init))
    max_length = sentence_room(tokenizer, config)
    texts = transfer_texts(choice, pairs, nli, raw, log)
    texts = limit_texts(texts, max_texts, config.seed)
    return texts, say_truncated(texts, tokenizer, max_length, config, log)


def distill_examples(
    settings: DistillConfig,
    choice: str,
    texts: list[str],
    teacher: Any,
    pairs: pd.DataFrame,
    nli: pd.DataFrame,
    log: logging.Logger,
    student: Any = None,
) -> list[Any]:
    """What objective distill trains on (``settings.examples``):
    the sentences; each with its ``neighbours`` nearest teacher neighbours (``sentcl.training.objectives.distill.neighbour_groups``),
    of which ``keep_hardest`` (the share the ``student(sentences) -> vectors`` disagrees with the teacher on most);
    or the ``choice`` text's unlabeled pairs (``sentcl.data.texts.text_pairs``). A text without pairs, or too short:
    ``TextChoiceError``."""
    kind, neighbours = settings.examples, settings.neighbours
    if teacher is None:
        return texts
    if kind == "neighbours":
        from sentcl.training.objectives.distill import neighbour_groups

        try:
            examples = neighbour_groups(texts, teacher, neighbours)
        except ValueError as exc:
            raise TextChoiceError(str(exc)) from None
        log.info(
            "distill: %d sentences, each with its %d nearest teacher neighbours", len(examples), neighbours
        )
        if settings.keep_hardest < 1:
            from sentcl.training.objectives.distill import hardest_groups

            examples = hardest_groups(examples, teacher, student, settings.keep_hardest)
            log.info(
                "distill: the %d groups (%.0f%%) the student disagrees with the teacher on most",
                len(examples),
                100 * settings.keep_hardest,
            )
        return examples
    if kind == "pairs":
        try:
            examples = text_pairs(choice, pairs, nli, texts)
        except ValueError as exc:
            raise TextChoiceError(f"train.distill.examples pairs: {exc}") from None
        log.info("distill: %d unlabeled pairs of the %s text (scores never read)", len(examples), choice)
        return examples
    return texts


def example_sentences(examples: Iterable[Any]) -> list[str]:
    """Every sentence the ``examples`` hold, unique and sorted: an example is a sentence, or a tuple whose
    strings are sentences (an NLI pair and its label, a triplet, a sentence and its neighbours, an unlabeled
    pair). What a training stage records as the text it trained on (``data/seen/<stage>.txt``)."""
    found: set[str] = set()
    for example in examples:
        if isinstance(example, str):
            found.add(example)
        elif isinstance(example, tuple | list):
            found.update(part for part in example if isinstance(part, str))
    return sorted(found)


def write_seen(path: Path, sentences: Iterable[str]) -> Path:
    """``sentences`` one a line (a newline inside one becomes a space: one line is one sentence)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = sorted({" ".join(s.splitlines()) for s in sentences})
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def read_seen(path: Path) -> list[str]:
    """A seen-text file back: its lines."""
    return path.read_text(encoding="utf-8").splitlines()


def limit_texts(texts: list[str], max_texts: int | str | None, seed: int) -> list[str]:
    """Few-shot: a seeded sample of ``max_texts`` sentences (``all`` or None keeps every one)."""
    if max_texts in (None, "all") or int(max_texts) >= len(texts):
        return texts
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[i] for i in sorted(order[: int(max_texts)])]


def nli_pairs(nli: pd.DataFrame) -> list[tuple[str, str, int]]:
    return [
        (p, h, NLI_LABEL_IDS[lab]) for p, h, lab in zip(nli.premise, nli.hypothesis, nli.label, strict=True)
    ]


def nli_triplets(nli: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(premise, entailment hypothesis, contradiction hypothesis) for supervised SimCSE, matched in file order."""
    triplets = []
    for premise, group in nli.groupby("premise", sort=True):
        entailed = group[group.label == "entailment"].hypothesis.tolist()
        contradicted = group[group.label == "contradiction"].hypothesis.tolist()
        triplets.extend((premise, e, c) for e, c in zip(entailed, contradicted, strict=False))
    return triplets


def resolve_init(init: str, models_dir: Path) -> str:
    """``base``/``nli``/``joint`` name the pipeline's own checkpoints in ``models_dir``; anything else is a
    model folder or id."""
    if init in INIT_NAMES:
        return str(Path(models_dir) / init)
    return init
