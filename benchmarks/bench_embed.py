"""Embedding throughput: ``python -m stages.embed`` against ``python -m stages.evaluate``, whole processes.

Both encode the unique sentences of the seven STS test tasks (26,289 on the SentEval mirror) with the same model:
evaluate as ``--model DIR --no-dev`` (it also scores them), embed from a text file of those sentences, one a line,
into a ``.npy``. Each is timed as a whole process, start to exit (imports, model load, ONNX export, writing the
output). The runs alternate (evaluate, embed, evaluate, embed, ...) so that a machine shared with other jobs slows
both alike; throughput is sentences over the median wall time. The load average is printed with the numbers.

    make bench-embed                       # or: python benchmarks/bench_embed.py --model models/base --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET = 0.8  # issue 14: embed at no less than 0.8x evaluate's sentences per second


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "SENTCL_MLFLOW": "0"}
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    from sentcl.evaluation.benchmark import load_benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default="models/base", help="folder (default models/base; make run writes it)"
    )
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "raw")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        raise SystemExit(f"bench-embed: {args.model} is not a folder; `dvc repro base` writes models/base")
    sentences = load_benchmark(args.data, with_dev=False).sentences
    with tempfile.TemporaryDirectory(prefix="sentcl-bench-embed-") as tmp:
        text = Path(tmp) / "sentences.txt"
        # One a line: a sentence holding a line break would become two lines (none does in SentEval).
        text.write_text("".join(s.replace("\n", " ") + "\n" for s in sentences), encoding="utf-8")
        evaluate = [sys.executable, "-m", "stages.evaluate", "--model", args.model, "--data", str(args.data)]
        evaluate += ["--no-dev", "--no-progress", "--output", str(Path(tmp) / "sts.json")]
        embed = [sys.executable, "-m", "stages.embed", "--model", args.model, "--input", str(text)]
        embed += ["--output", str(Path(tmp) / "vectors.npy"), "--no-progress"]
        times: dict[str, list[float]] = {"evaluate": [], "embed": []}
        load_before = os.getloadavg()
        for repeat in range(args.repeats):
            for name, cmd in (("evaluate", evaluate), ("embed", embed)):
                times[name].append(timed(cmd))
                print(f"bench-embed: run {repeat + 1} {name} {times[name][-1]:.1f} s", flush=True)
        load_after = os.getloadavg()
    rate = {name: len(sentences) / statistics.median(values) for name, values in times.items()}
    ratio = rate["embed"] / rate["evaluate"]
    pairs = ", ".join(f"{b / a:.2f}x" for a, b in zip(times["embed"], times["evaluate"], strict=True))
    print(
        f"bench-embed: {len(sentences)} unique STS test sentences, model {args.model}, {args.repeats} runs each\n"
        f"  evaluate {statistics.median(times['evaluate']):.1f} s ({rate['evaluate']:.0f} sentences/s)\n"
        f"  embed    {statistics.median(times['embed']):.1f} s ({rate['embed']:.0f} sentences/s)\n"
        f"  embed / evaluate = {ratio:.2f}x (per pair: {pairs}; target >= {TARGET}x)\n"
        f"  load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f}"
        f" on {os.cpu_count()} cores"
    )
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
