"""One prepared run for a lent GPU: BERT-base-sized contrastive training in bf16, as the transfer stage runs it.

What it measures, on one process that joins a process group (NCCL on CUDA, gloo on CPU; world size 1 unless
started by ``torchrun``) so that the trainer takes its distributed path:

- training: ``sentcl.training.trainer.Trainer.train_step`` with the transfer stage's ``transfer.base`` recipe
  (params.yaml), bf16 autocast (``--bf16``), at ``--batch-size`` sentences a step (``auto``: the largest power
  of two, up to ``--max-batch``, whose step fits in device memory); median step time over ``--steps`` timed
  steps after ``--warmup`` steps; tokens/s (padded tokens, what the device computes) and model FLOPs
  utilisation;
- MFU: model FLOPs per step over (step time x ``--peak-tflops``, the device's dense bf16 peak; H200: 989).
  Per token of each of the two views' forward and backward passes: 6 x (matmul weights of the encoder layers,
  12 x d^2 per layer for BERT: Q, K, V, O and the two feed-forward matrices) + 12 x layers x padded length x d
  (attention scores and their weighted sum: Kaplan et al. 2020, PaLM's appendix B). Embedding look-ups, layer
  norms, softmax and the pooler are not counted, as usual for MFU;
- the gradient all-reduce a step adds with more than one rank (timed on its own: one flat fp32 buffer of every
  gradient, the trainer's own scheme), so a world-size-1 run still exercises NCCL;
- peak memory: ``torch.cuda.max_memory_allocated`` (CUDA), the growth of resident memory (CPU);
- evaluation throughput: ``Encoder.encode`` (what STS-B dev selection runs) in fp32, and under bf16 autocast.

``--model bert-base`` builds BERT-base (110M parameters) from ``BertConfig()`` with random weights and the bundled
model's tokenizer (the same bert-base-uncased vocabulary): no hub download. Any other value is a model folder or
id; on CPU the default is the bundled all-MiniLM-L6-v2 for a few steps (what ``make test`` runs).

    make bench-gpu                                         # on a GPU: bert-base, batch auto, bf16
    python -m benchmarks.bench_gpu --device cpu --steps 2 --batch-size 8   # the CPU smoke run
    torchrun --nproc_per_node 8 -m benchmarks.bench_gpu   # several GPUs (batch is per rank)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.bench_train import PeakMemory
from sentcl.model.encoder import Encoder, resolve_model_path
from sentcl.training.precision import bf16_autocast
from sentcl.training.runtime import select_device
from sentcl.training.trainer import Trainer
from stages.common import RAW, SHARED_MIRROR, load_params
from stages.training import stage_config
from stages.transfer import STAGE_KEYS

H200_DENSE_BF16_TFLOPS = 989.0


def build_encoder(model: str, max_length: int) -> Encoder:
    """``bert-base``: BERT-base from its config with random weights (throughput does not depend on the values)."""
    if model != "bert-base":
        return Encoder.from_pretrained(model, max_length=max_length)
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    torch.manual_seed(0)
    return Encoder(BertModel(BertConfig(vocab_size=tokenizer.vocab_size)), tokenizer, max_length=max_length)


def training_flops(config, batch: int, length: int, views: int = 2) -> float:
    """Model FLOPs of one training step: ``views`` forward+backward passes over ``batch`` x ``length`` tokens."""
    d, layers, ff = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    matmul_weights = layers * (4 * d * d + 2 * d * ff)
    per_token = 6 * matmul_weights + 12 * layers * length * d
    return float(views * batch * length * per_token)


def sentences(n: int, seed: int = 0) -> tuple[list[str], str]:
    """``n`` sentences: STS-B train from data/raw or the team mirror when present, else seeded random text."""
    from sentcl.data.senteval import read_stsb

    for root in (RAW, SHARED_MIRROR):
        if (root / "STS" / "STSBenchmark").is_dir():
            pairs = read_stsb(root / "STS" / "STSBenchmark", "train")
            texts = list(dict.fromkeys(s for p in pairs for s in (p.sentence1, p.sentence2)))
            return (texts * (n // len(texts) + 1))[:n], f"STS-B train ({root})"
    rng = random.Random(seed)
    words = "a man woman dog cat is the of and on in with playing guitar eating food riding horse".split()
    return [" ".join(rng.choices(words, k=rng.randint(6, 40))) for _ in range(n)], "random words"


def init_process_group(device: torch.device) -> str:
    """Join ``torchrun``'s group, or make a one-process group: NCCL on CUDA, gloo on CPU."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        return dist.get_backend()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds each rank to the current device
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        store = Path(tempfile.mkdtemp()) / "store"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    return backend


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fitting_batch(trainer: Trainer, texts: list[str], start: int, largest: int) -> int:
    """The largest power of two from ``start`` to ``largest`` whose training step fits (one step each)."""
    fits, batch = 0, start
    while batch <= min(largest, len(texts)):
        try:
            trainer.train_step(texts[:batch], 1)
            sync(trainer.device)
            fits = batch
            print(f"batch {batch}: fits ({torch.cuda.max_memory_allocated(trainer.device) / 2**30:.1f} GiB)")
        except torch.OutOfMemoryError:
            trainer.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            print(f"batch {batch}: out of memory")
            break
        batch *= 2
    if not fits:
        raise SystemExit(f"batch {start} does not fit on {trainer.device}")
    return fits


