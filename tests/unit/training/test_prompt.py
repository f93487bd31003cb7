"""PromptBERT pooling, denoising and the prompt contrastive loss on a tiny masked-LM BERT, checked against
forward passes and arithmetic written out by hand from kongds/Prompt-BERT (prompt_bert/models.py, train.py,
evaluation.py), not against this package's own output."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sentcl.evaluation.models import CHECKPOINTS
from sentcl.model.encoder import Encoder, resolve_model_path
from sentcl.model.fast_encode import FastEncoder
from sentcl.model.pooling import (
    POOLING_FILE,
    ModelPooling,
    PromptSettings,
    read_model_pooling,
)
from sentcl.model.prompt import (
    PAPER_TEMPLATE,
    PAPER_TRAIN_TEMPLATES,
    NoMaskTokenError,
    PromptPooler,
    template_ids,
)
from sentcl.params import write_params
from sentcl.training.objectives.promptbert import MLPHead, PromptContrastiveLoss
from tests.unit.evaluation.test_sts_benchmark import make_tiny_model, split_inputs, write_mini_senteval

TEMPLATE = PAPER_TEMPLATE  # This sentence : "[X]" means [MASK] .


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, model, tokenizer) of a tiny BERT without dropout, so two passes over the same input agree."""
    from transformers import AutoModel, AutoTokenizer

    folder = make_tiny_model(tmp_path_factory.mktemp("prompt-model"))
    model = AutoModel.from_pretrained(folder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return folder, model.eval(), AutoTokenizer.from_pretrained(folder)


def by_hand_ids(tokenizer, template: str, sentence: str) -> list[int]:
    """The authors' evaluation.py way: the whole filled-in template through the tokenizer in one call."""
    return tokenizer(template.replace("[X]", sentence))["input_ids"]


def hand_delta(model, tokenizer, template: str, length: int) -> torch.Tensor:
    """evaluation.py ``get_delta`` for one length: the template with an empty slot, positions after the
    prefix (with [CLS]) moved ``length`` on; the state at [MASK]."""
    before = template.split("[X]")[0]
    bs_length = len(tokenizer(before.strip())["input_ids"]) - 2 + 1
    ids = torch.tensor([tokenizer(template.replace("[X]", ""))["input_ids"]])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    positions[:, bs_length:] += length
    hidden = model(input_ids=ids, position_ids=positions).last_hidden_state
    return hidden[ids == tokenizer.mask_token_id][0]


def hand_state(model, tokenizer, ids: list[int]) -> torch.Tensor:
    ids_t = torch.tensor([ids])
    hidden = model(input_ids=ids_t).last_hidden_state
    return hidden[0, ids.index(tokenizer.mask_token_id)]


def test_representation_is_the_hidden_state_at_the_shifted_mask(tiny):
    _, model, tokenizer = tiny
    pooler = PromptPooler(tokenizer, PromptSettings(TEMPLATE), max_length=64)
    short, long = "dog", "zebra quartz"  # 1 token; 2 words spelled in ~11 word pieces
    ids_short, ids_long = by_hand_ids(tokenizer, TEMPLATE, short), by_hand_ids(tokenizer, TEMPLATE, long)
    shift = ids_long.index(tokenizer.mask_token_id) - ids_short.index(tokenizer.mask_token_id)
    assert shift == len(tokenizer.tokenize(long)) - 1 >= 5
    with torch.no_grad():
        batch = pooler.tokenize([short, long])  # one padded batch: the short row has padding
        assert batch["input_ids"][1].tolist() == ids_long
        got = pooler(model, batch["input_ids"], batch["attention_mask"])
        expected = torch.stack(
            [hand_state(model, tokenizer, ids_short), hand_state(model, tokenizer, ids_long)]
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_denoising_subtracts_the_empty_template_state_at_the_sentence_length(tiny):
    _, model, tokenizer = tiny
    pooler = PromptPooler(tokenizer, PromptSettings(TEMPLATE, denoise=True), max_length=64)
    sentences = ["a man is playing a guitar", "two dogs"]
    with torch.no_grad():
        batch = pooler.tokenize(sentences)
        got = pooler(model, batch["input_ids"], batch["attention_mask"])
        for row, sentence in enumerate(sentences):
            length = len(tokenizer.tokenize(sentence))
            state = hand_state(model, tokenizer, by_hand_ids(tokenizer, TEMPLATE, sentence))
            expected = state - hand_delta(model, tokenizer, TEMPLATE, length)
            torch.testing.assert_close(got[row], expected, atol=1e-5, rtol=1e-5)
        # The delta is the template's own [MASK] state: an empty sentence denoises to zero.
        empty = pooler.tokenize([""])
        zero = pooler(model, empty["input_ids"], empty["attention_mask"])
    assert float(zero.abs().max()) < 1e-5


def test_a_long_sentence_is_cut_inside_the_template(tiny):
    _, _, tokenizer = tiny
    template = template_ids(tokenizer, TEMPLATE)
    pooler = PromptPooler(tokenizer, PromptSettings(TEMPLATE), max_length=32)
    sentence = " ".join(["man dog cat"] * 20)
    (row,) = pooler.token_ids([sentence])
    assert len(row) == 32
    whole = by_hand_ids(tokenizer, TEMPLATE, sentence)
    prefix_len = whole.index(tokenizer.convert_tokens_to_ids('"')) + 1
    suffix_len = len(tokenizer.tokenize('" means [MASK] .')) + 1  # and [SEP]
    assert row[:prefix_len] == whole[:prefix_len]  # [CLS] this sentence : "
    assert row[-suffix_len:] == whole[-suffix_len:]  # " means [MASK] . [SEP]
    assert row.count(tokenizer.mask_token_id) == 1
    kept = 32 - prefix_len - suffix_len
    assert row[prefix_len:-suffix_len] == tokenizer(sentence, add_special_tokens=False)["input_ids"][:kept]
    with pytest.raises(ValueError, match="no room"):
        PromptPooler(tokenizer, PromptSettings(TEMPLATE), max_length=template.length).token_ids(["a"])


def test_the_bundled_minilm_tokenizer_has_a_mask_and_a_tokenizer_without_one_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    bundled = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    ids = template_ids(bundled, TEMPLATE)
    assert ids.prefix == tuple(bundled.convert_tokens_to_ids(["[CLS]", "this", "sentence", ":", '"']))
    assert ids.suffix == tuple(bundled.convert_tokens_to_ids(['"', "means", "[MASK]", ".", "[SEP]"]))

    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    no_mask = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="[UNK]", pad_token="[PAD]")
    with pytest.raises(NoMaskTokenError, match="no(ne| mask)"):
        template_ids(no_mask, TEMPLATE)
    with pytest.raises(ValueError, match="exactly one"):
        PromptSettings("no slot here [MASK]")


def authors_loss(model, tokenizer, sentences, templates, temperature, head=None):
    """models.py ``cl_forward`` + train.py ``prepare_features`` transcribed: bs/es around the truncated sentence,
    one forward for both views, delta/delta1 from ``get_delta`` (50 lengths), ``blen`` per template, the MLP,
    cos/temp and cross-entropy with labels arange."""

    def parts(template):
        before, after = template.split("[X]")
        bs = tokenizer.encode(before.strip())[:-1]
        es = tokenizer.encode(after.replace("[MASK]", tokenizer.mask_token).strip())[1:]
        return bs, es

    def get_delta(bs, es, length=50):
        ids = torch.tensor([bs + es]).repeat(length, 1)
        positions = torch.arange(ids.shape[1]).unsqueeze(0).repeat(length, 1)
        positions[:, len(bs) :] += torch.arange(length).unsqueeze(-1)  # len(cls.bs)+1 with bs holding [CLS]
        hidden = model(input_ids=ids, position_ids=positions).last_hidden_state
        return hidden[ids == tokenizer.mask_token_id], ids.shape[1]

    (bs1, es1), (bs2, es2) = parts(templates[0]), parts(templates[1])
    delta, template_len = get_delta(bs1, es1)
    delta1, template_len1 = get_delta(bs2, es2)
    rows = []
    for bs, es in ((bs1, es1), (bs2, es2)):
        for s in sentences:
            rows.append(bs + tokenizer.encode(s, add_special_tokens=False)[:32] + es)
    ml = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (ml - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (ml - len(r)) for r in rows])
    hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    pooler_output = hidden[input_ids == tokenizer.mask_token_id]
    n = len(sentences)
    blen = attention_mask.sum(-1)
    first = pooler_output[:n] - delta[blen[:n] - template_len]
    second = pooler_output[n:] - delta1[blen[n:] - template_len1]
    if head is not None:
        first, second = head(first), head(second)
    cos_sim = F.cosine_similarity(first.unsqueeze(1), second.unsqueeze(0), dim=-1) / temperature
    return F.cross_entropy(cos_sim, torch.arange(n))


