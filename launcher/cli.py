"""The `sd2` console script: the library's commands (`sd2.cli`) plus `serve` and `ui`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sd2.cli import add_library_commands, new_parser, run_command
from sd2.cli_args import (
    add_draft_step_argument,
    add_draft_weights_argument,
    add_packed_weights_argument,
    add_placement_arguments,
    parse_drafters,
)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start the REST service (FastAPI + SQLite trace store) with uvicorn")
    p.add_argument("--host", default=None, help="bind address (default: $SD2_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="default: $SD2_PORT or 8000")
    p.add_argument("--drafter", action="append", default=[], metavar="NAME=PATH", help="add a drafter folder")
    p.add_argument("--no-ui", action="store_true", help="serve the REST API only (no browser UI at /)")
    p.add_argument(
        "--verifier",
        default=None,
        help="hub id or folder (default: $SD2_VERIFIER, else the embedded SmolLM2-135M-Instruct)",
    )
    add_placement_arguments(p)  # --device and --dtype, over $SD2_DEVICE and $SD2_DTYPE
    add_draft_step_argument(p)  # over $SD2_DRAFT_STEP
    add_draft_weights_argument(p)  # over $SD2_DRAFT_WEIGHTS
    add_packed_weights_argument(p)  # over $SD2_PACKED_WEIGHTS

    def run(args: argparse.Namespace) -> int:
        from launcher.serve import serve  # the web stack is imported only by this command

        models = {
            "verifier": args.verifier,
            "device": args.device,
            "dtype": args.dtype,
            "draft_step": args.draft_step,
            "packed_weights": False if args.no_packed_weights else None,
            "draft_weights": args.draft_weights,
        }
        return serve(args.host, args.port, parse_drafters(args.drafter), ui=not args.no_ui, **models)

    p.set_defaults(func=run)


def _add_ui(sub: argparse._SubParsersAction) -> None:
    from app.cli import DEFAULT_API, add_arguments  # argparse only; gradio waits for run_ui

    p = sub.add_parser("ui", help="start the browser UI alone, talking to a running `sd2 serve` over HTTP")
    add_arguments(p)

    def run(args: argparse.Namespace) -> int:
        from app.cli import run_ui

        return run_ui(args.api or os.environ.get("SD2_API_URL", DEFAULT_API), args.host, args.port)

    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser, sub = new_parser("sd2")
    add_library_commands(sub)
    _add_serve(sub)
    _add_ui(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
