"""The --device / --dtype flags every model-loading command shares (argparse only: no torch import)."""

from __future__ import annotations

import argparse

DTYPE_CHOICES = ("auto", "bf16", "fp32")
DTYPE_ENV = "SD2_DTYPE"


def add_placement_arguments(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """--device (unless `device` is False) and --dtype; resolved by `sd2.devices.default_placement`."""
    if device:
        parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=DTYPE_CHOICES,
        help=f"precision (default: ${DTYPE_ENV}, else auto = bf16 on CUDA and on CPUs with native bf16, "
        "fp32 elsewhere)",
    )
