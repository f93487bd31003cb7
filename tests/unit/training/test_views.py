"""The views against independent transcriptions of their anchors' code, on a tiny BERT.

What enters the first transformer layer is captured with a forward pre-hook and compared with ConSERT's own
arithmetic (yym6472/ConSERT ``transformers/modeling_bert.py``: ``_cutoff_embeddings``, ``_sample_span``,
``_replace_position_ids``; ``AdvCLSoftmaxLoss.py``: the adversarial noise) applied to the clean embedding output
with the same choice of rows, columns or elements.
"""

from __future__ import annotations

import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.objectives.base import Embedder
from sentcl.training.views import (
    ViewConfig,
    embedding_output_hook,
    make_view,
    position_offset,
    repeat_words,
    sample_span,
    shuffle_positions,
)
from tests.tiny import make_tiny_encoder, train_config

SENTENCES = ["a man is playing a guitar", "two dogs", "the woman is riding a red horse on the street"]
RATES = ViewConfig(
    token_cutoff=0.3,
    feature_cutoff=0.25,
    dropout=0.2,
    span=0.4,
    cutoff_paper_span=0.3,
    adversarial_eps=0.7,
    word_repetition=0.32,
)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    enc = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path_factory.mktemp("views"), dropout=0.1)))
    enc.model.eval()  # the encoder's own dropout off: the view is the only change
    return enc


def layer0_input(encoder: Encoder, view_name: str, batch, grad=None, seed: int = 0) -> torch.Tensor:
    """The hidden states that enter the first transformer layer under ``view_name``."""
    seen: list[torch.Tensor] = []
    handle = encoder.model.encoder.layer[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    view = make_view(
        view_name,
        batch["input_ids"],
        batch["attention_mask"],
        RATES,
        torch.Generator().manual_seed(seed),
        hidden=encoder.dim,
        adversarial_grad=grad,
    )
    try:
        with torch.no_grad(), embedding_output_hook(encoder.model, view.embedding_output):
            encoder.model(input_ids=view.input_ids, attention_mask=view.attention_mask)
    finally:
        handle.remove()
    return seen[0]


def clean_embedding_output(encoder: Encoder, batch) -> torch.Tensor:
    with torch.no_grad():
        return encoder.model.embeddings(input_ids=batch["input_ids"])


# ConSERT's _cutoff_embeddings, transcribed with the random choice of indexes made explicit.
def consert_cutoff(embedding_output, attention_mask, direction, rate, indexes_per_row):
    bsz, seq_len, emb_size = embedding_output.shape
    out = []
    for bsz_id in range(bsz):
        sample_embedding = embedding_output[bsz_id]
        num_tokens = int(attention_mask[bsz_id].sum())
        if direction == "row":
            num_dimensions, dim_index = num_tokens, 0
        elif direction == "column":
            num_dimensions, dim_index = emb_size, 1
        else:  # random
            num_dimensions, dim_index = num_tokens * emb_size, 0
        cutoff_indexes = indexes_per_row[bsz_id]
        assert len(cutoff_indexes) == int(num_dimensions * rate)
        assert all(0 <= i < num_dimensions for i in cutoff_indexes)
        if direction == "random":
            sample_embedding = sample_embedding.reshape(-1)
        cut = torch.index_fill(
            sample_embedding, dim_index, torch.tensor(cutoff_indexes, dtype=torch.long), 0.0
        )
        if direction == "random":
            cut = cut.reshape(seq_len, emb_size)
        out.append(cut.unsqueeze(0))
    return torch.cat(out, 0)


@pytest.mark.parametrize(
    "direction,view", [("row", "token_cutoff"), ("column", "feature_cutoff"), ("random", "dropout")]
)
def test_cutoff_views_equal_consert_on_the_embedding_output(encoder, direction, view):
    batch = encoder.tokenize(SENTENCES)
    mask = batch["attention_mask"]
    seen = layer0_input(encoder, view, batch)
    zero = seen == 0
    if direction == "row":
        indexes = [zero[b].all(-1).nonzero().squeeze(1).tolist() for b in range(len(SENTENCES))]
        rate = RATES.token_cutoff
    elif direction == "column":
        indexes = [zero[b].all(0).nonzero().squeeze(1).tolist() for b in range(len(SENTENCES))]
        rate = RATES.feature_cutoff
    else:
        indexes = [zero[b].reshape(-1).nonzero().squeeze(1).tolist() for b in range(len(SENTENCES))]
        rate = RATES.dropout
    expected = consert_cutoff(clean_embedding_output(encoder, batch), mask, direction, rate, indexes)
    torch.testing.assert_close(seen, expected, rtol=0, atol=0)  # cut entries exactly zero, nothing rescaled
    if direction == "row":  # a cut row is zero there even though it has a position embedding
        assert all(
            len(ix) == int(int(n) * rate) and max(ix, default=0) < n
            for ix, n in zip(indexes, mask.sum(1), strict=True)
        )


def test_dropout_view_zeroes_exactly_its_count_of_real_token_elements(encoder):
    batch = encoder.tokenize(SENTENCES)
    seen = layer0_input(encoder, "dropout", batch, seed=3)
    for row, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        assert int((seen[row, :n] == 0).sum()) == int(n * encoder.dim * RATES.dropout)
        assert int((seen[row, n:] == 0).sum()) == 0


def test_adversarial_view_adds_eps_g_over_per_token_norm(encoder):
    batch = encoder.tokenize(SENTENCES)
    clean = clean_embedding_output(encoder, batch)
    grad = torch.randn_like(clean)
    seen = layer0_input(encoder, "adversarial", batch, grad=grad)
    # AdvCLSoftmaxLoss: norm = g.norm(p=2, dim=-1); noise = noise_norm * g / (norm.unsqueeze(-1) + 1e-10)
    expected = clean + RATES.adversarial_eps * grad / (grad.norm(p=2, dim=-1).unsqueeze(-1) + 1e-10)
    torch.testing.assert_close(seen, expected)


def test_span_masks_ids_and_attention_like_sample_span(encoder):
    batch = encoder.tokenize(SENTENCES)
    ids, mask = sample_span(
        batch["input_ids"], batch["attention_mask"], RATES.span, 0, torch.Generator().manual_seed(1)
    )
    for row, true_len in enumerate(batch["attention_mask"].sum(1).tolist()):
        kept = mask[row].nonzero().squeeze(1).tolist()
        start_id = kept[0]
        # _sample_span: sample_len = max(int(true_len*(1-rate)), 1); tmp = [1]*seq_len; tmp[start:start+len] = 0
        sample_len = max(int(true_len * (1 - RATES.span)), 1)
        assert 0 <= start_id <= true_len - sample_len
        tmp = [1] * batch["input_ids"].shape[1]
        for idx in range(start_id, start_id + sample_len):
            tmp[idx] = 0
        masked = torch.tensor(tmp).bool()
        assert ids[row].tolist() == batch["input_ids"][row].masked_fill(masked, 0).tolist()
        assert mask[row].tolist() == batch["attention_mask"][row].masked_fill(masked, 0).tolist()


def test_shuffle_permutes_real_positions_from_the_models_offset(encoder):
    from transformers import RobertaConfig, RobertaModel

    roberta = RobertaModel(
        RobertaConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=20,
            pad_token_id=1,
        )
    )
    assert position_offset(encoder.model) == 0 and position_offset(roberta) == 2  # padding_idx + 1
    mask = encoder.tokenize(SENTENCES)["attention_mask"]
    positions = shuffle_positions(mask, position_offset(roberta), torch.Generator().manual_seed(0))
    for row, n in enumerate(mask.sum(1).tolist()):
        assert sorted(positions[row, :n].tolist()) == list(range(2, 2 + n))
        assert positions[row, n:].tolist() == list(range(2 + n, 2 + mask.shape[1]))
    assert any(
        positions[row, :n].tolist() != list(range(2, 2 + n)) for row, n in enumerate(mask.sum(1).tolist())
    )


