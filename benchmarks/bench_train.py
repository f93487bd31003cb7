"""Training throughput of the ``transfer`` loop, in fp32 and in bf16, against a plain Hugging Face loop in fp32.

The peer is what a user would write with transformers alone, in fp32. Every loop takes the same batch of STS
sentences, encodes it twice with dropout (SimCSE's views), mean-pools, computes NT-Xent, back-propagates and steps
AdamW. The loops alternate (peer, sentcl fp32, sentcl bf16, peer, ...) so that a machine shared with other jobs
slows all alike; each ratio is of median step times measured in this one run. ``bf16`` is forced here whatever
``train.bf16: auto`` would pick on this machine (printed first): on a CPU without native bf16 it shows the cost.

    make bench-train            # or: python -m benchmarks.bench_train --batch-size 64 --steps 6
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psutil
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

from sentcl.model.encoder import Encoder, resolve_model_path
from sentcl.training.precision import cpu_has_native_bf16, use_bf16
from sentcl.training.runtime import select_device
from sentcl.training.trainer import Trainer
from stages.common import load_params
from stages.training import stage_config
from stages.transfer import STAGE_KEYS


class PeakMemory:
    """Peak GPU memory allocated (CUDA), or on CPU the peak growth of resident memory over the block's start
    (sampled every 5 ms): both models live in this process, so their weights are left out of the CPU figure."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak = device, 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._start = psutil.Process().memory_info().rss
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            self._thread.join()
            self.peak -= self._start


def plain_loop(
    model_path: str, sentences: list[str], device: torch.device, lr: float, t: float, max_length: int
):
    """What one would write with transformers alone: tokenize, two forwards, mean pool, NT-Xent, AdamW."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def step() -> float:
        batch = tokenizer(
            sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(device)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        views = []
        for _ in range(2):
            hidden = model(**batch).last_hidden_state
            views.append((hidden * mask).sum(1) / mask.sum(1))
        z = F.normalize(torch.cat(views), dim=-1)
        n = len(sentences)
        logits = z @ z.T / t
        logits.fill_diagonal_(float("-inf"))
        loss = F.cross_entropy(logits, torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def ours(
    model_path: str,
    sentences: list[str],
    device: torch.device,
    lr: float,
    t: float,
    max_length: int,
    bf16: bool,
):
    encoder = Encoder.from_pretrained(model_path)
    # The peer's work: dropout as the only view, NT-Xent over both directions, every other setting params.yaml's.
    overrides = {"mode": "transfer", "objective": "contrastive", "loss": "nt_xent", "views": ("none", "none"), "encoder_dropout": True,
                 "alpha": 1.0, "temperature": t, "lr": lr, "batch_size": len(sentences), "max_length": max_length,
                 "steps": 10**6, "warmup_ratio": 0.0, "device": str(device), "bf16": bf16, "compile": False}  # fmt: skip
    config = stage_config(load_params(), "transfer", overrides, "base", STAGE_KEYS)
    trainer = Trainer(encoder, config, sentences, [("a", "b", 0.0), ("c", "d", 1.0)], progress=False)
    counter = iter(range(1, 10**6))
    return lambda: trainer.train_step(sentences, next(counter))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per loop (after one warm-up step)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = select_device(args.device)
    path = resolve_model_path(args.model)
    from sentcl.data.senteval import read_stsb
    from stages.common import RAW, SHARED_MIRROR

    root = RAW if (RAW / "STS").is_dir() else SHARED_MIRROR
    pairs = read_stsb(root / "STS" / "STSBenchmark", "train")
    sentences = [p.sentence1 for p in pairs[: args.batch_size]]
    auto = use_bf16("auto", device)
    native = "" if device.type != "cpu" else f" (CPU native bf16: {'yes' if cpu_has_native_bf16() else 'no'})"
    print(f"train.bf16: auto picks {'bf16' if auto else 'fp32'} on {device}{native}")
    peer = "plain HF fp32"
    loops = {
        peer: plain_loop(path, sentences, device, 3e-6, 0.05, args.max_length),
        "sentcl fp32": ours(path, sentences, device, 3e-6, 0.05, args.max_length, bf16=False),
        "sentcl bf16": ours(path, sentences, device, 3e-6, 0.05, args.max_length, bf16=True),
    }
    times: dict[str, list[float]] = {name: [] for name in loops}
    peaks: dict[str, int] = dict.fromkeys(loops, 0)
    for step in loops.values():
        step()  # warm-up: allocator, kernels, lazy init
    for _ in range(args.steps):
        for name, step in loops.items():
            with PeakMemory(device) as memory:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
            peaks[name] = max(peaks[name], memory.peak)
    kind = "GPU allocated" if device.type == "cuda" else "RSS growth during a step"
    print(f"device {device}, batch {args.batch_size} sentences x 2 views, {args.steps} timed steps each")
    rates = {name: args.batch_size / statistics.median(times[name]) for name in loops}
    for name in loops:
        print(
            f"{name:14s} {rates[name]:7.1f} sentences/s  x{rates[name] / rates[peer]:.3f} of the peer  "
            f"(median step {statistics.median(times[name]):.3f} s)  peak {kind} {peaks[name] / 2**20:,.0f} MiB"
        )
    print(f"ratios are throughput over the {peer} peer's; > 1 is faster")


if __name__ == "__main__":
    main()
