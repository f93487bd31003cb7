"""The `promptbert` preset and objective through the trainer, on a tiny masked-LM BERT: the loss equals Prompt-BERT's
own arithmetic written out by hand, and a trained folder is scored (during training and after) with the prompt
pooling it is saved with, not last-avg.

The transcription below follows kongds/Prompt-BERT, not sentcl/model/prompt.py: the templates are run.sh's own strings
(``*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*``), split into ``bs``/``es`` as train.py does (lines
618-641, ``prepare_features``), the delta is models.py ``get_delta`` (50 lengths, suffix positions shifted after
``len(cls.bs) + 1``), and the loss is models.py ``cl_forward``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from sentcl.evaluation.sts import STSEvaluator
from sentcl.model.encoder import Encoder
from sentcl.model.pooling import ModelPooling, PromptSettings, read_model_pooling
from sentcl.training.trainer import Trainer
from tests.tiny import make_tiny_encoder, tiny_sentences, tiny_vocab, train_config, write_tiny_processed

# run.sh unsup-bert TEMPLATE and TEMPLATE2 (sup-bert trains on TEMPLATE alone), --temp 0.05.
RUN_SH_TEMPLATE = '*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*'
RUN_SH_TEMPLATE2 = '*cls*_This_sentence_:_"*sent_0*"_means*mask*.*sep+*'
RUN_SH_TEMP = 0.05
# eval_only.sh unsup-bert: the trained model is scored with TEMPLATE, no delta; evaluation.py adds the period.
UNSUP_EVAL = PromptSettings('This sentence of "[X]" means [MASK] .', denoise=False, add_period=True)

TEXTS = tiny_sentences(24, seed=3)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 20, 2)]


@pytest.fixture(scope="module")
def still_model(tmp_path_factory):
    """A tiny BERT without dropout (two passes over one input agree), with its whole vocabulary."""
    from transformers import AutoTokenizer, BertTokenizerFast

    folder = make_tiny_encoder(tmp_path_factory.mktemp("promptbert"), dropout=0.0)
    if len(AutoTokenizer.from_pretrained(folder)) < len(set(tiny_vocab())):
        BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    return folder


def bs_es(tokenizer, template: str) -> tuple[str, str]:
    """train.py lines 618-629: the run.sh template to the text before and after the sentence."""
    template = (
        template.replace("*mask*", tokenizer.mask_token)
        .replace("*sep+*", "")
        .replace("*cls*", "")
        .replace("*sent_0*", " ")
    )
    before, after = template.split(" ")
    return before.replace("_", " "), after.replace("_", " ")


class PromptBERTByHand:
    """kongds/Prompt-BERT train.py ``prepare_features`` + prompt_bert/models.py ``cl_forward``, on one model."""

    def __init__(self, model, tokenizer, templates: list[str]) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.parts = [bs_es(tokenizer, t) for t in templates]
        # train.py line 783: model.bs, the first template's prefix without special tokens (used for every delta).
        self.cls_bs = tokenizer.encode(self.parts[0][0], add_special_tokens=False)

    def rows(self, sentences, part) -> list[list[int]]:
        """prepare_features: ``bs = encode(bs)[:-1]``, ``es = encode(es)[1:]``, ``bs + s[:32] + es``."""
        bs = self.tokenizer.encode(part[0])[:-1]
        es = self.tokenizer.encode(part[1])[1:]
        return [bs + self.tokenizer.encode(s, add_special_tokens=False)[:32] + es for s in sentences]

    def get_delta(self, part, length: int = 50) -> tuple[torch.Tensor, int]:
        """models.py ``get_delta``: the template alone (train.py line 786: ``encode(bs + es)``), positions after
        ``len(cls.bs) + 1`` moved on by 0..length-1, the state at the mask."""
        template = self.tokenizer.encode(part[0] + part[1])
        d_input_ids = torch.tensor([template]).repeat(length, 1)
        d_position_ids = torch.arange(d_input_ids.shape[1]).unsqueeze(0).repeat(length, 1)
        d_position_ids[:, len(self.cls_bs) + 1 :] += torch.arange(length).unsqueeze(-1)
        last_hidden = self.model(input_ids=d_input_ids, position_ids=d_position_ids).last_hidden_state
        return last_hidden[d_input_ids == self.tokenizer.mask_token_id], d_input_ids.shape[1]

    def pooled(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One padded forward (prepare_features pads to the longest row); the state at each row's mask."""
        ml = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [self.tokenizer.pad_token_id] * (ml - len(r)) for r in rows])
        attention_mask = torch.tensor([[1] * len(r) + [0] * (ml - len(r)) for r in rows])
        last_hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return last_hidden[input_ids == self.tokenizer.mask_token_id], attention_mask

    def unsup_loss(self, sentences, mlp_weight, mlp_bias) -> torch.Tensor:
        """cl_forward, num_sent 2, different templates: view 1 minus delta, view 2 minus delta1, both at
        ``blen = attention_mask.sum(-1) - template_len``; MLPLayer (dense, tanh); cos / temp; CE with arange."""
        pooler_output, attention_mask = self.pooled(
            self.rows(sentences, self.parts[0]) + self.rows(sentences, self.parts[1])
        )
        delta, template_len = self.get_delta(self.parts[0])
        delta1, template_len1 = self.get_delta(self.parts[1])
        n = len(sentences)
        blen = attention_mask.sum(-1)
        z1 = pooler_output[:n] - delta[blen[:n] - template_len]
        z2 = pooler_output[n:] - delta1[blen[n:] - template_len1]
        z1, z2 = (
            torch.tanh(F.linear(z1, mlp_weight, mlp_bias)),
            torch.tanh(F.linear(z2, mlp_weight, mlp_bias)),
        )
        cos_sim = F.cosine_similarity(z1.unsqueeze(1), z2.unsqueeze(0), dim=-1) / RUN_SH_TEMP
        return F.cross_entropy(cos_sim, torch.arange(n))

    def sup_loss(self, triplets) -> torch.Tensor:
        """cl_forward, num_sent 3, one template: every sentence minus delta[blen]; cos(z1, [z2; z3]) / temp, CE
        with arange (hard_negative_weight 0). sup-bert's MLM transform (org_mlp) is not carried (README)."""
        a, p, n = (list(x) for x in zip(*triplets, strict=True))
        pooler_output, attention_mask = self.pooled(self.rows(a + p + n, self.parts[0]))
        delta, template_len = self.get_delta(self.parts[0])
        pooler_output = pooler_output - delta[attention_mask.sum(-1) - template_len]
        z1, z2, z3 = pooler_output.chunk(3)
        cos_sim = F.cosine_similarity(z1.unsqueeze(1), z2.unsqueeze(0), dim=-1) / RUN_SH_TEMP
        z1_z3_cos = F.cosine_similarity(z1.unsqueeze(1), z3.unsqueeze(0), dim=-1) / RUN_SH_TEMP
        return F.cross_entropy(torch.cat([cos_sim, z1_z3_cos], 1), torch.arange(len(triplets)))


