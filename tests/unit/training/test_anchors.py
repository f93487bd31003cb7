"""Where sentcl follows its anchors' code line by line, checked against independent transcriptions on tiny models.

ConSERT (yym6472/ConSERT): the contrastive-adversarial view (``sentence_transformers/losses/AdvCLSoftmaxLoss.py``
``forward`` with ``data_augmentation_strategy == "adv"``), span pooling (``transformers/modeling_bert.py``
``_sample_span`` inside ``BertModel.forward``, pooling in sentence-transformers' ``Pooling`` with the features'
own mask), shuffle (``_replace_position_ids``), the optimizer and schedule of sentence-transformers 0.3 ``fit``
(``sentence_transformers/SentenceTransformer.py``, ``main.py``; transformers 3.x ``AdamW``). ESimCSE
(caskcsg/sentemb ``ESimCSE/esimcse/models.py``, ``trainers.py`` ``compute_loss``): the momentum queue.
Prompt-BERT (kongds/Prompt-BERT ``prompt_bert/models.py``): dropout in the delta pass.
The transcriptions use the anchors' variable names and never call the sentcl function they check.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sentcl.model.encoder import Encoder
from sentcl.training.objectives.base import Embedder
from sentcl.training.objectives.factory import build_objective
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, train_config

PAIRS = [
    ("a man is playing a guitar", "a man plays", 0),
    ("two dogs on the street", "a cat", 2),
    ("the woman is riding a red horse", "a woman rides", 0),
    ("children playing ball", "kids are sitting", 1),
]


def mean_pool(last_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers 0.3 ``Pooling`` (mean tokens): sum of masked states over the mask's sum."""
    m = mask.unsqueeze(-1).float()
    return (last_hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def reps_to_output(linear: torch.nn.Linear, rep_a: torch.Tensor, rep_b: torch.Tensor) -> torch.Tensor:
    """AdvCLSoftmaxLoss._reps_to_output with --concatenation_sent_max_square."""
    vectors_concat = [rep_a, rep_b, torch.abs(rep_a - rep_b), torch.max(rep_a, rep_b).pow(2)]
    return linear(torch.cat(vectors_concat, 1))


# --- the adversarial view -----------------------------------------------------------------------------------


def consert_adv_forward(model, linear, batch_a, batch_b, labels, noise_norm):
    """AdvCLSoftmaxLoss.forward, the "adv" branch (steps 1-3), with BertModel's ``_most_recent_embedding_output``
    and ``_replace_embedding_output`` (flag ``data_aug_adv``) as a forward hook on the embeddings module.
    Returns rep_a, rep_b, adv_rep_a, adv_rep_b."""

    def run(feature, noise_embedding=None):
        recorded = []

        def hook(_module, _args, embedding_output):
            recorded.append(embedding_output)  # self._most_recent_embedding_output = embedding_output
            return embedding_output if noise_embedding is None else noise_embedding

        handle = model.embeddings.register_forward_hook(hook)
        try:
            out = model(input_ids=feature["input_ids"], attention_mask=feature["attention_mask"])
        finally:
            handle.remove()
        return mean_pool(out.last_hidden_state, feature["attention_mask"]), recorded[0]

    # 1. normal forward
    rep_a, embedding_output_a = run(batch_a)
    rep_b, embedding_output_b = run(batch_b)
    output = reps_to_output(linear, rep_a, rep_b)
    normal_loss = F.cross_entropy(output, labels.view(-1))
    # 2. adversarial backward (the anchor zeroes the parameters' gradients afterwards: autograd.grad never sets them)
    unnormalized_noise_a, unnormalized_noise_b = torch.autograd.grad(
        normal_loss, [embedding_output_a, embedding_output_b], retain_graph=True
    )
    norm_a = unnormalized_noise_a.norm(p=2, dim=-1)
    normalized_noise_a = unnormalized_noise_a / (norm_a.unsqueeze(dim=-1) + 1e-10)
    norm_b = unnormalized_noise_b.norm(p=2, dim=-1)
    normalized_noise_b = unnormalized_noise_b / (norm_b.unsqueeze(dim=-1) + 1e-10)
    noise_a = noise_norm * normalized_noise_a
    noise_b = noise_norm * normalized_noise_b
    # 3. adversarial forward
    noise_embedding_a = embedding_output_a + noise_a
    noise_embedding_b = embedding_output_b + noise_b
    adv_rep_a, _ = run(batch_a, noise_embedding_a)
    adv_rep_b, _ = run(batch_b, noise_embedding_b)
    return rep_a, rep_b, adv_rep_a, adv_rep_b


def consert_contrastive(hidden1, hidden2, temperature):
    """AdvCLSoftmaxLoss._contrastive_loss_forward (nt_xent, do_hidden_normalization)."""
    batch_size = hidden1.shape[0]
    hidden1, hidden2 = F.normalize(hidden1, p=2, dim=-1), F.normalize(hidden2, p=2, dim=-1)
    labels = torch.arange(0, batch_size)
    masks = F.one_hot(torch.arange(0, batch_size), num_classes=batch_size).float()
    logits_aa = hidden1 @ hidden1.T / temperature - masks * 1e9
    logits_bb = hidden2 @ hidden2.T / temperature - masks * 1e9
    logits_ab = hidden1 @ hidden2.T / temperature
    logits_ba = hidden2 @ hidden1.T / temperature
    loss_a = F.cross_entropy(torch.cat([logits_ab, logits_aa], dim=1), labels)
    loss_b = F.cross_entropy(torch.cat([logits_ba, logits_bb], dim=1), labels)
    return loss_a + loss_b


def test_adversarial_default_is_consert_noise_norm():
    # AdvCLSoftmaxLoss.__init__ noise_norm=0.01; main.py passes --noise_norm only with --adv_training, which the
    # contrastive-adversarial path (--add_cl, data_augmentation_strategy adv) does not set.
    assert train_config(mode="joint").view.adversarial_eps == 0.01


def test_adversarial_view_equals_consert_adv_branch_reps_loss_and_gradients(tmp_path):
    """On a model without dropout: the four representations, the joint loss and every parameter's gradient equal
    the anchor's arithmetic (noise along the CE gradient at the embedding output, added to the clean pass's
    embedding output with its graph), with a noise large enough that its direction matters."""
    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.0)))
    eps = 0.5
    config = train_config(
        mode="joint",
        views=("none", "adversarial"),
        view={"adversarial_eps": eps},
        max_square=True,
        alpha=0.15,
    )
    objective = build_objective(config, encoder.dim)
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    encoder.model.train()
    reps = objective.representations(embed, PAIRS)
    loss = objective.loss(reps)

    linear = objective.classifier.head.linear
    labels = torch.tensor([label for _, _, label in PAIRS])
    batch_a = encoder.tokenize([p for p, _, _ in PAIRS])
    batch_b = encoder.tokenize([h for _, h, _ in PAIRS])
    rep_a, rep_b, adv_rep_a, adv_rep_b = consert_adv_forward(
        encoder.model, linear, batch_a, batch_b, labels, eps
    )
    for got, want in (
        (reps["u"], rep_a),
        (reps["v"], rep_b),
        (reps["p2"], adv_rep_a),
        (reps["h2"], adv_rep_b),
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # The noise moves the representations (so the comparison above checks its direction).
    assert (adv_rep_a - rep_a).norm() > 10 * 1e-5
    # final_loss = loss_n_n + cl_rate * (contrastive_loss_a + contrastive_loss_b)
    loss_n_n = F.cross_entropy(reps_to_output(linear, rep_a, rep_b), labels)
    final_loss = loss_n_n + 0.15 * (
        consert_contrastive(rep_a, adv_rep_a, 0.1) + consert_contrastive(rep_b, adv_rep_b, 0.1)
    )
    torch.testing.assert_close(loss, final_loss, rtol=1e-4, atol=1e-5)
    params = [p for p in encoder.model.parameters() if p.requires_grad] + list(linear.parameters())
    got = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    want = torch.autograd.grad(final_loss, params, allow_unused=True)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or not g.abs().any()
        else:
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-6)


