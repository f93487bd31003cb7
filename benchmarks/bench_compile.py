"""Does ``train.compile: true`` pay for itself? The transfer stage's own steps, eager against compiled, end to end.

Two trainers with the transfer stage's settings (params.yaml: views, batch size, max length, steps) start from the
same model and take the same batches of the default target text (``transfer.texts``) with the ``transfer.base``
recipe. Their steps
alternate (eager, compiled, eager, ...) so that a shared machine slows both alike. The compiled total includes
every compilation (the first step, and recompiles when a batch's padded length changes): what a stage run pays.
Evaluation is left out of both (it runs the same encoder: compiling it costs one more compilation, never less).

    python -m benchmarks.bench_compile                 # params.yaml's transfer.steps and batch size
    python -m benchmarks.bench_compile --steps 10      # shorter
"""

from __future__ import annotations

import argparse
import time

import torch

from sentcl.model.encoder import Encoder
from sentcl.training.trainer import Trainer
from stages.common import PROCESSED, RAW, load_params
from stages.training import load_nli, load_pairs, stage_config, transfer_texts
from stages.transfer import STAGE_KEYS


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, help="default: params transfer.steps")
    parser.add_argument("--processed", default=str(PROCESSED))
    parser.add_argument("--bf16", default="false", help="auto | true | false (default false: fp32)")
    args = parser.parse_args()
    params = load_params()
    pairs, nli = load_pairs(args.processed), load_nli(args.processed)
    texts = transfer_texts(params["transfer"]["texts"], pairs, nli, RAW)
    dev = [("a", "b", 0.0), ("c", "d", 1.0)]  # unused: no evaluation here
    trainers, totals, firsts = {}, {}, {}
    for name, compiled in (("eager", False), ("compiled", True)):
        config = stage_config(
            params,
            "transfer",
            {
                "mode": "transfer",
                "objective": "contrastive",
                "steps": args.steps,
                "compile": compiled,
                "bf16": args.bf16,
            },
            "base",
            STAGE_KEYS,
        )
        init = Encoder.from_pretrained(params["model"]["name"], max_length=config.max_length)
        trainers[name] = Trainer(init, config, texts, dev, progress=False)
        totals[name], firsts[name] = 0.0, 0.0
    steps = trainers["eager"].cfg.steps
    losses: dict[str, list[float]] = {name: [] for name in trainers}
    for step in range(steps):
        for name, trainer in trainers.items():
            items = trainer._rank_items(trainer.order.indices(step))
            start = time.perf_counter()
            losses[name].append(trainer.train_step(items, step + 1))
            seconds = time.perf_counter() - start
            totals[name] += seconds
            if step == 0:
                firsts[name] = seconds
        if (step + 1) % 10 == 0 or step + 1 == steps:
            print(
                f"step {step + 1}/{steps}: " + ", ".join(f"{n} {t:.1f} s" for n, t in totals.items()),
                flush=True,
            )
    cfg = trainers["eager"].cfg
    print(
        f"{steps} transfer steps of batch {cfg.batch_size}, views {list(cfg.views)}, "
        f"bf16 {trainers['eager'].autocast}, {torch.get_num_threads()} threads"
    )
    for name in trainers:
        print(f"{name:9s} {totals[name]:7.1f} s in all, first step {firsts[name]:6.1f} s")
    print(f"compiled/eager time: {totals['compiled'] / totals['eager']:.3f} (< 1: compiling pays)")
    drift = max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"], strict=True))
    print(f"largest loss difference between the two: {drift:.2e}")


if __name__ == "__main__":
    main()
