"""One training loop for the three ConSERT modes: ``nli`` (supervised), ``joint`` (CE + alpha * NT-Xent) and
``transfer`` (unsupervised: contrastive on target-domain text, or the tsdae, distill or promptbert objective).

Read top to bottom: setup, one optimizer step, evaluation, the loop with checkpoint selection. Each piece it calls
has a module of its own: the config ``sentcl.training.config``; the objective (representations and loss)
``sentcl.training.objectives``; the step's loss, wrapped by GradCache when accumulating, ``sentcl.training.gradcache``;
the optimizer and L2-SP ``sentcl.training.optimizer``; the ranks under ``torchrun`` ``sentcl.training.distributed``;
resume state ``sentcl.training.resume``; checkpoint selection ``sentcl.training.selection``; the device, batch order
and random state ``sentcl.training.runtime``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from sentcl.evaluation.sts import STSEvaluator
from sentcl.model.encoder import Encoder
from sentcl.training.config import TrainConfig
from sentcl.training.distributed import all_reduce_gradients, broadcast, mean_over_ranks, rank_share
from sentcl.training.gradcache import CachedLoss, ObjectiveLoss
from sentcl.training.objectives.base import Embedder, Objective
from sentcl.training.objectives.contrastive import MomentumQueue
from sentcl.training.objectives.factory import build_objective
from sentcl.training.optimizer import InitDecay, build_optimizer, freeze
from sentcl.training.precision import describe_precision, use_bf16
from sentcl.training.resume import ResumeState, fingerprint, inputs_digest
from sentcl.training.runtime import BatchOrder, dist_info, select_device
from sentcl.training.selection import TrainResult, selectable

log = logging.getLogger(__name__)
# The loop's progress that resume state carries (with the weights, optimizer and random state).
PROGRESS = ("step", "rows", "elapsed", "init_scores", "best_scores", "best_step", "bad", "best_state")


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
        if config.freeze:
            frozen = freeze(self.encoder.model, config.freeze)
            log.info("freeze: %s (%.1fM parameters left untrained)", ", ".join(config.freeze), frozen / 1e6)
        self.optimizer, self.scheduler, self.params = build_optimizer(config, self.encoder, self.objective)
        # The encoder's weights as the trainer got them, which a resumed run's are too (state loads in fit).
        self.init_decay = InitDecay(self.encoder, config.init_decay)
        queue = config.queue_size and config.mode != "nli"  # ESimCSE's extra negatives
        self.queue = MomentumQueue(self.encoder.model, config.queue_size, config.momentum) if queue else None

        self.order = BatchOrder(len(self.examples), config.batch_size, config.seed)
        if self.order.batch_size < config.batch_size:
            log.warning("only %d examples: the batch shrinks from %d", len(self.examples), config.batch_size)
        self.evaluator = STSEvaluator(dev_pairs, "stsb-dev")
        self.domain_evaluator = STSEvaluator(domain_dev, "domain-dev") if domain_dev else None
        self.domain_dev, self.max_task_drop = list(domain_dev or []), max_task_drop
        self.progress, self.on_row = progress and self.rank == 0, on_row
        self.autocast = use_bf16(config.bf16, self.device)
        if config.compile:
            self.encoder.model.compile()  # in place: state_dict keys, saving and resume are unchanged
        bf16 = torch.bfloat16 if self.autocast else None
        self.embed = Embedder(
            self.encoder, config.view, self.generator, self.device, bf16, config.chunk_tokens
        )
        # The step's loss: the objective's on the whole batch, or GradCache's wrapper of it (grad_accum > 1).
        self.criterion: ObjectiveLoss | CachedLoss = ObjectiveLoss(self.objective, self.embed)
        if config.grad_accum > 1:
            self.criterion = CachedLoss(self.criterion, config.grad_accum)
        # The fingerprint digests the init weights: after compiling (in place), before any step.
        inputs = inputs_digest(self.examples, self.encoder.model) if checkpoint_dir else ""
        self.resume = ResumeState(
            checkpoint_dir,
            fingerprint(config, self.world, inputs, self.domain_dev, max_task_drop) if checkpoint_dir else "",
            {
                "model": self.encoder.model,
                "objective": self.objective,
                "optimizer": self.optimizer,
                "scheduler": self.scheduler,
            },
            self.queue,
            self.generator,
            self.device,
            self.rank,
            self.world,
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

    def train_step(self, items: Sequence[Any], step: int) -> float:
        self._set_dropout()
        queued = None
        if self.queue is not None:
            queued = self.queue.advance(self.encoder.model, self.embed.tokenize(self._sentences(items)))
            queued = self.objective.queue_entries(queued)  # projected as the anchors' (ESimCSE models.py)
        loss = self.criterion(items, self.queue.negatives if self.queue is not None else None)
        value = mean_over_ranks(loss, self.world)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"loss is {value} at step {step}: stopping (try a lower lr or a higher temperature)"
            )
        loss.backward()  # with grad_accum > 1, GradCache's second pass over the micro-batches
        if self.world > 1:
            all_reduce_gradients(self.params, self.world)
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.init_decay.pull(self.optimizer.param_groups[0]["lr"])
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

    # -- evaluation and checkpoints ----------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """STS-B dev, and the domain dev set when there is one (Spearman x 100 by name)."""
        scores = None
        if self.rank == 0:
            encode = partial(self.encoder.encode, batch_size=128)  # the pooling it is saved with
            scores = {"stsb_dev": self.evaluator(encode)}
            if self.domain_evaluator is not None:
                scores["domain_dev"] = self.domain_evaluator(encode)
        return broadcast(scores)

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.encoder.model.state_dict().items()}

    # -- the loop --------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        cfg = self.cfg
        started = time.perf_counter()
        log.info("precision: %s", describe_precision(cfg.bf16, self.device))
        resumed = self.resume.load()
        if resumed:
            step, rows, elapsed, init, best, best_step, bad, best_state = (resumed[k] for k in PROGRESS)
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
                seconds = elapsed + time.perf_counter() - started
                progress = (step, rows, seconds, init, best, best_step, bad, best_state)
                self.resume.save(dict(zip(PROGRESS, progress, strict=True)))
        bar.close()
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
            self._out_of_patience(bad),
            rows,
            init.get("domain_dev"),
            best.get("domain_dev"),
            self.max_task_drop if self.domain_evaluator is not None else None,
        )

    def _out_of_patience(self, bad: int) -> bool:
        return self.cfg.patience is not None and bad >= self.cfg.patience

    def _rank_items(self, indices: list[int]) -> list[Any]:
        return [self.examples[i] for i in rank_share(indices, self.rank, self.world)]

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
        self.resume.remove()


def _describe(scores: dict[str, float]) -> str:
    names = {"stsb_dev": "STS-B dev", "domain_dev": "domain dev"}
    return ", ".join(f"{names[k]} {v:.2f}" for k, v in scores.items())
