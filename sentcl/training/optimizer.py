"""The optimizer a run trains with (``build_optimizer``): torch's AdamW with a linear warm-up and a linear, cosine
or constant lr after it (``train.optimizer: adamw``, ``train.schedule``) or ConSERT's (``consert``):
sentence-transformers 0.3's parameter groups, transformers' linear schedule with warm-up, and transformers 3.x
``AdamW`` without bias correction. ``train.layer_lr_decay``: layer-wise rates. ``InitDecay``: L2-SP's pull toward
the init weights."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sentcl.training.config import ConfigError, TrainConfig

# --- the optimizer of a run ------------------------------------------------------------------------------


def freeze(model: nn.Module, prefixes: tuple[str, ...]) -> int:
    """Leave every parameter of ``model`` whose name starts with one of ``prefixes`` untrained
    (``train.freeze``): ``requires_grad`` off, so autograd computes no gradient for it (a frozen embedding matrix
    costs no backward at all) and the optimizer never holds it. A prefix that names no parameter, or prefixes
    that leave no layer to train (a pooler the sentence vector never reads aside), are a ``ConfigError``.
    Returns how many parameters (elements) were frozen."""
    named = dict(model.named_parameters())
    kind = type(model).__name__
    for prefix in prefixes:
        if not any(name.startswith(prefix) for name in named):
            raise ConfigError(f"freeze: {prefix!r} is the start of no parameter name of {kind}")
    hits = {name: p for name, p in named.items() if name.startswith(tuple(prefixes))}
    if not any(
        p.requires_grad for name, p in named.items() if name not in hits and not name.startswith("pooler.")
    ):
        raise ConfigError(f"freeze: {list(prefixes)} leaves nothing of {kind} to train")
    frozen = 0
    for p in hits.values():
        if p.requires_grad:
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


def build_optimizer(
    config: TrainConfig, encoder: nn.Module, objective: nn.Module
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, list[nn.Parameter]]:
    """The optimizer, its lr schedule and the parameters it trains: the encoder's and the objective's, the
    objective's heads (``head_parameters``) at ``head_lr``; frozen parameters (``requires_grad`` off) left out."""
    heads = [p for name in objective.head_parameters for p in getattr(objective, name).parameters()]
    head_ids = {id(p) for p in heads}
    # e.g. SimCSE's projection; TSDAE's decoder shares (ties) most of its weights with the encoder.
    owned = head_ids | {id(p) for p in encoder.parameters()}
    body = [p for p in objective.parameters() if id(p) not in owned]
    groups = layer_groups(encoder, config.lr, config.layer_lr_decay)
    groups[0]["params"] += body
    if heads:
        groups.append({"params": heads, "lr": config.lr if config.head_lr is None else config.head_lr})
    params = [p for group in groups for p in group["params"]]
    if config.optimizer == "consert":
        names = {id(p): n for n, p in [*encoder.named_parameters(), *objective.named_parameters()]}
        groups = consert_param_groups(groups, names, config.weight_decay)
        optimizer = BertAdamW(groups, lr=config.lr)
        schedule = consert_schedule(config.steps, config.warmup_ratio, config.schedule)
    else:
        fused = {"fused": True} if config.fused_optimizer else {}
        optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, **fused)
        warmup = int(config.warmup_ratio * config.steps)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return after_warmup(config.schedule, step, warmup, config.steps)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule), params


def after_warmup(shape: str, step: int, warmup: int, steps: int) -> float:
    """The lr's factor at ``step`` once the warm-up is over: ``linear`` from 1 down to 0 at ``steps``, ``cosine``
    half a cosine from 1 to 0 at ``steps`` (transformers ``get_cosine_schedule_with_warmup``), ``constant`` 1."""
    if shape == "constant":
        return 1.0
    if shape == "cosine":
        progress = (step - warmup) / max(1, steps - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return max(0.0, (steps - step) / max(1, steps - warmup))


# A numbered layer of a transformer's stack in a parameter's name: BERT's ``encoder.layer.3.``, ``layers.3.``.
LAYER_NAME = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
EMBEDDINGS_NAME = re.compile(r"(?:^|\.)embeddings\.")


def layer_groups(encoder: nn.Module, lr: float, decay: float) -> list[dict[str, Any]]:
    """The encoder's trainable parameters as optimizer groups, the first at ``lr``. With ``decay`` below 1
    (``train.layer_lr_decay``, ELECTRA's layer-wise rates, Clark et al. 2020), layer ``i`` of ``n`` trains at
    ``lr * decay ** (n - 1 - i)`` and the embeddings at ``lr * decay ** n``: the top layer at ``lr`` (ELECTRA's
    ``_get_layer_lrs`` gives its task head ``lr`` and the top layer ``decay ** 2``; a sentence vector has no head
    above the top layer); everything else (a pooler, a head) at ``lr``."""
    named = list(encoder.named_parameters())
    trained = [(name, p) for name, p in named if p.requires_grad]
    if decay == 1:
        return [{"params": [p for _, p in trained], "lr": lr}]
    layers = {int(m.group(1)) for name, _ in named if (m := LAYER_NAME.search(name))}
    if not layers:
        raise ConfigError(f"layer_lr_decay: {type(encoder).__name__} has no numbered layers (layer.N.)")
    count = max(layers) + 1
    depth: dict[int, list[nn.Parameter]] = {}
    for name, p in trained:
        layer = LAYER_NAME.search(name)
        below = count - 1 - int(layer.group(1)) if layer else count if EMBEDDINGS_NAME.search(name) else 0
        depth.setdefault(below, []).append(p)
    depth.setdefault(0, [])
    return [{"params": depth[d], "lr": lr * decay**d} for d in sorted(depth)]


class InitDecay:
    """L2-SP (Li et al. 2018, "Explicit inductive bias for transfer learning"), decoupled as AdamW decays: before
    each update every trainable weight of ``model`` moves toward its weight at construction by ``lr * strength`` of
    the gap (``train.init_decay``; 0: off). Built before a resumed run loads its state, so it pulls toward the init.
    """

    def __init__(self, model: nn.Module, strength: float) -> None:
        self.strength = strength
        self.start = (
            [(p, p.detach().clone()) for p in model.parameters() if p.requires_grad] if strength else []
        )

    @torch.no_grad()
    def pull(self, lr: float) -> None:
        """Call before ``optimizer.step()``, as torch's AdamW applies its own decay before the update."""
        for weight, start in self.start:
            weight.sub_(weight - start, alpha=lr * self.strength)


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


def consert_schedule(steps: int, warmup_ratio: float, shape: str = "linear") -> Callable[[int], float]:
    """transformers ``get_linear_schedule_with_warmup`` (ConSERT ``transformers/optimization.py``): from 0 up to
    the lr over ``warmup`` steps, then down to 0 at ``steps``; the first step runs at lr 0. ConSERT's main.py
    takes ``warmup = ceil(0.1 * len(dataset) * epochs / batch)``: here ``ceil(warmup_ratio * steps)``. Another
    ``shape`` (``train.schedule``) replaces the part after the warm-up."""
    warmup = math.ceil(round(warmup_ratio * steps, 6))

    def lr_lambda(current_step: int) -> float:
        if current_step < warmup:
            return float(current_step) / float(max(1, warmup))
        return after_warmup(shape, current_step, warmup, steps)

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