def test_cutoff_paper_span_zeroes_one_contiguous_run(encoder):
    batch = encoder.tokenize(SENTENCES)
    seen = layer0_input(encoder, "cutoff_paper_span", batch)
    for row, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        cut = (seen[row] == 0).all(-1).nonzero().squeeze(1).tolist()
        assert len(cut) == max(1, int(n * RATES.cutoff_paper_span)) and cut == list(
            range(cut[0], cut[0] + len(cut))
        )


def test_word_repetition_follows_esimcse(encoder):
    batch = encoder.tokenize(SENTENCES * 20)
    ids, mask = repeat_words(
        batch["input_ids"], batch["attention_mask"], 0.32, 0, torch.Generator().manual_seed(0)
    )
    for row, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        original = batch["input_ids"][row, :n].tolist()
        new = ids[row, : int(mask[row].sum())].tolist()
        added = len(new) - n
        # train.py: add_len = random.randrange(min(10, int(dup_rate * input_len))), positions from range(1, L - 1)
        limit = int(0.32 * n)
        assert (added == 0) if limit == 0 else (0 <= added < min(10, limit))
        assert new[0] == original[0] and new[-1] == original[-1]  # [CLS] and [SEP] are never repeated
        # Each extra token is a copy placed right after its original: dropping them gives the sentence back.
        i, extra = 0, 0
        for j, token in enumerate(new):
            if i < n and token == original[i]:
                i += 1
            else:
                assert token == new[j - 1]
                extra += 1
        assert i == n and extra == added


@pytest.mark.parametrize("dropout", [True, False])
def test_encoder_dropout_is_the_recipes_setting(tmp_path, dropout):
    from sentcl.training.trainer import Trainer

    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.1)))
    config = train_config(views=("feature_cutoff", "shuffle"), encoder_dropout=dropout, batch_size=4)
    trainer = Trainer(encoder, config, SENTENCES * 2, [(SENTENCES[0], SENTENCES[1], 1.0)] * 3, progress=False)
    trainer._set_dropout()
    embed: Embedder = trainer.embed
    batch = embed.tokenize(SENTENCES)
    with torch.no_grad():
        a, b = embed(batch), embed(batch)
    assert torch.equal(a, b) is (not dropout)
