"""The paper's analyses of a representation space: alignment and uniformity (Wang and Isola, 2020), the cosine
distribution by gold-score bucket (ConSERT Figure 1, the "collapse" of BERT's space), and the Spearman of mean
pooling with the top-k most frequent tokens left out (ConSERT Section 5)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from sentcl.evaluation.benchmark import Subset, spearman100
from sentcl.evaluation.sts import cosine
from sentcl.model.fast_encode import FastEncoder

# Gold STS-B scores run 0..5; the last bucket is closed so that 5.0 belongs to it.
BUCKETS = ((0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0))
POSITIVE_THRESHOLD = 4.0  # SimCSE's choice: pairs scored above 4 are the positives for alignment


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)


def alignment(a: np.ndarray, b: np.ndarray, alpha: float = 2.0) -> float:
    """E ||f(x) - f(y)||^alpha over positive pairs (rows of ``a`` and ``b``), on unit vectors. Lower is better."""
    a, b = _normalize(np.asarray(a, np.float64)), _normalize(np.asarray(b, np.float64))
    return float((np.linalg.norm(a - b, axis=1) ** alpha).mean())


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """log E exp(-t ||f(x) - f(y)||^2) over all distinct pairs of rows, on unit vectors. Lower is better."""
    x = _normalize(np.asarray(x, np.float64))
    # ||u - v||^2 = 2 - 2 u.v on unit vectors; the upper triangle holds each unordered pair once.
    sq = np.clip(2.0 - 2.0 * (x @ x.T), 0.0, None)
    upper = sq[np.triu_indices(len(x), k=1)]
    # log-mean-exp, shifted so that exp never underflows to 0 for a well spread space
    z = -t * upper
    return float(z.max() + np.log(np.exp(z - z.max()).mean()))


def bucket_of(score: float) -> int:
    for i, (low, high) in enumerate(BUCKETS):
        if low <= score < high or (i == len(BUCKETS) - 1 and score == high):
            return i
    raise ValueError(f"gold score {score} outside 0..5")


def bucket_label(i: int) -> str:
    low, high = BUCKETS[i]
    return f"{low:g}-{high:g}"


def space_stats(subset: Subset, vectors1: np.ndarray, vectors2: np.ndarray, sentences: np.ndarray) -> dict:
    """Alignment, uniformity and the cosine distribution by gold bucket for one scored subset.

    ``sentences`` holds one vector per distinct sentence (for uniformity, so repeats do not count twice).
    """
    cos = cosine(np.asarray(vectors1, np.float64), np.asarray(vectors2, np.float64))
    positives = subset.gold > POSITIVE_THRESHOLD
    buckets = np.array([bucket_of(float(g)) for g in subset.gold])
    by_bucket = {}
    for i in range(len(BUCKETS)):
        values = cos[buckets == i]
        by_bucket[bucket_label(i)] = {
            "pairs": int(values.size),
            "mean": float(values.mean()) if values.size else float("nan"),
            "std": float(values.std()) if values.size else float("nan"),
        }
    return {
        "alignment": alignment(vectors1[positives], vectors2[positives]),
        "uniformity": uniformity(sentences),
        "positive_pairs": int(positives.sum()),
        "spearman": spearman100(cos, subset.gold),
        "cosine_by_bucket": by_bucket,
        "cosine_overall": {"mean": float(cos.mean()), "min": float(cos.min()), "max": float(cos.max())},
        "cosines": cos,
        "buckets": buckets,
    }


def token_frequencies(encoder: FastEncoder, sentences: Sequence[str]) -> Counter:
    """How often each token id occurs in the tokenized ``sentences`` ([CLS] and [SEP] included: mean pooling
    averages them like any other token)."""
    counts: Counter = Counter()
    for ids in encoder._tokenize(sentences):
        counts.update(ids)
    return counts


@torch.inference_mode()
def pooled_without_frequent(
    encoder: FastEncoder,
    sentences: Sequence[str],
    ranked_ids: Sequence[int],
    max_k: int,
    progress: bool = False,
) -> np.ndarray:
    """Mean pooling of the last layer with the ``k`` most frequent tokens left out, for every k in 0..max_k.

    Returns ``[max_k + 1, len(sentences), dim]``. One forward pass serves every k: a token of frequency rank
    r is in the mean for k <= r, so the sum for k is the full sum minus the cumulated sums of ranks < k.
    A sentence made only of removed tokens keeps the plain mean (it would have no vector otherwise).
    """
    rank = {int(token): r for r, token in enumerate(ranked_ids[:max_k])}
    out = np.zeros((max_k + 1, len(sentences), encoder.dim), dtype=np.float32)
    model = encoder.torch_model.model
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(sentences), desc="frequent-token pooling", unit="sent", leave=False)
    for rows, input_ids, mask in encoder.batches(sentences):
        ids_t, mask_t = torch.from_numpy(input_ids), torch.from_numpy(mask)
        hidden = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state.double()
        m = mask_t.double()
        ranks = np.vectorize(lambda t: rank.get(int(t), max_k))(input_ids)
        # by_rank[r] = sum and count of the tokens of rank r in each sentence (rank max_k = "never removed")
        one_hot = torch.nn.functional.one_hot(torch.from_numpy(ranks), max_k + 1).double() * m.unsqueeze(-1)
        sums = torch.einsum("btr,btd->rbd", one_hot, hidden)  # [rank, batch, dim]
        counts = one_hot.sum(1).T  # [rank, batch]
        total_sum, total_count = sums.sum(0), counts.sum(0)
        removed_sum = torch.cat([torch.zeros_like(sums[:1]), sums[:max_k].cumsum(0)])
        removed_count = torch.cat([torch.zeros_like(counts[:1]), counts[:max_k].cumsum(0)])
        kept_sum, kept_count = total_sum - removed_sum, total_count - removed_count
        empty = kept_count <= 0
        kept_sum[empty] = total_sum.expand_as(kept_sum)[empty]
        kept_count[empty] = total_count.expand_as(kept_count)[empty]
        out[:, rows] = (kept_sum / kept_count.unsqueeze(-1)).float().numpy()
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()
    return out
