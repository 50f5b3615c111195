"""`sd2 bench`: arguments and entry point. Only argparse is imported at module level (the CLI stays fast)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sd2.cli_args import (
    add_draft_step_argument,
    add_draft_weights_argument,
    add_packed_weights_argument,
    add_placement_arguments,
    load_engine,
    parse_drafters,
)
from sd2.config import DECODE_DEFAULTS, parse_k

if TYPE_CHECKING:
    from sd2.bench.plan import BenchPlan
    from sd2.engine import Engine

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench options (defaults None = the plan's default, or the --quick one)."""
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help="verifier, hf-generate, self, hf-assisted[:DRAFTER], or a drafter name "
        "(default: verifier hf-generate self, plus hf-assisted and every drafter)",
    )
    p.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="load a drafter folder under NAME (repeatable); hf-assisted prefers 'pretrained'",
    )
    p.add_argument(
        "--verifier", default=None, help="hub id or folder (default: embedded SmolLM2-135M-Instruct)"
    )
    add_placement_arguments(p)
    add_draft_step_argument(p)
    add_draft_weights_argument(p)
    add_packed_weights_argument(p)
    p.add_argument(
        "--stock-kernels",
        action="store_true",
        help="our loops on transformers' own kernels too (not exact: see greedy_match); by default they run "
        "batch-invariant and hf-generate / hf-assisted on the stock kernels, in the same precision",
    )
    p.add_argument(
        "--prompt-sets",
        nargs="+",
        default=None,
        metavar="NAME",
        help="prompt files (stems) in --prompts-dir, or 'demo' (default: every file, else demo)",
    )
    p.add_argument("--prompts-dir", type=Path, default=None, help="default: the repository's assets/prompts")
    p.add_argument(
        "--k",
        nargs="+",
        type=parse_k,
        default=None,
        help=f"draft lengths, integers or auto (default: {DECODE_DEFAULTS.k})",
    )
    p.add_argument(
        "--temperatures",
        nargs="+",
        type=float,
        default=None,
        help=f"default {DECODE_DEFAULTS.temperature:g} (greedy)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"default {DECODE_DEFAULTS.max_new_tokens} (quick: 32)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repetitions per cell (default 3, quick 2); each redraws the same seeded sample",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="independent samples of each prompt at T > 0, pooled into τ (default 1; T = 0 runs one): "
        "what a sampled τ needs, where --repeats only times the same draw again",
    )
    p.add_argument(
        "--max-prompts", type=int, default=None, help="prompts per set, 0 = all (default 10, quick 2)"
    )
    p.add_argument(
        "--draft-threshold",
        type=float,
        default=None,
        help="the confidence stop of our speculative cells: a block's draft ends after a draft whose "
        f"drafter probability is ≤ this (default {DECODE_DEFAULTS.draft_threshold} = off; hf-assisted "
        "keeps transformers' own schedule)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"sample j of prompt i is drawn with seed + 1000·j + i (default {DECODE_DEFAULTS.seed}); at "
        "T > 0 another seed gives new samples (runs of several seeds pool with benchmarks/paired_tau.py)",
    )
    p.add_argument(
        "--counterfactual",
        action="store_true",
        help="steered methods also draft each block unsteered and have the verifier judge it on the side: "
        "the report adds the steering gain per cell (the output and the speed figures stay the same)",
    )
    p.add_argument(
        "--batch",
        nargs="+",
        type=int,
        default=None,
        metavar="B",
        help="instead of the method comparison: B requests of each method decoded together against one "
        "after another (aggregate and per-request tokens/s, p50/p95 latency, tokens checked against solo "
        "runs), e.g. --batch 1 2 4 8 16; our loop's methods only",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: under ~3 minutes on 2 CPU cores")
    p.add_argument("--k-sweep", action="store_true", help="try k ∈ {1,2,3,4,6,8,12} and report the best k")
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default: $SD2_HOME/bench/<UTC time>)"
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="also store the result in a running sd2 service (e.g. http://127.0.0.1:8000), "
        "shown by the UI's History and Theory views",
    )
    p.add_argument("--label", default=None, help="a label for the stored result")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SD2_API_KEY"),
        help="X-API-Key for --store (default: $SD2_API_KEY)",
    )


def build_plan(args: argparse.Namespace, drafter_names: list[str]) -> BenchPlan:
    """Command-line arguments → BenchPlan (explicit options win over --quick and --k-sweep defaults)."""
    from sd2.bench.plan import K_SWEEP, K_SWEEP_QUICK, BenchPlan, quick_plan, resolve_methods

    methods = [m for value in args.methods for m in value.split(",") if m] if args.methods else None
    plan = BenchPlan(
        methods=resolve_methods(methods, drafter_names),
        k_sweep=args.k_sweep,
        counterfactual=args.counterfactual,
    )
    if args.quick:
        plan = quick_plan(plan)
    if args.k_sweep:
        plan = replace(plan, ks=K_SWEEP_QUICK if args.quick else K_SWEEP)
    explicit = {
        "ks": tuple(args.k) if args.k else None,
        "temperatures": tuple(args.temperatures) if args.temperatures else None,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "samples": args.samples,
        "seed": args.seed,
        "draft_threshold": args.draft_threshold,
    }
    plan = replace(plan, **{key: value for key, value in explicit.items() if value is not None})
    if args.max_prompts is not None:
        plan = replace(plan, max_prompts=args.max_prompts or None)  # 0 = every prompt of the set
    return plan


