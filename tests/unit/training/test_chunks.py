"""``train.chunk_tokens``: the encoder's training forward in length-sorted chunks gives the padded forward's loss and
gradients. The reference is always the padded path (``chunk_tokens`` 0), on a tiny model in eval mode (no
dropout) with sentences from 1 to ~40 tokens, for every objective that runs the encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.objectives.base import Embedder
from sentcl.training.objectives.chunks import length_chunks
from sentcl.training.objectives.factory import build_objective
from tests.tiny import WORDS, make_tiny_encoder, train_config

CHUNK = 96  # padded tokens per chunk: several chunks in a batch whose longest row is ~40 tokens


def varied_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of 1 to 40 words (one token each in the tiny vocabulary), in random order."""
    rng = np.random.default_rng(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        words = 1 + int(rng.integers(0, 40)) if rng.random() < 0.3 else 1 + int(rng.integers(0, 8))
        out[" ".join(rng.choice(WORDS, size=words))] = None
    return list(out)


SENTENCES = varied_sentences(24)
PAIRS = [(SENTENCES[i], SENTENCES[(i * 5 + 7) % 24], i % 3) for i in range(12)]
TRIPLETS = [(SENTENCES[i], SENTENCES[(i + 5) % 24], SENTENCES[(i + 11) % 24]) for i in range(8)]


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("chunks"), "student", dropout=0.0, max_length=64)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.teacher import TeacherVectors
    from tests.unit.training.test_distill import make_tiny_teacher

    folder = make_tiny_teacher(tmp_path_factory.mktemp("chunks-teacher"))
    vectors = FastEncoder(folder, backend="torch")(SENTENCES)
    return TeacherVectors(SENTENCES, vectors.astype(np.float16), {"model": str(folder)})


