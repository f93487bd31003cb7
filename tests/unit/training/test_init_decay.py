"""``train.init_decay`` (L2-SP, Li et al. 2018, decoupled as AdamW's own decay): just before each optimizer
update, every encoder weight moves toward the weight the trainer started from by ``lr * init_decay`` of the gap.
Checked against that formula written out, on a tiny model; torch's optimizer step hooks read the weights the
update starts from. That a resumed run pulls toward the same init is ``test_resume.py`` (it trains with a pull)."""

from __future__ import annotations

import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.trainer import Trainer
from tests.tiny import tiny_sentences, train_config

TEXTS = tiny_sentences(64, seed=1)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 40, 2)]
STEPS = 5


def run(model_dir, init_decay: float):
    """Per step: the weights before it, the weights the optimizer's update started from, and that update's lr."""
    encoder = Encoder.from_pretrained(str(model_dir))
    named = dict(encoder.named_parameters())
    config = train_config(steps=STEPS, batch_size=8, lr=1e-2, warmup_ratio=0.4, init_decay=init_decay)
    trainer = Trainer(encoder, config, TEXTS, DEV, progress=False)
    starts: list[tuple[float, dict[str, torch.Tensor]]] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: starts.append(
            (opt.param_groups[0]["lr"], {n: p.detach().clone() for n, p in named.items()})
        )
    )
    init = {n: p.detach().clone() for n, p in named.items()}
    before = []
    for step in range(STEPS):
        before.append({n: p.detach().clone() for n, p in named.items()})
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    final = {n: p.detach().clone() for n, p in named.items()}
    return init, before, starts, final


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(sum(((a[n] - b[n]) ** 2).sum() for n in a) ** 0.5)


def test_each_update_starts_from_the_weights_pulled_toward_the_init(tiny_model):
    decay = 20.0
    init, before, starts, _ = run(tiny_model, decay)
    assert len(starts) == STEPS
    pulled = 0
    for step, (weights, (lr, start)) in enumerate(zip(before, starts, strict=True)):
        assert lr > 0
        for name, w in weights.items():
            expected = w - lr * decay * (w - init[name])  # p -= lr * init_decay * (p - p_init)
            torch.testing.assert_close(start[name], expected, rtol=0, atol=1e-6, msg=f"{name} at step {step}")
        pulled += distance(start, weights) > 1e-4
    assert pulled == STEPS - 1  # every step but the first, whose weights are the init


def test_off_leaves_the_update_to_adamw_and_on_stays_nearer_the_init(tiny_model):
    init, before, starts, free_end = run(tiny_model, 0.0)
    for weights, (_, start) in zip(before, starts, strict=True):
        assert all(torch.equal(start[n], weights[n]) for n in weights)
    *_, held_end = run(tiny_model, 20.0)
    assert distance(held_end, init) < 0.9 * distance(free_end, init)


def test_a_negative_init_decay_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exc:
        train_config(init_decay=-1.0)
    assert exc.value.code == 2 and "init_decay: not negative" in capsys.readouterr().err
