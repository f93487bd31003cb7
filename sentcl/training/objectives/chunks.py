"""The encoder's training forward without compute on padding: a batch runs in chunks of rows of like length.

A tokenized batch is padded to its longest sentence (64 tokens at most) while most STS sentences have 10-20, so
most of a padded forward is spent on positions the attention mask then ignores. ``run_in_chunks`` sorts the rows by
length, cuts them into chunks of at most ``max_tokens`` padded tokens (rows x the chunk's longest row, the rule of
``sentcl.model.fast_encode.FastEncoder.batches``), runs each chunk trimmed to its own longest row, and puts the
outputs back in batch order. Each chunk keeps its graph: the caller takes the loss over the whole batch and
back-propagates once, so negatives, similarity matrix and views are the batch's; only the padded positions are gone.
A padded key is masked out of attention exactly (its weight is 0), so a row's vector does not depend on the
padding around it: chunked and padded forwards agree to float rounding (tests/unit/training/test_chunks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from sentcl.training.views import embedding_output_hook


def row_widths(attention_mask: torch.Tensor) -> list[int]:
    """Columns each row needs: up to its last attended position (its length, under right padding)."""
    columns = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    return [max(1, int(w)) for w in ((attention_mask != 0) * columns).amax(1).tolist()]


def length_chunks(attention_mask: torch.Tensor, max_tokens: int) -> list[tuple[list[int], int]] | None:
    """(rows, width) of each chunk: rows sorted by width, each chunk as many as fit in ``max_tokens`` padded
    tokens (at least one). None when chunking saves nothing: one chunk as wide as the batch."""
    widths = row_widths(attention_mask)
    order = sorted(range(len(widths)), key=widths.__getitem__)
    chunks, start = [], 0
    while start < len(order):
        size = 1
        while start + size < len(order) and (size + 1) * widths[order[start + size]] <= max_tokens:
            size += 1
        rows = order[start : start + size]
        chunks.append((rows, widths[rows[-1]]))  # ascending: the last row sets the chunk's width
        start += size
    if len(chunks) == 1 and chunks[0][1] == attention_mask.shape[1]:
        return None
    return chunks


def restore_order(parts: list[torch.Tensor], chunks: list[tuple[list[int], int]]) -> torch.Tensor:
    """The chunks' outputs (rows in chunk order) back in batch order: row ``i`` of the result is row ``i`` of the
    batch."""
    order = torch.tensor([r for rows, _ in chunks for r in rows], device=parts[0].device)
    return torch.cat(parts)[torch.argsort(order)]


class _Stop(Exception):
    """Ends a forward once the embedding block's output is in hand."""


def embedding_output(model: nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """The embedding block's output for ``inputs``, as ``model`` itself computes it (its own position and token
    type ids, LayerNorm, dropout), without running the layers above it."""
    got: list[torch.Tensor] = []

    def grab(output: torch.Tensor) -> torch.Tensor:
        got.append(output)
        raise _Stop

    with embedding_output_hook(model, grab):
        try:
            model(**inputs)
        except _Stop:
            pass
    return got[0]


@contextmanager
def _replaced(model: nn.Module, rows: list[int], width: int, full: torch.Tensor | None) -> Iterator[None]:
    """While inside, the embedding block's output is ``full``'s rows ``rows`` up to ``width`` (if ``full``)."""
    if full is None:
        yield
        return
    index = torch.tensor(rows, device=full.device)
    with embedding_output_hook(model, lambda _output: full[index, :width]):
        yield


def run_in_chunks(
    forward: Callable[..., torch.Tensor],
    model: nn.Module,
    chunks: list[tuple[list[int], int]],
    tensors: dict[str, torch.Tensor],
    embedded: torch.Tensor | None = None,
) -> torch.Tensor:
    """``forward(**chunk)`` per chunk, outputs back in batch order. ``tensors`` are the per-row inputs
    ([batch, length]: input ids, attention mask, position ids), each sliced to the chunk's rows and width.
    ``embedded`` ([batch, length, hidden]): the batch's embedding output, already perturbed by the view; each
    chunk's embedding block then returns its slice of it (the chunk's own computation is dropped), so every
    random draw of the view was made once for the whole batch and the gradient reaches ``embedded`` whole."""
    parts = []
    for rows, width in chunks:
        index = torch.tensor(rows, device=next(iter(tensors.values())).device)
        chunk = {name: t.index_select(0, index)[:, :width] for name, t in tensors.items()}
        with _replaced(model, rows, width, embedded):
            parts.append(forward(**chunk))
    return restore_order(parts, chunks)
