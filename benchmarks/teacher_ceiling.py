"""The ceilings of distillation: the teacher alone, the student alone and their ensemble (the mean of the two
cosines of each pair) on the seven STS tasks, both protocols, plus STS-B dev; also the teacher through the PCA
projection that ``embedding_mse`` distils toward (as many axes as the student has dimensions).

The teacher's vectors are the teacher stage's output (data/teacher, fp16), so the teacher is not run again; the
student is encoded with the evaluate stage's fast path. Scoring is ``sentcl.evaluation.benchmark``'s (the evaluate stage's).

    python benchmarks/teacher_ceiling.py [--teacher-vectors data/teacher] [--student models/base] [--output F.json]
    python benchmarks/teacher_ceiling.py --unseen [--teacher models/teacher/all-mpnet-base-v2] [--student DIR]

``--unseen``: the teacher and the student on the evaluate stage's unseen-STS pairs instead (the scored STS-B and
SICK train pairs none of whose sentences any training stage's text in data/seen/ holds, nor any evaluation
reads: ``sentcl.evaluation.seen.unseen_sts_subsets``). Their sentences are in no teacher vectors file, so the
teacher model is run, through the evaluate stage's fast path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: this checkout's packages

from sentcl.params import ROOT  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from sentcl.evaluation.benchmark import TASKS, load_benchmark, protocol_scores, spearman100
    from sentcl.evaluation.sts import cosine
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.teacher import TeacherVectors
    from sentcl.training.objectives.distill import pca_components

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher-vectors", type=Path, default=ROOT / "data" / "teacher")
    parser.add_argument("--student", default=str(ROOT / "models" / "base"))
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "raw")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--unseen", action="store_true", help="score the unseen-STS pairs instead")
    parser.add_argument("--teacher", default=str(ROOT / "models" / "teacher" / "all-mpnet-base-v2"))
    args = parser.parse_args(argv)
    if args.unseen:
        return unseen(args.teacher, args.student)

    benchmark = load_benchmark(args.data)
    sentences = benchmark.sentences
    teacher = TeacherVectors.load(args.teacher_vectors)
    t = teacher.lookup(sentences)
    s = FastEncoder(args.student)(sentences)
    # the embedding_mse target: the teacher through its top principal axes, one per student dimension (the
    # sentence-transformers distillation example's PCA Dense layer, applied to uncentred vectors)
    axes = pca_components(teacher.vectors, s.shape[1]).numpy()
    t_pca = t.astype(np.float32) @ axes.T
    index = {x: i for i, x in enumerate(sentences)}

    def cosines(vectors: np.ndarray, subset) -> np.ndarray:
        a = vectors[[index[x] for x in subset.sentences1]].astype(np.float64)
        b = vectors[[index[x] for x in subset.sentences2]].astype(np.float64)
        return cosine(a, b)

    results = {}
    for name, sims in (
        ("teacher", lambda sub: cosines(t, sub)),
        ("student", lambda sub: cosines(s, sub)),
        ("ensemble", lambda sub: (cosines(t, sub) + cosines(s, sub)) / 2),
        ("teacher_pca", lambda sub: cosines(t_pca, sub)),
        # what storing vectors in float16 costs, measured on the student (whose fp32 vectors are at hand)
        ("student_fp16", lambda sub: cosines(s.astype(np.float16).astype(np.float32), sub)),
    ):
        row = protocol_scores(benchmark.subsets, [sims(sub) for sub in benchmark.subsets])
        row["stsb_dev"] = spearman100(sims(benchmark.dev), benchmark.dev.gold)
        results[name] = row
    results["teacher_meta"] = teacher.meta
    for name in ("teacher", "student", "ensemble", "teacher_pca", "student_fp16"):
        for protocol in ("all", "mean"):
            row = results[name][protocol]
            cells = " ".join(f"{row[k]:.2f}" for k in (*TASKS, "avg"))
            print(f"{name:12s} {protocol:4s} {cells} | dev {results[name]['stsb_dev']:.2f}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def unseen(teacher: str, student: str) -> int:
    import pandas as pd
    from transformers import AutoTokenizer

    from sentcl.evaluation import seen
    from sentcl.evaluation.sts import cosine
    from sentcl.model.encoder import resolve_model_path
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.training.recipes import training_stages
    from stages.common import PROCESSED, SEEN, load_params

    texts = {s for stage in training_stages() for s in (SEEN / f"{stage}.txt").read_text().splitlines()}
    max_length = int(load_params()["model"]["max_length"])
    tokens = seen.token_matcher(
        AutoTokenizer.from_pretrained(resolve_model_path(ROOT / "models" / "base")), max_length
    )
    subsets = seen.unseen_sts_subsets(pd.read_parquet(PROCESSED / "pairs.parquet"), texts, tokens)
    for name, folder in (("teacher", teacher), ("student", student)):
        encode = FastEncoder(folder, pooling="last-avg")
        row = seen.unseen_sts_scores(
            subsets, [cosine(encode(list(s.sentences1)), encode(list(s.sentences2))) for s in subsets]
        )
        sources = ", ".join(f"{k} {v['spearman']:.2f} ({v['pairs']})" for k, v in row["sources"].items())
        print(f"unseen STS: {name} {row['spearman']:.2f} on {row['pairs']} pairs ({sources}; {folder})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
