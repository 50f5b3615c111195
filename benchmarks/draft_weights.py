"""Drafters on int8 copies of their weights against the same drafters on their own weights, side by side
in one `sd2 bench` run: τ, α̂, c, greedy match and decode speed-up over the verifier alone.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/draft_weights.py --drafters sd2 pretrained \
        --prompt-sets chat code summarize --k auto --max-new-tokens 96 --max-prompts 24 \
        --out assets/benchmarks/draft_weights

The engine loads every drafter on its full weights (`--draft-weights full`); each named drafter gets a
copy, NAME-int8, on int8 copies of its weights (sd2.int8_weights), and the bench runs the verifier,
NAME and NAME-int8 over the same prompts in one process (sd2.bench.harness), so machine drift falls on
every method alike. Writes the bench's bench.md and bench.json to --out and prints the markdown.
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from sd2.bench.harness import run_bench
from sd2.bench.plan import BenchPlan, resolve_methods
from sd2.bench.prompts import load_prompt_sets
from sd2.bench.report import RunInfo, write_outputs
from sd2.cli_args import parse_drafters
from sd2.engine import Engine
from sd2.int8_weights import use_int8_weights


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drafters", nargs="+", default=["sd2", "pretrained"], help="drafters to compare")
    parser.add_argument(
        "--drafter", action="append", default=[], metavar="NAME=PATH", help="load this folder too"
    )
    parser.add_argument("--prompt-sets", nargs="+", default=["chat"])
    parser.add_argument("--k", nargs="+", default=["auto"], help="draft lengths: integers or auto")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-prompts", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    extra = parse_drafters(args.drafter)
    engine = Engine.load(drafters=extra, draft_weights="full")
    for name in args.drafters:
        drafter = engine.drafter(name)
        int8 = replace(
            drafter,
            name=f"{name}-int8",
            model=copy.deepcopy(drafter.model),
            draft_head=copy.deepcopy(drafter.draft_head),
        )
        use_int8_weights(int8.model, int8.draft_head)
        engine.add_drafter(int8)
    methods = ["verifier", *(m for name in args.drafters for m in (name, f"{name}-int8"))]
    plan = BenchPlan(
        methods=resolve_methods(methods, list(engine.drafters)),
        ks=tuple(k if k == "auto" else int(k) for k in args.k),
        temperatures=tuple(args.temperatures),
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        max_prompts=args.max_prompts,
    )
    prompt_sets = load_prompt_sets(names=args.prompt_sets)
    result = run_bench(engine, plan, prompt_sets, on_progress=lambda msg: print(msg, file=sys.stderr))
    info = RunInfo(
        command="python benchmarks/draft_weights.py " + shlex.join(sys.argv[1:]),
        verifier=engine.verifier_name,
        drafters=extra,
        device=engine.placement.device.type,
        dtype=engine.placement.precision,
        batch_invariant=engine.batch_invariant,
        packed_weights=engine.packed_weights,
        draft_weights="full (NAME-int8: int8 copies)",
    )
    paths = write_outputs(result, info, args.out)
    print(paths["markdown"].read_text())


if __name__ == "__main__":
    main()
