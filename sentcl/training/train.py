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
embeddings (see ``sentcl.training.losses``) and gradients are averaged with one all-reduce per step (what DDP does;
done by hand because the cached-gradient passes and unused parameters such as BERT's pooler do not fit DDP's
hooks).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from sentcl.evaluation.sts import STSEvaluator
from sentcl.model.encoder import Encoder
from sentcl.model.pooling import ModelPooling, PromptSettings
from sentcl.training.objectives.base import CONTRASTIVE_LOSSES, Embedder, Objective
from sentcl.training.objectives.contrastive import MomentumQueue
from sentcl.training.objectives.distill import DistillConfig
from sentcl.training.objectives.factory import build_objective
from sentcl.training.objectives.promptbert import PromptTraining
from sentcl.training.precision import BF16_SETTINGS, describe_precision, use_bf16
from sentcl.training.recipes import PRESETS
from sentcl.training.views import NEEDS_LABELS, VIEWS, ViewConfig

log = logging.getLogger(__name__)

MODES = ("nli", "joint", "transfer")
OBJECTIVES = ("ce", "sup_simcse", "promptbert")
TRANSFER_OBJECTIVES = ("contrastive", "tsdae", "promptbert", "distill")
# Objectives that read (premise, entailment hypothesis, contradiction hypothesis) in nli mode.
TRIPLET_OBJECTIVES = ("sup_simcse", "promptbert")
# Presets that only make sense in some modes (their objective reads sentences).
PRESET_MODES = {"promptbert": ("transfer",)}
OPTIMIZERS = ("adamw", "consert")


class ConfigError(ValueError):
    """A params.yaml value that cannot run: the message is one line naming the key."""


