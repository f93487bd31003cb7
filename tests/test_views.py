"""Each view's semantics on hand-made batches."""

from __future__ import annotations

import pytest
import torch

from sentcl.views import ViewConfig, fgv_perturbation, make_view, repeat_words, shuffle_positions

# Three sentences of 6, 4 and 2 real tokens, right-padded to 6.
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
IDS = torch.tensor([[2, 10, 11, 12, 13, 3], [2, 14, 15, 3, 0, 0], [2, 3, 0, 0, 0, 0]])
HIDDEN = 20
TABLE = torch.nn.Embedding(20, HIDDEN)
torch.nn.init.uniform_(TABLE.weight, 0.5, 1.5)  # no zero entries, so zeros come from the view alone


def view(name: str, seed: int = 0, **config):
    return make_view(name, IDS, MASK, TABLE, ViewConfig(**config), torch.Generator().manual_seed(seed))


def test_none_gives_identical_views():
    a, b = view("none", seed=0), view("none", seed=1)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.input_ids, IDS)
    assert a.inputs_embeds is None and a.position_ids is None and torch.equal(a.attention_mask, MASK)


def test_shuffle_keeps_token_ids_and_permutes_only_real_positions():
    changed = False
    for seed in range(5):
        v = view("shuffle", seed)
        assert torch.equal(v.input_ids, IDS) and v.inputs_embeds is None
        for row, n in enumerate(MASK.sum(1).tolist()):
            positions = v.position_ids[row]
            assert sorted(positions[:n].tolist()) == list(range(n))  # a permutation of the real positions
            assert positions[n:].tolist() == list(range(n, 6))  # padding untouched
            changed |= positions[:n].tolist() != list(range(n))
    assert changed


def test_shuffle_positions_handles_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    positions = shuffle_positions(mask, torch.Generator().manual_seed(0))
    assert positions[0, :2].tolist() == [0, 1] and sorted(positions[0, 2:].tolist()) == [2, 3, 4]


@pytest.mark.parametrize("name,ratio", [("token_cutoff", 0.15), ("token_cutoff", 0.5), ("span_cutoff", 0.5)])
def test_row_cutoffs_zero_exactly_the_chosen_real_token_rows(name, ratio):
    clean = TABLE(IDS)
    v = view(name, **{name: ratio})
    zero_rows = (v.inputs_embeds == 0).all(-1)
    for row, n in enumerate(MASK.sum(1).tolist()):
        chosen = zero_rows[row].nonzero().squeeze(1).tolist()
        assert len(chosen) == max(1, int(n * ratio))
        assert all(i < n for i in chosen)  # never padding
        if name == "span_cutoff":
            assert chosen == list(range(chosen[0], chosen[0] + len(chosen)))  # contiguous
        kept = ~zero_rows[row]
        assert torch.equal(v.inputs_embeds[row][kept], clean[row][kept])
        assert (v.inputs_embeds[row][zero_rows[row]] == 0).all()


def test_feature_cutoff_zeroes_exactly_the_chosen_columns_of_each_sentence():
    clean = TABLE(IDS)
    v = view("feature_cutoff", feature_cutoff=0.2)
    for row in range(3):
        zero_columns = (v.inputs_embeds[row] == 0).all(0)
        assert int(zero_columns.sum()) == int(HIDDEN * 0.2)
        assert torch.equal(v.inputs_embeds[row][:, ~zero_columns], clean[row][:, ~zero_columns])
        assert not (v.inputs_embeds[row][:, ~zero_columns] == 0).any()  # no other element touched


def test_dropout_zeroes_single_elements_and_rescales_the_rest():
    clean = TABLE(IDS)
    v = view("dropout", dropout=0.2)
    zeros = v.inputs_embeds == 0
    assert 0.1 < zeros.float().mean() < 0.3
    assert not zeros.all(-1).any()  # elements, not whole rows
    torch.testing.assert_close(v.inputs_embeds[~zeros], clean[~zeros] / 0.8)


def test_word_repetition_duplicates_non_special_tokens_in_place():
    special = {0, 2, 3}
    ids, mask = repeat_words(IDS, MASK, 0.5, special, 0, torch.Generator().manual_seed(3))
    grew = False
    for row in range(3):
        new = ids[row][mask[row].bool()].tolist()
        old = IDS[row][MASK[row].bool()].tolist()
        dedup = [t for i, t in enumerate(new) if i == 0 or t != new[i - 1] or t in special]
        assert dedup == old  # removing repeats gives the sentence back: only duplications happened
        assert new.count(2) == 1 and new.count(3) == 1  # [CLS] and [SEP] are never repeated
        grew |= len(new) > len(old)
    assert grew and (ids[mask == 0] == 0).all()


def test_adversarial_adds_a_normalised_gradient_step():
    grad = torch.randn(3, 6, HIDDEN)
    v = make_view("adversarial", IDS, MASK, TABLE, ViewConfig(adversarial_eps=0.5), adversarial_grad=grad)
    delta = v.inputs_embeds - TABLE(IDS)
    torch.testing.assert_close(delta.flatten(1).norm(dim=1), torch.full((3,), 0.5))
    torch.testing.assert_close(delta, fgv_perturbation(grad, 0.5))
    with pytest.raises(ValueError, match="joint mode"):
        view("adversarial")


def test_views_are_reproducible_from_the_generator_state():
    assert torch.equal(view("token_cutoff", seed=7).inputs_embeds, view("token_cutoff", seed=7).inputs_embeds)
