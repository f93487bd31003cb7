"""Training objectives as small pieces: what examples each reads, which embeddings it needs, and its loss.

An objective turns a micro-batch of examples into the embeddings its loss needs (``representations``) and turns
those into a loss (``loss``). The split is what gradient caching needs: ``Trainer`` embeds every micro-batch
first, computes the loss over the whole batch, then replays each micro-batch with gradient.

=================  ===========================  =====================================================
objective          examples                     loss
=================  ===========================  =====================================================
``Contrastive``    sentences                    alpha * NT-Xent or InfoNCE over views[0], views[1]
``NLIClassifier``  (premise, hypothesis, label) CE of the classifier over concat(u, v, |u-v|[, max^2])
``SupSimCSE``      (premise, entailed, contra.) supervised SimCSE
``Joint``          (premise, hypothesis, label) CE on views[0] + alpha * (C(premises) + C(hypotheses))
``TSDAE``          sentences                    a decoder's CE rebuilding each sentence from the vector of a
                                                damaged copy (sentence-transformers' DenoisingAutoEncoderLoss)
``PromptBERT``     sentences (transfer) or      InfoNCE between a sentence's two templates, each denoised,
                   triplets (nli)               after the MLP head; supervised SimCSE under one template
                                                (``sentcl.prompt.PromptBERTObjective``)
=================  ===========================  =====================================================
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from sentcl.encoder import Encoder
from sentcl.losses import MLPProjection, NLIHead, info_nce, nli_loss, nt_xent, sup_simcse
from sentcl.prompt import PromptBERTObjective
from sentcl.views import ViewConfig, embedding_output_hook, make_view, position_offset

log = logging.getLogger(__name__)
CONTRASTIVE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"nt_xent": nt_xent, "info_nce": info_nce}
Reps = dict[str, torch.Tensor]


class Embedder:
    """Runs the encoder on one view of a tokenized batch: the view's inputs, its embedding-output hook, autocast.

    Training pools with last-avg; the encoder's own dropout is whatever train/eval mode the trainer set.
    """

    def __init__(
        self,
        encoder: Encoder,
        view_config: ViewConfig,
        generator: torch.Generator,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.encoder, self.view_config, self.generator, self.device = encoder, view_config, generator, device
        self.autocast_dtype = autocast_dtype
        self.pad_id = encoder.tokenizer.pad_token_id or 0
        self.position_start = position_offset(encoder.model)

    def tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        # last-avg whatever the encoder is saved with: a prompt pooling's tokenization is PromptBERTObjective's
        return self.encoder.tokenize(sentences, pooling="last-avg").to(self.device)

    def __call__(
        self,
        batch: dict[str, torch.Tensor],
        view: str = "none",
        adversarial_grad: torch.Tensor | None = None,
        capture: list[torch.Tensor] | None = None,
        adversarial_base: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sentence vectors of ``view`` of ``batch``; ``capture`` receives the (perturbed) embedding output;
        ``adversarial_base`` is the clean pass's embedding output the adversarial noise is added to."""
        inputs = make_view(
            view,
            batch["input_ids"],
            batch["attention_mask"],
            self.view_config,
            self.generator,
            hidden=self.encoder.dim,
            pad_id=self.pad_id,
            position_start=self.position_start,
            adversarial_grad=adversarial_grad,
            adversarial_base=adversarial_base,
        )
        perturb = inputs.embedding_output
        hook = perturb
        if capture is not None:

            def hook(output: torch.Tensor) -> torch.Tensor:
                output = perturb(output) if perturb else output
                capture.append(output)
                return output

        kwargs = {} if inputs.position_ids is None else {"position_ids": inputs.position_ids}
        enabled = self.autocast_dtype is not None
        with (
            embedding_output_hook(self.encoder.model, hook),
            torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=enabled),
        ):
            return self.encoder(inputs.input_ids, inputs.attention_mask, "last-avg", **kwargs)


class Objective(nn.Module):
    """Base class; the parameters an objective owns (a classifier, a projection) train with the encoder."""

    examples = "sentences"  # sentences | pairs | triplets
    head_parameters: tuple[str, ...] = ()  # submodules trained at head_lr

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        raise NotImplementedError

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        """What the momentum encoder's sentence vectors enter the queue as: the loss's own space."""
        return z