def test_the_promptbert_preset_trains_prompt_berts_unsupervised_loss(still_model):
    encoder = Encoder.from_pretrained(str(still_model))
    # The transfer section's own recipe (views, no dropout, temperature 0.1) is what the preset replaces.
    config = train_config(preset="promptbert", batch_size=6, steps=2, bf16=False)
    trainer = Trainer(encoder, config, TEXTS, DEV, progress=False)
    trainer._set_dropout()
    assert encoder.model.training  # run.sh trains with BERT's dropout on (HF Trainer's train mode)
    batch = TEXTS[:6]
    ours = trainer.loss(trainer.representations(batch))
    mlp = trainer.objective.projection.dense  # the training-only MLPLayer, random as the authors' at init
    with torch.no_grad():
        theirs = PromptBERTByHand(encoder.model, encoder.tokenizer, [RUN_SH_TEMPLATE, RUN_SH_TEMPLATE2])
        expected = theirs.unsup_loss(batch, mlp.weight, mlp.bias)
    assert float(expected) > 0
    torch.testing.assert_close(ours.detach(), expected, atol=1e-5, rtol=1e-5)
    # The MLP is not part of the saved model; the folder pools with eval_only.sh's setting.
    assert encoder.pooling == "prompt" and encoder.prompt == UNSUP_EVAL


def test_promptbert_on_nli_trains_prompt_berts_supervised_loss(still_model):
    encoder = Encoder.from_pretrained(str(still_model))
    triplets = [(TEXTS[i], TEXTS[i + 1], TEXTS[i + 2]) for i in range(0, 12, 3)]
    config = train_config("nli", objective="promptbert", batch_size=4, steps=2, bf16=False)
    trainer = Trainer(encoder, config, triplets, DEV, progress=False)
    trainer._set_dropout()
    ours = trainer.loss(trainer.representations(triplets))
    with torch.no_grad():
        expected = PromptBERTByHand(encoder.model, encoder.tokenizer, [RUN_SH_TEMPLATE]).sup_loss(triplets)
    torch.testing.assert_close(ours.detach(), expected, atol=1e-5, rtol=1e-5)
    # eval_only.sh sup-bert: the same template with the delta.
    assert encoder.prompt == PromptSettings(UNSUP_EVAL.template, denoise=True, add_period=True)


def test_promptbert_with_gradient_caching_gives_the_gradient_of_one_large_batch(still_model):
    """grad_accum replays each micro-batch's templates and deltas: the gradient equals one batch's (negatives and
    the delta's pass included). Gradients, not weights after a step: Adam's first step is lr * sign(g), which
    turns float noise in the near-zero gradients of rarely used position rows into lr-sized differences."""

    def gradients(grad_accum: int) -> dict[str, torch.Tensor]:
        encoder = Encoder.from_pretrained(str(still_model))
        config = train_config(preset="promptbert", grad_accum=grad_accum, batch_size=8, steps=2, bf16=False)
        trainer = Trainer(encoder, config, TEXTS, DEV, progress=False)
        trainer._set_dropout()
        items = trainer._rank_items(trainer.order.indices(0))
        if grad_accum == 1:
            trainer.loss(trainer.representations(items)).backward()
        else:
            trainer.criterion(items).backward()  # GradCache over grad_accum micro-batches
        named = [*encoder.model.named_parameters(), *trainer.objective.named_parameters(prefix="head")]
        return {name: p.grad.clone() for name, p in named if p.grad is not None}

    whole, cached = gradients(1), gradients(4)
    assert set(whole) == set(cached) and "head.projection.dense.weight" in whole
    for key, value in whole.items():
        torch.testing.assert_close(cached[key], value, atol=1e-6, rtol=1e-4, msg=key)
    assert float(whole["embeddings.position_embeddings.weight"].abs().sum()) > 0


