"""Label-free selection and gate data: the held-out share of a domain text, its two parts (selection's and the
gate's) and the teacher-scored pairs within each part."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sentcl.data.roles import normalise
from sentcl.retrain.agreement import agreement_pairs, hold_out, split_heldout
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


def test_the_variants_of_one_sentence_land_on_the_same_side():
    """ "The same sentence" is decided by sentcl.data.roles.normalise: a held-out sentence's variants (case,
    punctuation, spaces) are held out with it, never trained on beside it."""
    text = [f"Sentence number {i}." for i in range(400)]
    variants = [f"sentence  number {i}" for i in range(400)]
    train, held = hold_out(text + variants, share=0.2, limit=10_000, seed=3)
    assert held and {normalise(s) for s in train}.isdisjoint(normalise(s) for s in held)
    assert all((f"Sentence number {i}." in held) == (f"sentence  number {i}" in held) for i in range(400))
    # The cap counts sentences and keeps a key's variants together (an odd cap leaves the last pair out).
    capped = hold_out(text + variants, share=0.2, limit=11, seed=3)[1]
    assert len(capped) == 10 and set(capped) <= set(held)


def test_the_held_out_sentences_split_into_a_selection_part_and_a_gate_part_sharing_no_sentence():
    held = [f"held sentence {i} ." for i in range(300)] + [f"Held Sentence {i}" for i in range(0, 300, 7)]
    selection, gate = split_heldout(held, gate_share=0.5, seed=5)
    assert sorted(selection + gate) == sorted(held)  # every held-out sentence in exactly one part
    assert {normalise(s) for s in selection}.isdisjoint(normalise(s) for s in gate)
    assert 110 <= len({normalise(s) for s in gate}) <= 190  # ~half of 300 keys (binomial sd ~8.7)
    assert selection == [s for s in held if s in set(selection)]  # the order kept
    # A key's part does not depend on what else is held out: yesterday's gate sentences stay the gate's.
    more = split_heldout(held + [f"another {i}" for i in range(200)], gate_share=0.5, seed=5)[1]
    assert set(gate) <= set(more)
    assert split_heldout(held, 0.5, seed=6)[1] != gate  # seeded
    few = [f"s{i}" for i in range(12)]
    for share in (0.01, 0.99):  # each part keeps 5 sentences at least, whatever the share
        parts = split_heldout(few, share, seed=1)
        assert sorted(parts[0] + parts[1]) == sorted(few) and min(map(len, parts)) == 5
    assert split_heldout(few[:9], 0.5, seed=1) == (few[:9], [])  # too few to give the gate a part


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


def test_teacher_stage_writes_the_agreement_pairs_within_each_held_out_part(tmp_path, tiny_model):
    """--heldout and --heldout-gate: both parts are encoded (and never part of the text); each part's file holds
    pairs within that part only, each scored by the cosine of the teacher's stored vectors of its sentences."""
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
    text, held = tiny_sentences(6, seed=3), tiny_sentences(14, seed=9)
    parts = {"selection": held[:8], "gate": held[8:]}
    assert not set(text) & set(held) and len(set(held)) == 14
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    for part, sentences in parts.items():
        (tmp_path / f"{part}.txt").write_text("\n".join(sentences) + "\n")
    output = tmp_path / "out"
    stage.main(
        [
            *("--params", str(tmp_path / "params.yaml"), "--texts", str(tmp_path / "text.txt")),
            *("--processed", str(write_tiny_processed(tmp_path / "processed")), "--output", str(output)),
            *("--heldout", str(tmp_path / "selection.txt"), "--heldout-gate", str(tmp_path / "gate.txt")),
        ]
    )
    record = TeacherVectors.load(output)
    assert set(record.sentences) == set(text) | set(held)
    for part, sentences in parts.items():
        file = f"agreement-{part}.tsv"
        rows = [line.split("\t") for line in (output / file).read_text().splitlines()]
        assert record.meta["agreement"][part] == {"heldout": len(sentences), "pairs": len(rows), "file": file}
        # each sentence's 2 neighbours and 1 random partner within its part, a pair once
        assert len(sentences) <= len(rows) <= len(sentences) * 3
        for a, b, score in rows:
            assert a in sentences and b in sentences and a != b  # never a pair across the parts
            u, v = record.lookup([a, b])
            cosine = float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
            assert float(score) == pytest.approx(cosine, abs=1e-5)
