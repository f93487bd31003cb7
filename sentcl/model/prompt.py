"""PromptBERT (Jiang et al., 2022): a sentence's vector is the last-layer state at the [MASK] of a template.

    h = last_hidden[MASK] of  [CLS] This sentence : " <sentence> " means [MASK] . [SEP]

Template denoising subtracts what the template alone contributes: the [MASK] state of the template with no
sentence in it, its suffix positions shifted by the sentence's token count L so the [MASK] sits where it sits in
the sentence's pass, looked up by L (``get_delta`` in kongds/Prompt-BERT prompt_bert/models.py and evaluation.py).
Prompt contrastive training encodes each sentence under two templates, denoises each, and applies SimCSE's
InfoNCE to the pair.

Templates are plain strings with ``[X]`` for the sentence and ``[MASK]`` for the tokenizer's mask token. The
authors' ``*cls*_This_sentence_:_"*sent_0*"_means*mask*.*sep+*`` is ``This sentence : "[X]" means [MASK] .``
here: their code splits it at the sentence into a prefix and a suffix, tokenizes each without special tokens and
concatenates ``[CLS] + prefix + sentence + suffix + [SEP]`` (train.py ``prepare_features``), which is what
``tokenize_prompt`` does, so a long sentence loses its own last tokens and never the template.

Everything here returns tensors and keeps the caller's autograd mode: under ``torch.no_grad`` for evaluation,
with gradient (through both the sentence's pass and the delta's, as the authors' default) for training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sentcl.model.pooling import MASK, PromptSettings, check_template

# The paper's manual templates (run.sh). ``bert-prompt`` scores an untrained bert-base-uncased with PAPER_TEMPLATE;
# ``unsup-bert`` trains on the pair PAPER_TRAIN_TEMPLATES and evaluates with its first, without the delta;
# ``sup-bert`` trains and evaluates on PAPER_TRAIN_TEMPLATES[0] with the delta.
# params.yaml holds the defaults (evaluate.prompt, train presets); these name the paper's values for tests.
PAPER_TEMPLATE = 'This sentence : "[X]" means [MASK] .'
PAPER_TRAIN_TEMPLATES = ('This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .')
# Model types whose default position ids start after the padding index (RoBERTa's numbering).
_PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer")


class NoMaskTokenError(ValueError):
    """The tokenizer has no mask token, so there is no [MASK] to read a prompt representation from."""


@dataclass(frozen=True)
class TemplateIds:
    """A template tokenized around its slot: ``prefix`` starts with the start token ([CLS]/<s>), ``suffix``
    ends with the end token ([SEP]/</s>) and holds the one mask token."""

    template: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    mask_token_id: int
    unk_token_id: int | None

    @property
    def length(self) -> int:
        """Tokens of the template alone: the authors' ``template_len`` (a row's sentence length is
        ``attention_mask.sum() - length``)."""
        return len(self.prefix) + len(self.suffix)


def template_ids(tokenizer, template: str) -> TemplateIds:
    """Tokenize ``template`` for ``tokenizer``; ``NoMaskTokenError`` when the tokenizer has no mask token."""
    before, after = check_template(template)
    mask = getattr(tokenizer, "mask_token", None)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask is None or mask_id is None:
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise NoMaskTokenError(
            f"prompt pooling needs a tokenizer with a mask token; {name} has none (use a masked-LM model such "
            "as BERT or RoBERTa, or another pooling)"
        )

    def words(text: str) -> list[int]:
        text = text.strip()  # RoBERTa: the authors strip the prefix so it does not start with a space token
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    # [CLS] ... [SEP] for BERT, <s> ... </s> for RoBERTa: what the tokenizer wraps an empty text in
    # (train.py: ``model.bos = tokenizer.encode('')[0]``, ``model.eos = tokenizer.encode('')[1]``).
    specials = tokenizer("", add_special_tokens=True)["input_ids"]
    start, end = (specials[:1], specials[1:]) if len(specials) >= 2 else ([], specials)
    prefix = start + words(before)
    before_mask, after_mask = after.split(MASK)
    suffix = words(before_mask) + [mask_id] + words(after_mask) + end
    return TemplateIds(template, tuple(prefix), tuple(suffix), int(mask_id), tokenizer.unk_token_id)


def tokenize_prompt(
    tokenizer,
    sentences: Sequence[str],
    template: TemplateIds,
    max_length: int,
    add_period: bool = False,
) -> list[list[int]]:
    """Token ids of each sentence inside the template, at most ``max_length`` in all: the sentence is cut
    (its last tokens), never the template. ``add_period``: end a sentence with "." unless it ends in
    . ? " or ' (the authors' evaluation.py ``batcher`` does this for prompts; their training does not)."""
    budget = max_length - template.length
    if budget < 1:
        raise ValueError(
            f"max_length {max_length} leaves no room for a sentence in the {template.length}-token template "
            f"{template.template!r}"
        )
    texts = [str(s).strip() for s in sentences]
    if add_period:
        texts = [s + "." if s and s[-1] not in ".?\"'" else s for s in texts]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    rows = []
    for ids in encoded:
        ids = ids[:budget]
        if template.unk_token_id is not None:  # a literal [MASK] in the text must not be read as the slot
            ids = [template.unk_token_id if i == template.mask_token_id else i for i in ids]
        rows.append([*template.prefix, *ids, *template.suffix])
    return rows


