"""Fast sentence embedding for evaluation: tokenize once, sort globally by token length, batch by a token budget,
run the transformer in ONNX Runtime (or torch inference mode), pool inside the graph. With ONNX Runtime and
several cores, batches go to worker processes of one thread each: on 2 cores, two 1-thread sessions encode
~18% faster than one 2-thread session (small matrices scale badly across threads within one matmul).

Every trick here is exact up to float32 rounding (checked against torch at load time, and by the tests):
length-sorted batches only change how much padding each row sees, and padding is masked out of both the
attention and the mean. Nothing lossy (int8, fp16) is used, so scores match the plain torch encoder to 0.01.

The one exception is asked for by name: ``backend="int8"`` runs a release folder's ``onnx/model_int8.onnx``
(written by the export stage, :mod:`sentcl.model.quantize`) with the same tokenization, batching and workers. It
is lossy by design, so it is not checked against torch at load time; the export measured it on the dev splits.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sentcl.model.encoder import POOLINGS, pool, resolve_model_path
from sentcl.model.folder import count_over_limit, model_max_length, transformer_folder
from sentcl.model.pooling import ModelPooling, PromptSettings

log = logging.getLogger(__name__)
EXACT_BACKENDS = ("onnx", "torch")  # equal to torch to 1e-4: what the pipeline evaluates checkpoints with
BACKENDS = (*EXACT_BACKENDS, "int8")  # int8: a release folder's onnx/model_int8.onnx, lossy
# Measured on 2 CPU cores with MiniLM-L6 (mean 14 tokens a sentence): ~512 tokens a batch is the sweet spot;
# batches of 128 sentences are 2-4x slower per sentence (activations leave the cache).
DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_BATCH = 64
# Largest |difference| between the ONNX and torch vectors accepted at load time; float32 noise is ~1e-6.
EXPORT_TOLERANCE = 1e-4
# Each worker holds its own copy of the model; beyond a few, memory grows faster than throughput.
MAX_WORKERS = 4


def cpu_threads() -> int:
    """Cores this process may use (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_workers(threads: int) -> int:
    return max(1, min(threads, MAX_WORKERS))


def ort_session(path: str, threads: int, spin: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning idle threads steal time from other jobs (and from sibling workers) on a shared machine.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


_worker_session = None


def _worker_start(path: str, threads: int) -> None:
    global _worker_session
    _worker_session = ort_session(path, threads, spin=True)


def _worker_run(batch: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    rows, input_ids, mask = batch
    return rows, _worker_session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]


class MissingInt8Error(FileNotFoundError):
    """``backend="int8"`` on a folder without ``onnx/model_int8.onnx``."""


class _Pooled(nn.Module):
    """The transformer plus pooling as one graph, so ONNX Runtime returns sentence vectors directly."""

    def __init__(self, model: nn.Module, pooling: str) -> None:
        super().__init__()
        self.model, self.pooling = model, pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        all_layers = self.pooling in ("last2-avg", "first-last-avg")
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=all_layers)
        hidden = out.hidden_states if all_layers else (out.last_hidden_state,)
        return pool(hidden, attention_mask, self.pooling)


class FastEncoder:
    """``encoder(sentences) -> float32 array [n, dim]`` in the input order.

    ``backend="onnx"`` exports the model once (a few seconds) and falls back to torch, with a warning, when
    the export fails or disagrees with torch. ``workers`` (ONNX only; default: one per core, at most
    ``MAX_WORKERS``) processes share ``threads`` cores between them.
    """

    def __init__(
        self,
        model_path: str | Path,
        pooling: str = "last-avg",
        max_length: int | None = None,
        backend: str = "onnx",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_batch: int = DEFAULT_MAX_BATCH,
        threads: int | None = None,
        workers: int | None = None,
        progress: bool = False,
        prompt: PromptSettings | None = None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        ModelPooling(pooling, prompt)  # prompt pooling needs its settings
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.model_path = resolve_model_path(str(model_path))
        folder = transformer_folder(self.model_path)
        self.pooling, self.max_tokens, self.max_batch, self.progress = (
            pooling,
            max_tokens,
            max_batch,
            progress,
        )
        self.max_length = max_length or model_max_length(self.model_path)
        self.threads = threads or cpu_threads()
        self.workers = workers or default_workers(self.threads)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        torch.set_num_threads(self.threads)
        self.prompt_pooler = None
        if pooling == "prompt":
            # The [MASK] gather and the per-length delta table live in the graph (sentcl/model/prompt.py PromptGraph),
            # so ONNX Runtime runs them too; the template goes in at tokenization.
            from sentcl.model.prompt import PromptGraph, PromptPooler

            self.prompt_pooler = PromptPooler(self.tokenizer, prompt, self.max_length)
            self.torch_model = PromptGraph(
                AutoModel.from_pretrained(folder).eval(), self.prompt_pooler
            ).eval()
        else:
            self.torch_model = _Pooled(AutoModel.from_pretrained(folder).eval(), pooling).eval()
        self.dim = int(self.torch_model.model.config.hidden_size)
        self.session = None
        self.backend = "torch"
        self.last_truncated = 0  # sentences cut to max_length by the last call (or batches())
        if backend == "onnx":
            self._start_onnx()
        elif backend == "int8":
            self._start_int8()

    # -- tokenization and batching -------------------------------------------------------------------------
    def _tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        if self.prompt_pooler is not None:  # each sentence inside the template, cut inside it if too long
            return self.prompt_pooler.token_ids(sentences)
        # The same call sentence-transformers makes (strip, truncate to max_seq_length), minus the padding.
        return self.tokenizer(
            [str(s).strip() for s in sentences], truncation=True, max_length=self.max_length
        )["input_ids"]

    def batches(self, sentences: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(row indices, input_ids, attention_mask) over all sentences sorted by token length, each batch
        holding at most ``max_tokens`` padded tokens (and ``max_batch`` rows)."""
        ids = self._tokenize(sentences)
        self.last_truncated = count_over_limit(self.tokenizer, sentences, ids, self.max_length)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        order = np.argsort(lengths, kind="stable")
        start = 0
        pad = self.tokenizer.pad_token_id or 0
        while start < len(order):
            # Sorted ascending, so the last row of a batch sets its padded width.
            size = 1
            while (
                start + size < len(order)
                and size < self.max_batch
                and (size + 1) * lengths[order[start + size]] <= self.max_tokens
            ):
                size += 1
            rows = order[start : start + size]
            width = int(lengths[rows[-1]])
            input_ids = np.full((len(rows), width), pad, dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for j, i in enumerate(rows):
                input_ids[j, : lengths[i]] = ids[i]
                mask[j, : lengths[i]] = 1
            yield rows, input_ids, mask
            start += size

    # -- backends ------------------------------------------------------------------------------------------
    def _run_torch(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.torch_model(torch.from_numpy(input_ids), torch.from_numpy(mask)).float().numpy()

    def _run_onnx(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]

    def _start_onnx(self) -> None:
        try:
            self._workdir = tempfile.TemporaryDirectory(prefix="sentcl-onnx-")
            onnx_path = Path(self._workdir.name) / "model.onnx"
            example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
            if (
                self.prompt_pooler is not None
            ):  # the graph reads the [MASK] and the length: a real prompt batch
                _, ids, mask = next(self.batches(["a man is here", "a dog"]))
                example = (torch.from_numpy(ids), torch.from_numpy(mask))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # The TorchScript exporter: 1-2 s for a MiniLM, against ~10 s for the dynamo one, same graph speed.
                torch.onnx.export(
                    self.torch_model,
                    example,
                    str(onnx_path),
                    input_names=["input_ids", "attention_mask"],
                    output_names=["embedding"],
                    dynamic_axes={
                        "input_ids": {0: "batch", 1: "tokens"},
                        "attention_mask": {0: "batch", 1: "tokens"},
                        "embedding": {0: "batch"},
                    },
                    opset_version=17,
                    dynamo=False,
                )
            self.onnx_path = str(onnx_path)
            self.session = ort_session(self.onnx_path, self.threads, spin=False)
            self._check_onnx()
            self.backend = "onnx"
        except Exception as error:  # any model the exporter cannot handle still gets evaluated, slower
            log.warning(
                "ONNX backend unavailable for %s with %s pooling (%s); falling back to torch",
                self.model_path,
                self.pooling,
                error,
            )
            self.session = None
            self.backend = "torch"

    def _start_int8(self) -> None:
        from sentcl.model.quantize import INT8_FILE

        path = Path(self.model_path) / INT8_FILE
        if not path.is_file():  # no silent fallback: whoever asked for int8 measures or serves int8
            raise MissingInt8Error(
                f"{self.model_path}: no {INT8_FILE} (the export stage writes it when int8 is within tolerance)"
            )
        self.onnx_path = str(path)
        self.session = ort_session(self.onnx_path, self.threads, spin=False)
        self.backend = "int8"

    def _check_onnx(self) -> None:
        probe = ["a", "a man is playing a guitar on the street .", "two dogs run", "x " * 40]
        worst = 0.0
        for _, input_ids, mask in self.batches(probe):
            worst = max(
                worst, float(np.abs(self._run_onnx(input_ids, mask) - self._run_torch(input_ids, mask)).max())
            )
        if not worst <= EXPORT_TOLERANCE:
            raise RuntimeError(f"ONNX output differs from torch by {worst:.2e}")

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(sentences), self.dim), dtype=np.float32)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(sentences), desc=f"encode ({self.backend})", unit="sent", leave=False)
        for rows, batch_vectors in self._encoded_batches(sentences):
            vectors[rows] = batch_vectors
            if bar is not None:
                bar.update(len(rows))
        if bar is not None:
            bar.close()
        return vectors

    def _encoded_batches(self, sentences: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.processes_used = 1
        if self.session is None:
            for rows, input_ids, mask in self.batches(sentences):
                yield rows, self._run_torch(input_ids, mask)
            return
        import multiprocessing

        forkable = "fork" in multiprocessing.get_all_start_methods()
        if self.workers <= 1 or len(sentences) < 1000 or not forkable:  # a pool costs ~1 s to start
            for rows, input_ids, mask in self.batches(sentences):
                yield rows, self._run_onnx(input_ids, mask)
            return
        # fork: workers need only numpy and onnxruntime, already imported here; they never touch torch.
        context = multiprocessing.get_context("fork")
        per_worker = max(1, self.threads // self.workers)
        self.processes_used = self.workers
        with context.Pool(self.workers, _worker_start, (self.onnx_path, per_worker)) as pool:
            yield from pool.imap_unordered(_worker_run, self.batches(sentences), chunksize=4)
