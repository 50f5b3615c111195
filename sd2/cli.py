"""The library's commands: `generate`, `bench`, `train`, `data` (`python -m sd2`).

The `sd2` console script (`launcher.cli`) adds `serve` and `ui` on top; this module imports neither the
service nor the UI."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from sd2.cli_args import (
    add_draft_step_argument,
    add_draft_weights_argument,
    add_packed_weights_argument,
    add_placement_arguments,
    load_engine,
    parse_drafters,
)
from sd2.config import DECODE_DEFAULTS, parse_k

DEFAULT_PROMPT = "Explain in three sentences why the sky is blue."


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode one prompt and show the per-token trace")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message (chat-templated unless --raw)")
    p.add_argument(
        "--method", default=None, help="verifier, self, or a drafter name (default: sd2 or the first drafter)"
    )
    p.add_argument(
        "--drafter", action="append", default=[], metavar="[NAME=]PATH", help="load a drafter folder"
    )
    p.add_argument(
        "--verifier", default=None, help="hub id or folder (default: embedded SmolLM2-135M-Instruct)"
    )
    p.add_argument("--no-steering", action="store_true", help="run a steered drafter without its head")
    p.add_argument(
        "--counterfactual",
        action="store_true",
        help="with a steered drafter, also draft each block unsteered and judge it on the side: each "
        "block gets a won/tied/lost record and the run a steering gain (the output stays the same)",
    )
    p.add_argument(
        "--k",
        type=parse_k,
        default=DECODE_DEFAULTS.k,
        help="drafts per block, or auto (the default): each block's k from the pair's measured costs "
        "and the run's acceptance so far",
    )
    p.add_argument(
        "--draft-threshold",
        type=float,
        default=DECODE_DEFAULTS.draft_threshold,
        help="stop a block's draft once the drafter's probability of its latest draft is ≤ this (0 = never)",
    )
    p.add_argument("--temperature", type=float, default=DECODE_DEFAULTS.temperature, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=DECODE_DEFAULTS.top_k, help="0 = off")
    p.add_argument("--top-p", type=float, default=DECODE_DEFAULTS.top_p, help="1 = off")
    p.add_argument("--max-new-tokens", type=int, default=DECODE_DEFAULTS.max_new_tokens)
    p.add_argument("--seed", type=int, default=DECODE_DEFAULTS.seed)
    p.add_argument(
        "--raw", action="store_true", help="send the prompt as plain text, without the chat template"
    )
    add_placement_arguments(p)
    add_draft_step_argument(p)
    add_draft_weights_argument(p)
    add_packed_weights_argument(p)
    p.add_argument(
        "--stock-kernels",
        action="store_true",
        help="run the verifier on transformers' own kernels: faster on some CPUs, but a verify's logits "
        "then depend on its length, so output is no longer guaranteed identical to the verifier's",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (docs/trace.md)")
    p.add_argument("--no-color", action="store_true")
    p.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    from sd2.config import DecodeConfig
    from sd2.console import format_metrics, render_blocks
    from sd2.engine import GenerateRequest

    decode = DecodeConfig(
        k=args.k,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        draft_threshold=args.draft_threshold,
    )
    drafters = parse_drafters(args.drafter)
    engine = load_engine(args, drafters)
    method = args.method or next(iter(engine.drafter_names()), "verifier")  # sd2 first when it ships
    request = GenerateRequest(
        prompt=args.prompt,
        method=method,
        decode=decode,
        steering=not args.no_steering,
        chat=not args.raw,
        counterfactual=args.counterfactual,
    )
    if args.json:
        print(json.dumps(engine.generate(request).to_dict(), ensure_ascii=False))
        return 0
    colour = not args.no_color and sys.stdout.isatty()
    for item in engine.stream(request):
        if hasattr(item, "drafts"):
            print(render_blocks([item], colour=colour, show_drafts=colour), end="", flush=True)
        else:
            print()
            print(format_metrics(item.metrics, method))
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from sd2.bench.command import add_arguments, run  # argparse only; the heavy imports wait for run

    p = sub.add_parser("bench", help="benchmark methods × prompt sets × temperatures × k (sd2.bench)")
    add_arguments(p)
    p.set_defaults(func=run)


def _add_train(sub: argparse._SubParsersAction) -> None:
    from sd2.train.cli import add_train_parser  # argparse only; torch-heavy imports wait for the run

    add_train_parser(sub)


def _add_data(sub: argparse._SubParsersAction) -> None:
    from sd2.data.cli import add_data_parser

    add_data_parser(sub)


def add_library_commands(sub: argparse._SubParsersAction) -> None:
    """generate, bench, train and data: the commands that need only the `sd2` package."""
    _add_generate(sub)
    _add_bench(sub)
    _add_train(sub)
    _add_data(sub)


def new_parser(prog: str = "sd2") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The top-level parser (with -v) and its empty subcommand set, for this module and the launcher."""
    parser = argparse.ArgumentParser(prog=prog, description="Steered speculative decoding lab (SD²).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    return parser, parser.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    parser, sub = new_parser("python -m sd2")
    add_library_commands(sub)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, set up logging and run the chosen command; a bad value is exit code 2 with one line."""
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"sd2: error: {err}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
