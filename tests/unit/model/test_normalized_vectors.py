"""The bundled model returns unit vectors (its pipeline ends in sentence-transformers' Normalize); models/base,
every checkpoint trained from it and the exported ONNX graph keep that, so a dot-product index ranks the same
after an upgrade as before it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from sentcl.model.encoder import Encoder
from tests.paths import ROOT
from tests.tiny import make_tiny_encoder

SENTENCES = ["A man is playing a guitar.", "Someone plays music on a stage.", "The cat sleeps."]


def _module_types(folder: Path) -> list[str]:
    return [m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())]


def test_models_base_keeps_the_bundled_models_normalize(tmp_path):
    from sentence_transformers import SentenceTransformer

    from sentcl.model.encoder import resolve_model_path
    from stages import base

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    base.main(["--params", str(tmp_path / "params.yaml"), "--output", str(tmp_path / "base")])

    bundled = SentenceTransformer(resolve_model_path(params["model"]["name"]), device="cpu")
    assert _module_types(Path(resolve_model_path(params["model"]["name"])))[-1] == "Normalize"
    assert _module_types(tmp_path / "base") == ["Transformer", "Pooling", "Normalize"]
    ours = SentenceTransformer(str(tmp_path / "base"), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # short sentences: the 64-token limit of models/base cuts nothing, so the vectors are the bundled model's
    np.testing.assert_allclose(ours, bundled.encode(SENTENCES), atol=1e-5)


def test_a_checkpoint_saved_from_a_normalizing_folder_and_its_onnx_graph_normalize(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    plain = make_tiny_encoder(tmp_path)
    with_normalize = tmp_path / "with-normalize"
    SentenceTransformer(modules=[*SentenceTransformer(str(plain), device="cpu"), Normalize()]).save(
        str(with_normalize)
    )
    encoder = Encoder.from_pretrained(str(with_normalize), max_length=32)
    encoder.save(tmp_path / "trained")  # what a training stage writes after its last step
    assert _module_types(tmp_path / "trained")[-1] == "Normalize"
    reference = SentenceTransformer(str(with_normalize), device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        Encoder.from_pretrained(str(tmp_path / "trained")).encode(SENTENCES), reference, atol=1e-5
    )
    # a folder without Normalize stays as it is
    assert _module_types(plain)[-1] == "Pooling"
    Encoder.from_pretrained(str(plain)).save(tmp_path / "plain-again")
    assert _module_types(tmp_path / "plain-again")[-1] == "Pooling"

    import onnxruntime as ort

    from sentcl.registry.release import export_onnx

    report = export_onnx(tmp_path / "trained", 32)
    assert report["normalized"] is True and report["max_abs_diff_vs_pytorch"] <= 1e-4
    session = ort.InferenceSession(
        str(tmp_path / "trained" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    tokens = encoder.tokenize(SENTENCES)
    onnx_vectors = session.run(
        None, {"input_ids": tokens["input_ids"].numpy(), "attention_mask": tokens["attention_mask"].numpy()}
    )[0]
    np.testing.assert_allclose(onnx_vectors, reference, atol=1e-4)
