"""GradCache as a wrapper of the loss (``sentcl.training.gradcache.CachedLoss``), on a tiny model with dropout and
random views, so the second pass only matches the first if it replays each micro-batch's random state. The
reference is written here: the same micro-batches embedded one after another with their graphs kept, their
embeddings concatenated, the objective's loss over them, one backward (what GradCache must equal, without the
memory saving). That accumulation equals one large batch is test_train.py's, test_chunks.py's and test_precision.py's.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.gradcache import CachedLoss
from sentcl.training.trainer import Trainer
from tests.tiny import tiny_sentences, train_config

TEXTS = tiny_sentences(32, seed=4)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 20, 2)]
MICRO = 4


def trainer(model_dir) -> Trainer:
    """Dropout on, token cutoff drawing from the views' generator, a projection head trained with the encoder, and
    a loss that draws random numbers itself (as one with dropout in its head would)."""
    config = train_config(
        views=("shuffle", "token_cutoff"),
        encoder_dropout=True,
        projection=True,
        batch_size=16,
        grad_accum=MICRO,
        steps=2,
        bf16=False,
    )
    run = Trainer(Encoder.from_pretrained(str(model_dir)), config, TEXTS, DEV, progress=False)
    run._set_dropout()
    loss = run.objective.loss

    def noisy_loss(reps, negatives=None):
        torch.rand(2), torch.rand(2, generator=run.generator), random.random(), np.random.rand()
        return loss(reps, negatives)

    run.objective.loss = noisy_loss
    return run


def gradients(run: Trainer) -> dict[str, torch.Tensor]:
    named = [*run.encoder.model.named_parameters(), *run.objective.named_parameters(prefix="head")]
    return {name: p.grad.clone() for name, p in named if p.grad is not None}


def random_state(run: Trainer) -> list:
    """Every random source a view, a dropout mask or the loss draws from."""
    name, keys, pos, *_ = np.random.get_state()
    return [torch.get_rng_state(), run.generator.get_state(), random.getstate(), (name, keys.tolist(), pos)]


def with_graphs_kept(run: Trainer, items: list[str]) -> tuple[float, dict, list]:
    micro = [items[i::MICRO] for i in range(MICRO)]
    parts = [run.objective.representations(run.embed, part) for part in micro]
    embedded = random_state(run)
    reps = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    loss = run.objective.loss(reps)
    loss.backward()
    return float(loss.detach()), gradients(run), embedded


def cached(run: Trainer, items: list[str]) -> tuple[float, dict, list]:
    assert isinstance(run.criterion, CachedLoss)
    loss = run.criterion(items)
    assert all(p.grad is None for p in run.encoder.model.parameters())  # none before the backward
    loss.backward()
    return float(loss.detach()), gradients(run), random_state(run)


def test_the_cached_loss_equals_the_micro_batches_with_their_graphs_kept(tiny_model):
    items = TEXTS[:16]
    value, grads, after = cached(trainer(tiny_model), items)
    ref_value, ref_grads, ref_after = with_graphs_kept(trainer(tiny_model), items)
    assert value == ref_value  # the first pass is the reference's forward, without gradient
    assert set(grads) == set(ref_grads) and "head.projection.dense.weight" in grads
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert float(ref_grads["embeddings.word_embeddings.weight"].abs().sum()) > 0
    # The replay leaves every random source where the embedding pass left it (as the trainer always has).
    for got, want in zip(after, ref_after, strict=True):
        assert torch.equal(got, want) if isinstance(got, torch.Tensor) else got == want


def test_a_scaled_backward_is_refused_before_any_gradient_reaches_the_encoder(tiny_model):
    """sentence-transformers' hook multiplies the cached gradients by the gradient the loss receives; here the
    objective's own parameters (the projection) took theirs unscaled when the loss was computed, so a scaled
    backward would mix two scales: it is refused, and the encoder keeps no gradient."""
    run = trainer(tiny_model)
    loss = run.criterion(TEXTS[:16])
    with pytest.raises(
        RuntimeError, match=r"back-propagates as it is \(loss.backward\(\)\), got a gradient of 2.0"
    ):
        (2 * loss).backward()
    assert all(p.grad is None for p in run.encoder.model.parameters())