@dataclass
class TrainConfig:
    """Every training setting; params.yaml (``train:`` + a stage's section) is the only home of their values."""

    mode: str  # nli | joint | transfer
    objective: str  # nli: ce (SBERT classifier) | sup_simcse | promptbert; transfer: contrastive | tsdae | promptbert
    loss: str  # the contrastive term: nt_xent (ConSERT, both directions) | info_nce (SimCSE, one way)
    steps: int  # optimizer steps at most
    batch_size: int  # sentences (transfer) or pairs (nli, joint) per step, over all ranks
    grad_accum: int  # micro-batches per step; negatives still span the whole batch
    lr: float
    head_lr: float | None  # the NLI classifier's lr (None: lr)
    weight_decay: float
    warmup_ratio: float  # linear warm-up, then linear decay to zero at ``steps``
    optimizer: str  # adamw (torch AdamW, decay on every parameter) | consert (sentence-transformers 0.3 fit)
    max_grad_norm: float  # 0 switches clipping off
    temperature: float
    alpha: float  # weight of the contrastive term (ConSERT's --cl_rate)
    views: tuple[str, str]
    view: ViewConfig
    prompt: PromptTraining  # objective promptbert: templates, denoising, the saved folder's pooling
    distill: DistillConfig  # objective distill: loss, weight, projection, contrastive term (sentcl.training.objectives.distill)
    encoder_dropout: bool  # the encoder's own dropout during training: a recipe's setting, not the views'
    max_square: bool  # NLI classifier also reads max(u, v)^2 (ConSERT --concatenation_sent_max_square)
    projection: bool  # SimCSE's training-only MLP head (unsupervised contrastive losses only)
    preset: str | None  # simcse | esimcse | promptbert: see PRESETS
    queue_size: int  # ESimCSE momentum-encoder queue of extra negatives; 0 = off
    momentum: float
    deletion_ratio: float  # TSDAE: share of whitespace tokens deleted from the encoder's input
    max_length: int
    eval_steps: int
    patience: int | None  # evaluations without a gain before stopping; null = never stop early
    min_delta: float  # a gain is more than this many Spearman points (x100) over the best so far
    save_steps: int  # resume checkpoint every this many steps; 0 = at every evaluation
    seed: int
    device: str  # auto | cpu | cuda | cuda:N | mps
    bf16: (
        bool | str
    )  # auto | true | false: bf16 autocast of the encoder's forward passes (sentcl.training.precision)
    compile: bool  # torch.compile the encoder in place (benchmarks/bench_compile.py measures whether it pays)
    chunk_tokens: int  # encoder forwards in length-sorted chunks of this many padded tokens; 0 = off

    def __post_init__(self) -> None:
        if isinstance(self.view, dict):
            self.view = _build(ViewConfig, self.view, "view")
        if isinstance(self.prompt, dict):
            self.prompt = _build(PromptTraining, self.prompt, "prompt")
        if isinstance(self.distill, dict):
            self.distill = _build(DistillConfig, self.distill, "distill")
        self.views = tuple(self.views)
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise ConfigError(f"preset: unknown {self.preset!r}; choose from {', '.join(PRESETS)}")
            modes = PRESET_MODES.get(self.preset, MODES)
            if self.mode not in modes:
                raise ConfigError(
                    f"preset: {self.preset!r} runs in {', '.join(modes)} mode, not {self.mode}"
                    + (" (supervised NLI: objective promptbert)" if self.preset == "promptbert" else "")
                )
            if self.preset == "promptbert" and self.objective == "tsdae":
                raise ConfigError(
                    "preset: 'promptbert' is its own objective; objective tsdae conflicts with it"
                )
            for key, value in PRESETS[self.preset].items():
                setattr(self, key, value)
        self._check()

    def saved_pooling(self) -> ModelPooling:
        """The pooling the trained folder is saved with, and STS-B dev is scored with during training: the
        prompt of ``prompt.saved`` for objective promptbert, else last-avg (the training pooling)."""
        if self.objective == "promptbert":
            return ModelPooling("prompt", self.prompt.saved)
        return ModelPooling("last-avg")

    def _check(self) -> None:
        def need(ok: bool, key: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"{key}: {rule}, got {getattr(self, key)!r}")

        # A number written as text ("1e-5" reaches Python as a string under YAML 1.1) is named, not a TypeError.
        for f in fields(self):
            kinds = {"int": (int,), "float": (int, float)}.get(f.type.replace(" | None", ""))
            value = getattr(self, f.name)
            if kinds and not (value is None and "None" in f.type):
                need(isinstance(value, kinds) and not isinstance(value, bool), f.name, f"a number ({f.type})")
        need(self.mode in MODES, "mode", f"one of {', '.join(MODES)}")
        choices = TRANSFER_OBJECTIVES if self.mode == "transfer" else OBJECTIVES
        need(self.objective in choices, "objective", f"one of {', '.join(choices)} in {self.mode} mode")
        tsdae = self.mode == "transfer" and self.objective == "tsdae"
        need(self.loss in CONTRASTIVE_LOSSES, "loss", f"one of {', '.join(CONTRASTIVE_LOSSES)}")
        need(
            len(self.views) == 2 and all(v in VIEWS for v in self.views),
            "views",
            f"two of {', '.join(VIEWS)}",
        )
        if NEEDS_LABELS & set(self.views):
            need(
                self.mode == "joint" and self.views[1] == "adversarial" and self.views[0] != "adversarial",
                "views",
                "adversarial needs labels: joint mode only, as the second view",
            )
        need(self.steps >= 1, "steps", "at least 1")
        contrastive = self.mode == "joint" or self.objective in (
            "contrastive",
            "sup_simcse",
            "promptbert",
            "distill",
        )
        need(self.batch_size >= (2 if contrastive else 1), "batch_size", "at least 2 (in-batch negatives)")
        need(self.grad_accum >= 1, "grad_accum", "at least 1")
        need(
            self.batch_size % self.grad_accum == 0,
            "batch_size",
            f"a multiple of grad_accum {self.grad_accum}",
        )
        need(self.lr >= 0, "lr", "not negative")
        need(self.head_lr is None or self.head_lr >= 0, "head_lr", "null or not negative")
        need(self.weight_decay >= 0, "weight_decay", "not negative")
        need(0 <= self.warmup_ratio <= 1, "warmup_ratio", "in [0, 1]")
        need(self.optimizer in OPTIMIZERS, "optimizer", f"one of {', '.join(OPTIMIZERS)}")
        need(self.max_grad_norm >= 0, "max_grad_norm", "not negative (0 = off)")
        need(self.temperature > 0, "temperature", "greater than 0")
        need(self.alpha >= 0, "alpha", "not negative")
        need(self.queue_size >= 0, "queue_size", "not negative")
        need(0 <= self.momentum < 1, "momentum", "in [0, 1)")
        need(not (tsdae and self.queue_size), "queue_size", "0 with tsdae (it has no negatives)")
        # Only the unsupervised contrastive losses (transfer, joint's contrastive term) read the MLP head.
        # Supervised SimCSE (princeton-nlp/SimCSE run_sup_example.sh: no --mlp_only_train) keeps its MLP at
        # evaluation, which a saved folder cannot carry; the CE classifier and TSDAE have none.
        need(
            not self.projection or (self.mode != "nli" and not tsdae),
            "projection",
            f"false with objective {self.objective} in {self.mode} mode (no MLP head there: supervised SimCSE "
            "keeps its MLP at evaluation, which a saved folder cannot carry)",
        )
        need(0 <= self.deletion_ratio < 1, "deletion_ratio", "in [0, 1)")
        need(self.max_length >= 2, "max_length", "at least 2")
        need(self.eval_steps >= 1, "eval_steps", "at least 1")
        need(self.patience is None or self.patience >= 1, "patience", "null or at least 1")
        need(self.min_delta >= 0, "min_delta", "not negative")
        need(self.save_steps >= 0, "save_steps", "not negative")
        need(str(self.bf16).lower() in BF16_SETTINGS, "bf16", f"one of {', '.join(BF16_SETTINGS)}")
        need(self.chunk_tokens >= 0, "chunk_tokens", "not negative (0 = off)")
        if self.objective == "promptbert":
            need(self.mode != "joint", "objective", "not promptbert in joint mode (nli or transfer)")
            wanted = 2 if self.mode == "transfer" else 1
            if len(self.prompt.templates) != wanted:
                kind = "two views of a sentence" if wanted == 2 else "anchor, positive and hard negative"
                raise ConfigError(
                    f"prompt.templates: {wanted} with objective promptbert in {self.mode} mode ({kind}), "
                    f"got {len(self.prompt.templates)}"
                )
            need(
                self.views == ("none", "none"),
                "views",
                "none, none with objective promptbert (its views are templates)",
            )
            need(not self.queue_size, "queue_size", "0 with objective promptbert (the queue pools last-avg)")

    @classmethod
    def from_sections(cls, sections: Sequence[tuple[str, dict[str, Any]]]) -> TrainConfig:
        """Merge params.yaml sections in order (later wins; ``view`` and ``prompt`` merge key by key). A key that
        is not a setting is an error naming the key and its section; so is a setting that no section gives."""
        values: dict[str, Any] = {}
        for section, items in sections:
            _merge(values, items, cls, section)
        missing = _missing(values, cls)
        if missing:
            raise ConfigError(f"{', '.join(s for s, _ in sections)}: no value for {missing[0]!r}")
        return cls(**values)


