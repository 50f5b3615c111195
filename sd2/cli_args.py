"""Command-line pieces the commands share (argparse only: no torch import): the --device / --dtype
flags of every model-loading command, and --drafter values."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

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


def parse_drafters(values: Sequence[str]) -> dict[str, str]:
    """--drafter PATH or NAME=PATH (repeatable); a bare path is named after its folder."""
    drafters = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            path, name = value, os.path.basename(os.path.normpath(value))
        drafters[name] = path
    return drafters
