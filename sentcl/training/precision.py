"""Which arithmetic training runs in: bf16 autocast where the hardware computes bf16 natively, fp32 elsewhere.

``train.bf16: auto`` turns autocast on for CUDA devices that support bf16 and for CPUs with native bf16 matrix
instructions (x86 AVX512-BF16 or AMX, AArch64's BF16 extension). On any other CPU, bf16 is emulated by converting
to fp32 around every matrix product, which is slower than fp32 itself, so ``auto`` keeps fp32 there.
``true``/``false`` force it either way. Autocast only covers the encoder's forward pass: the losses cast their
inputs to fp32 (``sentcl.training.losses``) and evaluation encodes outside it, so reported scores are fp32 scores.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

BF16_SETTINGS = ("auto", "true", "false")
# /proc/cpuinfo flags of native bf16 arithmetic: x86 (``flags``) and AArch64 (``Features``).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpuinfo_flags(path: Path | str = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo, e.g. macOS)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def cpu_has_native_bf16(cpuinfo: Path | str = "/proc/cpuinfo") -> bool:
    """True when the CPU computes bf16 in hardware, by the kernel's flags; without /proc/cpuinfo, only AMX is
    detectable (torch's cpuid probe), and anything else counts as no."""
    flags = cpuinfo_flags(cpuinfo)
    if flags:
        return bool(NATIVE_BF16_FLAGS & flags)
    init_amx = getattr(torch._C._cpu, "_init_amx", None)
    return bool(init_amx and init_amx())


def parse_bf16(setting: bool | str) -> str:
    """``auto``, ``true`` or ``false`` from a params value (YAML gives booleans for true/false)."""
    value = str(setting).lower() if isinstance(setting, bool | str) else None
    if value not in BF16_SETTINGS:
        raise ValueError(f"train.bf16 must be one of {', '.join(BF16_SETTINGS)}, got {setting!r}")
    return value


def use_bf16(setting: bool | str, device: torch.device, cpuinfo: Path | str = "/proc/cpuinfo") -> bool:
    """Whether training on ``device`` runs its forward passes under bf16 autocast."""
    value = parse_bf16(setting)
    if value != "auto":
        return value == "true"
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16(cpuinfo)
    return False  # MPS and others: fp32 unless forced


def describe_precision(
    setting: bool | str, device: torch.device, cpuinfo: Path | str = "/proc/cpuinfo"
) -> str:
    """One line saying which arithmetic training runs in on ``device`` and why, for logs, CI and the report."""
    value, enabled = parse_bf16(setting), use_bf16(setting, device, cpuinfo)
    name = "bf16 autocast" if enabled else "fp32"
    if value != "auto":
        return f"{name} (train.bf16: {value}, forced)"
    if device.type == "cpu":
        native = "has" if cpu_has_native_bf16(cpuinfo) else "has no"
        return f"{name} (train.bf16: auto; this CPU {native} native bf16)"
    return f"{name} (train.bf16: auto on {device.type})"


def bf16_autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``enabled``; otherwise nothing (also on device types autocast lacks)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


if (
    __name__ == "__main__"
):  # `python -m sentcl.training.precision`: what `auto` picks here (printed by .ci/run)
    print(f"training precision on this machine: {describe_precision('auto', torch.device('cpu'))}")