def test_a_promptbert_transfer_saves_and_selects_with_its_prompt_pooling(still_model, tmp_path, monkeypatch):
    """Two steps of `stages.transfer --preset promptbert`: STS-B dev during training and the saved folder both use
    the prompt pooling, and `stages.evaluate` scores the folder with it (not last-avg)."""
    import stages.evaluate as evaluate
    from sentcl.training.data import stsb_dev
    from stages import transfer
    from stages.common import load_params
    from stages.training import load_pairs
    from tests.unit.evaluation.test_sts_benchmark import write_mini_senteval

    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    processed = write_tiny_processed(tmp_path / "processed")
    out, metrics = tmp_path / "promptbert", tmp_path / "metrics"
    # 50 words: inside max_length 64 alone, not inside the ~24-token template (texts_truncated counts the room left).
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join([*tiny_sentences(31, seed=5), " ".join(["dog"] * 50)]) + "\n")
    argv = ["--init", str(still_model), "--preset", "promptbert", "--steps", "2", "--texts", str(texts)]
    argv += ["--processed", str(processed), "--output", str(out), "--metrics-dir", str(metrics)]
    transfer.main([*argv, "--checkpoints-dir", str(tmp_path / "checkpoints")])

    assert read_model_pooling(out) == ModelPooling("prompt", UNSUP_EVAL)
    with open(metrics / "curves" / "transfer-custom.csv") as f:
        rows = list(csv.DictReader(f))
    dev_pairs = stsb_dev(load_pairs(processed))
    max_length = load_params()["model"]["max_length"]

    def dev_score(folder, **pooling) -> float:
        encoder = Encoder.from_pretrained(str(folder), max_length=max_length, **pooling)
        return STSEvaluator(dev_pairs, "dev")(lambda s: encoder.encode(s, batch_size=128))

    init_prompt = dev_score(still_model, pooling="prompt", prompt=UNSUP_EVAL)
    init_mean = dev_score(still_model, pooling="last-avg")
    assert abs(init_prompt - init_mean) > 0.1  # the two poolings rank the dev pairs differently
    assert float(rows[0]["stsb_dev"]) == pytest.approx(init_prompt, abs=1e-6)  # the trainer's step-0 score
    record = json.loads((metrics / "train" / "transfer-custom.json").read_text())
    assert dev_score(out) == pytest.approx(
        record["stsb_dev_best"], abs=0.006
    )  # the folder, with its own pooling
    assert record["texts_truncated"] == 1 and record["examples"] == 32

    data = tmp_path / "senteval"
    write_mini_senteval(data)
    # params' pooling for folders that carry none: a different template, so a fallback would show.
    params = {"evaluate": {"backend": "torch", "prompt": {"template": "[X] [MASK]", "denoise": False}}}
    monkeypatch.setattr(evaluate, "load_params", lambda *args, **kwargs: params)
    written = tmp_path / "sts.json"
    argv = ["--model", f"p={out}", "--data", str(data), "--output", str(written), "--backend", "torch"]
    evaluate.main([*argv, "--no-progress"])
    scored = json.loads(written.read_text())["p"]
    assert scored["pooling"] == "prompt" and scored["prompt"] == asdict(UNSUP_EVAL)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"prompt": {"templatez": []}}, "command line.prompt: unknown key 'templatez'"),
        ({"prompt": {"saved": {"pooling": "cls"}}}, "command line.prompt.saved: unknown key 'pooling'"),
        ({"prompt": {"templates": ["no slot [MASK]"]}}, "prompt.templates: prompt template 'no slot [MASK]'"),
        ({"prompt": {"templates": ["[X] [MASK]"]}}, "prompt.templates: 2 with objective promptbert"),
        ({"mode": "nli"}, "preset: 'promptbert' runs in transfer mode, not nli"),
        ({"preset": None, "objective": "promptbert"}, "views: none, none with objective promptbert"),
    ],
)
def test_promptbert_settings_fail_in_one_line_naming_the_key(overrides, message, capsys):
    values = {"mode": "transfer", "preset": "promptbert", **overrides}
    with pytest.raises(SystemExit) as stop:
        train_config(values.pop("mode"), **values)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_max_length_without_room_for_the_sentence_stops_before_training(still_model):
    encoder = Encoder.from_pretrained(str(still_model))
    config = train_config(preset="promptbert", max_length=12, bf16=False)  # the templates are ~24 tiny tokens
    with pytest.raises(ValueError, match="max_length 12 leaves no room for a sentence"):
        Trainer(encoder, config, TEXTS, DEV, progress=False)
