"""Data augmentation: the two views T1(x), T2(x) of contrastive training, where ConSERT applies them.

ConSERT changes three things inside ``BertModel.forward`` (yym6472/ConSERT ``transformers/modeling_bert.py``):

- ``shuffle`` permutes the position ids of each sentence's real tokens (``_replace_position_ids``);
- ``span`` keeps one contiguous span of the input ids and sets the rest to [PAD] (``_sample_span``); as in
  ConSERT, attention and pooling keep the original mask (its extended attention mask is built before
  ``_sample_span``, and sentence-transformers' ``Pooling`` reads the features' own mask), so the [PAD] positions
  outside the span still attend and are averaged;
- ``token_cutoff``, ``feature_cutoff``, ``dropout`` and ``adversarial`` replace the output of the embedding block,
  i.e. word + position + token-type embeddings after LayerNorm and dropout (``_replace_embedding_output``,
  ``_cutoff_embeddings``), so a cut token row is exactly zero when it enters the first transformer layer.

Here the embedding-output views are a forward hook on the model's embeddings module, so they work for any
Hugging Face encoder that has one (BERT, RoBERTa, MPNet, DistilBERT, the bundled MiniLM). ESimCSE's
``word_repetition`` works on token ids (caskcsg/sentemb ``ESimCSE/train.py``, ``dup_type == "bpe"``).
``cutoff_paper_span`` is the span cutoff of the Cutoff paper (Shen et al., 2020), not ConSERT's ``span``: it
zeroes one contiguous span of embedding-output rows.

Randomness comes from an explicit ``torch.Generator`` so that a run is reproducible and resumable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

VIEWS = (
    "none",
    "shuffle",
    "span",
    "token_cutoff",
    "feature_cutoff",
    "dropout",
    "cutoff_paper_span",
    "adversarial",
    "word_repetition",
)
# Views that replace the embedding block's output (the rest change the inputs).
EMBEDDING_OUTPUT_VIEWS = frozenset(
    {"token_cutoff", "feature_cutoff", "dropout", "cutoff_paper_span", "adversarial"}
)
NEEDS_LABELS = frozenset({"adversarial"})


@dataclass(frozen=True)
class ViewConfig:
    """Strength of each view (params.yaml ``view:``; ConSERT's cutoff/dropout/span rates, ESimCSE's dup_rate)."""

    token_cutoff: float
    feature_cutoff: float
    dropout: float
    span: float
    cutoff_paper_span: float
    adversarial_eps: float  # per-token norm of the adversarial noise (ConSERT noise_norm)
    word_repetition: float

    def __post_init__(self) -> None:
        for name in (
            "token_cutoff",
            "feature_cutoff",
            "dropout",
            "span",
            "cutoff_paper_span",
            "word_repetition",
        ):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"view.{name} must be in [0, 1), got {value}")
        if self.adversarial_eps < 0:
            raise ValueError(f"view.adversarial_eps must be >= 0, got {self.adversarial_eps}")


EmbeddingOutputFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class ViewInput:
    """What the model receives for one view; ``embedding_output`` (if set) rewrites the embedding block's output."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    embedding_output: EmbeddingOutputFn | None = None


# --- where the model is touched -----------------------------------------------------------------------------


