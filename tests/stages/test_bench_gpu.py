"""The GPU benchmark's CPU smoke run (the same code a lent device runs) and its FLOP count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from stages.common import ROOT


def bert_training_flops(layers: int, d: int, ff: int, batch: int, length: int) -> float:
    """Transcribed from Kaplan et al. 2020 (table 1) / PaLM appendix B: per token, forward 2N + 4 * layers * L * d
    (N the non-embedding matmul weights: 4 d^2 attention + 2 d ff feed-forward per layer); training is 3x forward.
    Two views per sentence."""
    n = layers * (4 * d * d + 2 * d * ff)
    forward_per_token = 2 * n + 4 * layers * length * d
    return 2 * batch * length * 3 * forward_per_token


def test_bench_gpu_runs_on_cpu_with_the_bundled_model(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.bench_gpu", "--device", "cpu", "--steps", "2", "--warmup", "1",
               "--batch-size", "8", "--eval-sentences", "48", "--eval-batch", "16", "--output", str(out)]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["backend"], result["world_size"], result["model"]) == ("gloo", 1, "all-MiniLM-L6-v2")
    assert 22.5e6 < result["parameters"] < 23e6  # all-MiniLM-L6-v2: 22.7M parameters (its model card)
    assert len(result["padded_lengths"]) == 2 and result["batch_per_rank"] == 8
    # all-MiniLM-L6-v2's config: 6 layers, hidden 384, intermediate 1536.
    expected = sum(bert_training_flops(6, 384, 1536, 8, n) for n in result["padded_lengths"]) / 2
    assert abs(result["model_tflops_per_step_per_rank"] * 1e12 - expected) < 1e-6 * expected
    assert result["mfu"] is None  # no device peak on a CPU unless given
    for key in (
        "sentences_per_s",
        "padded_tokens_per_s",
        "eval_sentences_per_s_fp32",
        "eval_sentences_per_s_bf16",
    ):
        assert result[key] > 0
    assert result["real_tokens_per_s"] <= result["padded_tokens_per_s"]
    assert "MFU" in run.stdout and "eval:" in run.stdout


def test_bert_base_is_built_from_its_config_without_the_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from benchmarks.bench_gpu import build_encoder

    encoder = build_encoder("bert-base", 64)
    config = encoder.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (12, 768, 3072)
    # bert-base-uncased's BertModel (with pooler): 109,482,240 parameters.
    assert sum(p.numel() for p in encoder.model.parameters()) == 109_482_240
