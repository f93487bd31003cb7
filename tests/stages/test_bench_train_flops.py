"""bench-train's fraction of peak rests on its FLOP count a real token: held against torch's own count of the
matrix products of one training step, with and without frozen layers."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from benchmarks.bench_train import flops_per_token
from sentcl.training.optimizer import freeze as freeze_layers

BATCH, LENGTH = 4, 16


def counted_flops_per_token(prefixes: tuple[str, ...]) -> tuple[float, BertModel]:
    """torch's FlopCounterMode over one forward and backward of a 3-layer BERT on unpadded batches."""
    config = BertConfig(
        vocab_size=100, hidden_size=128, num_hidden_layers=3, num_attention_heads=2, intermediate_size=512,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False)
    freeze_layers(model, prefixes)
    ids = torch.randint(5, 100, (BATCH, LENGTH))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).last_hidden_state.pow(2).mean().backward()
    return counter.get_total_flops() / (BATCH * LENGTH), model


@pytest.mark.parametrize(
    "prefixes",
    [
        (),  # every weight trained
        ("embeddings", "encoder.layer.0", "encoder.layer.1"),  # the default: no backward below layer 2
        (
            "embeddings",
            "encoder.layer.1",
        ),  # a frozen layer with a trained one below: the backward passes through
        ("embeddings.word_embeddings",),
    ],
)
def test_flop_count_matches_torch_counting_the_step(prefixes):
    counted, model = counted_flops_per_token(prefixes)
    assert flops_per_token(model, LENGTH, prefixes) == pytest.approx(counted, rel=0.02)


def test_frozen_bottom_layers_cost_less_than_a_full_step():
    full, model = counted_flops_per_token(())
    frozen, _ = counted_flops_per_token(("embeddings", "encoder.layer.0", "encoder.layer.1"))
    assert frozen < 0.7 * full
    assert flops_per_token(model, LENGTH, ("embeddings", "encoder.layer.0")) < flops_per_token(model, LENGTH)
