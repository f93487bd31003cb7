"""The losses against small examples computed independently, with explicit loops over anchors."""

from __future__ import annotations

import math

import torch

from sentcl.losses import NLIHead, joint_loss, nli_loss, nt_xent, sup_simcse


def cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(y * y for y in b))


def nt_xent_by_hand(z1: list[list[float]], z2: list[list[float]], t: float, extra=()) -> float:
    views = z1 + z2
    n = len(z1)
    total = 0.0
    for i, anchor in enumerate(views):
        positive = (i + n) % (2 * n)
        others = [j for j in range(2 * n) if j != i]
        denominator = sum(math.exp(cos(anchor, views[j]) / t) for j in others)
        denominator += sum(math.exp(cos(anchor, e) / t) for e in extra)
        total += -math.log(math.exp(cos(anchor, views[positive]) / t) / denominator)
    return total / (2 * n)


Z1 = [[1.0, 0.0, 0.5], [0.2, 1.0, -0.3], [-1.0, 0.4, 0.1]]
Z2 = [[0.9, 0.1, 0.4], [0.0, 1.0, 0.0], [-0.5, -0.5, 1.0]]


def test_nt_xent_matches_a_hand_computed_example():
    for t in (0.05, 0.1, 1.0):
        got = nt_xent(torch.tensor(Z1), torch.tensor(Z2), t).item()
        assert math.isclose(got, nt_xent_by_hand(Z1, Z2, t), rel_tol=1e-5)


def test_nt_xent_two_sentences_by_closed_form():
    # Orthogonal sentences with identical views: each anchor sees its positive at cos 1 and two negatives at 0.
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    expected = -math.log(math.e / (math.e + 2))
    assert math.isclose(nt_xent(z, z, 1.0).item(), expected, rel_tol=1e-6)


def test_nt_xent_extra_negatives_join_every_denominator():
    extra = [[0.3, 0.3, 0.3], [1.0, -1.0, 0.0]]
    got = nt_xent(torch.tensor(Z1), torch.tensor(Z2), 0.1, torch.tensor(extra)).item()
    assert math.isclose(got, nt_xent_by_hand(Z1, Z2, 0.1, extra), rel_tol=1e-5)


def test_sup_simcse_matches_a_hand_computed_example():
    a, p, n = Z1, Z2, [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.5, -1.0, 0.0]]
    t = 0.05
    expected = 0.0
    for i in range(3):
        scores = [math.exp(cos(a[i], c) / t) for c in p + n]
        expected += -math.log(scores[i] / sum(scores))
    got = sup_simcse(torch.tensor(a), torch.tensor(p), torch.tensor(n), t).item()
    assert math.isclose(got, expected / 3, rel_tol=1e-5)


def test_nli_head_is_linear_over_u_v_and_their_distance():
    torch.manual_seed(0)
    head = NLIHead(3)
    u, v = torch.tensor(Z1), torch.tensor(Z2)
    labels = torch.tensor([0, 2, 1])
    w, b = head.linear.weight.tolist(), head.linear.bias.tolist()
    expected = 0.0
    for i in range(3):
        features = Z1[i] + Z2[i] + [abs(x - y) for x, y in zip(Z1[i], Z2[i], strict=True)]
        logits = [sum(wk * f for wk, f in zip(w[k], features, strict=True)) + b[k] for k in range(3)]
        expected += -logits[labels[i]] + math.log(sum(math.exp(x) for x in logits))
    assert math.isclose(nli_loss(head, u, v, labels).item(), expected / 3, rel_tol=1e-5)
    joint = joint_loss(head, u, v, labels, u, v, 0.1, alpha=0.15).item()
    assert math.isclose(joint, expected / 3 + 0.15 * nt_xent_by_hand(Z1, Z2, 0.1), rel_tol=1e-5)


def test_nt_xent_gradient_pulls_positives_together():
    z1 = torch.tensor(Z1, requires_grad=True)
    z2 = torch.tensor(Z2)
    before = nt_xent(z1, z2, 0.1)
    before.backward()
    with torch.no_grad():
        after = nt_xent(z1 - 0.01 * z1.grad, z2, 0.1)
    assert after < before
