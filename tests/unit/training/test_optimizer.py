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


@pytest.mark.parametrize("shape", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("optimizer", ["adamw", "consert"])
def test_after_the_warm_up_the_lr_follows_transformers_schedule_of_that_shape(still_model, shape, optimizer):
    """transformers' own schedules are the independent reading: past the warm-up, each step's lr factor equals
    theirs (the warm-ups differ by design: adamw's first step is not at lr 0)."""
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    steps = 40
    encoder = Encoder.from_pretrained(str(still_model))
    config = train_config(steps=steps, batch_size=8, warmup_ratio=0.1, schedule=shape, optimizer=optimizer)
    ours = Trainer(encoder, config, TEXTS, DEV, progress=False).scheduler.lr_lambdas[0]
    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = {
        "linear": get_linear_schedule_with_warmup(dummy, 4, steps),
        "cosine": get_cosine_schedule_with_warmup(dummy, 4, steps),
        "constant": get_constant_schedule_with_warmup(dummy, 4),
    }[shape].lr_lambdas[0]
    assert [ours(s) for s in range(4, steps + 1)] == pytest.approx([theirs(s) for s in range(4, steps + 1)])
    assert ours(steps - 1) < 0.2 if shape != "constant" else ours(steps - 1) == 1.0


def test_layer_wise_rates_move_each_layer_by_its_own_lr(still_model):
    """Adam's first update moves each weight by about its group's lr (the gradient over its own size): the
    top layer by lr, the layer below by lr * decay, the embeddings by lr * decay ** 2 (2 layers)."""
    lr, decay = 1e-2, 0.5
    before, after, _ = trained(still_model, steps=1, layer_lr_decay=decay)

    def moved(prefix: str) -> float:
        return max((after[n] - before[n]).abs().max().item() for n in before if n.startswith(prefix))

    assert moved("encoder.layer.1.") == pytest.approx(lr, rel=0.02)
    assert moved("encoder.layer.0.") == pytest.approx(lr * decay, rel=0.02)
    assert moved("embeddings.") == pytest.approx(lr * decay**2, rel=0.02)
    _, flat, _ = trained(still_model, steps=1)
    assert max((flat[n] - before[n]).abs().max().item() for n in before if n.startswith("embeddings.")) == (
        pytest.approx(lr, rel=0.02)
    )


def test_layer_wise_rates_need_numbered_layers_and_a_decay_in_range():
    from sentcl.training.optimizer import layer_groups

    with pytest.raises(ConfigError, match="layer_lr_decay: Linear has no numbered layers"):
        layer_groups(torch.nn.Linear(2, 2), 1e-3, 0.5)
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match=r"layer_lr_decay: in \(0, 1\]"):
            replace(train_config(), layer_lr_decay=bad)
    with pytest.raises(ConfigError, match="schedule: one of linear, cosine, constant"):
        replace(train_config(), schedule="step")
    with pytest.raises(ConfigError, match="layer_lr_decay: 1 with init_decay"):
        replace(train_config(), layer_lr_decay=0.8, init_decay=0.1)
