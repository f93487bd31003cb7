"""How many scored test pairs did the default transfer learn *as a pair*? Counted per STS task.

The default transfer (``transfer.base``, objective ``distill`` with ``examples: neighbours``) trains on the seven
test sets' own sentences, each with its ``distill.neighbours`` nearest teacher neighbours in one example, where the
teacher's similarity between them weighs ``group_weight`` times a random pair's. A test pair whose two sentences
sit in one such group was fitted to the teacher's similarity of exactly that pair: the strongest form of a seen
pair. This rebuilds the stage's examples with the stage's own code (same text, teacher vectors and params) and its
batch order (``BatchOrder``, the recipe's seed and batch size), and counts the test pairs

- *in a group*: both sentences in one group of the text (one is among the other's neighbours, or both among a
  third sentence's);
- *in a trained group*: the same, counting only the groups the steps actually drew;
- *seen*: both sentences in the training text at all (what ``stages.evaluate`` calls seen).

    python -m benchmarks.neighbour_pairs [--stage transfer-base] [--json FILE]

Needs ``dvc repro transfer-base`` (its teacher vectors in data/teacher).
"""

from __future__ import annotations

import argparse
import json
import logging
from itertools import combinations
from pathlib import Path

from sentcl.data.senteval import TASKS
from sentcl.training import data as training_data
from sentcl.training import recipes
from sentcl.training.runtime import BatchOrder
from stages import training
from stages.common import PROCESSED, RAW, load_params, offline_hub
from stages.transfer import load_teacher, transfer_config


def pair_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--init", default="base", help="the transfer's init (default: base)")
    parser.add_argument("--teacher-vectors", default="data/teacher")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args(argv)
    offline_hub()
    log = logging.getLogger("neighbour-pairs")
    params = load_params()
    stage, recipe = recipes.transfer_run(args.init, None, None)
    config = transfer_config(params, recipe, {"steps": None, "objective": None, "preset": None})
    if config.objective != "distill" or config.distill.examples != "neighbours":
        raise SystemExit(f"neighbour-pairs: {stage} does not distil on neighbour groups: nothing to count")
    pairs, nli = training.load_pairs(PROCESSED), training.load_nli(PROCESSED)
    init = training_data.resolve_init(args.init, Path("models"))
    choice, max_texts = params["transfer"]["texts"], params["transfer"]["max_texts"]
    texts, _ = training_data.training_text(choice, pairs, nli, RAW, init, config, max_texts, log)
    teacher = load_teacher(Path(args.teacher_vectors), texts)
    groups = training_data.distill_examples(config.distill, choice, texts, teacher, pairs, nli, log)
    order = BatchOrder(len(groups), config.batch_size, config.seed)
    drawn = {i for step in range(config.steps) for i in order.indices(step)}

    def inside(indices) -> set[tuple[str, str]]:  # noqa: ANN001
        return {pair_key(a, b) for i in indices for a, b in combinations(groups[i], 2) if a != b}

    in_any, in_trained, text = inside(range(len(groups))), inside(drawn), set(texts)
    test = pairs[(pairs.split == "test") & pairs.task.isin(TASKS)]
    rows = {}
    for task, part in test.groupby("task", sort=False):
        keys = [pair_key(a, b) for a, b in zip(part.sentence1, part.sentence2, strict=True)]
        rows[task] = {
            "pairs": len(keys),
            "seen": sum(a in text and b in text for a, b in keys),
            "in_group": sum(k in in_any for k in keys),
            "in_trained_group": sum(k in in_trained for k in keys),
        }
    total = {k: sum(r[k] for r in rows.values()) for k in ("pairs", "seen", "in_group", "in_trained_group")}
    rows["all"] = total
    print(f"{'task':<8} {'pairs':>7} {'seen':>7} {'in group':>9} {'trained':>8}")
    for task, r in rows.items():
        print(f"{task:<8} {r['pairs']:>7,} {r['seen']:>7,} {r['in_group']:>9,} {r['in_trained_group']:>8,}")
    print(
        f"neighbour-pairs: {stage}: {total['in_trained_group']:,} of {total['pairs']:,} test pairs "
        f"({100 * total['in_trained_group'] / total['pairs']:.1f}%) sat in one neighbour group the "
        f"{config.steps} steps drew ({len(drawn):,} of {len(groups):,} groups); {total['in_group']:,} in a "
        f"group of the text; {total['seen']:,} seen"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"stage": stage, "groups": len(groups), "drawn": len(drawn), "tasks": rows}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