def one_step(folder, config, items, chunk_tokens: int, teacher=None):
    """Representations, loss, every parameter's gradient, and the (rows, width) each first-layer forward saw."""
    encoder = Encoder.from_pretrained(str(folder))
    encoder.max_length = config.max_length
    torch.manual_seed(0)  # the same fresh heads (NLI classifier, projection) on both sides
    objective = build_objective(config, encoder.dim, encoder, teacher)
    encoder.eval(), objective.eval()
    embed = Embedder(
        encoder, config.view, torch.Generator().manual_seed(3), torch.device("cpu"), None, chunk_tokens
    )
    shapes: list[tuple[int, int]] = []

    def record(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        shapes.append(tuple(hidden.shape[:2]))

    handle = encoder.model.encoder.layer[0].register_forward_pre_hook(record, with_kwargs=True)
    try:
        reps = objective.representations(embed, items)
        loss = objective.loss(reps)
        loss.backward()
    finally:
        handle.remove()
    named = [
        *encoder.model.named_parameters(),
        *(("objective." + n, p) for n, p in objective.named_parameters()),
    ]
    grads = {n: p.grad.clone() for n, p in named if p.grad is not None}
    return {k: v.detach() for k, v in reps.items()}, loss.detach(), grads, shapes


def assert_chunked_equals_padded(folder, config, items, teacher=None):
    reps, loss, grads, padded_shapes = one_step(folder, config, items, 0, teacher)
    chunked_reps, chunked_loss, chunked_grads, shapes = one_step(folder, config, items, CHUNK, teacher)
    # Row by row: a loss symmetric in the batch's order (NT-Xent over two views of the same lengths) would not
    # see rows left in sorted order, the vectors do.
    for key, value in reps.items():
        torch.testing.assert_close(chunked_reps[key], value, rtol=1e-4, atol=1e-5, msg=key)
    torch.testing.assert_close(chunked_loss, loss, rtol=1e-5, atol=1e-6)
    assert chunked_grads.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        assert grad.abs().max() > 0 or "pooler" in name, name
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # The chunked step did chunk: more forwards, each within the budget (or one row), fewer tokens in all.
    # (Forwards of the same shape in both are not the batch's: PromptBERT's template deltas.)
    padded = [s for s in padded_shapes if s not in shapes]
    chunked = [s for s in shapes if s not in padded_shapes]
    assert padded and len(chunked) > len(padded)
    assert all(rows * width <= CHUNK or rows == 1 for rows, width in chunked), shapes
    assert sum(r * w for r, w in chunked) < 0.7 * sum(r * w for r, w in padded)


@pytest.mark.parametrize(
    "views",
    [
        ("shuffle", "token_cutoff"),
        ("feature_cutoff", "span"),
        ("dropout", "cutoff_paper_span"),
        ("none", "word_repetition"),
    ],
)
def test_contrastive_step_chunked_equals_padded(student, views):
    config = train_config(objective="contrastive", views=views, projection=True, bf16=False)
    assert_chunked_equals_padded(student, config, SENTENCES)


def test_default_distillation_step_chunked_equals_padded(student, teacher):
    from sentcl.training.objectives.distill import neighbour_groups

    # The default transfer's distillation: neighbour groups, the group weight, in-batch cosine MSE; and once
    # with the contrastive term over the base recipe's views (feature cutoff + shuffle).
    config = train_config(objective="distill", bf16=False)
    assert config.distill.examples == "neighbours" and config.distill.group_weight != 1
    groups = neighbour_groups(SENTENCES, teacher, config.distill.neighbours)[:6]
    assert_chunked_equals_padded(student, config, groups, teacher)
    config = train_config(objective="distill", distill={"contrastive": 0.5}, bf16=False)
    assert config.views == ("feature_cutoff", "shuffle")
    assert_chunked_equals_padded(student, config, groups, teacher)


@pytest.mark.parametrize(
    "mode,objective,views,items",
    [
        ("nli", "ce", ("none", "none"), PAIRS),
        ("nli", "sup_simcse", ("none", "none"), TRIPLETS),
        ("joint", "ce", ("none", "token_cutoff"), PAIRS),
        ("joint", "ce", ("none", "adversarial"), PAIRS),  # the captured embedding output and its gradient
    ],
)
def test_nli_step_chunked_equals_padded(student, mode, objective, views, items):
    config = train_config(mode, objective=objective, views=views, bf16=False)
    assert_chunked_equals_padded(student, config, items)


def test_promptbert_step_chunked_equals_padded(student):
    # Two templates, each denoised by its delta (computed once for the batch), the MLP head, InfoNCE.
    config = train_config(preset="promptbert", objective="promptbert", bf16=False)
    assert config.prompt.denoise and config.projection
    assert_chunked_equals_padded(student, config, SENTENCES)


def test_tsdae_step_chunked_equals_padded(student):
    config = train_config(objective="tsdae", bf16=False)
    assert_chunked_equals_padded(student, config, SENTENCES)


def test_training_steps_with_chunks_and_gradient_caching_equal_padded_steps(student):
    """The setting reaches the trainer's embedder; gradient caching replays the same chunks."""
    from sentcl.training.trainer import Trainer

    def weights(chunk_tokens: int, grad_accum: int) -> dict[str, torch.Tensor]:
        encoder = Encoder.from_pretrained(str(student))
        config = train_config(
            views=("shuffle", "token_cutoff"),
            steps=2,
            batch_size=12,
            grad_accum=grad_accum,
            lr=1e-3,
            warmup_ratio=0.0,
            bf16=False,
            chunk_tokens=chunk_tokens,
        )
        trainer = Trainer(encoder, config, SENTENCES, [("a", "b", 1.0)], progress=False)
        assert trainer.embed.chunk_tokens == chunk_tokens
        for step in range(2):
            trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
        return {k: v.clone() for k, v in encoder.model.state_dict().items()}

    init = Encoder.from_pretrained(str(student)).model.state_dict()
    # Against the padded run of the same accumulation: each micro-batch draws its own views. AdamW's first steps
    # are lr * g / (|g| + eps): a gradient at rounding level moves a weight by up to lr, hence atol 1e-4 (lr 1e-3).
    for grad_accum in (1, 2):
        padded = weights(0, grad_accum)
        assert any(not torch.allclose(v, init[k]) for k, v in padded.items())
        chunked = weights(CHUNK, grad_accum)
        for key, value in padded.items():
            torch.testing.assert_close(chunked[key], value, rtol=1e-4, atol=1e-4, msg=key)


def test_chunks_sort_by_length_fit_the_budget_and_cover_every_row_once():
    lengths = [3, 40, 1, 12, 12, 7, 40, 2, 25]
    mask = torch.zeros(len(lengths), 40, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    chunks = length_chunks(mask, 48)
    rows = [r for chunk, _ in chunks for r in chunk]
    assert sorted(rows) == list(range(len(lengths)))
    assert [lengths[r] for r in rows] == sorted(lengths)
    for chunk, width in chunks:
        assert width == max(lengths[r] for r in chunk)
        assert len(chunk) * width <= 48 or len(chunk) == 1
    # Greedy: the next row would have broken the budget.
    for (chunk, _width), (after, _) in zip(chunks, chunks[1:], strict=False):
        assert (len(chunk) + 1) * lengths[after[0]] > 48
    # Nothing to save: one chunk as wide as the batch runs as the padded batch.
    assert length_chunks(mask[[1, 6]], 1000) is None


def test_chunk_tokens_is_checked_by_name(capsys):
    with pytest.raises(SystemExit) as exc:
        train_config(chunk_tokens=-1)
    assert exc.value.code == 2 and "chunk_tokens: not negative" in capsys.readouterr().err
