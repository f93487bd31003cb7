"""The training config: ``TrainConfig`` (every training setting, checked on construction) and how params.yaml
sections merge into it (``TrainConfig.from_sections``); ``ConfigError`` names the key a bad value sits under."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from sentcl.model.pooling import ModelPooling, PromptSettings
from sentcl.params import merge
from sentcl.training.objectives.base import CONTRASTIVE_LOSSES
from sentcl.training.objectives.distill import DistillConfig
from sentcl.training.objectives.promptbert import PromptTraining
from sentcl.training.precision import BF16_SETTINGS
from sentcl.training.recipes import PRESETS
from sentcl.training.views import NEEDS_LABELS, VIEWS, ViewConfig

MODES = ("nli", "joint", "transfer")
OBJECTIVES = ("ce", "sup_simcse", "promptbert")
TRANSFER_OBJECTIVES = ("contrastive", "tsdae", "promptbert", "distill")
# Objectives that read (premise, entailment hypothesis, contradiction hypothesis) in nli mode.
TRIPLET_OBJECTIVES = ("sup_simcse", "promptbert")
# Presets that only make sense in some modes (their objective reads sentences).
PRESET_MODES = {"promptbert": ("transfer",)}
OPTIMIZERS = ("adamw", "consert")
SCHEDULES = ("linear", "cosine", "constant")  # the lr's shape after the warm-up (sentcl.training.optimizer)


class ConfigError(ValueError):
    """A params.yaml value that cannot run: the message is one line naming the key."""


@dataclass
class TrainConfig:
    """Every training setting; params.yaml (``train:`` + a stage's section) is the only home of their values."""

    mode: str  # nli | joint | transfer
    objective: str  # nli: ce (SBERT classifier) | sup_simcse | promptbert; transfer: contrastive | tsdae | promptbert
    loss: str  # the contrastive term: nt_xent (ConSERT, both directions) | info_nce (SimCSE, one way)
    steps: int  # optimizer steps at most; 0: not trained on this profile (the stage writes its init)
    batch_size: int  # sentences (transfer) or pairs (nli, joint) per step, over all ranks
    grad_accum: int  # micro-batches per step; negatives still span the whole batch
    lr: float
    head_lr: float | None  # the NLI classifier's lr (None: lr)
    weight_decay: float
    init_decay: float  # decoupled pull toward the init's weights (L2-SP): p -= lr * init_decay * (p - p_init); 0 = off
    warmup_ratio: float  # share of the steps the lr warms up linearly over
    schedule: (
        str  # after the warm-up: linear (down to 0 at ``steps``) | cosine (half a cosine to 0) | constant
    )
    layer_lr_decay: float  # the top layer trains at lr, each layer below at this times the one above; 1 = off
    optimizer: str  # adamw (torch AdamW, decay on every parameter) | consert (sentence-transformers 0.3 fit)
    fused_optimizer: bool  # adamw: torch's fused kernel (one pass over each tensor) where the device has one
    freeze: tuple[
        str, ...
    ]  # parameter-name prefixes of the encoder's model left untrained (not in the optimizer)
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
        self.freeze = tuple(self.freeze or ())
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
        need(self.steps >= 0, "steps", "not negative (0: the stage is not trained, its output is its init)")
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
        need(self.init_decay >= 0, "init_decay", "not negative (0 = off)")
        need(0 <= self.warmup_ratio <= 1, "warmup_ratio", "in [0, 1]")
        need(self.schedule in SCHEDULES, "schedule", f"one of {', '.join(SCHEDULES)}")
        need(0 < self.layer_lr_decay <= 1, "layer_lr_decay", "in (0, 1] (1 = off)")
        need(
            self.layer_lr_decay == 1 or not self.init_decay,
            "layer_lr_decay",
            "1 with init_decay (its pull runs at one lr)",
        )
        need(self.optimizer in OPTIMIZERS, "optimizer", f"one of {', '.join(OPTIMIZERS)}")
        need(isinstance(self.fused_optimizer, bool), "fused_optimizer", "true or false")
        need(
            all(isinstance(p, str) and p.strip() for p in self.freeze),
            "freeze",
            "a list of parameter-name prefixes (e.g. embeddings.word_embeddings, encoder.layer.0.)",
        )
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
        """Merge params.yaml sections in order (``sentcl.params.merge``: later wins; ``view``, ``prompt`` and
        ``distill`` key by key). A key that is not a setting is an error naming the key and its section; so is a
        setting that no section gives."""
        values: dict[str, Any] = {}
        for section, items in sections:
            _check_keys(items, cls, section)
            values = merge(values, items)
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


def _check_keys(items: dict[str, Any] | None, kind: type, where: str) -> None:
    """Every key of ``items`` is a setting of ``kind``, and a nested setting's value a mapping of its own."""
    names = {f.name for f in fields(kind)}
    for key, value in (items or {}).items():
        if key not in names:
            raise ConfigError(f"{where}: unknown key {key!r}")
        nested = _NESTED.get((kind, key))
        if nested is None:
            continue
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{where}.{key}: a mapping of {', '.join(f.name for f in fields(nested))}")
        _check_keys(value, nested, f"{where}.{key}")


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
