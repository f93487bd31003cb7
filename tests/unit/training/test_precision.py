"""train.bf16: what ``auto`` picks from the CPU's flags, what forcing does, and that losses and evaluation stay fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from sentcl.model.encoder import Encoder
from sentcl.training.precision import (
    bf16_autocast,
    cpu_has_native_bf16,
    describe_precision,
    parse_bf16,
    use_bf16,
)
from sentcl.training.trainer import Trainer
from stages.common import ROOT
from tests.tiny import make_tiny_encoder, tiny_sentences, train_config

CPU = torch.device("cpu")
TEXTS = tiny_sentences(32, seed=3)
DEV = [(TEXTS[i], TEXTS[i + 1], float(i % 5)) for i in range(0, 20, 2)]

# Abbreviated /proc/cpuinfo of real machines (two logical processors each, as the kernel repeats them).
AVX2_ONLY = "fpu vme sse sse2 avx f16c fma avx2 bmi2 sha_ni vaes vpclmulqdq"
SAPPHIRE_RAPIDS = AVX2_ONLY + " avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
COOPER_LAKE = AVX2_ONLY + " avx512f avx512bw avx512_vnni avx512_bf16"
SKYLAKE_X = AVX2_ONLY + " avx512f avx512bw avx512dq avx512vl"  # AVX-512 but no bf16: emulated, slow
NEOVERSE_V1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve bf16 i8mm"
GRAVITON2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm"


def cpuinfo(tmp_path, flags: str, key: str = "flags", name: str = "cpuinfo") -> str:
    path = tmp_path / name
    path.write_text(
        "".join(f"processor\t: {i}\nmodel name\t: test\n{key}\t\t: {flags}\n\n" for i in range(2))
    )
    return str(path)


@pytest.mark.parametrize(
    "flags,key,native",
    [
        (SAPPHIRE_RAPIDS, "flags", True),
        (COOPER_LAKE, "flags", True),
        (SKYLAKE_X, "flags", False),
        (AVX2_ONLY, "flags", False),
        (NEOVERSE_V1, "Features", True),
        (GRAVITON2, "Features", False),
    ],
)
def test_auto_uses_bf16_on_cpus_with_native_bf16_only(tmp_path, flags, key, native):
    path = cpuinfo(tmp_path, flags, key)
    assert cpu_has_native_bf16(path) is native
    assert use_bf16("auto", CPU, path) is native


def test_true_and_false_force_it_whatever_the_cpu(tmp_path):
    with_bf16, without = cpuinfo(tmp_path, SAPPHIRE_RAPIDS), cpuinfo(tmp_path, AVX2_ONLY, name="avx2")
    for setting in (True, "true", "True"):
        assert use_bf16(setting, CPU, without) is True
    for setting in (False, "false"):
        assert use_bf16(setting, CPU, with_bf16) is False


def test_auto_keeps_fp32_on_devices_it_does_not_know(tmp_path):
    assert use_bf16("auto", torch.device("mps"), cpuinfo(tmp_path, SAPPHIRE_RAPIDS)) is False


def test_auto_on_cuda_follows_the_device():
    if torch.cuda.is_available():
        assert use_bf16("auto", torch.device("cuda")) is torch.cuda.is_bf16_supported()
    else:  # a CPU build: no CUDA device, so never bf16 on it
        assert use_bf16("auto", torch.device("cuda")) is False


def test_this_machines_answer_matches_its_own_flags():
    """Read independently of the module: the flags of the first processor in /proc/cpuinfo."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    line = next((ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("flags", "Features")), "")
    flags = set(line.split(":", 1)[-1].split())
    assert cpu_has_native_bf16() is bool({"avx512_bf16", "amx_bf16", "bf16"} & flags)


@pytest.mark.parametrize("bad", ["yes", "bf16", 1, None])
def test_other_values_are_refused_with_the_allowed_ones(bad):
    with pytest.raises(ValueError, match="auto, true, false"):
        parse_bf16(bad)


def test_params_yaml_says_auto_and_no_compile_and_a_bad_value_names_the_key(capsys):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert (params["train"]["bf16"], params["train"]["compile"]) == ("auto", False)
    config = train_config()
    assert (config.bf16, config.compile) == ("auto", False)
    with pytest.raises(SystemExit) as exit_info:
        train_config(bf16="yes")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "params.yaml: bf16: one of auto, true, false, got 'yes'"


def test_autocast_context_runs_matmuls_in_bf16_only_when_enabled():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with bf16_autocast(CPU, True):
        assert (x @ w).dtype == torch.bfloat16
    with bf16_autocast(CPU, False):
        assert (x @ w).dtype == torch.float32


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bf16"), dropout=0.0)


def trainer(model_dir, bf16) -> Trainer:
    config = train_config(
        steps=2, batch_size=8, lr=1e-3, bf16=bf16, views=("none", "none"), encoder_dropout=False
    )
    return Trainer(Encoder.from_pretrained(str(model_dir)), config, TEXTS, DEV, progress=False)


def matmul_dtypes(run: Trainer) -> set[torch.dtype]:
    """Output dtypes of the encoder's linear layers from now on (filled by forward hooks)."""
    seen: set[torch.dtype] = set()
    for module in run.encoder.model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    return seen


