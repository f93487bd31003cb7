"""A PromptBERT transfer run on the bundled model, outside the trainer. The `promptbert` preset now runs in the
stage itself (`python -m stages.transfer --init base --preset promptbert --output DIR`, with early stopping and
selection on STS-B dev); this script stays as the no-selection variant: the same texts, seed, steps and batch as
the `transfer` stage, PromptBERT's objective (sentcl.training.objectives.promptbert.PromptContrastiveLoss: two templates, each denoised,
training-only MLP head, InfoNCE) and its lr/temperature; no early stopping. The folder it writes carries its pooling
(the first training template, no delta: kongds/Prompt-BERT run.sh `unsup-bert` eargs), so

    python -m benchmarks.promptbert_transfer --output models/promptbert-base
    python -m stages.evaluate --model models/promptbert-base      # scored with prompt pooling, from the folder

Not a DVC stage and not in `make run`: a measurement, like the other benchmarks.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

import torch

from sentcl.evaluation.sts import STSEvaluator
from sentcl.model.encoder import Encoder
from sentcl.model.pooling import PromptSettings
from sentcl.training.data import sts_test_sentences, stsb_dev
from sentcl.training.objectives.promptbert import MLPHead, PromptContrastiveLoss
from stages.common import load_params
from stages.training import load_pairs

log = logging.getLogger("promptbert_transfer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init", default="models/base")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--steps", type=int, help="default params transfer.steps")
    parser.add_argument("--batch-size", type=int, help="default params transfer.batch_size")
    parser.add_argument("--lr", type=float, default=1.0e-5, help="run.sh unsup-bert: 1e-5")
    parser.add_argument("--temperature", type=float, default=0.05, help="run.sh: --temp 0.05")
    parser.add_argument(
        "--templates",
        nargs=2,
        default=['This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .'],
        help="run.sh unsup-bert TEMPLATE and TEMPLATE2",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    section = params["transfer"]
    steps = args.steps or int(section["steps"])
    batch_size = args.batch_size or int(section["batch_size"])
    max_length = int(params["model"]["max_length"])
    torch.manual_seed(params["seed"])
    rng = random.Random(params["seed"])

    pairs = load_pairs()
    texts = sts_test_sentences(pairs)
    dev = STSEvaluator(stsb_dev(pairs), "stsb-dev")
    encoder = Encoder.from_pretrained(args.init, pooling="last-avg", max_length=max_length)
    eval_prompt = PromptSettings(args.templates[0], denoise=False, add_period=True)
    head = MLPHead(encoder.dim)  # models.py MLPLayer, --mlp_only_train: dropped after training
    loss_fn = PromptContrastiveLoss(
        encoder.tokenizer, args.templates, args.temperature, denoise=True, max_length=max_length, head=head
    )
    optimizer = torch.optim.AdamW(
        list(encoder.model.parameters()) + list(head.parameters()), lr=args.lr, weight_decay=0.0
    )
    warmup = int(float(params["train"]["warmup_ratio"]) * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / (warmup + 1) if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup)),
    )

    def dev_score(pooling: str) -> float:
        encoder.pooling, encoder.prompt = pooling, (eval_prompt if pooling == "prompt" else None)
        return dev(lambda s: encoder.encode(s, batch_size=128))

    log.info("init: STS-B dev last-avg %.2f, prompt %.2f", dev_score("last-avg"), dev_score("prompt"))
    order: list[int] = []
    started = time.time()
    encoder.model.train()
    for step in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(texts)), len(texts))
        batch, order = [texts[i] for i in order[:batch_size]], order[batch_size:]
        loss = loss_fn(encoder.model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.model.parameters(), float(params["train"]["max_grad_norm"]))
        optimizer.step()
        scheduler.step()
        if step % 10 == 0 or step == steps - 1:
            log.info("step %d/%d loss %.4f (%.0f s)", step + 1, steps, float(loss), time.time() - started)
    log.info("end: STS-B dev prompt %.2f, last-avg %.2f", dev_score("prompt"), dev_score("last-avg"))
    encoder.pooling, encoder.prompt = "prompt", eval_prompt
    encoder.save(args.output)
    log.info("wrote %s (pooling prompt, template %r, no delta)", args.output, eval_prompt.template)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
