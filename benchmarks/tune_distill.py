"""Choose the default transfer's distillation settings on tuning data only: no test pair is read.

Each variant is a set of params.yaml overrides (dotted keys) of the default transfer from the base model
(``transfer.base`` + ``transfer.distillation``, the pipeline's teacher vectors in data/teacher). Each runs the real
transfer stage in a scratch folder and is scored, beside the base model, on

- **STS-B dev** (1,500 pairs): no training text holds its sentences, so it measures what carries to new
  sentences;
- **SICK-R trial** (500 pairs), the gate's second guard;
- **STS-B train, seen** (the STS-B train pairs whose two sentences are both in the training text, never their
  scores): what the transductive setting gains on sentences it trained on, without reading a test pair.

    python -m benchmarks.tune_distill                                   # the default variants
    python -m benchmarks.tune_distill --variant lr5e-5x300:transfer.distillation.lr=5e-5,transfer.distillation.steps=300
    python -m benchmarks.tune_distill --teacher-vectors DIR --variant more:transfer.texts=FILE  # another text

Ends with a table (Spearman x 100, change against the base) and one line naming the best variant by the sum of
its STS-B dev and seen-train gains, STS-B dev and SICK-R trial each not below the base by more than
registry.max_dev_drop.

``--interpolate 0.5,1.5`` also scores, for each variant, the weights ``base + a (variant - base)`` (WiSE-FT,
Wortsman et al. 2022: a < 1 averages the trained weights with the init's, which is said to keep more on data
the training did not cover; a > 1 extrapolates). Those rows are reported, never chosen: no stage ships them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_domain import score
from sentcl.params import merge, write_params
from sentcl.training.data import read_seen, stsb_dev
from stages.common import PROCESSED, ROOT, load_params, offline_hub
from stages.training import load_pairs

DEFAULT_VARIANTS = {
    "default": {},
    "k1": {"transfer.distillation.distill.neighbours": 1},
    "gw1": {"transfer.distillation.distill.group_weight": 1.0},
    "gw40": {"transfer.distillation.distill.group_weight": 40.0},
    "lr5e-5x300": {
        "transfer.distillation.lr": 5.0e-5,
        "transfer.distillation.steps": 300,
        "transfer.distillation.eval_steps": 300,
    },
}


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, body = text.partition(":")
    overrides = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    return name, overrides


def tuning_sets(pairs, trained: set[str]) -> dict[str, list[tuple[str, str, float]]]:  # noqa: ANN001
    def scored(part) -> list[tuple[str, str, float]]:  # noqa: ANN001
        return list(zip(part.sentence1, part.sentence2, part.score.astype(float), strict=True))

    train = pairs[(pairs.task == "STSb") & (pairs.split == "train")]
    seen = train[train.sentence1.isin(trained) & train.sentence2.isin(trained)]
    return {
        "stsb_dev": stsb_dev(pairs),
        "sick_trial": scored(pairs[(pairs.task == "SICK-R") & (pairs.split == "dev")]),
        "stsb_train_seen": scored(seen),
    }


def run_variant(
    name: str, overrides: dict[str, Any], params: dict[str, Any], work: Path, teacher: Path
) -> tuple[Path, float]:
    folder = work / name
    variant = write_params(merge(params, nest(overrides)), folder / "params.yaml")
    options = {"--init": "base", "--output": folder / "model", "--stage": f"tune-{name}"}
    options |= {"--metrics-dir": folder / "metrics", "--checkpoints-dir": folder / "ckpt"}
    cmd = variant.command("stages.transfer", {**options, "--teacher-vectors": teacher})
    print(f"tune-distill: {name}: {overrides or 'params.yaml as it is'}", flush=True)
    started = time.perf_counter()
    env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1")
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
        raise SystemExit(f"tune-distill: variant {name} failed; its log is above")
    return folder, time.perf_counter() - started


def interpolate(init: str, trained: Path, weight: float, out: Path) -> Path:
    """A sentence-transformers folder with the weights ``init + weight * (trained - init)`` (every float tensor;
    the rest, like position ids, the init's)."""
    from sentence_transformers import SentenceTransformer

    from sentcl.model.encoder import resolve_model_path

    model = SentenceTransformer(resolve_model_path(init), device="cpu")
    end = SentenceTransformer(str(trained), device="cpu").state_dict()
    model.load_state_dict(
        {k: v + weight * (end[k] - v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    )
    model.save(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", help="name:key=value,key=value (repeatable)")
    parser.add_argument("--work", help="scratch folder, kept (default: a temporary one)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--teacher-vectors",
        type=Path,
        default=ROOT / "data" / "teacher",
        help="the teacher stage's output for the variants' text (a text other than transfer.texts: "
        "python -m stages.teacher --texts FILE --output DIR --no-benchmark)",
    )
    parser.add_argument(
        "--interpolate",
        help="weights a, comma-separated: also score base + a (variant - base), reported only",
    )
    args = parser.parse_args(argv)
    offline_hub()
    params = load_params()
    variants = dict(map(parse_variant, args.variant)) if args.variant else DEFAULT_VARIANTS
    pairs = load_pairs(PROCESSED)
    work = Path(args.work or tempfile.mkdtemp(prefix="tune-distill-")).resolve()
    backend = params["evaluate"]["backend"]
    results: dict[str, dict[str, Any]] = {}
    interpolated: dict[str, dict[str, Any]] = {}  # reported, never chosen
    base_scores = None
    for name, overrides in variants.items():
        folder, seconds = run_variant(name, overrides, params, work, args.teacher_vectors.resolve())
        trained = set(read_seen(folder / "metrics" / "seen" / f"tune-{name}.txt"))
        sets = tuning_sets(pairs, trained)
        if base_scores is None:
            base_scores = score(params["model"]["name"], [], sets, backend)
        after = score(str(folder / "model"), [], sets, backend)
        record = json.loads((folder / "metrics" / "train" / f"tune-{name}.json").read_text())
        results[name] = {
            "overrides": overrides,
            "scores": {k: after[k] for k in sets},
            "gains": {k: round(after[k] - base_scores[k], 2) for k in sets},
            "pairs": {k: len(v) for k, v in sets.items()},
            "best_step": record["best_step"],
            "steps": record["steps"],
            "wall_s": round(seconds, 1),
        }
        print(f"tune-distill: {name}: {results[name]['gains']} ({seconds:.0f} s)", flush=True)
        for weight in [float(w) for w in args.interpolate.split(",")] if args.interpolate else []:
            mixed = interpolate(params["model"]["name"], folder / "model", weight, folder / f"mix-{weight:g}")
            mixed_scores = score(str(mixed), [], sets, backend)
            interpolated[f"{name}@{weight:g}"] = {
                **results[name],
                "scores": {k: mixed_scores[k] for k in sets},
                "gains": {k: round(mixed_scores[k] - base_scores[k], 2) for k in sets},
                "wall_s": None,  # no training of its own
            }
            print(
                f"tune-distill: {name}@{weight:g}: {interpolated[f'{name}@{weight:g}']['gains']}", flush=True
            )
    drop = float(params["registry"]["max_dev_drop"])
    print(
        "\n| variant | STS-B dev | SICK-R trial | STS-B train, seen | step | wall s |\n|---|---|---|---|---|---|"
    )
    for name, r in {**results, **interpolated}.items():
        s, g = r["scores"], r["gains"]
        cells = [f"{s[k]:.2f} ({g[k]:+.2f})" for k in ("stsb_dev", "sick_trial", "stsb_train_seen")]
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
        print(f"| {name} | " + " | ".join(cells) + f" | {r['best_step']}/{r['steps']} | {wall} |")
    allowed = {
        n: r for n, r in results.items() if min(r["gains"]["stsb_dev"], r["gains"]["sick_trial"]) >= -drop
    }
    best = max(
        allowed, key=lambda n: allowed[n]["gains"]["stsb_dev"] + allowed[n]["gains"]["stsb_train_seen"]
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"work": str(work), "load": load, "variants": results, "interpolated": interpolated}, indent=2
            )
        )
    n_seen = next(iter(results.values()))["pairs"]["stsb_train_seen"]
    print(
        f"\ntune-distill: best on tuning data: {best} (STS-B dev {allowed[best]['gains']['stsb_dev']:+.2f}, "
        f"{n_seen:,} seen STS-B train pairs {allowed[best]['gains']['stsb_train_seen']:+.2f}); load {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