# Settings that are mappings of their own settings: merged key by key across sections, checked key by key.
_NESTED: dict[tuple[type, str], type] = {
    (TrainConfig, "view"): ViewConfig,
    (TrainConfig, "prompt"): PromptTraining,
    (TrainConfig, "distill"): DistillConfig,
    (PromptTraining, "saved"): PromptSettings,
}


def _merge(into: dict[str, Any], items: dict[str, Any] | None, kind: type, where: str) -> None:
    names = {f.name for f in fields(kind)}
    for key, value in (items or {}).items():
        if key not in names:
            raise ConfigError(f"{where}: unknown key {key!r}")
        nested = _NESTED.get((kind, key))
        if nested is None:
            into[key] = value
            continue
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{where}.{key}: a mapping of {', '.join(f.name for f in fields(nested))}")
        _merge(into.setdefault(key, {}), value, nested, f"{where}.{key}")


def _missing(values: dict[str, Any], kind: type, prefix: str = "") -> list[str]:
    """Settings no section gave, in dotted form: top-level ones first, then the nested ones."""
    names = [f.name for f in fields(kind)]
    top = sorted(prefix + n for n in names if n not in values)
    nested = [
        m
        for n in names
        if (kind, n) in _NESTED
        for m in _missing(values.get(n) or {}, _NESTED[(kind, n)], f"{prefix}{n}.")
    ]
    return top + sorted(nested)


