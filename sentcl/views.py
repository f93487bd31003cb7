"""Data augmentation at the token-embedding layer: the two views T1(x), T2(x) of contrastive training.

A view turns a tokenized batch into model inputs. Most views work on ``inputs_embeds``, the output of the
model's word-embedding table (before position embeddings and LayerNorm are added inside the model), so they
apply to any Hugging Face encoder that accepts ``inputs_embeds``; ``shuffle`` works on ``position_ids`` and
``word_repetition`` on the token ids themselves. Randomness comes from an explicit ``torch.Generator`` so that
a run is reproducible and resumable (its state is saved with the checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

VIEWS = (
    "none",
    "shuffle",
    "token_cutoff",
    "feature_cutoff",
    "span_cutoff",
    "dropout",
    "adversarial",
    "word_repetition",
)
# ConSERT switches the encoder's own dropout off when one of these is used: the view is the noise.
DISABLE_ENCODER_DROPOUT = frozenset({"token_cutoff", "feature_cutoff", "span_cutoff", "dropout"})
NEEDS_LABELS = frozenset({"adversarial"})


@dataclass(frozen=True)
class ViewConfig:
    """Strength of each view (ConSERT's defaults; ESimCSE's duplication rate)."""

    token_cutoff: float = 0.15
    feature_cutoff: float = 0.2
    span_cutoff: float = 0.15
    dropout: float = 0.2
    adversarial_eps: float = 1.0  # L2 norm of the FGV perturbation per sentence
    word_repetition: float = 0.32


@dataclass
class ViewInput:
    """What the model receives for one view: ``inputs_embeds`` replaces ``input_ids`` when it is set."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None


def _real_lengths(attention_mask: torch.Tensor) -> list[int]:
    return attention_mask.sum(1).tolist()


