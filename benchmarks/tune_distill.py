"""Choose the default transfer's distillation settings on declared selection data, with seeds and minutes.

Each variant is a set of params.yaml overrides (dotted keys) of the default transfer from the base model
(``transfer.base`` + ``transfer.distillation``, the pipeline's teacher vectors in data/teacher). Each runs the real
transfer stage in a scratch folder once per seed and is scored, beside the base model, on the **selection** sets of
``sentcl.data.roles`` and nothing else:

- **STS-B dev** (1,500 pairs as published; no training text holds its sentences, but 1,137 of its pairs are test
  pairs: the field's declared convention, counted in docs/methods.md);
- **SICK-R trial** less its pairs that are test pairs (486 pairs), the gate's second guard.

No test pair and no pair of the unseen check is read: those are read once per recipe, after the choice
(``make run``, ``python -m benchmarks.recipe_seeds``).

    python -m benchmarks.tune_distill                                   # the default recipe, three seeds
    python -m benchmarks.tune_distill --variant s300:transfer.distillation.steps=300 --seeds 42,43,44
    python -m benchmarks.tune_distill --teacher-vectors DIR --variant more:transfer.texts=FILE  # another text

Ends with a per-seed table (Spearman x 100, change against the base, training seconds), a per-variant summary
(mean and sd over seeds, the seeds' range, CPU seconds of training plus the teacher's encoding of the variant's text
at the rate its ``teacher.json`` records) and one line naming the choice by the rule of :func:`choose`: the
cheapest variant whose mean selection gain is within the seed spread of the best one's (the larger of the two
variants' seed ranges): a costlier variant is kept only when every cheaper one falls short of the best by more than
the seed spread.

``--interpolate 0.5,1.5`` also scores, for each run, the weights ``base + a (variant - base)`` (WiSE-FT,
Wortsman et al. 2022). Those rows are reported, never chosen: no stage ships them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_domain import score
from sentcl.data.roles import selection_sets
from sentcl.params import merge, write_params
from sentcl.training.runtime import cpu_seconds
from sentcl.training.teacher_run import sentences_to_encode
from stages.common import PROCESSED, RAW, ROOT, load_params, offline_hub
from stages.training import load_nli, load_pairs

SETS = ("stsb_dev", "sick_trial")  # the declared selection sets; their mean gain is the selection gain
DEFAULT_SEEDS = (42, 43, 44)


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
    """``name:key=value,key=value`` into the name and its overrides; a value is YAML, and a comma inside
    brackets belongs to it (``train.freeze=[embeddings,encoder.layer.0]``)."""
    name, _, body = text.partition(":")
    items, depth, start = [], 0, 0
    for i, char in enumerate(body + ","):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    overrides = {}
    for item in filter(None, items):
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    return name, overrides


def tuning_sets(pairs) -> dict[str, list[tuple[str, str, float]]]:  # noqa: ANN001
    """What the variants are scored on: the selection role of ``sentcl.data.roles``, nothing else."""
    sets = selection_sets(pairs)
    return {name: sets[name] for name in SETS}


def run_variant(
    name: str, overrides: dict[str, Any], params: dict[str, Any], work: Path, teacher: Path
) -> tuple[Path, float, float]:
    """One transfer run in ``work/name``: (its folder, wall seconds, CPU seconds of the stage process)."""
    folder = work / name
    variant = write_params(merge(params, nest(overrides)), folder / "params.yaml")
    options = {"--init": "base", "--output": folder / "model", "--stage": f"tune-{name}"}
    options |= {"--metrics-dir": folder / "metrics", "--checkpoints-dir": folder / "ckpt"}
    cmd = variant.command("stages.transfer", {**options, "--teacher-vectors": teacher})
    print(f"tune-distill: {name}: {overrides or 'params.yaml as it is'}", flush=True)
    before = cpu_seconds(own=False)
    started = time.perf_counter()
    env = dict(os.environ, SENTCL_MLFLOW="0", HF_HUB_OFFLINE="1")
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
        raise SystemExit(f"tune-distill: variant {name} failed; its log is above")
    return folder, time.perf_counter() - started, cpu_seconds(own=False) - before


def teacher_rate(folder: Path) -> float:
    """CPU seconds the teacher stage spent a sentence on the record in ``folder`` (its ``teacher.json``); a record
    from before ``encode_cpu_seconds`` was kept: its wall seconds on every core, an upper bound."""
    meta = json.loads((folder / "teacher.json").read_text())
    if meta.get("model") == "none" or not meta.get("sentences"):
        return 0.0
    cpu = meta.get("encode_cpu_seconds")
    if cpu is None:
        cpu = meta["encode_seconds"] * (os.cpu_count() or 1)
    return cpu / meta["sentences"]


def teacher_cost(params: dict[str, Any], rate: float, pairs, nli, raw: Path = RAW) -> tuple[int, float]:  # noqa: ANN001
    """What the teacher stage would encode for a variant's ``params`` (its text, sampled as the transfer stage
    samples it) and the CPU seconds that costs at ``rate``: a variant that trains on more text pays for its
    teacher vectors too."""
    count = len(sentences_to_encode(params, None, raw, pairs, nli))
    return count, round(rate * count, 1)


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


def selection_gain(gains: dict[str, float]) -> float:
    """The number variants are compared by: the mean of the selection sets' gains over the base."""
    return sum(gains[k] for k in SETS) / len(SETS)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's seeds: mean and sd of each gain and of the selection gain, the seeds' range (max - min) of
    the selection gain, mean training seconds (wall and CPU)."""

    def stats(values: list[float]) -> dict[str, float]:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return {"mean": round(statistics.fmean(values), 3), "sd": round(sd, 3)}

    chosen_by = [selection_gain(r["gains"]) for r in runs]
    cpu = statistics.fmean(r["cpu_s"] for r in runs)
    teacher = statistics.fmean(r.get("teacher_cpu_s", 0.0) for r in runs)
    return {
        "seeds": [r["seed"] for r in runs],
        "gains": {k: stats([r["gains"][k] for r in runs]) for k in SETS},
        "selection_gain": stats(chosen_by),
        "spread": round(max(chosen_by) - min(chosen_by), 3),
        "wall_s": round(statistics.fmean(r["wall_s"] for r in runs), 1),
        "cpu_s": round(cpu, 1),
        "teacher_cpu_s": round(teacher, 1),
        "cost_cpu_s": round(cpu + teacher, 1),  # what the rule weighs: training and the teacher's vectors
    }


SAME_PRICE = 0.10  # costs within 10% of the cheapest are the same price: a measured CPU second is not exact


def choose(summaries: dict[str, dict[str, Any]], cost: str = "cpu_s") -> tuple[str, list[str]]:
    """The rule, whatever order the variants come in: a variant is as good as the best mean when the best does not
    beat it by more than their seed spread (the larger of the two seeds' ranges; a noisy third variant does not
    loosen the bar between two others); of those, the cheapest by ``cost`` (mean over seeds) is the choice, and of
    variants at the same price (within ``SAME_PRICE``) the higher mean. So a costlier variant is kept only when
    every cheaper one falls short of the best by more than the seed spread, and one that costs more for less is
    never chosen. Returns the choice and one line per variant, cheapest first."""

    def mean(name: str) -> float:
        return summaries[name]["selection_gain"]["mean"]

    top = max(summaries, key=mean)

    def spread(name: str) -> float:
        return max(summaries[top]["spread"], summaries[name]["spread"])

    good = [n for n in summaries if mean(top) - mean(n) <= spread(n)]
    cheapest = min(summaries[n][cost] for n in good)
    same_price = [n for n in good if summaries[n][cost] <= cheapest * (1 + SAME_PRICE)]
    best = max(same_price, key=lambda n: (mean(n), -summaries[n][cost]))  # a tie: the cheaper
    lines = []
    for name in sorted(summaries, key=lambda n: summaries[n][cost]):
        verdict = "as good, the same price, not the best mean" if name in same_price else "as good, costlier"
        verdict = "chosen" if name == best else verdict if name in good else "short of it"
        lines.append(
            f"{name}: {mean(name):+.2f}, {mean(name) - mean(top):+.2f} from the best ({top}) against a seed spread"
            f" of {spread(name):.2f}, {summaries[name][cost]:.0f} {cost}: {verdict}"
        )
    return best, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", help="name:key=value,key=value (repeatable)")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated")
    parser.add_argument("--work", help="scratch folder, kept (default: a temporary one)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--teacher-vectors",
        type=Path,
        default=ROOT / "data" / "teacher",
        help="the teacher stage's output for the variants' text (a text other than transfer.texts: "
        "python -m stages.teacher --texts FILE --output DIR)",
    )
    parser.add_argument(
        "--interpolate",
        help="weights a, comma-separated: also score base + a (variant - base), reported only",
    )
    args = parser.parse_args(argv)
    offline_hub()
    params = load_params()
    variants = dict(map(parse_variant, args.variant)) if args.variant else {"default": {}}
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs, nli = load_pairs(PROCESSED), load_nli(PROCESSED)
    sets = tuning_sets(pairs)
    rate = teacher_rate(args.teacher_vectors)
    work = Path(args.work or tempfile.mkdtemp(prefix="tune-distill-")).resolve()
    backend = params["evaluate"]["backend"]
    base_scores = score(params["model"]["name"], [], sets, backend)
    runs: dict[str, list[dict[str, Any]]] = {}
    interpolated: list[dict[str, Any]] = []  # reported, never chosen
    for name, overrides in variants.items():
        for seed in seeds:
            run = f"{name}-s{seed}"
            folder, wall, cpu = run_variant(
                run, {"seed": seed, **overrides}, params, work, args.teacher_vectors.resolve()
            )
            after = score(str(folder / "model"), [], sets, backend)
            record = json.loads((folder / "metrics" / "train" / f"tune-{run}.json").read_text())
            texts, teacher_cpu = teacher_cost(
                merge(params, nest({"seed": seed, **overrides})), rate, pairs, nli
            )
            row = {
                "variant": name,
                "seed": seed,
                "overrides": overrides,
                "scores": {k: after[k] for k in SETS},
                "gains": {k: round(after[k] - base_scores[k], 2) for k in SETS},
                "best_step": record["best_step"],
                "steps": record["steps"],
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "texts": texts,
                "teacher_cpu_s": teacher_cpu,
            }
            runs.setdefault(name, []).append(row)
            print(
                f"tune-distill: {run}: {row['gains']} ({wall:.0f} s, {cpu:.0f} CPU s; teacher {teacher_cpu:.0f}"
                f" CPU s for {texts} sentences)",
                flush=True,
            )
            for weight in [float(w) for w in args.interpolate.split(",")] if args.interpolate else []:
                mixed = interpolate(
                    params["model"]["name"], folder / "model", weight, folder / f"mix-{weight:g}"
                )
                mixed_scores = score(str(mixed), [], sets, backend)
                interpolated.append(
                    {**row, "variant": f"{name}@{weight:g}", "wall_s": None, "cpu_s": None}
                    | {"gains": {k: round(mixed_scores[k] - base_scores[k], 2) for k in SETS}}
                )
    print(f"\nbase: STS-B dev {base_scores['stsb_dev']:.2f}, SICK-R trial {base_scores['sick_trial']:.2f}")
    print(
        "\n| variant | seed | STS-B dev | SICK-R trial | step | wall s | CPU s |\n|---|---|---|---|---|---|---|"
    )
    for row in [r for rows in runs.values() for r in rows] + interpolated:
        cells = [f"{row['scores'][k]:.2f} ({row['gains'][k]:+.2f})" for k in SETS]
        wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.0f}"
        cpu = "-" if row["cpu_s"] is None else f"{row['cpu_s']:.0f}"
        step = f"{row['best_step']}/{row['steps']}"
        print(f"| {row['variant']} | {row['seed']} | " + " | ".join(cells) + f" | {step} | {wall} | {cpu} |")
    summaries = {name: summarise(rows) for name, rows in runs.items()}
    print(
        "\n| variant | seeds | STS-B dev | SICK-R trial | selection gain | spread | wall s | CPU s, training +"
        " teacher |\n|---|---|---|---|---|---|---|---|"
    )
    for name, s in summaries.items():
        cells = [f"{s['gains'][k]['mean']:+.2f} +- {s['gains'][k]['sd']:.2f}" for k in SETS]
        gain = s["selection_gain"]
        print(
            f"| {name} | {len(s['seeds'])} | "
            + " | ".join(cells)
            + f" | {gain['mean']:+.2f} +- {gain['sd']:.2f} | {s['spread']:.2f} | {s['wall_s']:.0f}"
            + f" | {s['cpu_s']:.0f} + {s['teacher_cpu_s']:.0f} |"
        )
    best, lines = choose(summaries, cost="cost_cpu_s")
    for line in lines:
        print(f"tune-distill: {line}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "work": str(work),
                    "load": load,
                    "base": {k: base_scores[k] for k in SETS},
                    "pairs": {k: len(v) for k, v in sets.items()},
                    "runs": runs,
                    "summaries": summaries,
                    "choice": best,
                    "comparisons": lines,
                    "interpolated": interpolated,
                },
                indent=2,
            )
        )
    print(
        f"\ntune-distill: choice on selection data: {best} (selection gain "
        f"{summaries[best]['selection_gain']['mean']:+.2f} +- {summaries[best]['selection_gain']['sd']:.2f} over "
        f"{len(summaries[best]['seeds'])} seeds, {summaries[best]['cost_cpu_s']:.0f} CPU s with its teacher vectors); load {load}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
