"""Representation-space analyses on hand-made vectors and on the tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentcl.evaluation.analysis import (
    alignment,
    bucket_of,
    pooled_without_frequent,
    space_stats,
    token_frequencies,
    uniformity,
)
from sentcl.evaluation.benchmark import Subset
from sentcl.model.fast_encode import FastEncoder
from tests.unit.evaluation.test_sts_benchmark import make_tiny_model


def test_alignment_is_mean_squared_distance_of_unit_vectors():
    # Orthogonal unit vectors are sqrt(2) apart (squared 2); identical directions 0. Lengths must not matter.
    a = np.array([[2.0, 0.0], [0.0, 5.0]])
    b = np.array([[0.0, 3.0], [0.0, 0.1]])
    assert alignment(a, b) == pytest.approx((2.0 + 0.0) / 2)


def test_uniformity_is_log_mean_gaussian_potential_over_distinct_pairs():
    # Antipodal points: d^2 = 4, log exp(-2 * 4) = -8.
    assert uniformity(np.array([[1.0, 0.0], [-3.0, 0.0]])) == pytest.approx(-8.0)
    # Three points at 0, 90, 180 degrees: pair distances^2 are 2, 2 and 4.
    three = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert uniformity(three) == pytest.approx(math.log((2 * math.exp(-4) + math.exp(-8)) / 3))


def test_gold_buckets_are_half_open_except_the_last():
    assert [bucket_of(s) for s in (0.0, 0.99, 1.0, 3.999, 4.0, 5.0)] == [0, 0, 1, 3, 4, 4]
    with pytest.raises(ValueError):
        bucket_of(5.2)


def test_space_stats_cosines_by_bucket_and_positive_pairs():
    subset = Subset("STSb", "test", ("a", "b", "c"), ("d", "e", "f"), np.array([0.5, 4.5, 4.8]))
    v1 = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    v2 = np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 2.0]])  # cosines 0, 1/sqrt(2), 1
    stats = space_stats(subset, v1, v2, np.vstack([v1, v2]))
    assert stats["positive_pairs"] == 2
    assert stats["cosine_by_bucket"]["0-1"] == {"pairs": 1, "mean": 0.0, "std": 0.0}
    assert stats["cosine_by_bucket"]["4-5"]["mean"] == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert stats["cosine_by_bucket"]["2-3"]["pairs"] == 0
    # Positives: (1,0)-(1,1)/sqrt2 has d^2 = 2 - sqrt2; (0,1)-(0,1) has 0.
    assert stats["alignment"] == pytest.approx((2 - math.sqrt(2)) / 2)
    assert stats["spearman"] == pytest.approx(100.0)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> FastEncoder:
    return FastEncoder(make_tiny_model(tmp_path_factory.mktemp("model")), backend="torch")


def test_frequent_token_pooling_matches_a_direct_masked_mean(tiny_encoder):
    sentences = ["a man is riding a horse", "a a a", "the dog", "two children playing ball on the street"]
    counts = token_frequencies(tiny_encoder, sentences)
    ranked = [t for t, _ in counts.most_common()]
    cls_id, sep_id, a_id = (tiny_encoder.tokenizer.convert_tokens_to_ids(t) for t in ("[CLS]", "[SEP]", "a"))
    # [CLS]/[SEP] are in every sentence (4 each); "a" occurs 5 times, so it ranks first.
    assert counts[a_id] == 5 and counts[cls_id] == counts[sep_id] == 4 and ranked[0] == a_id
    pooled = pooled_without_frequent(tiny_encoder, sentences, ranked, max_k=3)
    assert pooled.shape == (4, 4, tiny_encoder.dim)
    # k = 0 is plain mean pooling.
    np.testing.assert_allclose(pooled[0], tiny_encoder(sentences), atol=1e-5)
    # k = 3 leaves out "a", [CLS] and [SEP]: recompute by hand for sentence 0 from the token states.
    ids = tiny_encoder.tokenizer(sentences[0])["input_ids"]
    with torch.inference_mode():
        hidden = tiny_encoder.torch_model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    keep = [i for i, t in enumerate(ids) if t not in set(ranked[:3])]
    np.testing.assert_allclose(pooled[3, 0], hidden[keep].mean(0).numpy(), atol=1e-5)
    # "a a a" has nothing left once "a" and the specials go: it keeps its plain mean instead of NaN.
    np.testing.assert_allclose(pooled[3, 1], pooled[0, 1], atol=1e-6)


def test_a_long_analysis_ends_with_one_line_saying_what_it_found_and_where(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """`make analysis-freq-tokens` ran minutes and ended without a word; now its last line is the finding."""
    import csv

    from stages import analyze
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval

    write_mini_senteval(tmp_path / "data")
    monkeypatch.setattr(analyze, "ANALYSIS", tmp_path / "metrics" / "analysis")
    monkeypatch.setattr(analyze, "PLOTS", tmp_path / "plots")
    args = ["freq-tokens", "--model", str(tiny_model), "--data", str(tmp_path / "data"), "--max-k", "3"]
    assert analyze.main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    rows = list(csv.DictReader(open(tmp_path / "metrics" / "analysis" / "freq_tokens.csv")))
    best = max(rows, key=lambda r: float(r["avg"]))
    assert last.startswith(
        f"analyze freq-tokens: best k = {best['k']}: avg {float(best['avg']):.2f} against "
    )
    assert "metrics/analysis/freq_tokens.csv" in last and "plots/freq_tokens.png" in last
