"""Label-free selection data: the held-out share of a domain text and the teacher-scored pairs among it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sentcl.retrain.agreement import agreement_pairs, hold_out
from tests.paths import ROOT


def test_hold_out_is_disjoint_stable_and_bounded():
    text = [f"sentence number {i} ." for i in range(1000)]
    train, held = hold_out(text + text[:10], share=0.1, limit=10_000, seed=7)
    assert set(train).isdisjoint(held) and set(train) | set(held) == set(text)
    assert 60 <= len(held) <= 140  # ~10% of 1,000 unique sentences (binomial sd ~9.5)
    assert train == [s for s in text if s not in set(held)]  # original order, duplicates once
    # A sentence's side does not depend on the rest of the text: a grown text keeps the held-out ones held out.
    _, held_more = hold_out(text + [f"another line {i}" for i in range(500)], share=0.1, limit=10_000, seed=7)
    assert set(held) <= set(held_more)
    limited = hold_out(text, 0.1, limit=25, seed=7)[1]
    assert len(limited) == 25 and set(limited) <= set(held)  # the cap keeps a subset of the same share
    assert hold_out(text, 0.1, 10_000, seed=8)[1] != held  # the seed matters
    assert hold_out(text[:19], 0.5, 100, seed=7) == (text[:19], [])  # too few to rank checkpoints by


def test_agreement_pairs_are_teacher_neighbours_and_random_ones_scored_by_teacher_cosine():
    # Two tight clusters on the plane: a,b near (1, 0); c,d near (0, 1).
    sentences = ["a", "b", "c", "d"]
    vectors = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    pairs = agreement_pairs(sentences, vectors * 3.0, neighbours=1, random=0, seed=0)  # scale must not matter
    assert [(a, b) for a, b, _ in pairs] == [("a", "b"), ("c", "d")]  # each nearest neighbour once
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert pairs[0][2] == pytest.approx(float(unit[0] @ unit[1]))
    with_random = agreement_pairs(sentences, vectors, neighbours=1, random=2, seed=0)
    names = {(a, b) for a, b, _ in with_random}
    assert {("a", "b"), ("c", "d")} <= names and len(names) > 2  # random pairs reach across the clusters
    assert all(a < b for a, b in names) and all(a != b for a, b in names)
    every = {tuple(sorted(p)) for p in itertools.combinations(sentences, 2)}
    assert names <= every
    assert with_random == agreement_pairs(sentences, vectors, neighbours=1, random=2, seed=0)  # seeded


def test_teacher_stage_writes_the_held_out_agreement_pairs_scored_by_its_vectors(tmp_path, tiny_model):
    """--heldout: the held-out sentences are encoded (and never part of the text), agreement.tsv holds pairs
    among them only, each scored by the cosine of the teacher's stored vectors of its two sentences."""
    import yaml

    from sentcl.model.teacher import TeacherVectors
    from stages import teacher as stage
    from tests.tiny import write_tiny_processed
    from tests.unit.training.test_distill import make_tiny_encoder, tiny_sentences

    teacher = make_tiny_encoder(tmp_path, "teacher", seed=1)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["name"] = str(tiny_model)
    params["teacher"].update(model=str(teacher), backend="torch")
    params["retrain"].update(agreement_neighbours=2, agreement_random=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    text, held = tiny_sentences(6, seed=3), tiny_sentences(8, seed=9)
    assert not set(text) & set(held)
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    (tmp_path / "heldout.txt").write_text("\n".join(held) + "\n")
    output = tmp_path / "out"
    stage.main(
        [
            *("--params", str(tmp_path / "params.yaml"), "--texts", str(tmp_path / "text.txt")),
            *("--processed", str(write_tiny_processed(tmp_path / "processed")), "--output", str(output)),
            *("--heldout", str(tmp_path / "heldout.txt")),
        ]
    )
    record = TeacherVectors.load(output)
    assert set(record.sentences) == set(text) | set(held)
    rows = [line.split("\t") for line in (output / "agreement.tsv").read_text().splitlines()]
    assert record.meta["agreement"] == {"heldout": 8, "pairs": len(rows), "file": "agreement.tsv"}
    assert 8 <= len(rows) <= 8 * 3  # each sentence's 2 neighbours and 1 random partner, a pair once
    for a, b, score in rows:
        assert a in held and b in held and a != b
        u, v = record.lookup([a, b])
        assert float(score) == pytest.approx(float(u @ v / np.linalg.norm(u) / np.linalg.norm(v)), abs=1e-5)