def test_adversarial_pass_adds_the_noise_to_the_clean_pass_embedding_output(tmp_path):
    """With dropout on, the adversarial pass's first-layer input is the clean pass's plus eps * g / ||g||, g the
    CE loss's gradient there: not a fresh embedding pass with another dropout mask (AdvCLSoftmaxLoss step 3)."""
    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.3)))
    eps = 0.01
    config = train_config(
        mode="joint", views=("none", "adversarial"), view={"adversarial_eps": eps}, max_square=True
    )
    objective = build_objective(config, encoder.dim)
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    encoder.model.train()
    seen: list[torch.Tensor] = []
    handle = encoder.model.encoder.layer[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        reps = objective.representations(embed, PAIRS)
    finally:
        handle.remove()
    assert len(seen) == 2
    clean, adversarial = seen
    ce = F.cross_entropy(
        reps_to_output(objective.classifier.head.linear, reps["u"], reps["v"]), reps["labels"]
    )
    (g,) = torch.autograd.grad(ce, clean, retain_graph=True)
    expected = clean + eps * g / (g.norm(p=2, dim=-1, keepdim=True) + 1e-10)
    torch.testing.assert_close(adversarial, expected, rtol=0, atol=1e-6)
    # Real tokens move by exactly eps each (the noise is normalised per token).
    mask = embed.tokenize([p for p, _, _ in PAIRS] + [h for _, h, _ in PAIRS])["attention_mask"].bool()
    moved = (adversarial - clean).norm(dim=-1)[mask]
    torch.testing.assert_close(moved, torch.full_like(moved, eps), rtol=1e-3, atol=1e-6)


# --- ESimCSE's momentum queue -------------------------------------------------------------------------------


def esimcse_entries(model, params, sentences, tokenizer, dense):
    """trainers.py compute_loss: ``model.eval()``, then models.py cl_forward with ``disable_dropout`` and
    ``momentum > 0``: the momentum model (``params``) on the sentences, pooled (sentcl: mean, the training
    pooling; the anchor: cls), then ``cls.mlp`` (dense + tanh), ``.clone().detach()``."""
    import copy

    momentum_model = copy.deepcopy(model)
    with torch.no_grad():
        for param_m, value in zip(momentum_model.parameters(), params, strict=True):
            param_m.copy_(value)
        momentum_model.eval()
        feature = tokenizer(
            list(sentences), padding=True, truncation=True, max_length=32, return_tensors="pt"
        )
        out = momentum_model(input_ids=feature["input_ids"], attention_mask=feature["attention_mask"])
        pooler_output = mean_pool(out.last_hidden_state, feature["attention_mask"])
        return torch.tanh(F.linear(pooler_output, dense["weight"], dense["bias"])).clone().detach()


def test_esimcse_queue_momentum_rule_eval_mode_projection_order_and_cap(tmp_path):
    from sentcl.training.trainer import Trainer
    from tests.tiny import tiny_sentences

    texts = tiny_sentences(16, seed=3)
    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.2)))
    momentum, neg_size, bs = 0.5, 6, 4
    config = train_config(
        loss="info_nce",
        views=("none", "word_repetition"),
        temperature=0.05,
        encoder_dropout=True,
        alpha=1.0,
        projection=True,
        queue_size=neg_size,
        momentum=momentum,
        batch_size=bs,
        steps=3,
        lr=1e-2,
        warmup_ratio=0.0,
        bf16=False,
    )
    trainer = Trainer(encoder, config, texts, [(texts[0], texts[1], 1.0)] * 3, progress=False)
    received: list[torch.Tensor] = []
    loss_fn = trainer.objective.loss

    def spy(reps, negatives=None):  # the real loss, recording the queue it was given
        received.append(negatives.detach().clone())
        return loss_fn(reps, negatives)

    trainer.objective.loss = spy

    def snapshot():
        params = [p.detach().clone() for p in encoder.model.parameters()]
        dense = {k: v.detach().clone() for k, v in trainer.objective.projection.dense.state_dict().items()}
        return params, dense

    p0, dense0 = snapshot()
    m0 = p0  # the momentum model starts as a copy of the encoder
    items1 = trainer._rank_items(trainer.order.indices(0))
    trainer.train_step(items1, 1)
    # models.py: param_m.data = param_m.data * momentum + param.data * (1. - momentum), param before the step
    m1 = [m * momentum + p * (1 - momentum) for m, p in zip(m0, p0, strict=True)]
    pre_z1 = esimcse_entries(encoder.model, m1, items1, encoder.tokenizer, dense0)
    assert received[0].shape[0] == 0  # step 1: pre_z1 is None, no queue term
    torch.testing.assert_close(trainer.queue.negatives, pre_z1, rtol=1e-5, atol=1e-6)

    p1, dense1 = snapshot()
    assert any(not torch.equal(a, b) for a, b in zip(p0, p1, strict=True))  # the step moved the encoder
    items2 = trainer._rank_items(trainer.order.indices(1))
    trainer.train_step(items2, 2)
    m2 = [m * momentum + p * (1 - momentum) for m, p in zip(m1, p1, strict=True)]
    eval_z = esimcse_entries(encoder.model, m2, items2, encoder.tokenizer, dense1)
    # The loss of step 2 read the queue as it was (step 1's entries), then step 2's were pushed:
    # self.pre_z1 = torch.cat((self.pre_z1, eval_z.clone()), 0)[-neg_size:]
    torch.testing.assert_close(received[1], pre_z1, rtol=1e-5, atol=1e-6)
    expected = torch.cat((pre_z1, eval_z), 0)[-neg_size:]
    assert trainer.queue.negatives.shape == (neg_size, encoder.dim)
    torch.testing.assert_close(trainer.queue.negatives, expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(trainer.queue.model.parameters(), m2, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert not trainer.queue.model.training  # eval mode: no dropout in the momentum encoder


# --- ConSERT's optimizer and schedule (sentence-transformers 0.3 fit) -----------------------------------------


def transformers3_adamw_step(params, grads, state, lr, weight_decay, betas=(0.9, 0.999), eps=1e-6):
    """transformers 3.x ``AdamW.step`` with ``correct_bias=False`` (ConSERT transformers/optimization.py)."""
    import math

    for p, grad in zip(params, grads, strict=True):
        st = state.setdefault(id(p), {})
        if len(st) == 0:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p.data)
            st["exp_avg_sq"] = torch.zeros_like(p.data)
        exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
        beta1, beta2 = betas
        st["step"] += 1
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        denom = exp_avg_sq.sqrt().add_(eps)
        step_size = lr
        correct_bias = False
        if correct_bias:
            step_size = step_size * math.sqrt(1.0 - beta2 ** st["step"]) / (1.0 - beta1 ** st["step"])
        p.data.addcdiv_(exp_avg, denom, value=-step_size)
        if weight_decay > 0.0:
            p.data.add_(p.data, alpha=-lr * weight_decay)


def test_consert_optimizer_step_is_transformers3_adamw_without_bias_correction():
    from sentcl.training.optimizer import BertAdamW

    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(4)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]

    def run(make):
        params = [p.clone().requires_grad_(True) for p in start]
        optimizer = make(
            [{"params": [params[0]], "weight_decay": 0.01}, {"params": [params[1]], "weight_decay": 0.0}]
        )
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        return [p.detach() for p in params]

    ours = run(lambda groups: BertAdamW(groups, lr=0.1))
    theirs = [p.clone() for p in start]
    state: dict = {}
    for step in grads:
        transformers3_adamw_step([theirs[0]], [step[0]], state, 0.1, 0.01)
        transformers3_adamw_step([theirs[1]], [step[1]], state, 0.1, 0.0)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    # torch's AdamW (bias correction, decay before the update) moves the same parameters elsewhere.
    torch_adamw = run(lambda groups: torch.optim.AdamW(groups, lr=0.1, eps=1e-6))
    assert not torch.allclose(torch_adamw[0], theirs[0], atol=1e-3)


