"""Quality is not traded for speed: the default transfer (``stages.transfer --init base``) in fp32 and in bf16,
over several seeds, scored by ``stages.evaluate``; one table, and whether bf16 stays within the fp32 seed spread.

Every run is a real stage process with tracking off (``SENTCL_MLFLOW=0``) writing only under ``--workdir``
(params copy, model, metrics, resume state), so the pipeline's own records are untouched. Needs
``data/processed`` and ``models/base`` (``dvc repro base validate``). Run it where bf16 is native (a GPU, or a CPU
with AVX512-BF16/AMX): elsewhere bf16 is emulated and several times slower than fp32.

    python -m benchmarks.bf16_quality --seeds 42 1 2 --workdir /tmp/bf16-quality
    python -m benchmarks.bf16_quality --precisions fp32 --seeds 42 1 2    # the fp32 seed spread alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from sentcl.params import Params, merge, write_params
from stages.common import ROOT, load_params, params_arguments


def run(params: Params, precision: str, seed: int, workdir: Path, threads: int | None) -> dict:
    """One transfer + evaluation; reuses a finished result already in ``workdir``."""
    name = f"{precision}-s{seed}"
    result_path = workdir / f"{name}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    own = merge(params, {"seed": seed, "train": {"bf16": precision == "bf16"}})
    run_params = write_params(own, workdir / f"params-{name}.yaml")
    env = {**os.environ, "SENTCL_MLFLOW": "0", "HF_HUB_OFFLINE": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    stage = f"transfer-base-{name}"
    started = time.perf_counter()
    train_record = workdir / "metrics" / "train" / f"{stage}.json"
    # A call that stopped after training (or after its evaluation) resumes there instead of training again.
    if not (train_record.is_file() and (workdir / "models" / name).is_dir()):
        options = {"--init": "base", "--stage": stage, "--output": workdir / "models" / name}
        options |= {"--metrics-dir": workdir / "metrics", "--checkpoints-dir": workdir / "checkpoints"}
        subprocess.run(run_params.command("stages.transfer", options), cwd=ROOT, env=env, check=True)
    stage_seconds = time.perf_counter() - started
    scores = workdir / f"eval-{name}.json"
    if not scores.is_file():
        options = {"--model": workdir / "models" / name, "--no-progress": True, "--output": scores}
        subprocess.run(run_params.command("stages.evaluate", options), cwd=ROOT, env=env, check=True)
    train = json.loads((workdir / "metrics" / "train" / f"{stage}.json").read_text())
    sts = json.loads(scores.read_text())
    result = {
        "precision": precision,
        "seed": seed,
        "stsb_dev": train["stsb_dev_best"],
        "best_step": train["best_step"],
        "avg": sts["all"]["avg"],  # Spearman x 100, protocol "all", the seven tasks
        "stage_seconds": round(stage_seconds, 1),  # 0-ish when resumed
        "load_average": os.getloadavg(),
    }
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/sentcl-bf16-quality"))
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each run (default: torch's)")
    params_arguments(parser)
    args = parser.parse_args()
    params = load_params(args.params, args.overrides)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = [run(params, p, s, args.workdir, args.threads) for s in args.seeds for p in args.precisions]
    print("| precision | seed | STS-B dev (selected, step) | seven-task avg | stage s |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['precision']} | {r['seed']} | {r['stsb_dev']:.2f} ({r['best_step']}) | {r['avg']:.2f} "
            f"| {r['stage_seconds']:.0f} |"
        )
    by = {p: [r for r in results if r["precision"] == p] for p in args.precisions}
    for key in ("stsb_dev", "avg"):
        line = []
        for precision, rows in by.items():
            values = [r[key] for r in rows]
            spread = max(values) - min(values)
            line.append(f"{precision} mean {statistics.fmean(values):.3f} (spread {spread:.3f})")
        print(f"{key}: " + "; ".join(line))
        if len(by) == 2 and len(by["fp32"]) > 1:
            low, high = (f(r[key] for r in by["fp32"]) for f in (min, max))
            inside = all(low <= r[key] <= high for r in by["bf16"])
            print(f"  bf16 {key} within the fp32 seed range [{low:.2f}, {high:.2f}]: {inside}")


if __name__ == "__main__":
    main()
