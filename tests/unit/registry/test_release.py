"""The model card (sentcl.registry.release.model_card) says what the shipped checkpoint trained with and on what:
the objective actually trained, the teacher (name, licence, weights sha256), and its scores split by what it saw,
each beside the base model on the same pairs; from the run's own records, on hand-built rows."""

from __future__ import annotations

import json

from sentcl.registry import release as rel

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSb", "SICK-R"]
SHA = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
DISTILLED = {
    "mode": "transfer",
    "objective": "distill",
    "steps": 400,
    "batch_size": 32,
    "lr": 0.0002,
    "freeze": ["embeddings.word_embeddings"],
    "distill": {
        "loss": "similarity_mse",
        "examples": "neighbours",
        "neighbours": 3,
        "group_weight": 40.0,
        "keep_hardest": 1.0,
    },
    "teacher": {
        "model": "all-mpnet-base-v2",
        "source": "sentence-transformers/all-mpnet-base-v2",
        "licence": "Apache-2.0",
        "weights_sha256": SHA,
    },
}


def info(training):
    return {
        "model_name": "sentcl-encoder",
        "checkpoint": "transfer-base",
        "candidates": ["base", "transfer-base"],
        "stsb_dev": 87.5,
        "beat_init": True,
        "training": training,
        "git_commit": None,
        "exported_at": "now",
        "weights_sha256": {},
        "onnx": {"max_abs_diff_vs_pytorch": 1e-7},
    }


def rows():
    champion = {
        "all": {t: 80.0 for t in TASKS} | {"avg": 80.0},
        "stsb_dev": 87.5,
        "seen_split": {
            "avg": {
                "seen": {"spearman": 82.0, "tasks": 7, "pairs": 15000},
                "unseen": {"spearman": 75.5, "tasks": 5, "pairs": 1200},
                "mixed": {"spearman": 78.0, "tasks": 6, "pairs": 1800},
            },
            "base_same_pairs": {
                "seen": {"spearman": 79.5, "tasks": 7, "pairs": 15000},
                "unseen": {"spearman": 74.0, "tasks": 5, "pairs": 1200},
                "mixed": {"spearman": 77.0, "tasks": 6, "pairs": 1800},
            },
        },
        "unseen_sts": {"pairs": 689, "spearman": 74.25},
    }
    base = {
        "all": {t: 78.0 for t in TASKS} | {"avg": 78.0},
        "stsb_dev": 86.7,
        "unseen_sts": {"pairs": 689, "spearman": 73.0},
    }
    return champion, base


def test_a_distilled_champion_names_its_teacher_objective_and_seen_split():
    champion, base = rows()
    card = rel.model_card(
        info(DISTILLED), {"model": {"name": "all-MiniLM-L6-v2", "max_length": 64}}, champion, base
    )
    assert "knowledge-distillation" in card.split("---")[1] and "contrastive" not in card.split("## Use")[0]
    assert "**distilled** by the sentcl pipeline from a stronger teacher, `all-mpnet-base-v2`" in card
    assert "400 steps of 32 groups of a sentence and its 3 nearest teacher neighbours" in card
    assert "a group's own entries weighing 40" in card and "embeddings.word_embeddings left untrained" in card
    assert "| licence | Apache-2.0 |" in card and f"| weights sha256 | `{SHA}` |" in card
    lines = card.splitlines()
    # gains by hand: 82.0 - 79.5, 78.0 - 77.0, 75.5 - 74.0, 74.25 - 73.0
    assert "| test pairs, both sentences trained on | 82.00 | 15000 | 79.50 | +2.50 |" in lines
    assert "| test pairs, one | 78.00 | 1800 | 77.00 | +1.00 |" in lines
    assert "| test pairs, neither | 75.50 | 1200 | 74.00 | +1.50 |" in lines
    assert "| unseen STS (no stage read either sentence) | 74.25 | 689 | 73.00 | +1.25 |" in lines


def test_a_base_or_contrastive_checkpoint_says_so_and_has_no_teacher():
    champion, base = rows()
    plain = rel.model_card(info(None), {}, base, base)
    assert "The pretrained base model, unchanged" in plain and "## Teacher" not in plain
    contrastive = dict(DISTILLED, objective="contrastive", views=["feature_cutoff", "shuffle"])
    del contrastive["teacher"], contrastive["distill"]
    card = rel.model_card(info(contrastive), {}, champion, base)
    assert "objective `contrastive`, views feature_cutoff + shuffle" in card and "## Teacher" not in card
    assert "contrastive-learning" in card.split("---")[1]


def test_the_training_record_is_read_from_the_stage_metrics(tmp_path):
    (tmp_path / "transfer-base.json").write_text(json.dumps({"beat_init": True, "trained": DISTILLED}))
    assert rel.training_record("transfer-base", tmp_path) == DISTILLED
    assert rel.training_record("base", tmp_path) is None
