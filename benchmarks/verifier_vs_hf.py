"""Issue 2's benchmark: our verifier-only loop against transformers' `generate`, and `self` speculation.

In one process, on the embedded verifier (or --verifier), on the same prompts and lengths:
  1. `verifier` (our loop) and `hf-generate` (greedy `model.generate`), one warm-up each, then
     --repeats repetitions interleaved (the order alternates every repetition); reports decode and
     end-to-end tokens/s, their ratio (target ≥ 0.95) and whether the token ids are identical;
  2. `self` (the verifier drafting for itself) at each k of --ks: τ must be exactly k + 1.
Prints a Markdown table with machine, date and command, then PASS/FAIL lines; exits 1 on any FAIL.
This is a benchmark, not a test: run it on a quiet machine.

    .venv/bin/python benchmarks/verifier_vs_hf.py                       # the full run (minutes)
    .venv/bin/python benchmarks/verifier_vs_hf.py --prompts 2 --max-new-tokens 32 --repeats 1
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from datetime import UTC, datetime

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RATIO_TARGET = 0.95  # ours ≥ 0.95 × hf-generate tokens/s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verifier", default=None, help="default: embedded SmolLM2-135M-Instruct")
    p.add_argument("--device", default=None)
    p.add_argument(
        "--prompt-set", default=None, help="a file stem in assets/prompts (default: chat, else demo)"
    )
    p.add_argument("--prompts", type=int, default=4, help="prompts used from the set")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 3, 8])
    return p.parse_args(argv)


def choose_prompt_set(name: str | None):
    from sd2.bench.prompts import load_prompt_sets
    from sd2.paths import assets_dir, prompts_dir

    if name is None:
        name = "chat" if assets_dir() is not None and (prompts_dir() / "chat.jsonl").is_file() else "demo"
    return load_prompt_sets(names=[name])[0]


def measure(engine, prompt_set, args):
    """Runs 1 and 2 of the module docstring; returns the cell summaries and the prompts used."""
    from sd2.bench.aggregate import aggregate
    from sd2.bench.harness import fitting_prompts, make_runner, run_prompt_set, trim_memory
    from sd2.bench.plan import BenchPlan, resolve_methods

    baseline = BenchPlan(
        methods=resolve_methods(["verifier", "hf-generate"], []),
        ks=tuple(args.ks),
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        max_prompts=args.prompts,
    )
    speculative = BenchPlan(
        methods=resolve_methods(["self"], []),
        ks=tuple(args.ks),
        max_new_tokens=args.max_new_tokens,
        repeats=1,
        warmup=0,
        max_prompts=args.prompts,
    )
    prompt_set = fitting_prompts(engine, baseline, prompt_set)
    trim_memory()  # loading the chat set leaves a heap that slows torch on CPU 4×: see trim_memory
    measurements = []
    for plan in (baseline, speculative):
        runners = {cell.label: make_runner(engine, cell) for cell in plan.cells()}
        measurements += run_prompt_set(engine, plan, prompt_set, 0.0, runners)
    return aggregate(baseline.cells() + speculative.cells(), measurements, {}), prompt_set


def report(summaries, prompt_set, args) -> tuple[str, list[tuple[bool, str]]]:
    """The Markdown report and the (passed, line) checks."""
    from sd2.bench.report import machine_info

    by_label = {(s.method, s.k): s for s in summaries}
    ours, hf = by_label[("verifier", None)], by_label[("hf-generate", None)]
    machine = machine_info()
    lines = [
        f"# verifier vs hf-generate — {datetime.now(UTC).isoformat(timespec='seconds')}",
        "",
        f"- command: `{shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])}`",
        f"- machine: {machine['platform']}, {machine['cpu_count']} CPUs ({machine['torch_threads']} torch "
        f"threads), GPU: {machine['cuda'] or 'none'}; torch {machine['torch']}, transformers "
        f"{machine['transformers']}",
        f"- prompts: {len(prompt_set.prompts)} from `{prompt_set.name}` ({prompt_set.source}); "
        f"{args.max_new_tokens} new tokens max; greedy; {args.repeats} interleaved repetitions + 1 warm-up",
        "",
        "| method | decode tok/s (median, range) | e2e tok/s | × hf-generate (decode / e2e) "
        "| ids = verifier | τ |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries:
        label = s.method if s.k is None else f"{s.method} (k={s.k})"
        tps = s.tokens_per_s
        match = "–" if s.greedy_match is None else f"{s.greedy_match:.0%}"
        lines.append(
            f"| {label} | {tps.median:.1f} ({tps.low:.1f}–{tps.high:.1f}) "
            f"| {s.tokens_per_s_e2e.median:.1f} | "
            f"{s.speedup_vs_hf_generate:.3f} / {s.speedup_e2e_vs_hf_generate:.3f} | {match} | {s.tau:.2f} |"
        )
    checks = [
        (
            ours.speedup_vs_hf_generate >= RATIO_TARGET,
            f"decode tokens/s ratio verifier / hf-generate = {ours.speedup_vs_hf_generate:.3f} "
            f"≥ {RATIO_TARGET}",
        ),
        (
            ours.speedup_e2e_vs_hf_generate >= RATIO_TARGET,
            f"end-to-end tokens/s ratio = {ours.speedup_e2e_vs_hf_generate:.3f} ≥ {RATIO_TARGET}",
        ),
        (
            hf.greedy_match == 1.0,
            f"hf-generate token ids identical to ours on {hf.greedy_match:.0%} of prompts",
        ),
    ]
    for k in args.ks:
        s = by_label[("self", k)]
        checks.append(
            (
                s.tau is not None and abs(s.tau - (k + 1)) < 1e-9,
                f"self k={k}: τ = {s.tau if s.tau is None else round(s.tau, 4)} (must be {k + 1}); "
                f"ids = verifier on {s.greedy_match:.0%} of prompts",
            )
        )
    return "\n".join(lines), checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from sd2.engine import Engine

    engine = Engine.load(args.verifier, device=args.device)
    prompt_set = choose_prompt_set(args.prompt_set)
    summaries, prompt_set = measure(engine, prompt_set, args)
    table, checks = report(summaries, prompt_set, args)
    print(table)
    print()
    for passed, line in checks:
        print(f"{'PASS' if passed else 'FAIL'} {line}")
    return 0 if all(passed for passed, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
