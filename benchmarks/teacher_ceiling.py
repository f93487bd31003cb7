"""The ceilings of distillation: the teacher alone, the student alone and their ensemble (the mean of the two
cosines of each pair) on the seven STS tasks (both protocols), the selection sets (STS-B dev, SICK-R trial) and the
unseen-STS pairs of the evaluate stage (``sentcl.data.roles``: none of their sentences in any training stage's text
or any evaluated split); also the teacher through the PCA projection that ``embedding_mse`` distils toward.

The teacher stage encodes only what training reads (the transfer text), so the teacher model runs here, through
the evaluate stage's fast path, as the student does. Scoring is ``sentcl.evaluation.benchmark``'s (the evaluate
stage's). A benchmark: it reads the test sets; it chooses nothing.

    python -m benchmarks.teacher_ceiling [--teacher models/teacher/all-mpnet-base-v2] [--student models/base]
                                         [--output F.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sentcl.evaluation import seen
from sentcl.evaluation.benchmark import TASKS, load_benchmark, protocol_scores, spearman100
from sentcl.evaluation.sts import cosine
from sentcl.model.fast_encode import FastEncoder
from sentcl.model.teacher import TeacherConfig
from sentcl.training.objectives.distill import pca_components
from sentcl.training.recipes import training_stages
from sentcl.training.teacher_run import open_encoder
from stages.common import MODELS, PROCESSED, RAW, SEEN, load_params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", default=str(MODELS / "teacher" / "all-mpnet-base-v2"))
    parser.add_argument("--student", default=str(MODELS / "base"))
    parser.add_argument("--data", type=Path, default=RAW)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)

    texts = {s for stage in training_stages() for s in (SEEN / f"{stage}.txt").read_text().splitlines()}
    unseen = seen.unseen_sts_subsets(pd.read_parquet(PROCESSED / "pairs.parquet"), texts)
    benchmark = load_benchmark(args.data)
    parts = [*benchmark.subsets, *benchmark.dev_subsets, *unseen]
    sentences = list(dict.fromkeys(x for p in parts for side in (p.sentences1, p.sentences2) for x in side))
    settings = TeacherConfig.from_params(load_params())
    t = open_encoder(Path(args.teacher), settings.backend, settings.max_tokens)(
        sentences
    )  # as the stage encodes
    s = FastEncoder(args.student, progress=True)(sentences)
    # the embedding_mse target: the teacher through its top principal axes, one per student dimension (the
    # sentence-transformers distillation example's PCA Dense layer, applied to uncentred vectors)
    t_pca = t.astype(np.float32) @ pca_components(t, s.shape[1]).numpy().T
    index = {x: i for i, x in enumerate(sentences)}

    def cosines(vectors: np.ndarray, subset) -> np.ndarray:  # noqa: ANN001
        a = vectors[[index[x] for x in subset.sentences1]].astype(np.float64)
        b = vectors[[index[x] for x in subset.sentences2]].astype(np.float64)
        return cosine(a, b)

    results = {}
    for name, sims in (
        ("teacher", lambda sub: cosines(t, sub)),
        ("student", lambda sub: cosines(s, sub)),
        ("ensemble", lambda sub: (cosines(t, sub) + cosines(s, sub)) / 2),
        ("teacher_pca", lambda sub: cosines(t_pca, sub)),
    ):
        row = protocol_scores(benchmark.subsets, [sims(sub) for sub in benchmark.subsets])
        row["stsb_dev"] = spearman100(sims(benchmark.dev), benchmark.dev.gold)
        row["sick_dev"] = spearman100(sims(benchmark.sick_dev), benchmark.sick_dev.gold)
        row["unseen_sts"] = seen.unseen_sts_scores(unseen, [sims(sub) for sub in unseen])
        results[name] = row
        cells = " ".join(f"{row['all'][k]:.2f}" for k in (*TASKS, "avg"))
        print(
            f"{name:12s} {cells} | STS-B dev {row['stsb_dev']:.2f} | SICK-R trial {row['sick_dev']:.2f} | "
            f"unseen STS {row['unseen_sts']['spearman']:.2f} ({row['unseen_sts']['pairs']} pairs)"
        )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