def _build(kind: type, values: dict[str, Any], section: str) -> Any:
    try:
        return kind(**values)
    except TypeError as exc:
        raise ConfigError(f"{section}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


@dataclass
class TrainResult:
    init_score: float  # STS-B dev at step 0
    best_score: float  # STS-B dev of the selected step
    best_step: int  # 0: no evaluation beat the init, and the output is the init
    steps: int  # steps run
    seconds: float
    stopped_early: bool
    rows: list[dict[str, Any]]  # the curves: step, loss, lr, stsb_dev (and domain_dev)
    domain_init: float | None = None  # domain dev at step 0, when selection ran on a domain dev set
    domain_best: float | None = None  # domain dev of the selected step
    max_task_drop: float | None = None  # the STS-B guard of domain selection

    @property
    def beat_init(self) -> bool:
        return self.best_step > 0

    def metrics(self) -> dict[str, Any]:
        domain = {}
        if self.domain_init is not None:
            domain = {
                "selected_on": "domain_dev",
                "domain_dev_step0": round(self.domain_init, 4),
                "domain_dev_best": round(self.domain_best, 4),
                "max_task_drop": self.max_task_drop,
            }
        return {
            "stsb_dev_step0": round(self.init_score, 4),
            "stsb_dev_best": round(self.best_score, 4),
            **domain,
            "best_step": self.best_step,
            "beat_init": self.beat_init,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "seconds": round(self.seconds, 1),
        }


# --- checkpoint selection -------------------------------------------------------------------------------


def selectable(
    scores: dict[str, float],
    best: dict[str, float],
    init: dict[str, float],
    min_delta: float,
    max_task_drop: float | None = None,
) -> bool:
    """Whether an evaluation's ``scores`` replace the ``best`` so far (scores: Spearman x 100 by name).

    Without ``domain_dev``: STS-B dev must beat the best by more than ``min_delta``. With it (a retrain for a
    domain): the domain dev score must beat the best's by more than ``min_delta``, and STS-B dev is a guard: a
    step whose STS-B dev is more than ``max_task_drop`` below the init's is never selected.
    """
    if "domain_dev" not in scores:
        return scores["stsb_dev"] > best["stsb_dev"] + min_delta
    if max_task_drop is None:
        raise ValueError("selection on a domain dev set needs max_task_drop, the STS-B dev guard")
    guarded = scores["stsb_dev"] >= init["stsb_dev"] - max_task_drop
    return guarded and scores["domain_dev"] > best["domain_dev"] + min_delta


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
        "numpy": _numpy_state(),
        "views": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> tuple:
    """NumPy's state with its key array as a tensor, so resume state loads with ``weights_only=True``."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)


def _set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    generator.set_state(state["views"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- ConSERT's optimizer ---------------------------------------------------------------------------------

# sentence-transformers 0.3 ``SentenceTransformer.fit`` (yym6472/ConSERT ``sentence_transformers/SentenceTransformer.py``)
CONSERT_NO_DECAY = ("bias", "LayerNorm.bias", "LayerNorm.weight")


def consert_param_groups(
    groups: list[dict[str, Any]], names: dict[int, str], weight_decay: float
) -> list[dict[str, Any]]:
    """Each group split in two as ``fit`` does: ``no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight']``
    matched as substrings of the parameter's name get weight decay 0, the rest ``weight_decay``."""
    out = []
    for group in groups:
        for decay in (True, False):
            params = [
                p for p in group["params"] if any(nd in names[id(p)] for nd in CONSERT_NO_DECAY) != decay
            ]
            if params:
                out.append({**group, "params": params, "weight_decay": weight_decay if decay else 0.0})
    return out


def consert_schedule(steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """transformers ``get_linear_schedule_with_warmup`` (ConSERT ``transformers/optimization.py``): from 0 up to
    the lr over ``warmup`` steps, then down to 0 at ``steps``; the first step runs at lr 0. ConSERT's main.py
    takes ``warmup = ceil(0.1 * len(dataset) * epochs / batch)``: here ``ceil(warmup_ratio * steps)``."""
    warmup = math.ceil(round(warmup_ratio * steps, 6))

    def lr_lambda(current_step: int) -> float:
        if current_step < warmup:
            return float(current_step) / float(max(1, warmup))
        return max(0.0, float(steps - current_step) / float(max(1, steps - warmup)))

    return lr_lambda


class BertAdamW(torch.optim.Optimizer):
    """transformers 3.x ``AdamW`` as ConSERT calls it (``eps=1e-6, correct_bias=False``; ConSERT
    ``transformers/optimization.py``): no bias correction, and the decoupled weight decay applied after the Adam
    update (``p -= lr * wd * p``), where torch's AdamW decays before it and corrects the bias."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-group["lr"])
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss


# --- the trainer ----------------------------------------------------------------------------------------


class Trainer:
    """Trains ``encoder`` in place on ``examples`` and leaves it holding the best checkpoint's weights.

    ``examples``: sentences (transfer); (premise, hypothesis, label) with label in 0..2 (nli/ce, joint);
    (premise, entailment hypothesis, contradiction hypothesis) (nli/sup_simcse, nli/promptbert).
    ``dev_pairs``: (sentence1, sentence2, score) of STS-B dev, scored with the pooling the model is saved with
    (``TrainConfig.saved_pooling``: last-avg, or PromptBERT's ``prompt.saved``).
    ``checkpoint_dir``: resume state; reused when it holds a run of the same config and data, removed at the end.
    ``domain_dev``: (sentence1, sentence2, score) of a retrain's domain: checkpoint selection then uses it, and
    STS-B dev becomes a guard that may not fall more than ``max_task_drop`` below the init (``selectable``).
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
        domain_dev: Sequence[tuple[str, str, float]] | None = None,
        max_task_drop: float | None = None,
        teacher: Any = None,
    ) -> None:
        self.cfg, self.examples = config, list(examples)
        if domain_dev and max_task_drop is None:
            raise ValueError("a domain dev set needs max_task_drop, the STS-B dev guard")
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
        # What STS-B dev is scored with and the folder is saved with: the trained objective's pooling
        # (PromptBERT: ``prompt.saved``), so the selected checkpoint is the one that scores best as shipped.
        saved = config.saved_pooling()
        self.encoder.pooling, self.encoder.prompt = saved.pooling, saved.prompt
        self.objective: Objective = build_objective(config, encoder.dim, encoder, teacher).to(self.device)
        heads = [
            p for name in self.objective.head_parameters for p in getattr(self.objective, name).parameters()
        ]
        head_ids = {id(p) for p in heads}
        # e.g. SimCSE's projection; TSDAE's decoder shares (ties) most of its weights with the encoder.
        owned = head_ids | {id(p) for p in self.encoder.parameters()}
        body = [p for p in self.objective.parameters() if id(p) not in owned]
        groups = [
            {"params": [p for p in self.encoder.parameters() if p.requires_grad] + body, "lr": config.lr}
        ]
        if heads:
            groups.append({"params": heads, "lr": config.lr if config.head_lr is None else config.head_lr})
        self.params = [p for group in groups for p in group["params"]]
        if config.optimizer == "consert":
            names = {
                id(p): n for n, p in [*self.encoder.named_parameters(), *self.objective.named_parameters()]
            }
            groups = consert_param_groups(groups, names, config.weight_decay)
            self.optimizer = BertAdamW(groups, lr=config.lr)
            schedule = consert_schedule(config.steps, config.warmup_ratio)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
            warmup = int(config.warmup_ratio * config.steps)

            def schedule(step: int) -> float:
                if step < warmup:
                    return (step + 1) / (warmup + 1)
                return max(0.0, (config.steps - step) / max(1, config.steps - warmup))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.queue = None
        if config.queue_size and config.mode != "nli":
            self.queue = MomentumQueue(self.encoder.model, config.queue_size, config.momentum)

        self.order = BatchOrder(len(self.examples), config.batch_size, config.seed)
        if self.order.batch_size < config.batch_size:
            log.warning("only %d examples: the batch shrinks from %d", len(self.examples), config.batch_size)
        self.evaluator = STSEvaluator(dev_pairs, "stsb-dev")
        self.domain_evaluator = STSEvaluator(domain_dev, "domain-dev") if domain_dev else None
        self.domain_dev, self.max_task_drop = list(domain_dev or []), max_task_drop
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.progress, self.on_row = progress and self.rank == 0, on_row
        self.autocast = use_bf16(config.bf16, self.device)
        if config.compile:
            self.encoder.model.compile()  # in place: state_dict keys, saving and resume are unchanged
        self._inputs_digest = self._digest_inputs() if self.checkpoint_dir else ""
        self.embed = Embedder(
            self.encoder,
            config.view,
            self.generator,
            self.device,
            torch.bfloat16 if self.autocast else None,
            config.chunk_tokens,
        )

    # -- one optimizer step ----------------------------------------------------------------------------------

    def representations(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The embeddings a micro-batch contributes to the loss (plus its labels)."""
        return self.objective.representations(self.embed, items)

    def loss(self, reps: dict[str, torch.Tensor]) -> torch.Tensor:
        negatives = self.queue.negatives if self.queue is not None else None
        return self.objective.loss(reps, negatives)

    def _set_dropout(self) -> None:
        """The encoder's own dropout is the recipe's setting (``encoder_dropout``), whatever the views are."""
        self.encoder.train()
        self.encoder.model.train(self.cfg.encoder_dropout)
        self.objective.train()

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
        queued = None
        if self.queue is not None:
            queued = self.queue.advance(self.encoder.model, self.embed.tokenize(self._sentences(items)))
            queued = self.objective.queue_entries(queued)  # projected as the anchors' (ESimCSE models.py)
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
        if queued is not None:
            self.queue.push(queued)
        return value

    def _sentences(self, items: Sequence[Any]) -> list[str]:
        if self.objective.examples == "sentences":
            return list(items)
        return [premise for premise, *_ in items] + [item[1] for item in items]

    def _cached_gradient_step(self, micro: list[Sequence[Any]], step: int) -> float:
        states, cached = [], []
        with torch.no_grad():
            for part in micro:
                states.append(_rng_state(self.generator))
                cached.append(self.representations(part))
        end_state = _rng_state(self.generator)
        leaves = {
            key: torch.cat([c[key].detach() for c in cached]).requires_grad_(
                cached[0][key].is_floating_point()
            )
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

    # -- evaluation and checkpoints ----------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """STS-B dev, and the domain dev set when there is one (Spearman x 100 by name)."""
        scores = None
        if self.rank == 0:

            def encode(sentences: Sequence[str]) -> np.ndarray:
                return self.encoder.encode(sentences, batch_size=128)  # the pooling it is saved with

            scores = {"stsb_dev": self.evaluator(encode)}
            if self.domain_evaluator is not None:
                scores["domain_dev"] = self.domain_evaluator(encode)
        return _broadcast(scores)

    def _fingerprint(self) -> str:
        """Config, training data and init weights: a changed input never resumes old weights."""
        config = asdict(self.cfg)
        config.pop("device")
        # Selection on another domain dev set (or another guard) restarts too.
        selection = [self.domain_dev, self.max_task_drop] if self.domain_dev else []
        payload = json.dumps(
            [config, self.world, self._inputs_digest, *selection], sort_keys=True, default=str
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def _digest_inputs(self) -> str:
        digest = hashlib.sha256(json.dumps(self.examples, default=str).encode())
        for name, tensor in sorted(self.encoder.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

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
            "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "momentum_model": self.queue.model.state_dict() if self.queue else None,
            "queue": self.queue.negatives.cpu() if self.queue else None,
            "rng": rngs,
        }
        tmp = self._state_path().with_suffix(".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, self._state_path())  # a kill mid-write leaves the previous state intact

    def load_state(self) -> dict[str, Any] | None:
        path = self._state_path()
        if path is None or not path.is_file():
            return None
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a torn or foreign file: say which folder to delete
            raise RuntimeError(
                f"{path}: unreadable resume state ({type(exc).__name__}); delete {self.checkpoint_dir} to start afresh"
            ) from None
        if payload.get("fingerprint") != self._fingerprint():
            log.warning("%s belongs to another config or data set: starting afresh", path)
            return None
        self.encoder.model.load_state_dict(payload["model"])
        self.objective.load_state_dict(payload["objective"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        if self.queue is not None:
            self.queue.model.load_state_dict(payload["momentum_model"])
            self.queue.negatives = payload["queue"].to(self.device)
        _set_rng_state(payload["rng"][self.rank], self.generator)
        return payload

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.encoder.model.state_dict().items()}

    # -- the loop --------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        cfg = self.cfg
        started = time.perf_counter()
        log.info("precision: %s", describe_precision(cfg.bf16, self.device))
        resumed = self.load_state()
        if resumed:
            step, rows, elapsed = resumed["step"], resumed["rows"], resumed["elapsed"]
            init, best, best_step, bad = (
                resumed[k] for k in ("init_scores", "best_scores", "best_step", "bad")
            )
            best_state = resumed["best_state"]
            log.info("resuming from step %d (best %s at step %d)", step, _describe(best), best_step)
        else:
            step, elapsed, bad = 0, 0.0, 0
            init = best = self.evaluate()
            best_step, best_state = 0, self._snapshot()
            rows = [{"step": 0, "loss": None, "lr": 0.0, **init}]
            self._emit(rows[-1])
            log.info("step 0 (init): %s", _describe(init))
        bar = tqdm(total=cfg.steps, initial=step, desc=f"{cfg.mode}", disable=not self.progress)
        while step < cfg.steps and not self._out_of_patience(bad):
            lr = self.scheduler.get_last_lr()[0]
            items = self._rank_items(self.order.indices(step))
            try:
                loss = self.train_step(items, step + 1)
            except torch.OutOfMemoryError as exc:
                raise RuntimeError(self._oom_message(step + 1)) from exc
            step += 1
            row = {"step": step, "loss": loss, "lr": lr, **dict.fromkeys(init)}
            evaluate = step % cfg.eval_steps == 0 or step == cfg.steps
            if evaluate:
                scores = self.evaluate()
                row.update(scores)
                if selectable(scores, best, init, cfg.min_delta, self.max_task_drop):
                    best, best_step, bad, best_state = scores, step, 0, self._snapshot()
                else:
                    bad += 1
                log.info(
                    "step %d: loss %.4f, %s (best %s at %d)",
                    step,
                    loss,
                    _describe(scores),
                    _describe(best),
                    best_step,
                )
            rows.append(row)
            self._emit(row)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", best=f"{best.get('domain_dev', best['stsb_dev']):.2f}")
            save_every = cfg.save_steps or cfg.eval_steps
            if step < cfg.steps and not self._out_of_patience(bad) and (step % save_every == 0):
                self.save_state(
                    {
                        "step": step,
                        "rows": rows,
                        "elapsed": elapsed + time.perf_counter() - started,
                        "init_scores": init,
                        "best_scores": best,
                        "best_step": best_step,
                        "bad": bad,
                        "best_state": best_state,
                    }
                )
        bar.close()
        stopped = self._out_of_patience(bad)
        self.last_state = self._snapshot()  # the weights before selection, for inspection and tests
        self.encoder.model.load_state_dict(best_state)
        if best_step == 0:
            log.warning("no evaluation beat the init (%s): the output is the init", _describe(init))
        return TrainResult(
            init["stsb_dev"],
            best["stsb_dev"],
            best_step,
            step,
            elapsed + time.perf_counter() - started,
            stopped,
            rows,
            init.get("domain_dev"),
            best.get("domain_dev"),
            self.max_task_drop if self.domain_evaluator is not None else None,
        )

    def _out_of_patience(self, bad: int) -> bool:
        return self.cfg.patience is not None and bad >= self.cfg.patience

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


def _describe(scores: dict[str, float]) -> str:
    names = {"stsb_dev": "STS-B dev", "domain_dev": "domain dev"}
    return ", ".join(f"{names[k]} {v:.2f}" for k, v in scores.items())


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
