"""Device and precision choice (docs/lossless.md): `--dtype auto|bf16|fp32`, or `$SD2_DTYPE`.

`auto` is bf16 on CUDA and on CPUs with native bf16 arithmetic (AVX-512 BF16 or AMX), fp32 elsewhere:
on the 2-core development CPU bf16 makes a verifier step ≈ 1.8× faster and a (k+1)-token verify cost
about one step, where fp32 makes it 1.7–2.0 steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from sd2.choices import DTYPE_CHOICES, DTYPE_ENV

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # keys: DTYPE_CHOICES without auto
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class Placement:
    """Where and in which precision the models run."""

    device: torch.device
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.device.type}/{self.precision}"

    @property
    def precision(self) -> str:
        """The short name users pass to --dtype: bf16 or fp32."""
        return dtype_name(self.dtype)


def dtype_name(dtype: torch.dtype) -> str:
    return next((name for name, value in DTYPES.items() if value == dtype), str(dtype).removeprefix("torch."))


def cpuinfo_field(name: str) -> str | None:
    """The first `name : value` of Linux's /proc/cpuinfo (e.g. "flags", "model name"), None without it."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith(name):
            return line.split(":", 1)[-1].strip()
    return None


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: AVX-512 BF16 or AMX, as torch's CPU probes (any OS) or
    Linux's /proc/cpuinfo flags report them. Without, bf16 is emulated: a bf16 training step of the
    4-layer cut measured more than 10× slower than fp32 on a Zen 3 EPYC (1 thread: 230 against 20 s)."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if any(getattr(cpu, name, lambda: False)() for name in probes):
        return True
    return bool(_NATIVE_BF16_FLAGS & set((cpuinfo_field("flags") or "").split()))


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (e.g. "AMD EPYC 9B45"), None where it cannot be read."""
    return cpuinfo_field("model name")


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """--dtype (or $SD2_DTYPE when None) → a torch dtype; refuses anything else naming the flag."""
    name = name if name is not None else os.environ.get(DTYPE_ENV, "auto")
    name = name.strip().lower()
    if name not in DTYPE_CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)} (or ${DTYPE_ENV}), got {name!r}")
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":  # pre-Ampere GPUs emulate bf16 slowly: fp32 there
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    else:
        native = device.type == "cpu" and cpu_has_native_bf16()
    return torch.bfloat16 if native else torch.float32


def default_placement(device: str | None = None, dtype: str | None = None) -> Placement:
    """CUDA when a GPU is present (or asked for), else the CPU; precision by `resolve_dtype`. A requested
    device that is not usable here is refused (ValueError naming --device), never replaced."""
    chosen = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r} was requested but no CUDA device is usable here")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise ValueError(
            f"--device {device!r} was requested but this machine has {torch.cuda.device_count()} CUDA "
            "device(s)"
        )
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    return Placement(chosen, resolve_dtype(dtype, chosen))