def test_prompt_contrastive_loss_and_its_gradient_match_the_authors_arithmetic(tiny):
    _, model, tokenizer = tiny
    sentences = ["a man is playing a guitar", "two dogs", "a woman riding a horse on the street", "cat"]
    torch.manual_seed(0)
    head = MLPHead(model.config.hidden_size)
    loss_fn = PromptContrastiveLoss(
        tokenizer, PAPER_TRAIN_TEMPLATES, temperature=0.05, max_length=64, head=head
    )

    model.zero_grad()
    ours = loss_fn(model, sentences)
    ours.backward()
    grad_ours = model.embeddings.position_embeddings.weight.grad.clone()
    model.zero_grad()
    theirs = authors_loss(model, tokenizer, sentences, PAPER_TRAIN_TEMPLATES, 0.05, head)
    theirs.backward()
    grad_theirs = model.embeddings.position_embeddings.weight.grad.clone()
    model.zero_grad()
    assert float(ours) > 0
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # The gradient flows through the delta's pass too (delta_freeze off), which touches positions past the
    # sentence rows' own: equal gradients there show the delta was not detached.
    torch.testing.assert_close(grad_ours, grad_theirs, atol=1e-5, rtol=1e-4)
    assert float(grad_ours.abs().sum()) > 0


def test_a_prompt_model_folder_carries_its_pooling_to_encoder_fast_encoder_and_onnx(tiny, tmp_path):
    folder, _, _ = tiny
    settings = PromptSettings(PAPER_TRAIN_TEMPLATES[0], denoise=True, add_period=True)
    saved = tmp_path / "prompt-model"
    Encoder.from_pretrained(str(folder), pooling="prompt", prompt=settings).save(saved)
    assert read_model_pooling(saved) == ModelPooling("prompt", settings)
    assert json.loads((saved / POOLING_FILE).read_text())["prompt"]["template"] == PAPER_TRAIN_TEMPLATES[0]

    loaded = Encoder.from_pretrained(str(saved), max_length=32)
    assert loaded.pooling == "prompt" and loaded.prompt == settings
    sentences = ["a man is playing a guitar", "two dogs run", "x " * 40, "a cat?"]
    reference = loaded.encode(sentences)
    for backend in ("torch", "onnx"):
        fast = FastEncoder(saved, pooling="prompt", prompt=settings, max_length=32, backend=backend)
        assert fast.backend == backend  # the ONNX graph holds the [MASK] gather and the delta table
        np.testing.assert_allclose(fast(sentences), reference, atol=1e-4)
    # Saving it again with mean pooling removes the stale file.
    loaded.pooling, loaded.prompt = "last-avg", None
    loaded.save(saved)
    assert read_model_pooling(saved) is None


