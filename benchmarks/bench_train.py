"""Training throughput of the transfer loop against a plain Hugging Face loop in fp32, padded and in chunks, and of
the default step as ``make run`` runs it.

Two steps are timed, each on real batches of the default text (``transfer.texts: heldout``):

- ``distill``: the default transfer's (``transfer.base`` + ``transfer.distillation``: each sentence with its 3
  nearest teacher neighbours, 32 groups = 128 sentences, in-batch cosine MSE with the group weight, encoder
  dropout off). The peer tokenizes the 128 sentences padded to the longest, mean-pools, computes the same
  weighted MSE and steps AdamW. Rows: sentcl in fp32 padded and in length-sorted chunks of each ``--chunks``
  size; **default**: the step exactly as params.yaml and ``train.bf16: auto`` run it on this machine (bf16 with
  chunks where the CPU has native bf16, fp32 with chunks elsewhere; ``train.freeze`` and
  ``train.fused_optimizer`` as params.yaml sets them); then the default with each of those two flipped, and the
  default on one thread. The teacher's vectors are data/teacher when the teacher stage has run, else the
  student's own vectors stand in (neighbours and targets then come from them; a step's cost does not depend on
  the values).
- ``contrastive``: SimCSE's work as a user would write it with transformers alone (64 sentences, two forwards
  with dropout, mean pool, NT-Xent, AdamW), and sentcl's transfer loop set to the same work.

Per row: sentences/s and the ratio to the peer; the **real-token share** (tokens of the sentences over the
tokens the forward computes: padded to the batch's longest, or to each chunk's longest); **seconds per 1,000 real
tokens**; and the **fraction of peak**: model FLOPs per real token (forward and backward: 6 x the non-embedding
parameters + the attention's 12 x layers x hidden x mean length, the nanoGPT/PaLM count, less what frozen layers
skip: :func:`flops_per_token`) times real tokens per second, over the CPU's physical peak (cores x clock x FLOP per cycle, derived from /proc/cpuinfo and printed).
The loops alternate on the same batch at each step (peer, sentcl padded, sentcl chunks, ...) so that a machine
shared with other jobs slows all alike; each ratio is of median step times measured in this one run. Memory: the
activations autograd keeps for the backward pass (exact, from a separate untimed step), and the peak growth of
resident memory during a timed step (CPU, sampled every 5 ms) or peak allocated memory (CUDA). The process's CPU
seconds per step are printed beside the wall time.
``bf16`` is forced in one extra contrastive row whatever ``train.bf16: auto`` would pick (printed first).

    make bench-train            # or: python -m benchmarks.bench_train --steps 6 --chunks 256,512,1024
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

from sentcl.model.encoder import Encoder, resolve_model_path
from sentcl.training.precision import cpu_has_native_bf16, use_bf16
from sentcl.training.runtime import BatchOrder, select_device
from sentcl.training.trainer import Trainer
from stages.common import load_params
from stages.training import stage_config
from stages.transfer import STAGE_KEYS, transfer_config

log = logging.getLogger("bench_train")


class PeakMemory:
    """Peak GPU memory allocated (CUDA), or on CPU the peak growth of resident memory over the block's start
    (sampled every 5 ms): all models live in this process, so their weights are left out of the CPU figure."""

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


def saved_for_backward(step: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for the backward pass during ``step``, parameters left out: the
    activation memory, which is what padding inflates."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


# --- the peers: transformers alone, padded to the batch's longest sentence --------------------------------


def _peer_model(model_path: str, device: torch.device, lr: float, dropout: bool):
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).to(device).train(dropout)
    return tokenizer, model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def _mean_pool(model, tokenizer, sentences: list[str], device: torch.device, max_length: int) -> torch.Tensor:
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    batch = batch.to(device)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return (model(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)


def _update(model, optimizer, loss: torch.Tensor) -> float:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def plain_contrastive(model_path: str, device: torch.device, lr: float, t: float, max_length: int):
    """What one would write with transformers alone: tokenize, two forwards, mean pool, NT-Xent, AdamW."""
    tokenizer, model, optimizer = _peer_model(model_path, device, lr, dropout=True)

    def step(sentences: list[str]) -> float:
        views = [_mean_pool(model, tokenizer, sentences, device, max_length) for _ in range(2)]
        z = F.normalize(torch.cat(views), dim=-1)
        n = len(sentences)
        logits = z @ z.T / t
        logits.fill_diagonal_(float("-inf"))
        targets = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(device)
        return _update(model, optimizer, F.cross_entropy(logits, targets))

    return step


def plain_distill(
    model_path: str, device: torch.device, lr: float, teacher, group_weight: float, max_length: int
):
    """The default distillation with transformers alone: the groups' sentences in one padded forward, mean
    pool, the in-batch cosine matrix regressed on the teacher's, a group's own entries weighing ``group_weight``."""
    tokenizer, model, optimizer = _peer_model(model_path, device, lr, dropout=False)

    def step(groups: list[tuple[str, ...]]) -> float:
        sentences = [g[side] for side in range(len(groups[0])) for g in groups]
        z = F.normalize(_mean_pool(model, tokenizer, sentences, device, max_length), dim=-1)
        t = F.normalize(torch.from_numpy(teacher.lookup(sentences)).float().to(device), dim=-1)
        group = torch.arange(len(sentences), device=device) % len(groups)
        off = ~torch.eye(len(sentences), dtype=torch.bool, device=device)
        weights = (1 + (group_weight - 1) * (group[:, None] == group[None, :]).float())[off]
        loss = (weights * ((z @ z.T - t @ t.T) ** 2)[off]).sum() / weights.sum()
        return _update(model, optimizer, loss)

    return step


# --- sentcl's trainer ------------------------------------------------------------------------------------


def sentcl_step(model_path: str, config, examples: list, teacher=None):
    encoder = Encoder.from_pretrained(model_path)
    trainer = Trainer(
        encoder, config, examples, [("a", "b", 0.0), ("c", "d", 1.0)], progress=False, teacher=teacher
    )
    counter = iter(range(1, 10**6))
    return lambda items: trainer.train_step(items, next(counter))


def contrastive_config(
    params, device, t: float, lr: float, batch: int, max_length: int, bf16: bool, chunk: int
):
    # The peer's work: dropout as the only view, NT-Xent over both directions, every other setting params.yaml's.
    overrides = {"mode": "transfer", "objective": "contrastive", "loss": "nt_xent", "views": ("none", "none"), "encoder_dropout": True,
                 "alpha": 1.0, "temperature": t, "lr": lr, "batch_size": batch, "max_length": max_length,
                 "steps": 10**6, "warmup_ratio": 0.0, "device": str(device), "bf16": bf16, "compile": False,
                 "chunk_tokens": chunk}  # fmt: skip
    return stage_config(params, "transfer", overrides, "base", STAGE_KEYS)


def distill_config(params, device, max_length: int, chunk: int):
    # The default transfer's distillation as params.yaml has it; only the run length and precision pinned.
    overrides = {"objective": "distill", "max_length": max_length, "steps": 10**6, "warmup_ratio": 0.0,
                 "device": str(device), "bf16": False, "compile": False, "chunk_tokens": chunk}  # fmt: skip
    return transfer_config(params, "base", overrides)


# --- data ------------------------------------------------------------------------------------------------


def default_text(path: str, max_length: int) -> list[str]:
    """``transfer.texts: heldout`` read from the SentEval data: data/raw, else $SENTEVAL_MIRROR (as the fetch
    stage reads it), else the team mirror beside the checkout."""
    from sentcl.data.validation import load_tables
    from sentcl.training.data import transfer_texts
    from stages.common import RAW, SHARED_MIRROR

    root = RAW if (RAW / "STS").is_dir() else Path(os.environ.get("SENTEVAL_MIRROR") or SHARED_MIRROR)
    if not (root / "STS").is_dir():
        raise SystemExit(f"bench-train: no SentEval data in {RAW} or {root} (set SENTEVAL_MIRROR)")
    pairs, nli, _ = load_tables(root, [])
    return transfer_texts("heldout", pairs, nli, root, log)


def load_teacher(texts: list[str], path: str, pool: int, seed: int):
    """(teacher, texts): data/teacher's vectors when they cover the text, else the student's own vectors of a
    seeded ``pool`` of the text (encoding all of it would take longer than the benchmark)."""
    from sentcl.model.teacher import TeacherError, TeacherVectors
    from stages.transfer import TEACHER_VECTORS

    try:
        teacher = TeacherVectors.load_covering(TEACHER_VECTORS, texts)
        print(f"teacher: {teacher.meta.get('model')} vectors from {TEACHER_VECTORS}")
        return teacher, texts
    except (TeacherError, OSError, KeyError, ValueError):
        pass
    from sentcl.model.fast_encode import FastEncoder

    rng = np.random.default_rng(seed)
    texts = [texts[i] for i in sorted(rng.choice(len(texts), size=min(pool, len(texts)), replace=False))]
    vectors = FastEncoder(path, backend="torch")(texts)
    print(f"teacher: no {TEACHER_VECTORS}; the student's own vectors of {len(texts)} sentences stand in")
    return TeacherVectors(texts, vectors.astype(np.float16), {"model": "student"}), texts


# --- the run ---------------------------------------------------------------------------------------------


def cpu_peak() -> tuple[float, float, str]:
    """(fp32 FLOP/s, bf16 FLOP/s, how they were derived) of the cores this process may use: cores x clock (``cpu
    MHz`` of /proc/cpuinfo) x FLOP per cycle per core from the instruction set: 32 fp32 (two 256-bit FMA pipes:
    AVX2, and AVX-512 on AMD, which runs it on 256-bit pipes) or 64 (AVX-512 on Intel: two 512-bit FMA ports);
    bf16 twice the fp32 rate with AVX512-BF16 (a dot product of bf16 pairs per lane) and 16x with AMX, else the
    fp32 rate (bf16 is emulated). An estimate from the ISA, not a measurement."""
    from sentcl.training.precision import cpuinfo_flags

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    mhz = next((float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")), 0.0)
    flags = cpuinfo_flags()
    amd = "AuthenticAMD" in text
    per_cycle = 64 if "avx512f" in flags and not amd else 32 if {"avx2", "fma"} <= flags else 16
    bf16 = per_cycle * (16 if "amx_bf16" in flags else 2 if "avx512_bf16" in flags else 1)
    cores = len(os.sched_getaffinity(0))
    fp32 = cores * mhz * 1e6 * per_cycle
    how = (
        f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} fp32 FLOP/cycle"
        f" ({'AMD' if amd else 'non-AMD'}, {'AVX-512' if 'avx512f' in flags else 'AVX2' if 'avx2' in flags else 'SSE'})"
        f" = {fp32 / 1e9:.0f} GFLOP/s fp32, {cores * mhz * 1e6 * bf16 / 1e9:.0f} GFLOP/s bf16"
        f" ({'AMX' if 'amx_bf16' in flags else 'AVX512-BF16' if 'avx512_bf16' in flags else 'emulated'})"
    )
    return fp32, cores * mhz * 1e6 * bf16, how


def flops_per_token(model: torch.nn.Module, mean_length: float, freeze: tuple[str, ...] = ()) -> float:
    """Training FLOPs per real token, forward and backward, of a BERT's matrix products (the nanoGPT/PaLM count,
    less what frozen weights skip): each weight costs 2 FLOPs a token forward, 2 more for its gradient where it
    trains, and 2 more for its input's gradient where a trained weight sits upstream of it (a layer's query, key
    and value read the layer's input; the rest of the layer also reads what those produced). Each layer's attention
    costs 4 x hidden x the mean sequence length forward (scores and their use), 12 where the backward passes
    through its query, key and value. So ``train.freeze`` of the bottom layers leaves them forward only, and the
    lowest trained layer computes no gradient of its input. Embeddings and the pooler are no matrix products."""
    config = model.config
    trained_below = False  # a trained parameter in a lower layer or the embeddings (named bottom to top)
    layer, trained_in_layer, attention = None, False, {}
    total = 0.0
    for name, p in model.named_parameters():
        trained = not (freeze and name.startswith(tuple(freeze)))
        found = re.match(r"encoder\.layer\.(\d+)\.", name)
        if found and found.group(1) != layer:
            trained_below, layer, trained_in_layer = trained_below or trained_in_layer, found.group(1), False
        if not found:  # the embeddings (below every layer) or the pooler (above)
            trained_below = trained_below or (trained and name.startswith("embeddings."))
            continue
        reads_layer_input = ".attention.self." in name
        upstream = trained_below or (trained_in_layer and not reads_layer_input)
        if reads_layer_input:
            attention[layer] = attention.get(layer, False) or trained or trained_below
        total += (2 + 2 * trained + 2 * upstream) * p.numel()
        trained_in_layer = trained_in_layer or trained
    backward = [attention.get(str(i), True) for i in range(config.num_hidden_layers)]
    return total + sum((12 if back else 4) * config.hidden_size * mean_length for back in backward)


def token_counts(tokenizer, sentences: list[str], max_length: int, chunk: int) -> tuple[int, int]:
    """(real tokens, tokens computed) of one batch: padded to its longest (``chunk`` 0) or to each length-sorted
    chunk's longest, the rule of ``sentcl.training.objectives.chunks.length_chunks``."""
    from sentcl.training.objectives.chunks import length_chunks

    batch = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    mask = batch["attention_mask"]
    real = int(mask.sum())
    chunks = length_chunks(mask, chunk) if chunk else None
    computed = sum(len(rows) * width for rows, width in chunks) if chunks else mask.numel()
    return real, computed


