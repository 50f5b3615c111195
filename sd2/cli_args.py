"""Command-line pieces the commands share (argparse only: no torch import until an engine loads): the
--device / --dtype flags of every model-loading command, --draft-step of the decoding ones, --drafter
values, and the Engine those flags describe."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sd2.choices import (
    DRAFT_STEP_CHOICES,
    DRAFT_STEP_ENV,
    DRAFT_WEIGHTS_CHOICES,
    DRAFT_WEIGHTS_ENV,
    DTYPE_CHOICES,
    DTYPE_ENV,
    PACKED_WEIGHTS_ENV,
)

if TYPE_CHECKING:
    from sd2.engine import Engine


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


def add_draft_step_argument(parser: argparse.ArgumentParser) -> None:
    """--draft-step: how the drafter's one-token step runs (sd2.draft_step)."""
    parser.add_argument(
        "--draft-step",
        default=None,
        choices=DRAFT_STEP_CHOICES,
        help=f"the drafter's step (default: ${DRAFT_STEP_ENV}, else auto = compiled on CUDA: a static cache "
        "and CUDA graphs through torch.compile; direct elsewhere: the eager step's logits without "
        "transformers' call stack, for Llama-shaped drafters)",
    )


def add_draft_weights_argument(parser: argparse.ArgumentParser) -> None:
    """--draft-weights: the drafters' weights as they are or as int8 copies (sd2.int8_weights)."""
    parser.add_argument(
        "--draft-weights",
        default=None,
        choices=DRAFT_WEIGHTS_CHOICES,
        help=f"the drafters' products (default: ${DRAFT_WEIGHTS_ENV}, else auto = int8 on a CPU in bf16 with "
        "the eager or direct step: int8 copies of their weights, half the bytes a draft step reads, the "
        "output still the verifier's; full elsewhere)",
    )


def add_packed_weights_argument(parser: argparse.ArgumentParser) -> None:
    """--no-packed-weights: the invariant kernels without packed copies of the weights (sd2.invariant)."""
    parser.add_argument(
        "--no-packed-weights",
        action="store_true",
        help=f"do not keep packed copies of the weights for oneDNN's CPU kernels (default: "
        f"${PACKED_WEIGHTS_ENV}, else on): saves as much memory as the weights (≈ 300 MB for the embedded "
        "verifier in bf16, 600 MB in fp32), slower on CPUs",
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


def load_engine(args: argparse.Namespace, drafters: Mapping[str, str]) -> Engine:
    """The Engine of a decoding command's --verifier, --device, --dtype, --stock-kernels, --draft-step,
    --draft-weights and --no-packed-weights, with `drafters` ({name: path}, from `parse_drafters`)."""
    from sd2.engine import Engine

    return Engine.load(
        args.verifier,
        drafters,
        device=args.device,
        dtype=args.dtype,
        batch_invariant=not args.stock_kernels,
        draft_step=args.draft_step,
        packed_weights=False if args.no_packed_weights else None,
        draft_weights=args.draft_weights,
    )