def test_consert_param_groups_and_schedule_follow_fit(tmp_path):
    """fit(): ``no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight']`` over ``loss_model.named_parameters()``
    (the model and the loss's classifier), weight_decay 0.01 for the rest; get_linear_schedule_with_warmup with
    ConSERT main.py's ``warmup_steps = ceil(len(train_dataset) * num_epochs / train_batch_size * 0.1)``."""
    import math

    from sentcl.training.optimizer import BertAdamW
    from sentcl.training.trainer import Trainer

    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.0)))
    steps = 40
    config = train_config(
        mode="joint", optimizer="consert", steps=steps, batch_size=4, lr=2e-5, warmup_ratio=0.1, head_lr=2e-5
    )
    trainer = Trainer(encoder, config, PAIRS * 3, [(PAIRS[0][0], PAIRS[0][1], 1.0)] * 3, progress=False)
    assert isinstance(trainer.optimizer, BertAdamW) and trainer.optimizer.defaults["eps"] == 1e-6
    # the anchor's grouping, transcribed: param_optimizer = list(loss_model.named_parameters())
    param_optimizer = [(f"model.{n}", p) for n, p in encoder.model.named_parameters()] + list(
        trainer.objective.named_parameters()
    )
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    expected = {id(p): 0.01 for n, p in param_optimizer if not any(nd in n for nd in no_decay)}
    expected |= {id(p): 0.0 for n, p in param_optimizer if any(nd in n for nd in no_decay)}
    got = {id(p): g["weight_decay"] for g in trainer.optimizer.param_groups for p in g["params"]}
    assert got == expected
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(got)  # each parameter once
    assert {g["initial_lr"] for g in trainer.optimizer.param_groups} == {2e-5}
    ln = encoder.model.embeddings.LayerNorm
    assert got[id(ln.weight)] == 0.0 and got[id(encoder.model.embeddings.word_embeddings.weight)] == 0.01

    # the schedule: lr_lambda of get_linear_schedule_with_warmup, stepped after each optimizer step
    num_warmup_steps = math.ceil(steps * 0.1)

    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(steps - current_step) / float(max(1, steps - num_warmup_steps)))

    seen = []
    for _ in range(steps + 1):
        seen.append(trainer.scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.scheduler.step()
    assert seen[0] == 0.0  # the first step runs at lr 0: warm-up from 0
    for step, lr in enumerate(seen):
        assert math.isclose(lr, 2e-5 * lr_lambda(step), rel_tol=1e-9, abs_tol=1e-15), step


def test_consert_warmup_count_matches_main_py_on_the_paper_corpus():
    """main.py: warmup_steps = ceil(len(train_dataset) * num_epochs / train_batch_size * 0.1), t_total = 930 * epochs
    (the DataLoader keeps the last, short batch: ceil(89,192 / 96) = 930 steps an epoch)."""
    import math

    from sentcl.training.optimizer import consert_schedule

    n, batch = 89192, 96
    steps_per_epoch = math.ceil(n / batch)
    assert steps_per_epoch == 930
    for epochs in (10, 25):
        t_total = steps_per_epoch * epochs
        warmup_steps = math.ceil(n * epochs / batch * 0.1)
        lam = consert_schedule(t_total, 0.1)
        ours = next(s for s in range(t_total) if lam(s) >= 1.0)
        # 10 epochs: 930 both; 25 epochs: ConSERT 2,323 (from the unrounded epoch length), sentcl 2,325
        assert abs(ours - warmup_steps) <= 2 and (epochs != 10 or ours == warmup_steps)


# --- the paper profile's step counts and ConSERT's corpus ----------------------------------------------------


def test_paper_profile_counts_consert_dataloader_steps_and_uses_its_optimizer():
    """torch DataLoader(shuffle=True, batch_size=96) keeps the last short batch: len(dataloader) = ceil(n / 96),
    and fit() runs steps_per_epoch * epochs steps (unsup-consert-base.sh 10 epochs, the sup-unsup and
    joint-unsup scripts 25)."""
    import math

    import yaml

    from stages.common import ROOT

    paper = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
    per_epoch = math.ceil(89192 / 96)
    assert paper["transfer"]["base"]["steps"] == per_epoch * 10
    assert paper["transfer"]["nli"]["steps"] == paper["transfer"]["joint"]["steps"] == per_epoch * 25
    assert paper["pretrain_nli"]["steps"] == paper["joint"]["steps"] == math.ceil(942069 / 96)
    assert paper["train"]["optimizer"] == "consert"


def test_consert_corpus_is_its_89192_sentences():
    """ConSERT README: "we merge all unlabeled texts from 7 STS datasets ... (total 89192 sentences)"."""
    import os
    from pathlib import Path

    import pytest

    from sentcl.data.senteval import consert_corpus

    root = ROOT
    mirror = Path(os.environ.get("SENTEVAL_MIRROR", root.parent / "shared" / "senteval"))
    if not mirror.is_dir():
        pytest.skip("the SentEval mirror is not beside the checkout (SENTEVAL_MIRROR)")
    corpus = consert_corpus(mirror)
    assert len(corpus) == 89192 and all(isinstance(s, str) and s.strip() for s in corpus)


# --- span pooling, shuffle wiring, word repetition's specials ------------------------------------------------

SENTENCES = ["a man is playing a guitar", "two dogs", "the woman is riding a red horse on the street"]


def test_span_view_is_consert_pad_ids_with_the_original_mask(tmp_path):
    """ConSERT BertModel.forward: ``extended_attention_mask`` is built from the original mask *before*
    ``_sample_span`` masks ids and mask, so only the ids change for the encoder (outside the span: id 0, [PAD],
    still attended); the Transformer module hands Pooling ``features['attention_mask']``, the original one."""
    from sentcl.training.views import ViewConfig, sample_span

    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.0)))
    rates = ViewConfig(0.1, 0.1, 0.1, 0.5, 0.1, 0.01, 0.3)
    embed = Embedder(encoder, rates, torch.Generator().manual_seed(7), torch.device("cpu"))
    features = embed.tokenize(SENTENCES)
    with torch.no_grad():
        got = embed(features, "span")
        # the same span (sample_span itself is checked against ConSERT in test_views)
        input_ids, attention_mask = sample_span(
            features["input_ids"], features["attention_mask"], 0.5, 0, torch.Generator().manual_seed(7)
        )
        extended_from = features[
            "attention_mask"
        ]  # get_extended_attention_mask(attention_mask) before the span
        output_tokens = encoder.model(input_ids=input_ids, attention_mask=extended_from)[0]
        expected = mean_pool(output_tokens, features["attention_mask"])
        # what attending to and averaging over the span alone would give
        span_only_tokens = encoder.model(input_ids=input_ids, attention_mask=attention_mask)[0]
        span_only = mean_pool(span_only_tokens, attention_mask)
    assert not torch.equal(input_ids, features["input_ids"])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(expected, span_only, atol=1e-4)