def embeddings_module(model: nn.Module) -> nn.Module:
    """The module whose output is word + position (+ type) embeddings after LayerNorm and dropout."""
    for candidate in (model, getattr(model, "base_model", None)):
        module = getattr(candidate, "embeddings", None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(f"{type(model).__name__} has no embeddings module: embedding-output views need one")


def position_offset(model: nn.Module) -> int:
    """The first position id of a sentence: 0 for BERT, padding_idx + 1 for RoBERTa and MPNet."""
    padding_idx = getattr(embeddings_module(model), "padding_idx", None)
    return 0 if padding_idx is None else int(padding_idx) + 1


@contextmanager
def embedding_output_hook(model: nn.Module, fn: EmbeddingOutputFn | None) -> Iterator[None]:
    """While inside, every forward of ``model`` passes its embedding output through ``fn``."""
    if fn is None:
        yield
        return
    handle = embeddings_module(model).register_forward_hook(lambda _module, _args, output: fn(output))
    try:
        yield
    finally:
        handle.remove()


# --- the views ------------------------------------------------------------------------------------------------


def _lengths(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per sentence; like ConSERT, they are the first ``n`` positions (right padding)."""
    return [int(n) for n in attention_mask.sum(1).tolist()]


def shuffle_positions(
    attention_mask: torch.Tensor, offset: int = 0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Position ids where each sentence's first ``n`` (real) positions are permuted; padding keeps its own.

    ConSERT ``_replace_position_ids``: ``indexes = list(range(num_tokens)); random.shuffle(indexes)``; [CLS] and
    [SEP] are shuffled too. ``offset`` is the model's first position id (RoBERTa: padding_idx + 1).
    """
    batch, length = attention_mask.shape
    positions = torch.arange(length).repeat(batch, 1)
    for row, n in enumerate(_lengths(attention_mask)):
        positions[row, :n] = torch.randperm(n, generator=generator)
    return (positions + offset).to(attention_mask.device)


def sample_span(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rate: float,
    pad_id: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ConSERT ``_sample_span``: keep one contiguous span of ``max(int(n * (1 - rate)), 1)`` tokens per sentence,
    start uniform in ``[0, n - span]``; every other position gets ``pad_id`` and attention 0. (The ``span`` view
    uses the ids only: ConSERT's model never reads the returned mask for attention or pooling.)"""
    keep = torch.zeros(input_ids.shape, dtype=torch.bool)
    for row, n in enumerate(_lengths(attention_mask)):
        span = max(int(n * (1 - rate)), 1)
        start = int(torch.randint(0, n - span + 1, (1,), generator=generator))
        keep[row, start : start + span] = True
    keep = keep.to(input_ids.device)
    return input_ids.masked_fill(~keep, pad_id), attention_mask.masked_fill(~keep, 0)


def token_cutoff(
    output: torch.Tensor, attention_mask: torch.Tensor, rate: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Zero ``int(n * rate)`` of each sentence's ``n`` real rows (ConSERT ``_cutoff_embeddings``, direction row)."""
    keep = torch.ones(output.shape[:2], dtype=output.dtype)
    for row, n in enumerate(_lengths(attention_mask)):
        keep[row, torch.randperm(n, generator=generator)[: int(n * rate)]] = 0
    return output * keep.to(output.device).unsqueeze(-1)


def feature_cutoff(
    output: torch.Tensor, rate: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Zero ``int(hidden * rate)`` columns per sentence, at every position (direction column)."""
    batch, _, hidden = output.shape
    keep = torch.ones(batch, hidden, dtype=output.dtype)
    for row in range(batch):
        keep[row, torch.randperm(hidden, generator=generator)[: int(hidden * rate)]] = 0
    return output * keep.to(output.device).unsqueeze(1)


def dropout_cutoff(
    output: torch.Tensor, attention_mask: torch.Tensor, rate: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Zero exactly ``int(n * hidden * rate)`` elements of a sentence's real-token block, with no rescaling
    (direction random: indexes into the first ``n * hidden`` elements of the flattened [length, hidden])."""
    batch, length, hidden = output.shape
    keep = torch.ones(batch, length * hidden, dtype=output.dtype)
    for row, n in enumerate(_lengths(attention_mask)):
        keep[row, torch.randperm(n * hidden, generator=generator)[: int(n * hidden * rate)]] = 0
    return output * keep.view(batch, length, hidden).to(output.device)


def cutoff_paper_span(
    output: torch.Tensor, attention_mask: torch.Tensor, rate: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The Cutoff paper's span cutoff: zero one contiguous run of ``max(1, int(n * rate))`` real rows."""
    keep = torch.ones(output.shape[:2], dtype=output.dtype)
    for row, n in enumerate(_lengths(attention_mask)):
        span = max(1, int(n * rate))
        start = int(torch.randint(0, n - span + 1, (1,), generator=generator))
        keep[row, start : start + span] = 0
    return output * keep.to(output.device).unsqueeze(-1)


def adversarial_noise(grad: torch.Tensor, eps: float) -> torch.Tensor:
    """``eps * g / ||g||`` with the L2 norm taken per token over the hidden size (ConSERT AdvCLSoftmaxLoss,
    ``do_noise_normalization``: ``g / (g.norm(p=2, dim=-1).unsqueeze(-1) + 1e-10)``)."""
    return (eps * grad / (grad.norm(p=2, dim=-1, keepdim=True) + 1e-10)).detach()


def repeat_words(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rate: float,
    pad_id: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ESimCSE word repetition (``ESimCSE/train.py``, dup_type "bpe"): for a sentence of ``L`` tokens (specials
    included), if ``int(rate * L) > 0`` duplicate ``randrange(min(10, int(rate * L)))`` tokens in place, chosen
    among positions 1..L-2 (never [CLS] or the final [SEP]). The batch grows to its longest new sentence.
    """
    rows = []
    for ids, n in zip(input_ids.cpu().tolist(), _lengths(attention_mask), strict=True):
        real = ids[:n]
        limit = int(rate * n)
        chosen: set[int] = set()
        if limit > 0 and n > 2:
            k = min(int(torch.randint(0, min(10, limit), (1,), generator=generator)), n - 2)
            chosen = {1 + i for i in torch.randperm(n - 2, generator=generator)[:k].tolist()}
        new: list[int] = []
        for i, token in enumerate(real):
            new.extend([token, token] if i in chosen else [token])
        rows.append(new)
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=input_ids.dtype)
    mask = torch.zeros((len(rows), length), dtype=attention_mask.dtype)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=input_ids.dtype)
        mask[i, : len(r)] = 1
    return ids.to(input_ids.device), mask.to(attention_mask.device)


def make_view(
    name: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: ViewConfig,
    generator: torch.Generator | None = None,
    *,
    hidden: int,
    pad_id: int = 0,
    position_start: int = 0,
    adversarial_grad: torch.Tensor | None = None,
    adversarial_base: torch.Tensor | None = None,
) -> ViewInput:
    """Model inputs for the view ``name`` of a tokenized batch.

    ``adversarial`` needs ``adversarial_grad``: the gradient of the supervised loss with respect to the
    embedding output of the unperturbed forward pass (joint training only). With ``adversarial_base`` (that
    pass's embedding output, graph attached) the view's embedding output is ``base + noise``, whatever this
    pass's own embedding block computes: ConSERT ``AdvCLSoftmaxLoss.forward`` builds
    ``noise_embedding = embedding_output_a + noise_a`` from the clean pass and ``_replace_embedding_output``
    returns it, so no second embedding-dropout mask is drawn. Without it the noise is added to this pass's own.
    """
    if name == "none":
        return ViewInput(input_ids, attention_mask)
    if name == "shuffle":
        return ViewInput(
            input_ids,
            attention_mask,
            position_ids=shuffle_positions(attention_mask, position_start, generator),
        )
    if name == "span":
        # ConSERT's BertModel.forward builds the extended attention mask before ``_sample_span``, and
        # sentence-transformers' Pooling averages with the features' own mask: only the ids change.
        ids, _span_mask = sample_span(input_ids, attention_mask, config.span, pad_id, generator)
        return ViewInput(ids, attention_mask)
    if name == "word_repetition":
        ids, mask = repeat_words(input_ids, attention_mask, config.word_repetition, pad_id, generator)
        return ViewInput(ids, mask)
    # A cutoff's mask is drawn here, by cutting a block of ones, and multiplied into the output in the hook.
    ones = torch.ones(*attention_mask.shape, hidden)
    mask = attention_mask.cpu()
    if name == "token_cutoff":
        fn = _multiply(token_cutoff(ones, mask, config.token_cutoff, generator))
    elif name == "feature_cutoff":
        fn = _multiply(feature_cutoff(ones, config.feature_cutoff, generator))
    elif name == "dropout":
        fn = _multiply(dropout_cutoff(ones, mask, config.dropout, generator))
    elif name == "cutoff_paper_span":
        fn = _multiply(cutoff_paper_span(ones, mask, config.cutoff_paper_span, generator))
    elif name == "adversarial":
        if adversarial_grad is None:
            raise ValueError(
                "the adversarial view needs the supervised loss's gradient: use it in joint mode only"
            )
        noise = adversarial_noise(adversarial_grad, config.adversarial_eps)
        if adversarial_base is None:
            fn = lambda output: output + noise.to(output.dtype)  # noqa: E731
        else:
            fn = _replace(adversarial_base + noise.to(adversarial_base.dtype))
    else:
        raise ValueError(f"unknown view {name!r}; choose from {', '.join(VIEWS)}")
    return ViewInput(input_ids, attention_mask, embedding_output=fn)


def _replace(embedding_output: torch.Tensor) -> EmbeddingOutputFn:
    def fn(output: torch.Tensor) -> torch.Tensor:
        if output.shape != embedding_output.shape:
            raise ValueError(f"adversarial base {tuple(embedding_output.shape)} != {tuple(output.shape)}")
        return embedding_output.to(output.dtype)

    return fn


def _multiply(keep: torch.Tensor) -> EmbeddingOutputFn:
    return lambda output: output * keep.to(output.device, output.dtype)
