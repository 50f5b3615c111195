"""Device and dtype choice: CUDA + bf16 when available, else CPU fp32 (DESIGN.md §5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    """Where and in which precision the models run."""

    device: torch.device
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.device.type}/{str(self.dtype).removeprefix('torch.')}"


def default_placement(device: str | None = None) -> Placement:
    """CUDA with bf16 when a GPU is present (or asked for), CPU with fp32 otherwise."""
    chosen = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA device is available")
    return Placement(chosen, torch.bfloat16 if chosen.type == "cuda" else torch.float32)
