"""Training throughput of the ``transfer`` loop against a plain Hugging Face loop doing the same work.

Both take the same batch of STS sentences, encode it twice with dropout (SimCSE's views), mean-pool, compute
NT-Xent, back-propagate and step AdamW. The runs alternate (ours, plain, ours, plain, ...) so that a machine
shared with other jobs slows both alike; the ratio is of median step times measured in this one run.

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

from sentcl.encoder import Encoder, resolve_model_path
from sentcl.train import TrainConfig, Trainer, select_device


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


def ours(model_path: str, sentences: list[str], device: torch.device, lr: float, t: float, max_length: int):
    encoder = Encoder.from_pretrained(model_path)
    config = TrainConfig(mode="transfer", preset="simcse", temperature=t, lr=lr, batch_size=len(sentences),
                         max_length=max_length, steps=10**6, warmup_ratio=0, device=str(device))  # fmt: skip
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
    from sentcl.senteval import read_stsb
    from stages.common import RAW, SHARED_MIRROR

    root = RAW if (RAW / "STS").is_dir() else SHARED_MIRROR
    pairs = read_stsb(root / "STS" / "STSBenchmark", "train")
    sentences = [p.sentence1 for p in pairs[: args.batch_size]]
    loops = {
        "sentcl transfer": ours(path, sentences, device, 3e-6, 0.05, args.max_length),
        "plain HF": plain_loop(path, sentences, device, 3e-6, 0.05, args.max_length),
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
    rates = {}
    for name in loops:
        median = statistics.median(times[name])
        rates[name] = args.batch_size / median
        print(
            f"{name:16s} {rates[name]:8.1f} sentences/s  (median step {median:.3f} s)  peak {kind} {peaks[name] / 2**20:,.0f} MiB"
        )
    print(
        f"ratio sentcl/plain: {rates['sentcl transfer'] / rates['plain HF']:.3f} (throughput; > 1 is faster)"
    )


if __name__ == "__main__":
    main()