def test_evaluate_scores_a_prompt_folder_with_its_own_pooling_unless_a_flag_says_otherwise(
    tiny, tmp_path, monkeypatch
):
    import stages.evaluate as stage
    from sentcl.evaluation.models import evaluate_model

    folder, _, _ = tiny
    data = tmp_path / "senteval"
    write_mini_senteval(data)
    models, metrics = tmp_path / "models", tmp_path / "metrics"
    for name in CHECKPOINTS:
        shutil.copytree(folder, models / name)
    own = PromptSettings(PAPER_TRAIN_TEMPLATES[0], denoise=True)
    Encoder.from_pretrained(str(folder), pooling="prompt", prompt=own).save(models / "transfer-base")
    monkeypatch.setattr(stage, "MODELS", models)
    monkeypatch.setattr(stage, "METRICS", metrics)
    split_inputs(stage, tmp_path, monkeypatch)
    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    params = {"evaluate": {"backend": "torch", "prompt": {"template": PAPER_TEMPLATE, "denoise": False}}}
    params["model"] = {"max_length": 32}
    results = stage.run_pipeline(params, data, None, None)
    assert results["transfer-base"]["pooling"] == "prompt" and results["base"]["pooling"] == "last-avg"
    benchmark = stage.load_benchmark(data)
    by_prompt = evaluate_model(models / "transfer-base", benchmark, "prompt", "torch", prompt=own)
    by_mean = evaluate_model(models / "transfer-base", benchmark, "last-avg", "torch")
    assert results["transfer-base"]["all"] == by_prompt["all"] != by_mean["all"]

    # Standalone: the folder's own pooling, a --pooling flag for all, --no-denoise on the folder's prompt.
    out = tmp_path / "out.json"
    argv = [
        "--model",
        f"p={models / 'transfer-base'}",
        "--model",
        f"m={models / 'base'}",
        "--data",
        str(data),
        "--params",
        str(write_params(params, tmp_path / "params.yaml").file),
    ]
    stage.main([*argv, "--output", str(out), "--backend", "torch", "--no-progress"])
    written = json.loads(out.read_text())
    assert written["p"]["pooling"] == "prompt" and written["p"]["all"] == by_prompt["all"]
    assert written["m"]["pooling"] == "last-avg"
    stage.main([*argv, "--output", str(out), "--backend", "torch", "--no-progress", "--pooling", "last-avg"])
    assert json.loads(out.read_text())["p"]["all"] == by_mean["all"]
    stage.main([*argv, "--output", str(out), "--backend", "torch", "--no-progress", "--no-denoise"])
    written = json.loads(out.read_text())
    assert written["p"]["prompt"] == {
        "template": PAPER_TRAIN_TEMPLATES[0],
        "denoise": False,
        "add_period": False,
    }
    stage.main([*argv, "--output", str(out), "--backend", "torch", "--no-progress", "--pooling", "prompt"])
    written = json.loads(out.read_text())
    assert written["m"]["prompt"]["template"] == PAPER_TEMPLATE and written["m"]["pooling"] == "prompt"


