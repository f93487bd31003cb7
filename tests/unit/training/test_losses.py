"""The losses and objectives against independent transcriptions of their anchors' arithmetic.

ConSERT: ``sentence_transformers/losses/AdvCLSoftmaxLoss.py`` (``_contrastive_loss_forward``, ``_reps_to_output``,
``forward`` with ``--add_cl``); SimCSE: ``simcse/models.py`` ``cl_forward``; ESimCSE: ``esimcse/models.py``.
The transcriptions below use plain loops over anchors (or ConSERT's own tensor code, copied with its variable
names), never sentcl's functions.
"""

from __future__ import annotations

import math

import pytest
import torch

from sentcl.model.encoder import Encoder
from sentcl.training.losses import NLIHead, info_nce, nli_loss, nt_xent, sup_simcse
from sentcl.training.objectives.base import Embedder
from sentcl.training.objectives.factory import build_objective
from tests.tiny import make_tiny_encoder, train_config

LARGE_NUM = 1e9


def cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(y * y for y in b))


def consert_contrastive(hidden1: torch.Tensor, hidden2: torch.Tensor, temperature: float) -> torch.Tensor:
    """AdvCLSoftmaxLoss._contrastive_loss_forward, nt_xent with do_hidden_normalization, as ConSERT wrote it."""
    batch_size, hidden_dim = hidden1.shape
    hidden1 = torch.nn.functional.normalize(hidden1, p=2, dim=-1)
    hidden2 = torch.nn.functional.normalize(hidden2, p=2, dim=-1)
    hidden1_large, hidden2_large = hidden1, hidden2
    labels = torch.arange(0, batch_size)
    masks = torch.nn.functional.one_hot(torch.arange(0, batch_size), num_classes=batch_size).float()
    logits_aa = torch.matmul(hidden1, hidden1_large.transpose(0, 1)) / temperature - masks * LARGE_NUM
    logits_bb = torch.matmul(hidden2, hidden2_large.transpose(0, 1)) / temperature - masks * LARGE_NUM
    logits_ab = torch.matmul(hidden1, hidden2_large.transpose(0, 1)) / temperature
    logits_ba = torch.matmul(hidden2, hidden1_large.transpose(0, 1)) / temperature
    loss_a = torch.nn.functional.cross_entropy(torch.cat([logits_ab, logits_aa], dim=1), labels)
    loss_b = torch.nn.functional.cross_entropy(torch.cat([logits_ba, logits_bb], dim=1), labels)
    return loss_a + loss_b


def nt_xent_by_loops(z1, z2, t, extra=()) -> float:
    """The same by a loop over anchors: each view's anchors against the other view and their own view's others;
    ``extra`` candidates join the first view's anchors only (ESimCSE's queue)."""
    n = len(z1)
    total = 0.0
    for views, others, queue in ((z1, z2, extra), (z2, z1, ())):
        part = 0.0
        for i in range(n):
            candidates = [others[j] for j in range(n)] + [views[j] for j in range(n) if j != i] + list(queue)
            denominator = sum(math.exp(cos(views[i], c) / t) for c in candidates)
            part += -math.log(math.exp(cos(views[i], others[i]) / t) / denominator)
        total += part / n
    return total


def simcse_by_loops(z1, z2, t, extra=()) -> float:
    """cl_forward: cos_sim = sim(z1.unsqueeze(1), z2.unsqueeze(0)) / temp; CE with labels arange (one way);
    ESimCSE: cat((cos_sim, sim(z1, pre_z1)), 1)."""
    n = len(z1)
    total = 0.0
    for i in range(n):
        scores = [math.exp(cos(z1[i], z2[j]) / t) for j in range(n)] + [
            math.exp(cos(z1[i], e) / t) for e in extra
        ]
        total += -math.log(scores[i] / sum(scores))
    return total / n


Z1 = [[1.0, 0.0, 0.5], [0.2, 1.0, -0.3], [-1.0, 0.4, 0.1]]
Z2 = [[0.9, 0.1, 0.4], [0.0, 1.0, 0.0], [-0.5, -0.5, 1.0]]
QUEUE = [[0.3, 0.3, 0.3], [1.0, -1.0, 0.0]]


@pytest.mark.parametrize("t", [0.05, 0.1, 1.0])
def test_nt_xent_is_consert_sum_of_both_directions(t):
    got = nt_xent(torch.tensor(Z1), torch.tensor(Z2), t)
    torch.testing.assert_close(got, consert_contrastive(torch.tensor(Z1), torch.tensor(Z2), t))
    assert math.isclose(got.item(), nt_xent_by_loops(Z1, Z2, t), rel_tol=1e-5)


def test_queue_negatives_join_the_first_views_anchors_only():
    for loss, by_hand in ((nt_xent, nt_xent_by_loops), (info_nce, simcse_by_loops)):
        got = loss(torch.tensor(Z1), torch.tensor(Z2), 0.1, torch.tensor(QUEUE)).item()
        assert math.isclose(got, by_hand(Z1, Z2, 0.1, QUEUE), rel_tol=1e-5)


