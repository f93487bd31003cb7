"""The optimizer a run trains with (sentcl.training.optimizer): ``train.freeze`` leaves named parameters out of
training (no gradient, no optimizer state, unchanged after steps) and ``train.fused_optimizer`` makes the same
update as torch's default AdamW; on a tiny model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.config import ConfigError
from sentcl.training.optimizer import freeze
from sentcl.training.trainer import Trainer
from tests.tiny import tiny_sentences, train_config

TEXTS = tiny_sentences(64, seed=3)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 40, 2)]


def trained(model_dir, steps: int = 3, **settings) -> tuple[dict, dict, Trainer]:
    encoder = Encoder.from_pretrained(str(model_dir))
    before = {n: p.detach().clone() for n, p in encoder.model.named_parameters()}
    config = train_config(steps=steps, batch_size=8, lr=1e-2, warmup_ratio=0.0, **settings)
    trainer = Trainer(encoder, config, TEXTS, DEV, progress=False)
    for step in range(steps):
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    after = {n: p.detach().clone() for n, p in encoder.model.named_parameters()}
    return before, after, trainer


def test_frozen_parameters_stay_as_they_were_and_the_rest_trains(still_model):
    prefixes = ("embeddings.word_embeddings", "encoder.layer.0.")
    before, after, trainer = trained(still_model, freeze=list(prefixes))
    frozen = [n for n in before if n.startswith(prefixes)]
    assert frozen and "embeddings.word_embeddings.weight" in frozen
    for name in before:
        if name.startswith(prefixes):
            assert torch.equal(before[name], after[name]), name
    moved = [n for n in before if not n.startswith(prefixes) and not torch.equal(before[n], after[n])]
    assert "encoder.layer.1.attention.self.query.weight" in moved
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    named = dict(trainer.encoder.model.named_parameters())
    assert not any(id(named[n]) in held for n in frozen)
    assert all(named[n].grad is None for n in frozen)  # autograd never computed one


def test_a_prefix_that_names_nothing_is_refused(still_model):
    encoder = Encoder.from_pretrained(str(still_model))
    with pytest.raises(ValueError, match="'encoder.layer.99.' is the start of no parameter name"):
        freeze(encoder.model, ("encoder.layer.99.",))
    with pytest.raises(ConfigError, match="freeze: a list of parameter-name prefixes"):
        replace(train_config(), freeze=[""])


def test_the_fused_kernel_makes_the_default_adamw_update(still_model):
    """One step from the same weights and batch: the same update to float rounding (a step moves a weight by
    about lr = 1e-2; later steps would amplify rounding through Adam's normalisation of tiny gradients)."""
    start, plain, _ = trained(still_model, steps=1, fused_optimizer=False)
    _, fused, trainer = trained(still_model, steps=1, fused_optimizer=True)
    assert trainer.optimizer.defaults["fused"] is True
    moved = [name for name, value in plain.items() if not torch.equal(value, start[name])]
    assert len(moved) > len(plain) - 3  # all but the unused pooler
    for name, value in plain.items():
        torch.testing.assert_close(fused[name], value, rtol=0, atol=1e-5, msg=name)