def test_shuffled_positions_reach_the_position_embeddings(tmp_path):
    """The shuffle view's permuted ids are what the position-embedding table is read with (BertEmbeddings:
    ``position_embeddings(position_ids)``), and the sentence vector changes with them."""
    from sentcl.training.views import ViewConfig

    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.0)))
    rates = ViewConfig(0.1, 0.1, 0.1, 0.1, 0.1, 0.01, 0.3)
    embed = Embedder(encoder, rates, torch.Generator().manual_seed(0), torch.device("cpu"))
    features = embed.tokenize(SENTENCES)
    read: list[torch.Tensor] = []
    table = encoder.model.embeddings.position_embeddings
    handle = table.register_forward_hook(lambda _m, args, _out: read.append(args[0].clone()))
    try:
        with torch.no_grad():
            plain = embed(features, "none")
            shuffled = embed(features, "shuffle")
    finally:
        handle.remove()
    assert len(read) == 2
    length = features["input_ids"].shape[1]
    identity = torch.arange(length).expand(len(SENTENCES), -1)
    assert torch.equal(read[0].expand(len(SENTENCES), -1), identity)
    ids = read[1]
    permuted = False
    for row, n in enumerate(features["attention_mask"].sum(1).tolist()):
        # _replace_position_ids: indexes = list(range(num_tokens)); random.shuffle(indexes); rest in order
        assert sorted(ids[row, :n].tolist()) == list(range(n))
        assert ids[row, n:].tolist() == list(range(n, length))
        permuted |= ids[row, :n].tolist() != list(range(n))
    assert permuted
    assert not torch.allclose(plain, shuffled, atol=1e-5)