def shuffle_positions(attention_mask: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Position ids where each sentence's real tokens get a random permutation of their own positions.

    Padding keeps its positions; the token ids are not touched, so only the order the model sees changes.
    """
    batch, length = attention_mask.shape
    positions = torch.arange(length).repeat(batch, 1)
    mask = attention_mask.cpu().bool()
    for row in range(batch):
        real = mask[row].nonzero().squeeze(1)
        positions[row, real] = real[torch.randperm(len(real), generator=generator)]
    return positions.to(attention_mask.device)


def _cutoff_mask(
    attention_mask: torch.Tensor,
    ratio: float,
    choose: Callable[[int, int], torch.Tensor],
) -> torch.Tensor:
    """Boolean [batch, length]: for each sentence, ``choose(n, k)`` picks k = max(1, int(n * ratio)) of its
    n real tokens (as indices into them) to be zeroed."""
    cut = torch.zeros(attention_mask.shape, dtype=torch.bool)
    mask = attention_mask.cpu().bool()
    for row in range(mask.shape[0]):
        real = mask[row].nonzero().squeeze(1)
        if len(real) == 0:
            continue
        cut[row, real[choose(len(real), max(1, int(len(real) * ratio)))]] = True
    return cut.to(attention_mask.device)


def token_cutoff_mask(
    attention_mask: torch.Tensor, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Boolean [batch, length]: ``max(1, int(n * ratio))`` real tokens per sentence chosen to be zeroed."""
    return _cutoff_mask(attention_mask, ratio, lambda n, k: torch.randperm(n, generator=generator)[:k])


def span_cutoff_mask(
    attention_mask: torch.Tensor, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Boolean [batch, length]: one contiguous span of ``max(1, int(n * ratio))`` real tokens per sentence."""

    def span(n: int, k: int) -> torch.Tensor:
        start = int(torch.randint(0, n - k + 1, (1,), generator=generator))
        return torch.arange(start, start + k)

    return _cutoff_mask(attention_mask, ratio, span)


def feature_cutoff_mask(
    batch: int, hidden: int, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Boolean [batch, hidden]: ``max(1, int(hidden * ratio))`` embedding columns per sentence to be zeroed."""
    k = max(1, int(hidden * ratio))
    cut = torch.zeros(batch, hidden, dtype=torch.bool)
    for row in range(batch):
        cut[row, torch.randperm(hidden, generator=generator)[:k]] = True
    return cut


def element_dropout(embeds: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero single elements with probability ``p`` and rescale the rest by 1/(1-p), as ``nn.Dropout`` does."""
    keep = torch.rand(embeds.shape, generator=generator) >= p
    return embeds * keep.to(embeds.device, embeds.dtype) / (1 - p)


def fgv_perturbation(grad: torch.Tensor, eps: float) -> torch.Tensor:
    """Fast gradient value: ``eps * g / ||g||`` with the L2 norm taken per sentence over [length, hidden]."""
    norm = grad.flatten(1).norm(dim=1).clamp(min=1e-12).view(-1, *([1] * (grad.dim() - 1)))
    return (eps * grad / norm).detach()


def repeat_words(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    ratio: float,
    special_ids: set[int],
    pad_id: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ESimCSE word repetition: duplicate a random subset of each sentence's non-special tokens in place.

    The number duplicated is uniform in ``[0, max(2, int(ratio * n))]`` (ESimCSE's rule), capped at ``n``.
    The batch grows to its longest new sentence, padded on the right.
    """
    rows = []
    for ids, mask in zip(input_ids.cpu().tolist(), attention_mask.cpu().tolist(), strict=True):
        real = [t for t, m in zip(ids, mask, strict=True) if m]
        candidates = [i for i, t in enumerate(real) if t not in special_ids]
        upper = max(2, int(ratio * len(candidates)))
        k = min(int(torch.randint(0, upper + 1, (1,), generator=generator)), len(candidates))
        chosen = {candidates[i] for i in torch.randperm(len(candidates), generator=generator)[:k].tolist()}
        new = []
        for i, t in enumerate(real):
            new.extend([t, t] if i in chosen else [t])
        rows.append(new)
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=input_ids.dtype)
    mask = torch.zeros((len(rows), length), dtype=attention_mask.dtype)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=input_ids.dtype)
        mask[i, : len(r)] = 1
    return ids.to(input_ids.device), mask.to(attention_mask.device)


EmbedFn = Callable[[torch.Tensor], torch.Tensor]


def make_view(
    name: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    embed: EmbedFn,
    config: ViewConfig = ViewConfig(),
    generator: torch.Generator | None = None,
    adversarial_grad: torch.Tensor | None = None,
    special_ids: set[int] | None = None,
    pad_id: int = 0,
) -> ViewInput:
    """Model inputs for the view ``name`` of a tokenized batch; ``embed`` maps token ids to word embeddings.

    ``adversarial`` needs ``adversarial_grad``, the gradient of the supervised loss with respect to
    ``embed(input_ids)``; it is only available in joint training.
    """
    if name == "none":
        return ViewInput(input_ids, attention_mask)
    if name == "shuffle":
        return ViewInput(input_ids, attention_mask, position_ids=shuffle_positions(attention_mask, generator))
    if name == "word_repetition":
        ids, mask = repeat_words(
            input_ids, attention_mask, config.word_repetition, special_ids or set(), pad_id, generator
        )
        return ViewInput(ids, mask)
    embeds = embed(input_ids)
    if name == "token_cutoff":
        cut = token_cutoff_mask(attention_mask, config.token_cutoff, generator)
        embeds = embeds * (~cut).unsqueeze(-1).to(embeds.dtype)
    elif name == "span_cutoff":
        cut = span_cutoff_mask(attention_mask, config.span_cutoff, generator)
        embeds = embeds * (~cut).unsqueeze(-1).to(embeds.dtype)
    elif name == "feature_cutoff":
        cut = feature_cutoff_mask(embeds.shape[0], embeds.shape[-1], config.feature_cutoff, generator)
        embeds = embeds * (~cut).unsqueeze(1).to(embeds.device, embeds.dtype)
    elif name == "dropout":
        embeds = element_dropout(embeds, config.dropout, generator)
    elif name == "adversarial":
        if adversarial_grad is None:
            raise ValueError(
                "the adversarial view needs the supervised loss's gradient: use it in joint mode only"
            )
        embeds = embeds + fgv_perturbation(adversarial_grad, config.adversarial_eps)
    else:
        raise ValueError(f"unknown view {name!r}; choose from {', '.join(VIEWS)}")
    return ViewInput(input_ids, attention_mask, inputs_embeds=embeds)
