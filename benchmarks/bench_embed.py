"""Embedding throughput on CPU: torch fp32 (sentence-transformers ``encode``), ONNX fp32 and ONNX int8, as whole
``python -m stages.embed`` processes (``--backend sentence-transformers | onnx | int8``).

Each encodes the unique sentences of the seven STS test tasks (26,289 on the SentEval mirror) from a text file,
one a line, into a ``.npy``, timed start to exit (imports, model load, the fast path's ONNX export, the output).
All three run pinned to the same cores (``--threads``, default 2: the affinity mask and OMP_NUM_THREADS), so
thread counts match. The runs alternate (torch, onnx, int8, torch, ...) so that a machine shared with other jobs
slows each alike; throughput is sentences over the median wall time, printed as ratios to torch fp32 with the
load average. The int8 vectors are compared with fp32's (cosine), so a fast but wrong graph shows.

The model is a release folder with ``onnx/model_int8.onnx`` (``models/export``, the export stage's); any other
sentence-transformers folder or the bundled model's name is first exported and quantised into a scratch copy
with params.yaml ``export`` (as the export stage would, without its tolerance gate).

    make bench-embed                       # or: python benchmarks/bench_embed.py --model all-MiniLM-L6-v2 --data DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: this checkout's packages

from sentcl.params import ROOT  # noqa: E402
from stages.common import load_params  # noqa: E402

BACKENDS = {"torch fp32": "sentence-transformers", "onnx fp32": "onnx", "onnx int8": "int8"}


def timed(cmd: list[str], cores: list[int]) -> float:
    env = {**os.environ, "SENTCL_MLFLOW": "0", "OMP_NUM_THREADS": str(len(cores))}
    started = time.perf_counter()
    subprocess.run(
        cmd,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),  # the same cores for every backend
    )
    return time.perf_counter() - started


def release_folder(model: str, scratch: Path, params: Mapping[str, Any]) -> Path:
    """``model`` itself when it holds the int8 graph, else a scratch copy exported and quantised as the export
    stage does it."""
    from sentcl.model.encoder import resolve_model_path
    from sentcl.model.quantize import FP32_FILE, INT8_FILE, QuantizeConfig, quantize

    folder = Path(resolve_model_path(model))
    if (folder / INT8_FILE).is_file():
        return folder
    from sentcl.registry.release import export_onnx

    config = QuantizeConfig.from_params(params)
    if config.int8_method not in ("dynamic",):
        raise SystemExit(
            f"bench-embed: {model} has no {INT8_FILE}; run the export stage (static needs its text)"
        )
    copy = scratch / "model"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("onnx"))
    export_onnx(copy, int(params["model"]["max_length"]))
    quantize(copy / FP32_FILE, copy / INT8_FILE, config.int8_method, config.int8_per_channel)
    print(
        f"bench-embed: {model} exported and quantised ({config.int8_method}) into a scratch copy", flush=True
    )
    return copy


def main(argv: list[str] | None = None) -> int:
    from sentcl.evaluation.benchmark import load_benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/export", help="release folder (default models/export)")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "raw")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="cores every backend is pinned to")
    args = parser.parse_args(argv)
    params = load_params()
    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    sentences = load_benchmark(args.data, with_dev=False).sentences
    with tempfile.TemporaryDirectory(prefix="sentcl-bench-embed-") as tmp:
        folder = release_folder(args.model, Path(tmp), params)
        text = Path(tmp) / "sentences.txt"
        # One a line: a sentence holding a line break would become two lines (none does in SentEval).
        text.write_text("".join(s.replace("\n", " ") + "\n" for s in sentences), encoding="utf-8")
        times: dict[str, list[float]] = {name: [] for name in BACKENDS}
        load_before = os.getloadavg()
        for repeat in range(args.repeats):
            for name, backend in BACKENDS.items():
                options = {"--model": folder, "--input": text, "--output": Path(tmp) / f"{backend}.npy"}
                cmd = params.command("stages.embed", {**options, "--no-progress": True, "--backend": backend})
                times[name].append(timed(cmd, cores))
                print(f"bench-embed: run {repeat + 1} {name} {times[name][-1]:.1f} s", flush=True)
        load_after = os.getloadavg()
        fp32 = np.load(Path(tmp) / "onnx.npy")
        int8 = np.load(Path(tmp) / "int8.npy")
        torch_vectors = np.load(Path(tmp) / "sentence-transformers.npy")

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    cos = (unit(fp32) * unit(int8)).sum(1)
    torch_diff = np.abs(unit(fp32) - unit(torch_vectors)).max()  # the release graph may normalise, torch not
    rate = {name: len(sentences) / statistics.median(values) for name, values in times.items()}
    lines = [
        f"bench-embed: {len(sentences)} unique STS test sentences, model {args.model}, {args.repeats} runs each, "
        f"pinned to cores {cores}"
    ]
    for name in BACKENDS:
        lines.append(
            f"  {name:10s} {statistics.median(times[name]):6.1f} s ({rate[name]:.0f} sentences/s, "
            f"{rate[name] / rate['torch fp32']:.2f}x torch fp32)"
        )
    lines += [
        f"  onnx int8 / onnx fp32 = {rate['onnx int8'] / rate['onnx fp32']:.2f}x",
        f"  int8 vs fp32 cosine: min {cos.min():.4f}, mean {cos.mean():.4f}; "
        f"onnx fp32 vs torch max |diff| {torch_diff:.1e} (unit vectors)",
        f"  load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} "
        f"{load_after[1]:.2f} on {os.cpu_count()} cores",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