def run(args: argparse.Namespace) -> int:
    from sd2.bench.harness import run_bench
    from sd2.bench.prompts import load_prompt_sets
    from sd2.bench.report import RunInfo, write_outputs
    from sd2.paths import sd2_home

    drafters = parse_drafters(args.drafter)
    plan = build_plan(args, list(drafters))
    prompt_sets = load_prompt_sets(args.prompts_dir, args.prompt_sets)  # cut to max_prompts by run_bench
    engine = load_engine(args, drafters)
    if plan.counterfactual and not _steered_methods(plan, engine):
        log.warning(
            "bench: --counterfactual, but no method runs a drafter with a steering head: no gain rows"
        )
    if args.batch:
        return _run_batched(args, engine, plan, prompt_sets, drafters)
    result = run_bench(engine, plan, prompt_sets, on_progress=lambda msg: log.info("bench: %s", msg))
    info = RunInfo(
        command="sd2 " + shlex.join(sys.argv[1:]),
        verifier=engine.verifier_name,
        drafters=drafters,
        device=engine.placement.device.type,
        dtype=engine.placement.precision,
        batch_invariant=engine.batch_invariant,
        packed_weights=engine.packed_weights,
        draft_weights=engine.draft_weights,
    )
    out = args.out or sd2_home() / "bench" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    paths = write_outputs(result, info, out)
    print(paths["markdown"].read_text())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if args.store:
        return _store(paths["json"], args)
    return 0


def _run_batched(
    args: argparse.Namespace, engine: Engine, plan: BenchPlan, prompt_sets: list, drafters: dict[str, str]
) -> int:
    """`--batch`: sd2.bench.batched for the plan's methods of our loop, its sets, temperatures and k."""
    from sd2.bench.batched import batched_markdown, batched_record, describe, run_batched
    from sd2.bench.harness import fitting_prompts
    from sd2.paths import repo_relative, sd2_home

    if min(args.batch) < 1:
        print("sd2 bench: --batch sizes must be ≥ 1", file=sys.stderr)
        return 2
    methods = [m for m in plan.methods if m.runner == "ours"]
    if skipped := [m.name for m in plan.methods if m.runner != "ours"]:
        log.warning("bench --batch: %s run no loop of ours: left out", ", ".join(skipped))
    sets = [fitting_prompts(engine, plan, s) for s in prompt_sets]
    engine.warm_up()  # cost profiles and warm kernels, once for every method
    rows = []
    for method in methods:
        ks = plan.ks if method.speculative else (plan.context_k,)
        decodes = [plan.decode(k, t) for t in plan.temperatures for k in ks]
        rows += run_batched(
            engine,
            [method.name],
            sets,
            args.batch,
            decodes,
            plan.repeats,
            on_row=lambda row: log.info("bench: %s", describe(row)),
        )
    models = {
        "verifier": engine.verifier_name,
        "drafters": {name: repo_relative(path) for name, path in drafters.items()},
        "device": engine.placement.device.type,
        "dtype": engine.placement.precision,
    }
    created = datetime.now(UTC)
    record = batched_record(rows, "sd2 " + shlex.join(sys.argv[1:]), models, created)
    out = args.out or sd2_home() / "bench" / created.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "batched.json").write_text(json.dumps(record, indent=1) + "\n")
    markdown = batched_markdown(record, rows)
    (out / "batched.md").write_text(markdown)
    print(markdown)
    print(f"json: {out / 'batched.json'}\nmarkdown: {out / 'batched.md'}")
    return 1 if any(row.identical < row.batch for row in rows) else 0


def _steered_methods(plan: BenchPlan, engine: Engine) -> list[str]:
    """The plan's methods that run our loop with a drafter that has a steering head."""
    return [
        m.name
        for m in plan.methods
        if m.runner == "ours"
        and m.drafter in engine.drafter_names()
        and engine.drafter(m.drafter).head is not None
    ]


def _store(json_path: Path, args: argparse.Namespace) -> int:
    import json

    from sd2.bench.store import StoreError, store_result

    try:
        stored = store_result(json.loads(json_path.read_text()), args.store, args.api_key, args.label)
    except StoreError as err:
        print(f"sd2 bench: not stored: {err} (the result is in {json_path})", file=sys.stderr)
        return 1
    print(f"stored as benchmark #{stored['id']} at {args.store.rstrip('/')}/benchmarks/{stored['id']}")
    return 0
