"""The teacher stage's encoding settings on this CPU: ONNX Runtime's transformer fusions of the teacher's graph, and
how the cores are shared (worker processes against threads, the batch's token budget).

``python -m benchmarks.bench_teacher [--sentences N] [--rounds R]``. N random sentences of the STS pairs
(``data/processed/pairs.parquet``), the teacher of ``teacher.folder`` as the teacher stage opens it
(:class:`sentcl.model.fast_encode.FastEncoder`). Each comparison alternates its variants round by round on the same
sentences and prints the median rate, every round's seconds and the largest difference from the default's vectors:

- **graph**: the graph the stage exports (ONNX Runtime at ``ORT_ENABLE_ALL``) against it after
  ``onnxruntime.transformers.optimizer.optimize_model`` (BERT fusions, levels 1 and 2), one thread in this process;
- **cores**: the stage's default (one worker process of one thread a core, 512 padded tokens a batch) against one
  session of every thread, and against 1,024 tokens a batch.

A variant is worth keeping only if it is faster beyond the rounds' spread (its slowest round faster than the
default's fastest) and its vectors stay within fp32 rounding (``EXPORT_TOLERANCE``). Prints one line at the end
saying which won: the default unless one is.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from sentcl.model import teacher as T
from sentcl.model.fast_encode import EXPORT_TOLERANCE, FastEncoder, cpu_threads, ort_session
from sentcl.model.folder import transformer_folder
from sentcl.training.teacher_run import local_teacher
from stages.common import PROCESSED, ROOT, load_params


def compare(title: str, variants: dict[str, Callable[[], np.ndarray]], count: int, rounds: int) -> str:
    """Each variant once a round, in turn; a table; the winner: the first (the default) unless another is within
    fp32 tolerance of its vectors and faster beyond the rounds' spread (its slowest round faster than the
    default's fastest), then the fastest such."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, encode in variants.items():
            start = time.perf_counter()
            vectors[name] = encode()
            seconds[name].append(time.perf_counter() - start)
    default = next(iter(variants))
    print(f"\n{title}: {count} sentences, {rounds} rounds")
    rates = {name: count / statistics.median(times) for name, times in seconds.items()}
    for name, times in seconds.items():
        gap = float(np.abs(vectors[name] - vectors[default]).max())
        print(
            f"{name:44s} {rates[name]:7.1f} sentences/s  x{rates[name] / rates[default]:.3f}  "
            f"rounds {', '.join(f'{t:.1f}' for t in times)} s  max |diff| {gap:.1e}"
        )
        if gap > EXPORT_TOLERANCE or (name != default and max(times) >= min(seconds[default])):
            rates[name] = 0.0  # lossy, or not faster beyond the spread: never the winner
    return max(rates, key=rates.get)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig

    settings = T.TeacherConfig.from_params(load_params())
    folder = local_teacher(settings.model, settings, ROOT)  # verified, unpacked from its pieces if need be
    pooling = T.folder_pooling(folder)
    config = AutoConfig.from_pretrained(transformer_folder(folder))
    pairs = pd.read_parquet(PROCESSED / "pairs.parquet")
    pool = sorted(set(pairs.sentence1) | set(pairs.sentence2))
    random.Random(0).shuffle(pool)
    sentences = pool[: args.sentences]

    one = FastEncoder(folder, pooling=pooling, threads=1, workers=1)
    graphs = {"as the teacher stage exports it": one.onnx_path}
    with tempfile.TemporaryDirectory(prefix="sentcl-fused-") as scratch:
        heads, hidden = config.num_attention_heads, config.hidden_size
        for level in (1, 2):
            fused = optimize_model(
                one.onnx_path, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=level
            )
            counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
            print(f"BERT fusions, level {level}: {counts or 'none'}")
            path = str(Path(scratch) / f"fused-{level}.onnx")
            fused.save_model_to_file(path)
            graphs[f"BERT fusions, level {level}"] = path

        def on_graph(path: str) -> Callable[[], np.ndarray]:
            """The stage's own encoder (one thread, in this process) running ``path`` instead of its export."""
            encoder = copy.copy(one)  # its tokenizer and batching; only the session differs
            encoder.session = ort_session(path, 1, spin=True)
            return lambda: encoder(sentences)

        sessions = {name: on_graph(path) for name, path in graphs.items()}
        graph = compare("graph (one thread)", sessions, len(sentences), args.rounds)

    cores = cpu_threads()
    encoders = {
        f"{cores} workers x 1 thread (the default)": FastEncoder(folder, pooling=pooling, threads=cores),
        f"1 session x {cores} threads": FastEncoder(folder, pooling=pooling, threads=cores, workers=1),
        f"{cores} workers x 1 thread, 1,024 tokens a batch": FastEncoder(
            folder, pooling=pooling, threads=cores, max_tokens=1024
        ),
    }
    split = compare(
        f"cores ({cores})",
        {name: (lambda e=e: e(sentences)) for name, e in encoders.items()},
        len(sentences),
        args.rounds,
    )
    print(f"\nbench-teacher: the graph to keep: {graph}; the use of the cores to keep: {split}")


if __name__ == "__main__":
    main()