def test_export_onnx_pyfunc_and_embed_serve_a_prompt_folder_with_its_pooling(tiny, tmp_path):
    import onnxruntime as ort

    from sentcl.model.embedding_io import embed
    from sentcl.model.folder import model_max_length
    from sentcl.registry.release import export_onnx
    from sentcl_mlflow.pyfunc_encoder import SentenceEncoderModel

    folder, _, _ = tiny
    settings = PromptSettings(PAPER_TRAIN_TEMPLATES[0], denoise=True, add_period=True)
    saved = tmp_path / "prompt-model"
    Encoder.from_pretrained(str(folder), pooling="prompt", prompt=settings).save(saved)
    sentences = ["a man is playing a guitar", "two dogs run", "x " * 40, "a cat?", ""]
    encoder = Encoder.from_pretrained(str(saved), max_length=model_max_length(saved))
    # The prompt vector by hand: the state at the mask of the filled-in template minus the empty template's.
    with torch.no_grad():
        ids = by_hand_ids(encoder.tokenizer, settings.template, "two dogs run.")
        length = len(encoder.tokenizer.tokenize("two dogs run."))
        by_hand = hand_state(encoder.model, encoder.tokenizer, ids) - hand_delta(
            encoder.model, encoder.tokenizer, settings.template, length
        )
    expected = encoder.encode(sentences)
    np.testing.assert_allclose(expected[1], by_hand.numpy(), atol=1e-5)

    class Context:
        artifacts = {"encoder": str(saved)}

    served = SentenceEncoderModel()
    served.load_context(Context())
    np.testing.assert_allclose(served.predict(None, sentences), expected, atol=1e-5)

    embed(sentences, tmp_path / "vectors.npy", saved, max_batch=2, progress=False)
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), expected, atol=1e-5)

    report = export_onnx(saved, model_max_length(saved))
    assert report["pooling"] == "prompt" and report["prompt"]["template"] == settings.template
    session = ort.InferenceSession(str(saved / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    batch = encoder.tokenize(sentences)
    onnx_vectors = session.run(
        None, {"input_ids": batch["input_ids"].numpy(), "attention_mask": batch["attention_mask"].numpy()}
    )[0]
    np.testing.assert_allclose(onnx_vectors, expected, atol=1e-4)


def test_the_promptbert_objective_piece_gives_the_pure_loss_through_the_trainers_embedder(tiny):
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.promptbert import PromptBERTObjective
    from sentcl.training.views import ViewConfig

    folder, model, tokenizer = tiny
    encoder = Encoder(model, tokenizer, max_length=64)
    view = ViewConfig(0.15, 0.2, 0.2, 0.15, 0.15, 1.0, 0.32)
    embed = Embedder(encoder, view, torch.Generator().manual_seed(0), torch.device("cpu"))
    torch.manual_seed(0)
    head = MLPHead(model.config.hidden_size)
    sentences = ["a man is playing a guitar", "two dogs", "a woman riding a horse on the street", "cat"]
    objective = PromptBERTObjective(tokenizer, PAPER_TRAIN_TEMPLATES, 0.05, True, 64, projection=head)
    with torch.no_grad():
        loss = objective.loss(objective.representations(embed, sentences))
        theirs = authors_loss(model, tokenizer, sentences, PAPER_TRAIN_TEMPLATES, 0.05, head)
    torch.testing.assert_close(loss, theirs, atol=1e-5, rtol=1e-5)
    # Supervised: (premise, entailment, contradiction) under one template, denoised, supervised SimCSE.
    sup = PromptBERTObjective(tokenizer, PAPER_TRAIN_TEMPLATES[:1], 0.05, True, 64, examples="triplets")
    triplets = [
        ("a man", "a boy", "a cat"),
        ("two dogs", "dogs", "a car"),
        ("red ball", "a ball", "blue water"),
    ]
    with torch.no_grad():
        reps = sup.representations(embed, triplets)
        pooler = PromptPooler(tokenizer, PromptSettings(PAPER_TRAIN_TEMPLATES[0], denoise=True), 64)
        batch = pooler.tokenize([t[1] for t in triplets])
        positive = pooler(model, batch["input_ids"], batch["attention_mask"])
        torch.testing.assert_close(reps["positive"], positive, atol=1e-5, rtol=1e-5)
        z1, z2, z3 = reps["anchor"], reps["positive"], reps["negative"]
        cos = F.cosine_similarity(z1.unsqueeze(1), torch.cat([z2, z3]).unsqueeze(0), dim=-1) / 0.05
        torch.testing.assert_close(
            sup.loss(reps), F.cross_entropy(cos, torch.arange(3)), atol=1e-5, rtol=1e-5
        )