def test_forced_bf16_trains_the_encoder_in_bf16_and_the_loss_in_fp32(tiny_model):
    run = trainer(tiny_model, True)
    assert run.autocast
    dtypes = matmul_dtypes(run)
    reps = run.representations(TEXTS[:8])
    assert dtypes == {torch.bfloat16}  # every linear layer of the encoder ran in bf16
    loss = run.loss(reps)
    assert loss.dtype == torch.float32
    # The loss equals ConSERT's NT-Xent computed by hand in fp64 from the same embeddings
    # (yym6472/ConSERT sentence_transformers/losses/AdvCLSoftmaxLoss.py _contrastive_loss_forward: both directions
    # summed, each a mean over the N anchors), times the contrastive weight alpha.
    a, b = (x.double() / x.double().norm(dim=-1, keepdim=True) for x in (reps["z1"], reps["z2"]))
    t, eye, labels = run.cfg.temperature, torch.eye(8, dtype=torch.float64) * 1e9, torch.arange(8)
    ce = torch.nn.functional.cross_entropy
    loss_a = ce(torch.cat([a @ b.T / t, a @ a.T / t - eye], dim=1), labels)
    loss_b = ce(torch.cat([b @ a.T / t, b @ b.T / t - eye], dim=1), labels)
    expected = run.cfg.alpha * (loss_a + loss_b)
    assert abs(loss.item() - expected.item()) < 1e-5
    run.train_step(TEXTS[:8], 1)
    assert all(p.dtype == torch.float32 for p in run.encoder.model.parameters())  # fp32 master weights


def test_bf16_and_fp32_steps_agree_to_bf16_precision(tiny_model):
    fp32, bf16 = trainer(tiny_model, False), trainer(tiny_model, True)
    assert not fp32.autocast
    dtypes = matmul_dtypes(fp32)
    a = fp32.loss(fp32.representations(TEXTS[:8])).item()
    assert dtypes == {torch.float32}
    b = bf16.loss(bf16.representations(TEXTS[:8])).item()
    assert a != b  # bf16 really ran
    assert abs(a - b) < 0.02 * abs(a)


def test_evaluation_is_fp32_and_equal_whatever_training_precision(tiny_model):
    fp32, bf16 = trainer(tiny_model, False), trainer(tiny_model, True)
    dtypes = matmul_dtypes(bf16)
    vectors = bf16.encoder.encode(TEXTS, batch_size=16, pooling="last-avg")
    assert vectors.dtype == np.float32
    np.testing.assert_array_equal(vectors, fp32.encoder.encode(TEXTS, batch_size=16, pooling="last-avg"))
    assert bf16.evaluate() == fp32.evaluate()
    assert dtypes == {torch.float32}


def test_bf16_grad_accumulation_equals_one_large_batch_to_bf16_precision(tiny_model):
    """The bf16 path of the exact-arithmetic test in test_train.py (which pins fp32): forced on, so it runs on every
    CPU (emulated where bf16 is not native); micro-batches change the bf16 rounding, so the tolerance is bf16's."""

    def weights_after(**config) -> dict[str, torch.Tensor]:
        values = {"steps": 3, "batch_size": 8, "lr": 1e-3, "warmup_ratio": 0, "bf16": True, **config}
        config = train_config(views=("none", "none"), encoder_dropout=False, **values)
        run = Trainer(Encoder.from_pretrained(str(tiny_model)), config, TEXTS, DEV, progress=False)
        assert run.autocast
        for step in range(3):
            run.train_step(run._rank_items(run.order.indices(step)), step + 1)
        return {k: v.clone() for k, v in run.encoder.model.state_dict().items()}

    whole, accumulated = weights_after(), weights_after(grad_accum=4)
    init = Encoder.from_pretrained(str(tiny_model)).model.state_dict()
    # Adam divides by the gradient's running RMS, so a weight whose gradient is near zero takes a step of either sign
    # from bf16 rounding alone: compare the updates as a whole (relative L2 over all weights), not weight by weight.
    step_whole = torch.cat([(whole[k] - init[k]).flatten() for k in whole])
    step_acc = torch.cat([(accumulated[k] - init[k]).flatten() for k in whole])
    assert step_whole.norm() > 1e-3  # the steps really moved the weights
    relative = ((step_whole - step_acc).norm() / step_whole.norm()).item()
    assert relative < 0.1, relative
    # ... and the same comparison of two different seeds is far apart: the tolerance does discriminate.
    other = weights_after(seed=7)
    step_other = torch.cat([(other[k] - init[k]).flatten() for k in whole])
    assert ((step_whole - step_other).norm() / step_whole.norm()).item() > 3 * relative


@pytest.mark.parametrize(
    "setting,flags,expected",
    [
        ("auto", SAPPHIRE_RAPIDS, "bf16 autocast (train.bf16: auto; this CPU has native bf16)"),
        ("auto", AVX2_ONLY, "fp32 (train.bf16: auto; this CPU has no native bf16)"),
        ("true", AVX2_ONLY, "bf16 autocast (train.bf16: true, forced)"),
        (False, SAPPHIRE_RAPIDS, "fp32 (train.bf16: false, forced)"),
    ],
)
def test_the_precision_line_names_the_arithmetic_and_why(tmp_path, setting, flags, expected):
    assert describe_precision(setting, CPU, cpuinfo(tmp_path, flags)) == expected
