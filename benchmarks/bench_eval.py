"""Evaluation throughput: ``python -m stages.evaluate`` against the plain sentence-transformers way, whole processes.

The peer loads the model with ``SentenceTransformer`` and, for every subset of the seven tasks, calls
``encode(sentences, batch_size=128)`` on each side's sentence list (sentence-transformers sorts by length inside
each call), then cosine and scipy Spearman. Ours is the evaluate stage's standalone command with ``--no-dev``, so both
do the same seven tasks (dedup, one global length-sorted pass, ONNX Runtime). Each is timed as a whole process, start to exit (imports, model load and
export included). The runs alternate (peer, ours, peer, ours, ...) so that a machine shared with other jobs
slows both alike; throughput is the benchmark's 37,700 pair-side sentences over the median wall time, and the
numbers of both must agree to 0.01.

    make bench-eval            # or: python benchmarks/bench_eval.py --repeats 2 --data /path/to/senteval
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: this checkout's packages

from sentcl.params import ROOT  # noqa: E402
from stages.common import load_params  # noqa: E402

TOLERANCE = 0.01


def peer(model: str, data: Path, output: Path) -> None:
    """The peer, as a user would write it (run in its own process by ``main``)."""
    import numpy as np
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from sentcl.evaluation.benchmark import load_benchmark
    from sentcl.model.encoder import resolve_model_path

    st = SentenceTransformer(resolve_model_path(model), device="cpu")
    benchmark = load_benchmark(data, with_dev=False)  # the same readers, so the same pairs
    sims: dict[str, list] = {}
    gold: dict[str, list] = {}
    per_subset = {}
    for subset in benchmark.subsets:
        a = st.encode(list(subset.sentences1), batch_size=128)
        b = st.encode(list(subset.sentences2), batch_size=128)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        sims.setdefault(subset.task, []).append(cos)
        gold.setdefault(subset.task, []).append(subset.gold)
        per_subset[f"{subset.task}/{subset.name}"] = float(spearmanr(cos, subset.gold).statistic * 100)
    result = {"all": {}, "mean": {}, "subsets": per_subset}
    for task in sims:
        result["all"][task] = float(
            spearmanr(np.concatenate(sims[task]), np.concatenate(gold[task])).statistic * 100
        )
        names = [k for k in per_subset if k.startswith(task + "/")]
        result["mean"][task] = float(np.mean([per_subset[k] for k in names]))
    output.write_text(json.dumps(result))


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    default_data = ROOT / "data" / "raw"
    if not (default_data / "STS").is_dir():
        default_data = ROOT.parent / "shared" / "senteval"
    parser.add_argument("--data", type=Path, default=default_data)
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternating pairs of runs; medians are compared"
    )
    parser.add_argument(
        "--first", choices=("peer", "ours"), default="peer", help="who runs first in odd repeats"
    )
    parser.add_argument("--keep", type=Path, help="folder to keep both JSON results in")
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peer-output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_only:
        peer(args.model, args.data, args.peer_output)
        return 0

    from sentcl.evaluation.benchmark import load_benchmark

    benchmark = load_benchmark(args.data, with_dev=False)
    sides = 2 * benchmark.pair_count
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    times: dict[str, list[float]] = {"peer": [], "ours": []}
    with tempfile.TemporaryDirectory() as tmp:
        peer_json, ours_json = Path(tmp) / "peer.json", Path(tmp) / "ours.json"
        commands = {
            "peer": [sys.executable, __file__, "--peer-only", "--model", args.model, "--data", str(args.data)]
            + ["--peer-output", str(peer_json)],
            "ours": load_params().command(
                "stages.evaluate",
                {"--model": args.model, "--data": args.data, "--output": ours_json, "--no-progress": True}
                | {"--no-dev": True},
            ),
        }
        for repeat in range(args.repeats):
            # Alternate who goes first, so a load change mid-run does not always favour the same side.
            order = ("peer", "ours") if args.first == "peer" else ("ours", "peer")
            for who in order if repeat % 2 == 0 else order[::-1]:
                times[who].append(timed(commands[who], env))
                print(f"run {repeat + 1}/{args.repeats} {who}: {times[who][-1]:.1f} s", flush=True)
        peer_result, ours_result = json.loads(peer_json.read_text()), json.loads(ours_json.read_text())
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "peer.json").write_text(json.dumps(peer_result, indent=2))
            (args.keep / "ours.json").write_text(json.dumps(ours_result, indent=2))

    worst = 0.0
    print(f"\n{'task':8} {'peer all':>9} {'ours all':>9} {'peer mean':>10} {'ours mean':>10}")
    for task in peer_result["all"]:
        row = [
            peer_result["all"][task],
            ours_result["all"][task],
            peer_result["mean"][task],
            ours_result["mean"][task],
        ]
        worst = max(worst, abs(row[0] - row[1]), abs(row[2] - row[3]))
        print(f"{task:8} {row[0]:9.2f} {row[1]:9.2f} {row[2]:10.2f} {row[3]:10.2f}")
    subset_gap = max(
        abs(peer_result["subsets"][k] - ours_result["subsets"][k]) for k in peer_result["subsets"]
    )
    worst_subset = max(
        peer_result["subsets"], key=lambda k: abs(peer_result["subsets"][k] - ours_result["subsets"][k])
    )
    peer_s, ours_s = statistics.median(times["peer"]), statistics.median(times["ours"])
    print(
        f"\nmodel {args.model}, {sides} pair-side sentences ({len(benchmark.sentences)} unique), {os.cpu_count()} CPUs"
    )
    print(
        f"peer (sentence-transformers encode, batch 128 per side per subset): {peer_s:.1f} s, {sides / peer_s:.0f} sentences/s"
    )
    print(
        f"ours (python -m stages.evaluate --no-dev):                        {ours_s:.1f} s, {sides / ours_s:.0f} sentences/s"
    )
    print(f"speed-up: {peer_s / ours_s:.2f}x   largest score difference: {worst:.4f} (tolerance {TOLERANCE})")
    # Per subset, the peer's own float noise shows: it encodes the two sides of a pair of identical sentences
    # in different batches, so their cosine is 1 +- 1e-7 and those ties break at random (see sentcl.evaluation.sts.cosine).
    print(f"largest per-subset difference: {subset_gap:.4f} ({worst_subset})")
    if worst > TOLERANCE:
        print("FAIL: scores differ by more than the tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