def pad(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` tensors."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, : len(r)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _first_position(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    if getattr(config, "model_type", "") in _PADDING_OFFSET_POSITIONS:
        return int(config.pad_token_id) + 1
    return 0


def template_delta(model: nn.Module, template: TemplateIds, max_sentence_length: int) -> torch.Tensor:
    """``delta[L]`` for L = 0..max_sentence_length: the last-layer [MASK] state of the template with no sentence,
    its suffix positions moved L places on. kongds/Prompt-BERT prompt_bert/models.py ``get_delta``:
        d_position_ids[:, len(bs)+1:] += arange(length)[:, None];  delta = last_hidden[input_ids == mask]
    (``len(bs)+1`` = our ``len(prefix)``: the prefix with [CLS]). The model's mode decides dropout and the
    caller's grad mode decides gradient, as in the authors' training (``delta_freeze`` off by default).
    Two deliberate differences, neither changing their BERT numbers: each template shifts after its own prefix
    (theirs uses the first template's ``bs`` for both; their two prefixes have the same length), and RoBERTa-type
    models get their own position numbering (from pad_token_id + 1; theirs passes 0-based ids)."""
    device = next(model.parameters()).device
    rows = max_sentence_length + 1
    ids = torch.tensor([*template.prefix, *template.suffix], dtype=torch.long, device=device)
    input_ids = ids.unsqueeze(0).repeat(rows, 1)
    positions = torch.arange(len(ids), device=device).unsqueeze(0).repeat(rows, 1)
    positions[:, len(template.prefix) :] += torch.arange(rows, device=device).unsqueeze(-1)
    positions = positions + _first_position(model)
    output = model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        token_type_ids=torch.zeros_like(input_ids),
        position_ids=positions,
    )
    mask_at = len(template.prefix) + template.suffix.index(template.mask_token_id)
    return output.last_hidden_state[:, mask_at]


def mask_states(last_hidden: torch.Tensor, input_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """The state at each row's (one) mask token: models.py ``last_hidden[input_ids == cls.mask_token_id]``,
    as a per-row index so a row without a mask cannot shift the others."""
    index = (input_ids == mask_token_id).int().argmax(-1)
    return last_hidden[torch.arange(len(input_ids), device=input_ids.device), index]


def sentence_lengths(attention_mask: torch.Tensor, template: TemplateIds) -> torch.Tensor:
    """Tokens of the sentence in each row: models.py ``blen = attention_mask.sum(-1) - template_len``."""
    return attention_mask.sum(-1) - template.length


def denoise(
    states: torch.Tensor, attention_mask: torch.Tensor, template: TemplateIds, delta: torch.Tensor
) -> torch.Tensor:
    """models.py / evaluation.py ``pooler_output -= delta[blen]``."""
    return states - delta[sentence_lengths(attention_mask, template)]


def prompt_pool(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    template: TemplateIds,
    denoised: bool,
    **model_kwargs,
) -> torch.Tensor:
    """Sentence vectors of rows from ``tokenize_prompt``: the [MASK] state, minus the template's delta when
    ``denoised``. ``model_kwargs`` reach the model (``inputs_embeds``, ...)."""
    states = prompt_states(model, input_ids, attention_mask, template, **model_kwargs)
    return denoise_batch(model, states, attention_mask, template) if denoised else states


def prompt_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    template: TemplateIds,
    **model_kwargs,
) -> torch.Tensor:
    """The [MASK] state of each row, before denoising (training runs it on length-sorted chunks of a batch)."""
    output = model(input_ids=input_ids, attention_mask=attention_mask, **model_kwargs)
    return mask_states(output.last_hidden_state, input_ids, template.mask_token_id)


def denoise_batch(
    model: nn.Module, states: torch.Tensor, attention_mask: torch.Tensor, template: TemplateIds
) -> torch.Tensor:
    """``states`` of a batch minus the delta of each row's sentence length, the deltas computed up to the
    batch's longest sentence."""
    longest = int(sentence_lengths(attention_mask, template).max())
    return denoise(states, attention_mask, template, template_delta(model, template, longest))


class PromptPooler:
    """Tokenize-and-pool for one tokenizer and ``PromptSettings``: ``tokenize`` gives model inputs,
    ``__call__(model, input_ids, attention_mask)`` the vectors."""

    def __init__(self, tokenizer, settings: PromptSettings, max_length: int) -> None:
        self.tokenizer, self.settings, self.max_length = tokenizer, settings, max_length
        self.template = template_ids(tokenizer, settings.template)
        self.pad_id = tokenizer.pad_token_id or 0

    def token_ids(self, sentences: Sequence[str]) -> list[list[int]]:
        return tokenize_prompt(
            self.tokenizer, sentences, self.template, self.max_length, self.settings.add_period
        )

    def tokenize(self, sentences: Sequence[str]) -> dict[str, torch.Tensor]:
        return pad(self.token_ids(sentences), self.pad_id)

    def delta_table(self, model: nn.Module) -> torch.Tensor:
        """``delta[L]`` for every sentence length this pooler can produce (evaluation: compute once)."""
        return template_delta(model, self.template, self.max_length - self.template.length)

    def __call__(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, **model_kwargs
    ) -> torch.Tensor:
        return prompt_pool(
            model, input_ids, attention_mask, self.template, self.settings.denoise, **model_kwargs
        )


class PromptGraph(nn.Module):
    """The [MASK] gather and the per-length delta as one traceable module, for ONNX export: inputs are the
    prompt-tokenized ``input_ids`` and ``attention_mask``; the delta table is a constant (evaluation only)."""

    def __init__(self, model: nn.Module, pooler: PromptPooler) -> None:
        super().__init__()
        self.model, self.mask_token_id, self.template_length = (
            model,
            pooler.template.mask_token_id,
            (pooler.template.length),
        )
        self.denoised = pooler.settings.denoise
        with torch.no_grad():
            delta = pooler.delta_table(model) if self.denoised else torch.zeros(1, 1)
        self.register_buffer("delta", delta.detach().clone())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        index = (input_ids == self.mask_token_id).to(torch.int64).argmax(-1)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        states = hidden[rows, index]
        if self.denoised:
            states = states - self.delta[attention_mask.sum(-1) - self.template_length]
        return states
