"""One training loop for the three ConSERT modes: ``nli`` (supervised), ``joint`` (CE + alpha * NT-Xent) and
``transfer`` (unsupervised contrastive on target-domain text).

Read top to bottom: config, data order, the representations of a micro-batch, the loss, one optimizer step
(with gradient caching when accumulating), evaluation and checkpoint selection, resume state, the loop.

Gradient accumulation (``grad_accum > 1``) never shrinks the set of negatives: a step first embeds all
micro-batches without gradient, computes the loss over the whole batch, and then re-runs each micro-batch with
gradient, feeding it its slice of the embedding gradient (GradCache, Gao et al. 2021). The random state of each
micro-batch is replayed, so the views and dropout masks are the same in both passes and the update equals the
one of a single large batch; the price is one extra forward pass per micro-batch. Activation memory is that of
one micro-batch; the similarity matrix is still batch x batch.

Under ``torchrun`` the global ``batch_size`` is split over the ranks; contrastive losses all-gather the
embeddings (see ``sentcl.losses``) and gradients are averaged with one all-reduce per step (what DDP does;
done by hand because the cached-gradient passes and unused parameters such as BERT's pooler do not fit DDP's
hooks).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from sentcl.encoder import Encoder
from sentcl.losses import NLIHead, nli_loss, nt_xent, sup_simcse
from sentcl.precision import bf16_autocast, use_bf16
from sentcl.sts import STSEvaluator
from sentcl.views import DISABLE_ENCODER_DROPOUT, NEEDS_LABELS, VIEWS, ViewConfig, make_view

log = logging.getLogger(__name__)

MODES = ("nli", "joint", "transfer")
OBJECTIVES = ("ce", "sup_simcse")
PRESETS = {"simcse": {"views": ("none", "none"), "temperature": 0.05}}


@dataclass
class TrainConfig:
    mode: str = "transfer"  # nli | joint | transfer
    objective: str = "ce"  # nli mode: ce (SBERT classifier) | sup_simcse (hard negatives)
    steps: int = 200  # optimizer steps at most
    batch_size: int = 64  # sentences (transfer) or pairs (nli, joint) per step, over all ranks
    grad_accum: int = 1  # micro-batches per step; negatives still span the whole batch
    lr: float = 3e-6
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1  # linear warm-up, then linear decay to zero at ``steps``
    max_grad_norm: float = 1.0  # 0 switches clipping off
    temperature: float = 0.1
    alpha: float = 0.15  # joint: CE + alpha * NT-Xent
    head_lr: float | None = None  # the NLI classifier's lr (None: lr); it starts random, the encoder does not
    views: tuple[str, str] = ("shuffle", "feature_cutoff")
    view: ViewConfig = field(default_factory=ViewConfig)
    preset: str | None = None  # "simcse": views none/none (encoder dropout only), temperature 0.05
    queue_size: int = 0  # ESimCSE momentum-encoder queue of extra negatives (transfer mode); 0 = off
    momentum: float = 0.995
    max_length: int = 64
    eval_steps: int = 50
    patience: int = 3  # evaluations without a gain before stopping
    min_delta: float = 0.0  # a gain is more than this many Spearman points (x100) over the best so far
    save_steps: int = 0  # resume checkpoint every this many steps; 0 = at every evaluation
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    bf16: bool | str = "auto"  # auto | true | false: bf16 autocast of the forward passes (sentcl.precision)
    compile: bool = False  # torch.compile the encoder (measured slower end to end on 2 CPU cores: README)

    def __post_init__(self) -> None:
        if isinstance(self.view, dict):
            self.view = ViewConfig(**self.view)
        self.views = tuple(self.views)
        if self.preset:
            if self.preset not in PRESETS:
                raise ValueError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
            for key, value in PRESETS[self.preset].items():
                setattr(self, key, value)
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose from {', '.join(OBJECTIVES)}")
        if len(self.views) != 2 or any(v not in VIEWS for v in self.views):
            raise ValueError(f"views must be two of {', '.join(VIEWS)}, got {self.views}")
        if self.mode != "joint" and NEEDS_LABELS & set(self.views):
            raise ValueError("the adversarial view needs labels: use it in joint mode only")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of grad_accum {self.grad_accum}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """From a params.yaml section; keys that are not fields (e.g. a stage's own ``init``) are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    @property
    def encoder_dropout(self) -> bool:
        return not (DISABLE_ENCODER_DROPOUT & set(self.views))


@dataclass
class TrainResult:
    init_score: float  # STS-B dev at step 0
    best_score: float
    best_step: int  # 0: no evaluation beat the init, and the output is the init
    steps: int  # steps run
    seconds: float
    stopped_early: bool
    rows: list[dict[str, Any]]  # the curves: step, loss, lr, stsb_dev

    @property
    def beat_init(self) -> bool:
        return self.best_step > 0

    def metrics(self) -> dict[str, Any]:
        return {
            "stsb_dev_step0": round(self.init_score, 4),
            "stsb_dev_best": round(self.best_score, 4),
            "best_step": self.best_step,
            "beat_init": self.beat_init,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "seconds": round(self.seconds, 1),
        }


# --- distributed and device -----------------------------------------------------------------------------


def dist_info() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def select_device(name: str = "auto") -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _broadcast(value: Any) -> Any:
    rank, world = dist_info()
    if world == 1:
        return value
    box = [value if rank == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


# --- data order -----------------------------------------------------------------------------------------


class BatchOrder:
    """Which examples step ``s`` uses: epochs of seeded permutations, cut into full batches.

    A pure function of (seed, step), so a resumed run needs no data-loader state beyond the step.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n == 0:
            raise ValueError("no training examples")
        self.n, self.batch_size, self.seed = n, min(batch_size, n), seed
        self.per_epoch = n // self.batch_size
        self._cache: dict[int, list[int]] = {}

    def indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        if epoch not in self._cache:
            self._cache = {
                epoch: torch.randperm(
                    self.n, generator=torch.Generator().manual_seed(self.seed + epoch)
                ).tolist()
            }
        return self._cache[epoch][k * self.batch_size : (k + 1) * self.batch_size]


# --- random state ---------------------------------------------------------------------------------------


def _rng_state(generator: torch.Generator) -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "views": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    generator.set_state(state["views"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- the trainer ----------------------------------------------------------------------------------------


class Trainer:
    """Trains ``encoder`` in place on ``examples`` and leaves it holding the best checkpoint's weights.

    ``examples``: sentences (transfer); (premise, hypothesis, label) with label in 0..2 (nli/ce, joint);
    (premise, entailment hypothesis, contradiction hypothesis) (nli/sup_simcse).
    ``dev_pairs``: (sentence1, sentence2, score) of STS-B dev, scored with last-avg pooling.
    ``checkpoint_dir``: resume state; reused when it holds a run of the same config and data, removed at the end.
    """

    def __init__(
        self,
        encoder: Encoder,
        config: TrainConfig,
        examples: Sequence[Any],
        dev_pairs: Sequence[tuple[str, str, float]],
        checkpoint_dir: Path | str | None = None,
        progress: bool = True,
        on_row: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg, self.examples = config, list(examples)
        self.rank, self.world = dist_info()
        if config.batch_size % (self.world * config.grad_accum):
            raise ValueError(
                f"batch_size {config.batch_size} must divide into {self.world} ranks x {config.grad_accum} micro-batches"
            )
        self.device = select_device(config.device)
        torch.manual_seed(config.seed + self.rank)
        random.seed(config.seed + self.rank)
        np.random.seed(config.seed + self.rank)
        self.generator = torch.Generator().manual_seed(config.seed + 1000 + self.rank)

        self.encoder = encoder.to(self.device)
        self.encoder.max_length = config.max_length
        self.encoder.pooling = "last-avg"
        needs_head = config.mode == "joint" or (config.mode == "nli" and config.objective == "ce")
        self.head = NLIHead(encoder.dim).to(self.device) if needs_head else None
        groups = [{"params": [p for p in self.encoder.parameters() if p.requires_grad], "lr": config.lr}]
        if self.head:
            groups.append({"params": list(self.head.parameters()), "lr": config.head_lr or config.lr})
        self.params = [p for group in groups for p in group["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
        warmup = int(config.warmup_ratio * config.steps)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (config.steps - step) / max(1, config.steps - warmup))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.momentum_model = None
        self.queue = torch.zeros(0, encoder.dim, device=self.device)
        if config.queue_size and config.mode == "transfer":
            self.momentum_model = copy.deepcopy(self.encoder.model).requires_grad_(False)

        self.order = BatchOrder(len(self.examples), config.batch_size, config.seed)
        if self.order.batch_size < config.batch_size:
            log.warning("only %d examples: the batch shrinks from %d", len(self.examples), config.batch_size)
        self.evaluator = STSEvaluator(dev_pairs, "stsb-dev")
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.progress, self.on_row = progress and self.rank == 0, on_row
        tok = encoder.tokenizer
        self.special_ids, self.pad_id = set(tok.all_special_ids), tok.pad_token_id or 0
        self.autocast = use_bf16(config.bf16, self.device)
        if config.compile:
            self.encoder.model.compile()  # in place: state_dict keys, saving and resume are unchanged

    # -- representations and loss --------------------------------------------------------------------------

    def _tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.encoder.tokenize(sentences).to(self.device)

    def _embed(self, ids: torch.Tensor, mask: torch.Tensor, **kwargs) -> torch.Tensor:
        with bf16_autocast(self.device, self.autocast):
            return self.encoder(ids, mask, "last-avg", **kwargs)

    def _view(self, name: str, batch: dict[str, torch.Tensor], adversarial_grad=None) -> torch.Tensor:
        view = make_view(
            name,
            batch["input_ids"],
            batch["attention_mask"],
            self.encoder.model.get_input_embeddings(),
            self.cfg.view,
            self.generator,
            adversarial_grad=adversarial_grad,
            special_ids=self.special_ids,
            pad_id=self.pad_id,
        )
        kwargs = {}
        if view.position_ids is not None:
            kwargs["position_ids"] = view.position_ids
        if view.inputs_embeds is not None:
            return self._embed(None, view.attention_mask, inputs_embeds=view.inputs_embeds, **kwargs)
        return self._embed(view.input_ids, view.attention_mask, **kwargs)

    def _adversarial_grad(self, batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        """Gradient of the NLI loss with respect to the word embeddings of [premises; hypotheses]."""
        with torch.enable_grad():
            embeds = self.encoder.model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
            u, v = self._embed(None, batch["attention_mask"], inputs_embeds=embeds).chunk(2)
            (grad,) = torch.autograd.grad(nli_loss(self.head, u, v, labels), embeds)
        return grad

    def representations(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The embeddings a micro-batch contributes to the loss (plus its labels)."""
        cfg = self.cfg
        if cfg.mode == "transfer":
            batch = self._tokenize(items)
            return {"z1": self._view(cfg.views[0], batch), "z2": self._view(cfg.views[1], batch)}
        if cfg.mode == "nli" and cfg.objective == "sup_simcse":
            a, p, n = zip(*items, strict=True)
            z = self._embed(**self._ids(self._tokenize(list(a) + list(p) + list(n))))
            anchor, positive, negative = z.chunk(3)
            return {"anchor": anchor, "positive": positive, "negative": negative}
        premises, hypotheses, labels = zip(*items, strict=True)
        labels = torch.tensor(labels, device=self.device)
        # Premises and hypotheses go through the model together: one forward for u and v.
        batch = self._tokenize(list(premises) + list(hypotheses))
        u, v = self._embed(**self._ids(batch)).chunk(2)
        reps = {"u": u, "v": v, "labels": labels}
        if cfg.mode == "joint":
            grad = self._adversarial_grad(batch, labels) if "adversarial" in cfg.views else None
            reps["z1"] = self._view(cfg.views[0], batch, grad)
            reps["z2"] = self._view(cfg.views[1], batch, grad)
        return reps

    @staticmethod
    def _ids(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"ids": batch["input_ids"], "mask": batch["attention_mask"]}

    def loss(self, reps: dict[str, torch.Tensor]) -> torch.Tensor:
        cfg = self.cfg
        if cfg.mode == "transfer":
            return nt_xent(reps["z1"], reps["z2"], cfg.temperature, self.queue if len(self.queue) else None)
        if cfg.mode == "nli" and cfg.objective == "sup_simcse":
            return sup_simcse(reps["anchor"], reps["positive"], reps["negative"], cfg.temperature)
        ce = nli_loss(self.head, reps["u"], reps["v"], reps["labels"])
        if cfg.mode == "nli":
            return ce
        return ce + cfg.alpha * nt_xent(reps["z1"], reps["z2"], cfg.temperature)

    # -- one optimizer step ----------------------------------------------------------------------------------

    def _set_dropout(self) -> None:
        self.encoder.train()
        self.encoder.model.train(self.cfg.encoder_dropout)

    def _global_loss(self, loss: torch.Tensor, step: int) -> float:
        value = loss.detach().float()
        if self.world > 1:
            torch.distributed.all_reduce(value)
            value /= self.world
        value = float(value)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"loss is {value} at step {step}: stopping (try a lower lr or a higher temperature)"
            )
        return value

    def train_step(self, items: Sequence[Any], step: int) -> float:
        self._set_dropout()
        micro = [items[i :: self.cfg.grad_accum] for i in range(self.cfg.grad_accum)]
        if len(micro) == 1:
            loss = self.loss(self.representations(micro[0]))
            value = self._global_loss(loss, step)
            loss.backward()
        else:
            value = self._cached_gradient_step(micro, step)
        if self.world > 1:
            self._all_reduce_gradients()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.momentum_model is not None:
            self._update_momentum(items)
        return value

    def _cached_gradient_step(self, micro: list[Sequence[Any]], step: int) -> float:
        states, cached = [], []
        with torch.no_grad():
            for part in micro:
                states.append(_rng_state(self.generator))
                cached.append(self.representations(part))
        end_state = _rng_state(self.generator)
        leaves = {
            key: torch.cat([c[key] for c in cached])
            .detach()
            .requires_grad_(cached[0][key].is_floating_point())
            for key in cached[0]
        }
        loss = self.loss(leaves)
        value = self._global_loss(loss, step)
        loss.backward()
        offset = 0
        for part, state in zip(micro, states, strict=True):
            _set_rng_state(state, self.generator)
            reps = self.representations(part)
            size = len(part)
            pairs = [
                (reps[k], leaves[k].grad[offset * m : (offset + size) * m])
                for k, m in self._rows_per_item(reps, size).items()
                if leaves[k].grad is not None
            ]
            torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
            offset += size
        _set_rng_state(end_state, self.generator)
        return value

    @staticmethod
    def _rows_per_item(reps: dict[str, torch.Tensor], size: int) -> dict[str, int]:
        return {k: v.shape[0] // size for k, v in reps.items() if v.is_floating_point()}

    def _all_reduce_gradients(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.flatten() for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= self.world
        offset = 0
        for p, g in zip(self.params, grads, strict=True):
            p.grad = flat[offset : offset + g.numel()].view_as(p).clone()
            offset += g.numel()

    @torch.no_grad()
    def _update_momentum(self, items: Sequence[str]) -> None:
        for m, p in zip(self.momentum_model.parameters(), self.encoder.model.parameters(), strict=True):
            m.mul_(self.cfg.momentum).add_(p.detach(), alpha=1 - self.cfg.momentum)
        self.momentum_model.train(self.cfg.encoder_dropout)
        batch = self._tokenize(items)
        with bf16_autocast(self.device, self.autocast):
            out = self.momentum_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
        z = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        self.queue = torch.cat([z.float(), self.queue])[: self.cfg.queue_size]

    # -- evaluation and checkpoints ----------------------------------------------------------------------------

    def evaluate(self) -> float:
        score = None
        if self.rank == 0:
            score = self.evaluator(lambda s: self.encoder.encode(s, batch_size=128, pooling="last-avg"))
        return _broadcast(score)

    def _fingerprint(self) -> str:
        config = asdict(self.cfg)
        config.pop("device")
        payload = json.dumps([config, len(self.examples), self.world], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def _state_path(self) -> Path | None:
        return self.checkpoint_dir / "state.pt" if self.checkpoint_dir else None

    def save_state(self, state: dict[str, Any]) -> None:
        rngs = [_rng_state(self.generator)]
        if self.world > 1:
            rngs = [None] * self.world
            torch.distributed.all_gather_object(rngs, _rng_state(self.generator))
        if self.rank != 0 or self._state_path() is None:
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        payload = {
            **state,
            "fingerprint": self._fingerprint(),
            "model": self.encoder.model.state_dict(),
            "head": self.head.state_dict() if self.head else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "momentum_model": self.momentum_model.state_dict() if self.momentum_model else None,
            "queue": self.queue.cpu(),
            "rng": rngs,
        }
        tmp = self._state_path().with_suffix(".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, self._state_path())  # a kill mid-write leaves the previous state intact

    def load_state(self) -> dict[str, Any] | None:
        path = self._state_path()
        if path is None or not path.is_file():
            return None
        payload = torch.load(path, map_location="cpu", weights_only=False)
        if payload.get("fingerprint") != self._fingerprint():
            log.warning("%s belongs to another config or data set: starting afresh", path)
            return None
        self.encoder.model.load_state_dict(payload["model"])
        if self.head:
            self.head.load_state_dict(payload["head"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        if self.momentum_model is not None:
            self.momentum_model.load_state_dict(payload["momentum_model"])
        self.queue = payload["queue"].to(self.device)
        _set_rng_state(payload["rng"][self.rank], self.generator)
        return payload

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.encoder.model.state_dict().items()}

    # -- the loop --------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        cfg = self.cfg
        started = time.perf_counter()
        resumed = self.load_state()
        if resumed:
            step, rows, elapsed = resumed["step"], resumed["rows"], resumed["elapsed"]
            init_score, best, best_step, bad = (
                resumed[k] for k in ("init_score", "best", "best_step", "bad")
            )
            best_state = resumed["best_state"]
            log.info("resuming from step %d (best STS-B dev %.2f at step %d)", step, best, best_step)
        else:
            step, elapsed, bad = 0, 0.0, 0
            init_score = best = self.evaluate()
            best_step, best_state = 0, self._snapshot()
            rows = [{"step": 0, "loss": None, "lr": 0.0, "stsb_dev": init_score}]
            self._emit(rows[-1])
            log.info("step 0 (init): STS-B dev %.2f", init_score)
        bar = tqdm(total=cfg.steps, initial=step, desc=f"{cfg.mode}", disable=not self.progress)
        while step < cfg.steps and bad < cfg.patience:
            lr = self.scheduler.get_last_lr()[0]
            items = self._rank_items(self.order.indices(step))
            try:
                loss = self.train_step(items, step + 1)
            except torch.OutOfMemoryError as exc:
                raise RuntimeError(self._oom_message(step + 1)) from exc
            step += 1
            row = {"step": step, "loss": loss, "lr": lr, "stsb_dev": None}
            evaluate = step % cfg.eval_steps == 0 or step == cfg.steps
            if evaluate:
                row["stsb_dev"] = score = self.evaluate()
                if score > best + cfg.min_delta:
                    best, best_step, bad, best_state = score, step, 0, self._snapshot()
                else:
                    bad += 1
                log.info(
                    "step %d: loss %.4f, STS-B dev %.2f (best %.2f at %d)", step, loss, score, best, best_step
                )
            rows.append(row)
            self._emit(row)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", best=f"{best:.2f}")
            save_every = cfg.save_steps or cfg.eval_steps
            if step < cfg.steps and bad < cfg.patience and (step % save_every == 0):
                self.save_state(
                    {
                        "step": step,
                        "rows": rows,
                        "elapsed": elapsed + time.perf_counter() - started,
                        "init_score": init_score,
                        "best": best,
                        "best_step": best_step,
                        "bad": bad,
                        "best_state": best_state,
                    }
                )
        bar.close()
        stopped = bad >= cfg.patience
        self.last_state = self._snapshot()  # the weights before selection, for inspection and tests
        self.encoder.model.load_state_dict(best_state)
        if best_step == 0:
            log.warning("no evaluation beat the init (STS-B dev %.2f): the output is the init", init_score)
        return TrainResult(
            init_score, best, best_step, step, elapsed + time.perf_counter() - started, stopped, rows
        )

    def _rank_items(self, indices: list[int]) -> list[Any]:
        share = len(indices) // self.world
        mine = indices[self.rank * share : (self.rank + 1) * share]
        return [self.examples[i] for i in mine]

    def _emit(self, row: dict[str, Any]) -> None:
        if self.on_row and self.rank == 0:
            self.on_row(row)

    def _oom_message(self, step: int) -> str:
        cfg = self.cfg
        micro = cfg.batch_size // (self.world * cfg.grad_accum)
        return (
            f"CUDA out of memory at step {step} with {micro} examples per micro-batch: try batch_size="
            f"{max(1, cfg.batch_size // 2)}, or keep batch_size={cfg.batch_size} (and all its negatives) "
            f"with grad_accum={cfg.grad_accum * 2}"
        )

    def finish(self) -> None:
        """Remove the resume state once the output is safely written."""
        if self.rank == 0 and self.checkpoint_dir and self.checkpoint_dir.exists():
            import shutil

            shutil.rmtree(self.checkpoint_dir)


def train(
    encoder: Encoder,
    config: TrainConfig,
    examples: Sequence[Any],
    dev_pairs: Sequence[tuple[str, str, float]],
    checkpoint_dir: Path | str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train and leave ``encoder`` holding the selected weights; the resume state is kept (see ``Trainer.finish``)."""
    return Trainer(encoder, config, examples, dev_pairs, checkpoint_dir, progress).fit()