def measure(
    title: str,
    loops: dict[str, Callable],
    batches: list[list],
    peer: str,
    device,
    unit: int,
    tokens: dict[str, tuple[float, float]] | None = None,
    peaks: dict[str, float] | None = None,
    flops: dict[str, float] | None = None,
) -> dict[str, float]:
    """Warm-up on the first batch, then every loop on each later batch in turn; one table. ``tokens``: each
    loop's mean (real, computed) tokens a step; ``peaks``: each loop's peak FLOP/s; ``flops``: each loop's per real token.
    Returns each loop's median step seconds."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    memory_peaks: dict[str, int] = dict.fromkeys(loops, 0)
    saved = {name: saved_for_backward(lambda s=step: s(batches[0])) for name, step in loops.items()}
    for items in batches[1:]:
        for name, step in loops.items():
            with PeakMemory(device) as memory:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start, start_cpu = time.perf_counter(), time.process_time()
                step(items)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
            memory_peaks[name] = max(memory_peaks[name], memory.peak)
    kind = "GPU allocated" if device.type == "cuda" else "RSS growth"
    padded = "sentcl fp32 padded"
    medians = {name: statistics.median(times[name]) for name in loops}
    rates = {name: unit / medians[name] for name in loops}
    print(f"\n{title}: {unit} sentences a step, {len(batches) - 1} timed steps each")
    for name in loops:
        versus = f"  x{rates[name] / rates[padded]:.3f} of padded" if padded in rates and name != peer else ""
        work = ""
        if tokens and name in tokens:
            real, computed = tokens[name]
            per_k = medians[name] / real * 1000
            work = (
                f"  real tokens {100 * real / computed:.0f}% of computed, {per_k:.3f} s / 1,000 real tokens"
            )
            if flops and peaks and name in peaks and name in flops:
                work += f", {100 * flops[name] * real / medians[name] / peaks[name]:.0f}% of peak"
        print(
            f"{name:34s} {rates[name]:7.1f} sentences/s  x{rates[name] / rates[peer]:.3f} of the peer{versus}  "
            f"(median step {medians[name]:.3f} s, CPU {statistics.median(cpu[name]):.3f} s){work}  "
            f"saved for backward {saved[name] / 2**20:,.0f} MiB  peak {kind} {memory_peaks[name] / 2**20:,.0f} MiB"
        )
    return medians


def on_threads(step: Callable, threads: int) -> Callable:
    """``step`` run with torch on ``threads`` threads (the process's setting restored after)."""

    def run(items):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return step(items)
        finally:
            torch.set_num_threads(before)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--batch-size", type=int, default=64, help="contrastive: sentences per step")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per loop (after one warm-up step)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--chunks", default="256,512,1024", help="train.chunk_tokens values to time")
    parser.add_argument("--only", choices=("distill", "contrastive"), help="time one of the two steps")
    parser.add_argument("--pool", type=int, default=3000, help="sentences the stand-in teacher encodes")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    path = resolve_model_path(args.model)
    chunks = [int(c) for c in args.chunks.split(",") if c]
    params, seed = load_params(), 0
    texts = default_text(path, args.max_length)
    auto = use_bf16("auto", device)
    native = "" if device.type != "cpu" else f" (CPU native bf16: {'yes' if cpu_has_native_bf16() else 'no'})"
    print(
        f"train.bf16: auto picks {'bf16' if auto else 'fp32'} on {device}{native}; default text: {len(texts)}"
    )
    peer = "plain HF fp32"

    if args.only != "distill":
        lr, t = 3e-6, 0.05
        order = BatchOrder(len(texts), args.batch_size, seed)
        batches = [[texts[i] for i in order.indices(s)] for s in range(args.steps + 1)]

        def setting(bf16: bool, c: int):
            return contrastive_config(params, device, t, lr, args.batch_size, args.max_length, bf16, c)

        loops = {
            peer: plain_contrastive(path, device, lr, t, args.max_length),
            "sentcl fp32 padded": sentcl_step(path, setting(False, 0), texts),
            **{f"sentcl fp32 chunks {c}": sentcl_step(path, setting(False, c), texts) for c in chunks},
            "sentcl bf16 padded": sentcl_step(path, setting(True, 0), texts),
        }
        measure("contrastive (SimCSE's work)", loops, batches, peer, device, args.batch_size)
        del loops  # the trainers' models and optimizer states

    if args.only != "contrastive":
        from dataclasses import replace

        from sentcl.training.objectives.distill import neighbour_groups

        config = distill_config(params, device, args.max_length, 0)
        teacher, pool = load_teacher(texts, path, args.pool, seed)
        groups = neighbour_groups(pool, teacher, config.distill.neighbours)
        order = BatchOrder(len(groups), config.batch_size, seed)
        batches = [[groups[i] for i in order.indices(s)] for s in range(args.steps + 1)]
        # The step make run trains: params.yaml as it is, train.bf16 auto (only the run length pinned).
        default = transfer_config(
            params, "base", {"objective": "distill", "steps": 10**6, "device": str(device)}
        )
        word_embeddings = ("embeddings.word_embeddings",)
        flipped = replace(default, freeze=() if default.freeze else word_embeddings)
        kinds = {
            "sentcl fp32 padded": (config, False),
            **{
                f"sentcl fp32 chunks {c}": (distill_config(params, device, args.max_length, c), False)
                for c in chunks
            },
            "default (params.yaml, auto)": (default, use_bf16(default.bf16, device)),
            f"default, fused_optimizer {not default.fused_optimizer}".lower(): (
                replace(default, fused_optimizer=not default.fused_optimizer),
                use_bf16(default.bf16, device),
            ),
            f"default, freeze {list(flipped.freeze)}": (flipped, use_bf16(default.bf16, device)),
        }
        loops = {
            peer: plain_distill(
                path, device, config.lr, teacher, config.distill.group_weight, args.max_length
            ),
            **{name: sentcl_step(path, setting, groups, teacher) for name, (setting, _) in kinds.items()},
        }
        loops["default, 1 thread"] = on_threads(sentcl_step(path, default, groups, teacher), 1)
        kinds["default, 1 thread"] = kinds["default (params.yaml, auto)"]
        tokenizer = AutoTokenizer.from_pretrained(path)
        flat = [[sentence for group in batch for sentence in group] for batch in batches[1:]]
        tokens = {peer: (0.0, 0.0)}
        for name, (setting, _) in {peer: (config, False), **kinds}.items():
            counts = [token_counts(tokenizer, b, args.max_length, setting.chunk_tokens) for b in flat]
            tokens[name] = (statistics.fmean(c[0] for c in counts), statistics.fmean(c[1] for c in counts))
        fp32_peak, bf16_peak, how = cpu_peak() if device.type == "cpu" else (0.0, 0.0, "a GPU: no CPU peak")
        peaks = {peer: fp32_peak} | {n: bf16_peak if bf16 else fp32_peak for n, (_, bf16) in kinds.items()}
        peaks["default, 1 thread"] = peaks["default (params.yaml, auto)"] / max(
            1, len(os.sched_getaffinity(0))
        )
        unit = config.batch_size * (config.distill.neighbours + 1)
        mean_length = tokens[peer][0] / unit
        student = AutoModel.from_pretrained(path)
        flops = {peer: flops_per_token(student, mean_length)}
        flops |= {
            n: flops_per_token(student, mean_length, setting.freeze) for n, (setting, _) in kinds.items()
        }
        print(
            f"\npeak: {how}; {flops[peer] / 1e6:.1f} MFLOP a real token forward and backward at a mean "
            f"{mean_length:.1f} tokens a sentence, {flops['default (params.yaml, auto)'] / 1e6:.1f} with the "
            f"default's frozen layers ({list(default.freeze)})"
        )
        measure(
            "distill (the default transfer)",
            loops,
            batches,
            peer,
            device,
            unit,
            tokens if device.type == "cpu" else None,
            peaks,
            flops,
        )
    print("\nratios are throughput over the peer's (or sentcl padded's); > 1 is faster")


if __name__ == "__main__":
    main()