def test_word_repetition_never_duplicates_cls_or_sep(tmp_path):
    """ESimCSE train.py: ``dup = sorted(random.sample(range(1, input_len - 1), add_len))  # not [CLS]``: each
    output row has exactly one [CLS], first, and one [SEP], last, over many draws and lengths."""
    from sentcl.training.views import repeat_words
    from tests.tiny import tiny_sentences

    encoder = Encoder.from_pretrained(str(make_tiny_encoder(tmp_path, dropout=0.0)))
    cls_id, sep_id = encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id
    features = encoder.tokenize(tiny_sentences(40, seed=2) + ["a", "a b"])
    grew = 0
    for seed in range(25):
        ids, mask = repeat_words(
            features["input_ids"], features["attention_mask"], 0.5, 0, torch.Generator().manual_seed(seed)
        )
        for row in range(ids.shape[0]):
            new = ids[row, : int(mask[row].sum())].tolist()
            assert new.count(cls_id) == 1 and new[0] == cls_id, new
            assert new.count(sep_id) == 1 and new[-1] == sep_id, new
            grew += len(new) > int(features["attention_mask"][row].sum())
    assert grew > 100  # the view did repeat words


# --- settings no objective would read ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,overrides",
    [
        ("nli", {"objective": "sup_simcse", "projection": True}),
        ("nli", {"objective": "ce", "projection": True}),
        ("nli", {"objective": "promptbert", "projection": True}),
        ("transfer", {"objective": "tsdae", "projection": True}),
        ("transfer", {"optimizer": "sgd"}),
    ],
)
def test_settings_no_objective_reads_stop_with_one_line(mode, overrides, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_config(mode=mode, **overrides)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    key = next(iter(k for k in overrides if k != "objective"))
    assert "\n" not in err and err.startswith(f"params.yaml: {key}: "), err


def test_projection_still_trains_where_a_contrastive_loss_reads_it():
    assert train_config(preset="simcse", projection=True).projection
    assert train_config(mode="joint", projection=True).projection


# --- PromptBERT: the delta pass trains like the sentence pass ------------------------------------------------


def test_promptbert_delta_pass_runs_with_dropout_and_gradient(tmp_path):
    """Prompt-BERT models.py cl_forward calls ``get_delta`` inside the training forward (HF Trainer's train mode:
    BERT's dropout on) under ``torch.set_grad_enabled(not mask_embedding_sentence_delta_freeze)`` (default off:
    gradient on). sentcl's delta passes (the template alone, with shifted position ids) must do the same."""
    from transformers import AutoTokenizer, BertTokenizerFast

    from sentcl.training.trainer import Trainer
    from tests.tiny import tiny_sentences, tiny_vocab

    folder = make_tiny_encoder(tmp_path, dropout=0.3)
    if len(AutoTokenizer.from_pretrained(folder)) < len(set(tiny_vocab())):
        BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    encoder = Encoder.from_pretrained(str(folder))
    texts = tiny_sentences(8, seed=4)
    config = train_config(preset="promptbert", batch_size=4, steps=1, bf16=False)
    trainer = Trainer(encoder, config, texts, [(texts[0], texts[1], 1.0)] * 3, progress=False)
    trainer._set_dropout()
    deltas: list[tuple[bool, dict, torch.Tensor]] = []

    def hook(module, _args, kwargs, output):
        if kwargs.get("position_ids") is not None:  # get_delta passes d_position_ids; sentence passes do not
            inputs = {k: v.detach().clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
            deltas.append((module.training, inputs, output.last_hidden_state))

    handle = encoder.model.register_forward_hook(hook, with_kwargs=True)
    try:
        trainer.representations(texts[:4])
    finally:
        handle.remove()
    assert len(deltas) == 2  # one per template (delta, delta1)
    for training, inputs, hidden in deltas:
        assert training and hidden.requires_grad
        encoder.model.eval()
        with torch.no_grad():
            without_dropout = encoder.model(**inputs).last_hidden_state
        encoder.model.train()
        assert not torch.allclose(hidden.detach(), without_dropout, atol=1e-4)  # dropout changed the delta


def test_adversarial_joint_with_gradient_caching_equals_one_large_batch(tmp_path):
    """The adversarial pass reuses the clean pass's embedding output: gradient caching's replay must rebuild both,
    so accumulating 4 micro-batches still gives the weights of one large batch (fp32 pinned)."""
    from sentcl.training.trainer import Trainer
    from tests.tiny import tiny_sentences

    folder = make_tiny_encoder(tmp_path, dropout=0.0)
    texts = tiny_sentences(40, seed=5)
    pairs = [(texts[i], texts[(i * 7 + 3) % 40], i % 3) for i in range(32)]

    def weights_after(grad_accum):
        encoder = Encoder.from_pretrained(str(folder))
        config = train_config(
            mode="joint",
            views=("none", "adversarial"),
            view={"adversarial_eps": 0.5},
            steps=2,
            batch_size=8,
            lr=1e-3,
            warmup_ratio=0.0,
            grad_accum=grad_accum,
            bf16=False,
        )
        trainer = Trainer(encoder, config, pairs, [(texts[0], texts[1], 1.0)] * 3, progress=False)
        for step in range(2):
            trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
        return {k: v.clone() for k, v in encoder.model.state_dict().items()}

    whole, accumulated = weights_after(1), weights_after(4)
    for key in whole:
        torch.testing.assert_close(whole[key], accumulated[key], atol=1e-5, rtol=0, msg=key)