class Contrastive(Objective):
    """Unsupervised contrastive training on sentences: two views of each, pulled together (ConSERT unsup, SimCSE,
    ESimCSE). ConSERT multiplies its contrastive loss by ``--cl_rate`` even with ``--cl_loss_only`` (``alpha``)."""

    def __init__(
        self,
        loss: str,
        temperature: float,
        views: tuple[str, str],
        alpha: float,
        projection: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.contrastive, self.temperature, self.views, self.alpha = (
            CONTRASTIVE_LOSSES[loss],
            temperature,
            views,
            alpha,
        )
        self.projection = projection

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.projection(z.float()) if self.projection is not None else z

    def pair_loss(
        self, z1: torch.Tensor, z2: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.contrastive(self.project(z1), self.project(z2), self.temperature, negatives)

    def representations(self, embed: Embedder, items: Sequence[str]) -> Reps:
        batch = embed.tokenize(items)
        return {"z1": embed(batch, self.views[0]), "z2": embed(batch, self.views[1])}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return self.alpha * self.pair_loss(reps["z1"], reps["z2"], negatives)

    @torch.no_grad()
    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        """Through the same MLP head as the anchors (ESimCSE ``models.py`` ``cl_forward``: the momentum encoder's
        ``pooler_output`` goes through ``cls.mlp`` before ``.detach()``), so the queue is in the anchors' space."""
        return self.project(z).detach()


class NLIClassifier(Objective):
    """SBERT / ConSERT supervised NLI: the classifier's cross-entropy (``AdvCLSoftmaxLoss`` without contrast)."""

    examples = "pairs"
    head_parameters = ("head",)

    def __init__(self, dim: int, max_square: bool) -> None:
        super().__init__()
        self.head = NLIHead(dim, max_square)

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        premises, hypotheses, labels = zip(*items, strict=True)
        # Premises and hypotheses go through the model together: one forward for u and v.
        u, v = embed(embed.tokenize(list(premises) + list(hypotheses))).chunk(2)
        return {"u": u, "v": v, "labels": torch.tensor(labels, device=u.device)}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return nli_loss(self.head, reps["u"], reps["v"], reps["labels"])


class SupSimCSE(Objective):
    """Supervised SimCSE on (premise, entailment, contradiction) triplets."""

    examples = "triplets"

    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.temperature = temperature

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        a, p, n = zip(*items, strict=True)
        anchor, positive, negative = embed(embed.tokenize(list(a) + list(p) + list(n))).chunk(3)
        return {"anchor": anchor, "positive": positive, "negative": negative}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        return sup_simcse(reps["anchor"], reps["positive"], reps["negative"], self.temperature)


class Joint(Objective):
    """ConSERT's joint objective (``AdvCLSoftmaxLoss.forward`` with ``--add_cl``)::

        loss = CE(u, v) + alpha * (C(premises view 1, view 2) + C(hypotheses view 1, view 2))

    The classifier reads the first view's pass; premises and hypotheses are contrasted separately, so a premise's
    own hypothesis is never one of its negatives. With ``views[1] == "adversarial"`` the second view's embedding
    output is the first pass's plus ``eps * g / ||g||`` (per token), g the gradient of the CE loss at the first
    pass's embedding output; the sum keeps the first pass's graph, as ConSERT's ``noise_embedding`` does.
    """

    examples = "pairs"
    head_parameters = ("classifier",)

    def __init__(self, dim: int, max_square: bool, contrastive: Contrastive) -> None:
        super().__init__()
        self.classifier = NLIClassifier(dim, max_square)
        self.contrastive = contrastive

    def representations(self, embed: Embedder, items: Sequence[Any]) -> Reps:
        premises, hypotheses, labels = zip(*items, strict=True)
        first, second = self.contrastive.views
        batch = embed.tokenize(list(premises) + list(hypotheses))
        labels = torch.tensor(labels, device=embed.device)
        grad = base = None
        if second == "adversarial":
            captured: list[torch.Tensor] = []
            with torch.enable_grad():  # also inside gradient caching's no-grad pass
                u, v = embed(batch, first, capture=captured).chunk(2)
                ce = nli_loss(self.classifier.head, u, v, labels)
                (grad,) = torch.autograd.grad(ce, captured[0], retain_graph=True)
            base = captured[0]
        else:
            u, v = embed(batch, first).chunk(2)
        p2, h2 = embed(batch, second, adversarial_grad=grad, adversarial_base=base).chunk(2)
        return {"u": u, "v": v, "labels": labels, "p2": p2, "h2": h2}

    def queue_entries(self, z: torch.Tensor) -> torch.Tensor:
        return self.contrastive.queue_entries(z)

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        ce = self.classifier.loss(reps)
        c = self.contrastive
        premises = c.pair_loss(reps["u"], reps["p2"], negatives)
        hypotheses = c.pair_loss(reps["v"], reps["h2"], negatives)
        return ce + c.alpha * (premises + hypotheses)


class _EmbeddedSentences:
    """What ``DenoisingAutoEncoderLoss`` reads of a SentenceTransformer, for an encoder that runs elsewhere.

    The library builds its decoder from ``transformers_model`` (config, folder, weights to tie) and tokenizer;
    at loss time it calls the "model" on the source features, and here those already hold the sentence vectors
    (the trainer's ``Embedder`` made them, with its hook, autocast and gradient caching).
    """

    def __init__(self, encoder: Encoder) -> None:
        self.transformers_model, self.tokenizer = encoder.model, encoder.tokenizer

    def __getitem__(self, index: int) -> nn.Module:  # the library checks model[0] is no StaticEmbedding
        return self.transformers_model

    def __call__(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return features


class TSDAE(Objective):
    """TSDAE (Wang, Reimers & Gurevych 2021): from the vector of a damaged sentence, a decoder must rebuild the
    sentence. Decoder, weight tying and loss are sentence-transformers' ``DenoisingAutoEncoderLoss``
    (``sentence_transformers/sentence_transformer/losses/denoising_auto_encoder.py``); the encoder pass is the
    trainer's, pooled last-avg as everywhere in sentcl (the paper's best is CLS, with mean close behind).

    Noise (``DenoisingAutoEncoderDataset.delete`` in the same package, the paper's deletion ratio 0.6): each
    word is deleted with probability ``deletion_ratio`` and at least one is kept. Words are whitespace tokens,
    not nltk's ``word_tokenize``: SentEval text is already tokenised, and nltk's data cannot be downloaded here.
    The noise draws from the views' generator, so gradient caching replays it.

    The decoder is ``AutoModelForCausalLM`` of the encoder's own folder with cross-attention, tied to the
    encoder (``tie_encoder_decoder=True``): embeddings and every self-attention and feed-forward weight are
    shared. A folder saved as a sentence encoder (the bundled all-MiniLM-L6-v2, every sentcl model) has no LM
    head, so each layer's cross-attention and the LM head's transform start random (the output projection is the
    tied word embeddings): 3.7M fresh parameters next to 22.6M shared for MiniLM-L6 (measured). Until they
    learn, their gradients reach the shared weights as noise: the first steps can lower the encoder's scores,
    which is why a retrain selects on dev scores and keeps its init when no step helps.
    """

    def __init__(self, encoder: Encoder, deletion_ratio: float) -> None:
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
        from transformers.utils import logging as hf_logging

        if not encoder.model.config._name_or_path:
            raise ValueError(
                "TSDAE builds its decoder from the encoder's folder: load it with from_pretrained"
            )
        weights = {k: v.detach().clone() for k, v in encoder.model.state_dict().items()}
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the decoder's load report lists every fresh weight; one line below
        try:
            self.dae = DenoisingAutoEncoderLoss(_EmbeddedSentences(encoder), tie_encoder_decoder=True)
        finally:
            hf_logging.set_verbosity(verbosity)
        # Tying hands the encoder the decoder's weights, read from the folder: put back the ones in memory.
        encoder.model.load_state_dict(weights)
        self.deletion_ratio, self.max_length = deletion_ratio, encoder.max_length
        self.pad_id = self.dae.tokenizer_decoder.pad_token_id
        shared = {id(p) for p in encoder.model.parameters()}
        fresh = sum(p.numel() for p in self.dae.decoder.parameters() if id(p) not in shared)
        total = sum(p.numel() for p in self.dae.decoder.parameters())
        log.info(
            "TSDAE decoder: %d parameters, %d fresh (cross-attention, LM-head transform), the rest tied",
            total,
            fresh,
        )

    def damage(self, sentence: str, generator: torch.Generator) -> str:
        words = sentence.split()
        if not words:
            return sentence
        keep = torch.rand(len(words), generator=generator) > self.deletion_ratio
        if not keep.any():
            keep[torch.randint(len(words), (1,), generator=generator)] = True
        return " ".join(w for w, k in zip(words, keep.tolist(), strict=True) if k)

    def representations(self, embed: Embedder, items: Sequence[str]) -> Reps:
        damaged = [self.damage(s, embed.generator) for s in items]
        # Targets padded to max_length so that gradient caching can stack micro-batches; loss() trims them.
        targets = embed.encoder.tokenizer(
            list(items),
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {"z": embed(embed.tokenize(damaged)), "target_ids": targets["input_ids"].to(embed.device)}

    def loss(self, reps: Reps, negatives: torch.Tensor | None = None) -> torch.Tensor:
        ids = reps["target_ids"]
        ids = ids[:, : int((ids != self.pad_id).sum(1).max())]  # columns that are padding in every row go
        z = reps["z"].float()
        source = {
            "sentence_embedding": z,
            "attention_mask": torch.ones(len(z), 1, dtype=torch.long, device=z.device),
        }
        return self.dae([source, {"input_ids": ids}], labels=None)


class MomentumQueue:
    """ESimCSE's queue of extra negatives (``ESimCSE/esimcse/trainers.py`` ``compute_loss``, ``models.py``).

    Before each step the momentum encoder moves toward the encoder (``m = m * momentum + p * (1 - momentum)``)
    and embeds the batch's sentences in eval mode (no dropout); the loss uses the queue as it was, then the new
    embeddings join it and the oldest beyond ``size`` leave. The trainer passes the new embeddings through the
    objective's ``queue_entries`` (the MLP head when ``projection`` is on) before they are pushed.
    """

    def __init__(self, model: nn.Module, size: int, momentum: float) -> None:
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        self.size, self.momentum = size, momentum
        self.negatives = torch.zeros(0, model.config.hidden_size, device=next(model.parameters()).device)

    @torch.no_grad()
    def advance(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Move the momentum encoder and embed ``batch`` with it (the entries to push after this step)."""
        for m, p in zip(self.model.parameters(), model.parameters(), strict=True):
            m.mul_(self.momentum).add_(p.detach(), alpha=1 - self.momentum)
        self.model.eval()
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
        return ((out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).float()

    def push(self, z: torch.Tensor) -> None:
        self.negatives = torch.cat([self.negatives, z])[-self.size :]


def build_objective(config: Any, dim: int, encoder: Encoder | None = None, teacher: Any = None) -> Objective:
    """The objective of a ``TrainConfig``: the one place that reads ``mode`` and ``objective``. TSDAE builds its
    decoder from (and ties it to) ``encoder``; PromptBERT tokenizes with its tokenizer; distill reads the
    ``teacher``'s stored vectors (``sentcl.teacher.TeacherVectors``)."""
    if config.objective == "distill":  # sentcl/distill.py
        from sentcl.distill import build_distill

        return build_distill(config, dim, teacher)
    if config.objective == "promptbert":
        return _promptbert(config, dim, encoder)
    if config.mode == "transfer" and config.objective == "tsdae":
        if encoder is None:
            raise ValueError("the tsdae objective needs the encoder to build its decoder from")
        return TSDAE(encoder, config.deletion_ratio)
    contrastive = Contrastive(
        config.loss,
        config.temperature,
        config.views,
        config.alpha,
        MLPProjection(dim) if config.projection else None,
    )
    if config.mode == "transfer":
        return contrastive
    if config.mode == "joint":
        return Joint(dim, config.max_square, contrastive)
    if config.objective == "sup_simcse":
        return SupSimCSE(config.temperature)
    return NLIClassifier(dim, config.max_square)


def _promptbert(config: Any, dim: int, encoder: Encoder | None) -> PromptBERTObjective:
    """kongds/Prompt-BERT prompt_bert/models.py ``cl_forward``: transfer mode is run.sh unsup-bert (two templates,
    each denoised by its own delta, MLP head, InfoNCE); nli mode is sup-bert (anchor, entailment and contradiction
    under the one template, each denoised, supervised SimCSE; sup-bert has no MLPLayer: ``TrainConfig`` refuses
    ``projection`` in nli mode)."""
    if encoder is None:
        raise ValueError("the promptbert objective needs the encoder's tokenizer")
    sentences = config.mode == "transfer"
    return PromptBERTObjective(
        encoder.tokenizer,
        config.prompt.templates,
        config.temperature,
        config.prompt.denoise,
        config.max_length,
        examples="sentences" if sentences else "triplets",
        projection=MLPProjection(dim) if config.projection and sentences else None,
        contrastive=CONTRASTIVE_LOSSES[config.loss],
    )