def time_steps(trainer: Trainer, texts: list[str], batch: int, steps: int, warmup: int) -> dict[str, Any]:
    device, times, lengths, real = trainer.device, [], [], []
    with PeakMemory(device) as memory:
        for step in range(warmup + steps):
            start = (step * batch) % max(1, len(texts) - batch + 1)
            items = texts[start : start + batch]
            mask = trainer.encoder.tokenize(items)["attention_mask"]
            sync(device)
            began = time.perf_counter()
            trainer.train_step(items, step + 1)
            sync(device)
            if step >= warmup:
                times.append(time.perf_counter() - began)
                lengths.append(mask.shape[1])
                real.append(int(mask.sum()))
    return {"times": times, "lengths": lengths, "real_tokens": real, "peak_bytes": memory.peak}


def time_all_reduce(trainer: Trainer, repeats: int = 5) -> float:
    """Seconds of one all-reduce of every gradient as one flat fp32 buffer (the trainer's scheme at world > 1)."""
    flat = torch.zeros(sum(p.numel() for p in trainer.params), device=trainer.device)
    dist.all_reduce(flat)
    sync(trainer.device)
    began = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(flat)
    sync(trainer.device)
    return (time.perf_counter() - began) / repeats


def eval_throughput(
    encoder: Encoder, texts: list[str], batch: int, device: torch.device, bf16: bool
) -> float:
    encoder.encode(texts[:batch], batch_size=batch)  # warm-up
    sync(device)
    began = time.perf_counter()
    with bf16_autocast(device, bf16):
        encoder.encode(texts, batch_size=batch)
    sync(device)
    return len(texts) / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", help="bert-base (config-built) or a folder/id; default bert-base on CUDA, else the bundled model")  # fmt: skip
    parser.add_argument("--batch-size", default="auto", help="sentences per step per rank, or auto (CUDA: fill the device)")  # fmt: skip
    parser.add_argument("--max-batch", type=int, default=4096, help="largest batch auto tries")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--bf16", default="auto", help="auto (bf16 on CUDA and native-bf16 CPUs) | true | false"
    )
    parser.add_argument("--peak-tflops", type=float, help=f"dense bf16 peak of the device (default on CUDA: H200, {H200_DENSE_BF16_TFLOPS:g})")  # fmt: skip
    parser.add_argument("--eval-sentences", type=int, default=20000)
    parser.add_argument("--eval-batch", type=int, default=512)
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    device = select_device(args.device)
    backend = init_process_group(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = args.model or ("bert-base" if device.type == "cuda" else "all-MiniLM-L6-v2")
    peak = args.peak_tflops or (H200_DENSE_BF16_TFLOPS if device.type == "cuda" else None)
    params = load_params()
    config = stage_config(
        params,
        "transfer",
        {
            "mode": "transfer",
            "objective": "contrastive",  # the contrastive loop is what is measured (base's recipe distils)
            "bf16": args.bf16,
            "device": str(device),
            "max_length": args.max_length,
            "warmup_ratio": 0.0,
            "steps": 10**6,
            "batch_size": 2 * world,
        },
        "base",
        STAGE_KEYS,
    )
    encoder = build_encoder(model, args.max_length)
    texts, source = sentences(max(args.max_batch, args.eval_sentences, 64))
    trainer = Trainer(encoder, config, texts, [("a", "b", 0.0), ("c", "d", 1.0)], progress=False)
    if args.batch_size == "auto":
        batch = fitting_batch(trainer, texts, 64, args.max_batch) if device.type == "cuda" else 8
    else:
        batch = int(args.batch_size)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed = time_steps(trainer, texts, batch, args.steps, args.warmup)
    step_s = statistics.median(timed["times"])
    mean_step_s = statistics.fmean(timed["times"])
    length = statistics.median(timed["lengths"])
    # Per step on this rank, averaged over the timed steps (padded lengths differ from batch to batch).
    flops = statistics.fmean(training_flops(encoder.model.config, batch, n) for n in timed["lengths"])
    all_reduce_s = time_all_reduce(trainer)
    eval_texts = texts[: args.eval_sentences]
    result = {
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
        "backend": backend,
        "world_size": world,
        "model": model,
        "parameters": sum(p.numel() for p in encoder.model.parameters()),
        "text": source,
        "bf16": trainer.autocast,
        "views": list(config.views),
        "batch_per_rank": batch,
        "padded_lengths": timed["lengths"],
        "step_s_median": step_s,
        "step_s_mean": mean_step_s,
        "sentences_per_s": world * batch / step_s,
        "padded_tokens_per_s": world * 2 * batch * statistics.fmean(timed["lengths"]) / mean_step_s,
        "real_tokens_per_s": world * 2 * statistics.fmean(timed["real_tokens"]) / mean_step_s,
        "model_tflops_per_step_per_rank": flops / 1e12,
        "achieved_tflops_per_rank": flops / mean_step_s / 1e12,
        "peak_tflops": peak,
        "mfu": (flops / mean_step_s / 1e12 / peak) if peak else None,
        "grad_all_reduce_s": all_reduce_s,
        "peak_memory_gib": timed["peak_bytes"] / 2**30,
        "peak_memory_kind": "max_memory_allocated" if device.type == "cuda" else "RSS growth",
        "eval_sentences": len(eval_texts),
        "eval_sentences_per_s_fp32": eval_throughput(encoder, eval_texts, args.eval_batch, device, False),
        "eval_sentences_per_s_bf16": eval_throughput(encoder, eval_texts, args.eval_batch, device, True),
        "steps_timed": args.steps,
    }
    if rank == 0:
        mfu = f"{100 * result['mfu']:.1f}% of {peak:g} TFLOP/s" if peak else "n/a (no --peak-tflops)"
        print(
            f"{result['device']}, {backend} world {world}, {model} ({result['parameters'] / 1e6:.1f}M), "
            f"{'bf16' if trainer.autocast else 'fp32'}, views {config.views}, text: {source}\n"
            f"train: batch {batch}/rank x 2 views, padded length {length:g} (median), step {step_s * 1000:.1f} ms (median), "
            f"{result['sentences_per_s']:,.1f} sentences/s, {result['padded_tokens_per_s']:,.0f} tokens/s "
            f"({result['real_tokens_per_s']:,.0f} not padding)\n"
            f"MFU: {result['achieved_tflops_per_rank']:.3g} TFLOP/s per rank = {mfu}\n"
            f"gradient all-reduce ({backend}, {sum(p.numel() for p in trainer.params) / 1e6:.1f}M fp32): "
            f"{all_reduce_s * 1000:.2f} ms; peak memory {result['peak_memory_gib']:.2f} GiB ({result['peak_memory_kind']})\n"
            f"eval: {result['eval_sentences_per_s_fp32']:,.1f} sentences/s fp32, "
            f"{result['eval_sentences_per_s_bf16']:,.1f} bf16 ({len(eval_texts)} sentences, batch {args.eval_batch})"
        )
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
