"""The int8 ONNX graph: the params section, the shipping rule, quantisation of a tiny exported model, the
``int8`` backend of the fast encoder and ``stages.embed --backend int8``."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from sentcl.model.quantize import (
    FP32_FILE,
    INT8_FILE,
    QuantizeConfig,
    calibration_sample,
    dev_drops,
    quantize,
    within_tolerance,
)
from sentcl.params import ParamsError
from tests.paths import ROOT
from tests.tiny import tiny_sentences
from tests.unit.evaluation.test_sts_benchmark import make_tiny_model, write_mini_senteval

VALID = {
    "int8_method": "dynamic",
    "int8_per_channel": False,
    "int8_max_dev_drop": 0.3,
    "calibration_sentences": 64,
}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ------------------------------------------------------------------------------------------ params and rule


def test_the_shipped_params_section_is_valid_and_every_key_is_required():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    config = QuantizeConfig.from_params(params)
    assert config.int8_method in ("dynamic", "static") and config.int8_max_dev_drop > 0
    for key in VALID:
        with pytest.raises(ParamsError, match=f"export.{key} is missing"):
            QuantizeConfig.from_params({"export": {k: v for k, v in VALID.items() if k != key}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"int8_bits": 4}, "unknown key 'int8_bits'"),
        ({"int8_method": "fp16"}, "int8_method 'fp16' is not one of"),
        ({"int8_per_channel": "yes"}, "int8_per_channel must be true or false"),
        ({"int8_max_dev_drop": -0.1}, "int8_max_dev_drop must be a number >= 0"),
        ({"int8_max_dev_drop": True}, "int8_max_dev_drop must be a number >= 0"),
        ({"calibration_sentences": 0}, "calibration_sentences must be a whole number >= 1"),
    ],
)
def test_a_wrong_export_section_is_one_line_naming_the_key(change, message):
    with pytest.raises(ParamsError, match=message):
        QuantizeConfig.from_params({"export": VALID | change})


def test_check_params_stage_refuses_a_wrong_export_key(tmp_path, capsys):
    from stages import check_params

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["export"]["int8_tolerance"] = 0.3
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    assert check_params.main(["--params", str(path), "--output", str(tmp_path / "ok.json")]) == 2
    assert "unknown key 'int8_tolerance' in section 'export'" in capsys.readouterr().err
    assert not (tmp_path / "ok.json").exists()


def test_int8_ships_only_when_every_dev_split_holds():
    fp32 = {"stsb_dev": 86.70, "sick_dev": 79.80, "all": {"avg": 78.9}}
    assert dev_drops(fp32, {"stsb_dev": 86.50, "sick_dev": 79.90}) == pytest.approx(
        {"stsb_dev": 0.20, "sick_dev": -0.10}
    )
    assert within_tolerance(dev_drops(fp32, {"stsb_dev": 86.45, "sick_dev": 79.90}), 0.3)
    assert not within_tolerance(dev_drops(fp32, {"stsb_dev": 86.35, "sick_dev": 79.90}), 0.3)
    assert not within_tolerance(dev_drops(fp32, {"stsb_dev": 86.70, "sick_dev": 79.40}), 0.3)  # SICK-R trial
    assert within_tolerance(dev_drops(fp32, {"stsb_dev": 87.00}), 0.0)  # better than fp32 passes at 0
    assert not within_tolerance(dev_drops({"all": {"avg": 1.0}}, {"stsb_dev": 87.0}), 0.3)  # nothing compared


def test_calibration_sample_is_distinct_seeded_and_capped():
    text = ["b", "a", "b", " ", "c", "d", "e"]
    assert sorted(calibration_sample(text, 10)) == ["a", "b", "c", "d", "e"]
    sample = calibration_sample(text, 3)
    assert len(set(sample)) == 3 and set(sample) <= {"a", "b", "c", "d", "e"}
    assert calibration_sample(text, 3) == sample


# ------------------------------------------------------------------------------------------ a tiny model


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """A tiny model with its release fp32 graph (the export stage's exporter) and a dynamic int8 copy."""
    from sentcl.registry.release import export_onnx

    folder = make_tiny_model(tmp_path_factory.mktemp("int8"))
    export_onnx(folder, 32)
    quantize(folder / FP32_FILE, folder / INT8_FILE, "dynamic")
    return folder


@pytest.fixture(scope="module")
def senteval(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("senteval")
    write_mini_senteval(root)
    return root


def int8_scores(folder: Path, senteval: Path) -> dict:
    """Written out, apart from sentcl's encoder: each sentence alone through ONNX Runtime's session on the int8
    graph, cosines, scipy's Spearman x 100 per task (its subsets concatenated, the "all" protocol) and STS-B dev."""
    import onnxruntime as ort
    from scipy.stats import spearmanr
    from transformers import AutoTokenizer

    from sentcl.evaluation.benchmark import load_benchmark

    benchmark = load_benchmark(senteval)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    session = ort.InferenceSession(str(folder / INT8_FILE), providers=["CPUExecutionProvider"])
    cache: dict[str, np.ndarray] = {}

    def vector(sentence: str) -> np.ndarray:
        if sentence not in cache:
            batch = tokenizer([sentence], truncation=True, max_length=32, return_tensors="np")
            inputs = {k: batch[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
            cache[sentence] = session.run(None, inputs)[0][0].astype(np.float64)
        return cache[sentence]

    def spearman(parts) -> float:
        sims = np.concatenate(
            [
                cosines(
                    np.stack([vector(s) for s in p.sentences1]), np.stack([vector(s) for s in p.sentences2])
                )
                for p in parts
            ]
        )
        return 100 * spearmanr(sims, np.concatenate([p.gold for p in parts])).statistic

    tasks: dict[str, list] = {}
    for part in benchmark.subsets:
        tasks.setdefault(part.task, []).append(part)
    scores = {task: spearman(parts) for task, parts in tasks.items()}
    return {
        "all": scores | {"avg": float(np.mean(list(scores.values())))},
        "stsb_dev": spearman([benchmark.dev]),
    }


def _fp32_and_int8(folder: Path, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from sentcl.model.fast_encode import FastEncoder

    fp32 = FastEncoder(folder, pooling="last-avg", backend="onnx", threads=1, workers=1)
    int8 = FastEncoder(folder, pooling="last-avg", backend="int8", threads=1, workers=1)
    assert (fp32.backend, int8.backend) == ("onnx", "int8")
    return fp32(sentences), int8(sentences)


def test_dynamic_int8_vectors_are_close_to_fp32_but_not_equal(release):
    sentences = tiny_sentences(60, seed=3)
    fp32, int8 = _fp32_and_int8(release, sentences)
    assert (release / INT8_FILE).stat().st_size < (release / FP32_FILE).stat().st_size
    assert cosines(fp32, int8).min() > 0.99
    assert np.abs(fp32 - int8).max() > 1e-5  # really the int8 graph, not fp32 again


def test_static_int8_calibrated_on_text_is_close_to_fp32(release, tmp_path):
    from sentcl.model.encoder import Encoder

    folder = tmp_path / "static"
    shutil.copytree(release, folder)
    encoder = Encoder.from_pretrained(str(folder), max_length=32)
    quantize(
        folder / FP32_FILE,
        folder / INT8_FILE,
        "static",
        tokenize=lambda batch: {k: v.numpy() for k, v in encoder.tokenize(batch).items()},
        sentences=tiny_sentences(96, seed=5),
    )
    fp32, int8 = _fp32_and_int8(folder, tiny_sentences(60, seed=3))
    assert cosines(fp32, int8).min() > 0.98
    with pytest.raises(ValueError, match="calibration sentences"):
        quantize(folder / FP32_FILE, tmp_path / "x.onnx", "static")


def test_build_int8_keeps_the_graph_only_within_tolerance(release, senteval, tmp_path):
    from sentcl.registry.int8 import build_int8

    config = QuantizeConfig.from_params({"export": VALID})
    onnx = {"pooling": "last-avg"}
    folder = tmp_path / "gate"
    shutil.copytree(release, folder)
    (folder / INT8_FILE).unlink()
    # fp32 far below anything int8 can score: ships, and the record holds int8's own seven tasks and dev.
    shipped = build_int8(folder, config, {"stsb_dev": -100.0}, onnx, data_root=senteval, max_length=32)
    assert shipped["shipped"] and shipped["file"] == INT8_FILE and (folder / INT8_FILE).is_file()
    assert shipped["sha256"] == hashlib.sha256((folder / INT8_FILE).read_bytes()).hexdigest()
    expected = int8_scores(folder, senteval)
    assert shipped["all"] == pytest.approx(expected["all"], abs=1e-3)
    assert shipped["stsb_dev"] == pytest.approx(expected["stsb_dev"], abs=1e-3)
    # fp32 out of reach: not shipped, the file is gone, one line says which split and by how much.
    kept = build_int8(
        folder, config, {"stsb_dev": 200.0, "sick_dev": -100.0}, onnx, data_root=senteval, max_length=32
    )
    assert not kept["shipped"] and kept["file"] is None and not (folder / INT8_FILE).exists()
    assert kept["reason"].startswith("int8 not shipped: stsb_dev drops") and "fp32 only" in kept["reason"]
    assert "\n" not in kept["reason"]
    nothing = build_int8(folder, config, {"stsb_dev": 0.0}, onnx, data_root=tmp_path / "none", max_length=32)
    assert not nothing["shipped"] and not (folder / INT8_FILE).exists()


def test_model_card_and_metrics_show_int8_beside_fp32(release, senteval, tmp_path):
    from sentcl.registry import release as rel
    from sentcl.registry.int8 import build_int8

    folder = tmp_path / "card"
    shutil.copytree(release, folder)
    tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSb", "SICK-R"]
    row = {"all": {t: 11.0 + i for i, t in enumerate(tasks)} | {"avg": 14.0}, "stsb_dev": -50.0}
    config = QuantizeConfig.from_params({"export": VALID})
    int8 = build_int8(folder, config, row, {"pooling": "last-avg"}, data_root=senteval, max_length=32)
    info = {
        "model_name": "m",
        "checkpoint": "base",
        "candidates": ["base"],
        "stsb_dev": -50.0,
        "beat_init": False,
        "git_commit": None,
        "exported_at": "now",
        "weights_sha256": {},
        "onnx": {"max_abs_diff_vs_pytorch": 1e-7},
        "int8": int8,
        "trained_beat_init": False,
        "sts_row": row,
        "weights_fingerprint": "f",
    }
    card = rel.model_card(info, {"model": {"name": "tiny", "max_length": 32}}, row)
    fp32_line = next(line for line in card.splitlines() if line.startswith("| fp32 |"))
    int8_line = next(line for line in card.splitlines() if line.startswith("| int8 |"))
    assert "| 11.00 | 12.00 |" in fp32_line and fp32_line.endswith("| 14.00 | -50.00 |")
    assert f"{int8['all']['avg']:.2f} | {int8['stsb_dev']:.2f} |" in int8_line
    assert "`onnx/model_int8.onnx` is an int8 copy" in card
    summary = rel.release_summary(info | {"onnx": {"max_abs_diff_vs_pytorch": 1e-7}})
    assert summary["int8"]["shipped"] and summary["int8"]["fp32_avg"] == 14.0
    assert summary["int8"]["avg"] == int8["all"]["avg"]
    not_shipped = info | {
        "int8": {"shipped": False, "reason": "int8 not shipped: stsb_dev drops 0.50 > 0.3; fp32 only"}
    }
    assert "No int8 graph: int8 not shipped: stsb_dev drops 0.50" in rel.model_card(not_shipped, {}, row)


# ------------------------------------------------------------------------------------------ the embed stage


def test_embed_backend_int8_writes_int8_vectors_and_refuses_a_folder_without_them(release, tmp_path, capsys):
    from stages import embed

    sentences = tiny_sentences(20, seed=7)
    text = tmp_path / "in.txt"
    text.write_text("\n".join(sentences) + "\n")
    assert (
        embed.main(
            [
                "--input",
                str(text),
                "--output",
                str(tmp_path / "v.npy"),
                "--model",
                str(release),
                "--backend",
                "int8",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "int8" in capsys.readouterr().out
    fp32, int8 = _fp32_and_int8(release, sentences)
    got = np.load(tmp_path / "v.npy")
    np.testing.assert_allclose(got, int8, atol=1e-5)
    assert cosines(got, fp32).min() > 0.99

    plain = tmp_path / "plain"
    shutil.copytree(release, plain, ignore=shutil.ignore_patterns("model_int8.onnx"))
    code = embed.main(
        [
            "--input",
            str(text),
            "--output",
            str(tmp_path / "w.npy"),
            "--model",
            str(plain),
            "--backend",
            "int8",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("embed: ") and "onnx/model_int8.onnx" in err
    assert not (tmp_path / "w.npy").exists()


def test_fast_encoder_int8_without_the_file_is_a_clear_error(tmp_path):
    from sentcl.model.fast_encode import FastEncoder, MissingInt8Error

    folder = make_tiny_model(tmp_path)
    with pytest.raises(MissingInt8Error, match="no onnx/model_int8.onnx"):
        FastEncoder(folder, pooling="last-avg", backend="int8")


@pytest.mark.slow
def test_export_stage_says_in_one_line_when_int8_is_not_shipped(
    release, senteval, tmp_path, capsys, monkeypatch
):
    from stages import export

    monkeypatch.setenv("SENTCL_MLFLOW", "0")
    model = tmp_path / "base"
    shutil.copytree(release, model, ignore=shutil.ignore_patterns("onnx"))
    # fp32's STS-B dev out of int8's reach: the stage must ship fp32 only and say so
    (tmp_path / "sts.json").write_text(json.dumps({"base": {"all": {"avg": 50.0}, "stsb_dev": 99.0}}))
    args = [
        "--sts",
        str(tmp_path / "sts.json"),
        "--model",
        f"base={model}",
        "--output",
        str(tmp_path / "out"),
    ]
    args += ["--summary", str(tmp_path / "export.json"), "--data", str(senteval)]
    args += ["--train-metrics", str(tmp_path / "none")]
    assert export.main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "int8" in line]
    assert len(lines) == 1 and lines[0].startswith("export: int8 not shipped: stsb_dev drops")
    assert (tmp_path / "out" / FP32_FILE).is_file() and not (tmp_path / "out" / INT8_FILE).exists()
    summary = json.loads((tmp_path / "export.json").read_text())
    assert summary["int8"]["shipped"] is False and summary["int8"]["fp32_avg"] == 50.0
    assert "No int8 graph: int8 not shipped" in (tmp_path / "out" / "README.md").read_text()


def test_evaluate_command_scores_the_int8_graph_and_params_keep_checkpoints_exact(
    release, senteval, tmp_path
):
    from sentcl.params_check import ParamsError, check_evaluate
    from stages.evaluate import main

    scores = {}
    for backend in ("onnx", "int8"):
        out = tmp_path / f"{backend}.json"
        argv = ["--model", str(release), "--data", str(senteval), "--output", str(out), "--no-progress"]
        assert main([*argv, "--backend", backend]) == 0
        scores[backend] = json.loads(out.read_text())
    assert list(scores["int8"]["all"]) == list(scores["onnx"]["all"])  # the same seven tasks and average
    assert scores["int8"]["all"] == pytest.approx(int8_scores(release, senteval)["all"], abs=1e-3)
    # tiny random model, six pairs a subset: no claim on how close; the vectors' closeness is tested above
    # the pipeline evaluates checkpoints, which have no int8 graph: params.yaml may not ask for it
    with pytest.raises(ParamsError, match="evaluate.backend 'int8' is not one of onnx, torch"):
        check_evaluate({"evaluate": {"backend": "int8"}})


def test_the_served_model_encodes_with_the_int8_graph_when_asked(release, tmp_path):
    """The pyfunc MLflow serves takes params {"backend": "int8"}: the release's int8 graph, close to but not the
    torch vectors; an unknown backend, or int8 on a model that shipped none, is refused."""
    import shutil

    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.models import infer_signature

    from sentcl_mlflow import pyfunc_checks, pyfunc_encoder

    def save(folder: Path, where: Path):
        sentences = ["a dog runs", "a cat sleeps"]
        signature = infer_signature(
            sentences, np.zeros((2, 32), np.float32), params={"batch_size": 64, "backend": "torch"}
        )
        mlflow.pyfunc.save_model(
            str(where),
            python_model=pyfunc_encoder.__file__,
            code_paths=[pyfunc_checks.__file__],
            artifacts={"encoder": str(folder)},
            signature=signature,
        )
        return mlflow.pyfunc.load_model(str(where))

    sentences = tiny_sentences(20, seed=5)
    model = save(release, tmp_path / "served")
    torch_vectors = model.predict(sentences)
    int8_vectors = model.predict(sentences, params={"backend": "int8"})
    _, direct_int8 = _fp32_and_int8(release, sentences)
    assert int8_vectors.shape == torch_vectors.shape == (20, 32)
    assert np.allclose(int8_vectors, direct_int8, atol=1e-5)  # the graph the export shipped, nothing else
    assert cosines(torch_vectors, int8_vectors).min() > 0.99 and not np.allclose(torch_vectors, int8_vectors)
    with pytest.raises(MlflowException, match="backend 'fp16' is not one of torch, int8"):
        model.predict(sentences, params={"backend": "fp16"})
    without = tmp_path / "no-int8"
    shutil.copytree(release, without)
    (without / INT8_FILE).unlink()
    with pytest.raises(MlflowException, match="no onnx/model_int8.onnx"):
        save(without, tmp_path / "served-fp32").predict(sentences, params={"backend": "int8"})