def test_info_nce_is_simcse_one_way_loss():
    for t in (0.05, 0.5):
        got = info_nce(torch.tensor(Z1), torch.tensor(Z2), t).item()
        assert math.isclose(got, simcse_by_loops(Z1, Z2, t), rel_tol=1e-5)
        assert not math.isclose(got, info_nce(torch.tensor(Z2), torch.tensor(Z1), t).item(), rel_tol=1e-3)


def test_sup_simcse_matches_a_hand_computed_example():
    a, p, n = Z1, Z2, [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.5, -1.0, 0.0]]
    t = 0.05
    expected = 0.0
    for i in range(3):
        scores = [math.exp(cos(a[i], c) / t) for c in p + n]
        expected += -math.log(scores[i] / sum(scores))
    got = sup_simcse(torch.tensor(a), torch.tensor(p), torch.tensor(n), t).item()
    assert math.isclose(got, expected / 3, rel_tol=1e-5)


@pytest.mark.parametrize("max_square", [False, True])
def test_nli_head_is_consert_reps_to_output(max_square):
    torch.manual_seed(0)
    head = NLIHead(3, max_square=max_square)
    labels = [0, 2, 1]
    w, b = head.linear.weight.tolist(), head.linear.bias.tolist()
    expected = 0.0
    for i in range(3):
        features = Z1[i] + Z2[i] + [abs(x - y) for x, y in zip(Z1[i], Z2[i], strict=True)]
        if max_square:  # torch.max(rep_a, rep_b).pow(2)
            features += [max(x, y) ** 2 for x, y in zip(Z1[i], Z2[i], strict=True)]
        logits = [sum(wk * f for wk, f in zip(w[k], features, strict=True)) + b[k] for k in range(3)]
        expected += -logits[labels[i]] + math.log(sum(math.exp(x) for x in logits))
    got = nli_loss(head, torch.tensor(Z1), torch.tensor(Z2), torch.tensor(labels)).item()
    assert math.isclose(got, expected / 3, rel_tol=1e-5)


@pytest.fixture(scope="module")
def still_encoder(tmp_path_factory):
    return Encoder.from_pretrained(str(make_tiny_encoder(tmp_path_factory.mktemp("obj"), dropout=0.0)))


PAIRS = [
    ("a man is playing a guitar", "a man plays", 0),
    ("two dogs on the street", "a cat", 2),
    ("the woman is riding a red horse", "a woman rides", 0),
    ("children playing ball", "kids are sitting", 1),
]


def test_joint_objective_equals_advclsoftmaxloss_arithmetic(still_encoder):
    """CE on the first (plain) view + cl_rate * (contrast(premises) + contrast(hypotheses)), token cutoff view 2."""
    config = train_config(
        mode="joint", views=("none", "token_cutoff"), view={"token_cutoff": 0.3}, max_square=True, alpha=0.15
    )
    objective = build_objective(config, still_encoder.dim)
    embed = Embedder(still_encoder, config.view, torch.Generator().manual_seed(5), torch.device("cpu"))
    reps = objective.representations(embed, PAIRS)
    loss = objective.loss(reps)
    # ConSERT, data_augmentation_strategy "cutoff": rep_a, rep_b plain; rep_a_cutoff, rep_b_cutoff the second view.
    rep_a, rep_b = reps["u"], reps["v"]
    rep_a_cutoff, rep_b_cutoff = reps["p2"], reps["h2"]
    w = objective.classifier.head.linear
    features = torch.cat([rep_a, rep_b, torch.abs(rep_a - rep_b), torch.max(rep_a, rep_b).pow(2)], 1)
    loss_n_n = torch.nn.functional.cross_entropy(w(features), reps["labels"])
    contrastive_loss_a = consert_contrastive(rep_a, rep_a_cutoff, 0.1)
    contrastive_loss_b = consert_contrastive(rep_b, rep_b_cutoff, 0.1)
    expected = loss_n_n + 0.15 * (contrastive_loss_a + contrastive_loss_b)
    torch.testing.assert_close(loss, expected)
    # The second view is a real cutoff: a premise's two views differ, and the plain view is the CE input.
    premises = embed.tokenize([p for p, _, _ in PAIRS])
    with torch.no_grad():
        plain = still_encoder(premises["input_ids"], premises["attention_mask"])
    assert not torch.allclose(rep_a, rep_a_cutoff) and torch.allclose(rep_a, plain, atol=1e-5)


def test_simcse_preset_loss_equals_cl_forward_and_its_mlp_is_training_only(still_encoder):
    config = train_config(preset="simcse", projection=True)
    objective = build_objective(config, still_encoder.dim)
    embed = Embedder(still_encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    sentences = [p for p, _, _ in PAIRS] + [h for _, h, _ in PAIRS]
    reps = objective.representations(embed, sentences)
    # MLPLayer: dense + tanh over the pooled vector, then cos_sim / temp and one-way CE.
    mlp = objective.projection.dense
    z1, z2 = torch.tanh(mlp(reps["z1"])), torch.tanh(mlp(reps["z2"]))
    cos_sim = torch.nn.functional.cosine_similarity(z1.unsqueeze(1), z2.unsqueeze(0), dim=-1) / 0.05
    expected = torch.nn.functional.cross_entropy(cos_sim, torch.arange(len(sentences)))
    torch.testing.assert_close(objective.loss(reps), expected)
    assert not any(name.startswith("projection") for name in still_encoder.model.state_dict())
