"""Paired comparison of methods in an `sd2 bench` result: τ differences with bootstrap intervals.

    python benchmarks/paired_tau.py assets/benchmarks/drafters_chat24.json [--set chat --k 4 --temperature 0]
    python benchmarks/paired_tau.py NEW.json --earlier OLD.json --earlier-label gen5   # across two runs
    python benchmarks/paired_tau.py SAMPLES3.json --set code --temperature 1   # a run with --samples 3
    python benchmarks/paired_tau.py S0.json S1000.json S2000.json --set code --temperature 1  # pooled seeds

Every method decoded the same prompts, so the comparison is paired: for each pair of methods it resamples
prompts with replacement (seeded), recomputes both τ (accepted-and-emitted tokens / verifier blocks,
pooled over the resampled prompts, as `sd2 bench` pools them) and reports the observed difference, its
95 % interval, and on how many prompts each side had the higher per-prompt τ. Markdown on stdout.

At T > 0 a prompt's τ depends on the draw, so a cell wants several samples of each prompt: a run with
`--samples N`, or several runs of the same prompts with different `--seed`s, or both. All samples of a
prompt are pooled before the bootstrap, which resamples prompts with all of their samples. Repetitions
(`--repeats`) redraw the same sample, so only the first is read.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from sd2.bench.paired import pooled_tau, pooled_tau_difference
from sd2.bench.plan import SAMPLE_SEED_STRIDE


def per_prompt(result: dict, prompt_set: str, k: int, temperature: float) -> dict[str, dict[str, tuple]]:
    """method → prompt id → (judged tokens, judged blocks), summed over the samples of that cell's first
    repetition (warm-up generations, repeat −1, are left out as `sd2 bench` leaves them out; later
    repetitions redraw the same samples)."""
    table: dict[str, dict[str, tuple]] = {}
    for gen in result["generations"]:
        if (gen["prompt_set"], gen["k"], gen["temperature"]) != (prompt_set, k, temperature):
            continue
        if gen["repeat"] != 0:
            continue
        tokens, blocks = table.setdefault(gen["method"], {}).get(gen["prompt_id"], (0, 0))
        table[gen["method"]][gen["prompt_id"]] = (
            tokens + gen["judged_tokens"],
            blocks + gen["judged_blocks"],
        )
    return table


def missing_cell(path: Path, result: dict, prompt_set: str, k: int, temperature: float) -> str:
    """The message for a (set, k, T) cell a result does not hold: what was asked and what it holds."""
    held = sorted({(g["prompt_set"], str(g["k"]), g["temperature"]) for g in result["generations"]})
    holds = ", ".join(f"{s} k={c} T={t:g}" for s, c, t in held) or "no generations"
    return f"no generations for set {prompt_set!r}, k={k}, T={temperature:g} in {path}; it holds: {holds}"


def pool_results(results: list[tuple[Path, dict]], prompt_set: str, k: int, temperature: float) -> dict:
    """per_prompt of several results pooled (tokens and blocks summed per prompt). No two may hold the same
    draw: at T = 0 every run draws the same greedy output, and at T > 0 sample j of a run seeds like sample
    0 of a run with --seed seed + 1000·j (`sd2.bench.plan`), so the samples' seeds must not overlap."""
    if temperature == 0 and len(results) > 1:
        raise SystemExit(
            "at T = 0 every run decodes the same greedy output: pooling several would count it twice "
            "(pass one result)"
        )
    seeds: dict[int, Path] = {}
    for path, result in results:
        plan = result["plan"]
        for sample in range(plan.get("samples", 1)):  # results before schema version 3 hold one sample
            seed = plan["seed"] + SAMPLE_SEED_STRIDE * sample
            if seed in seeds:
                raise SystemExit(
                    f"{seeds[seed]} and {path} both hold the samples seeded from {seed}: pooling them "
                    "would count the same draws twice (give each run its own --seed, "
                    f"{SAMPLE_SEED_STRIDE} · --samples apart)"
                )
            seeds[seed] = path
    pooled: dict[str, dict[str, tuple]] = {}
    for path, result in results:
        table = per_prompt(result, prompt_set, k, temperature)
        if not table:
            raise SystemExit(missing_cell(path, result, prompt_set, k, temperature))
        for method, cells in table.items():
            for prompt_id, (tokens, blocks) in cells.items():
                t, b = pooled.setdefault(method, {}).get(prompt_id, (0, 0))
                pooled[method][prompt_id] = (t + tokens, b + blocks)
    return pooled


def compare(a: dict, b: dict, draws: int, seed: int) -> dict:
    ids = sorted(a.keys() & b.keys())
    if not ids:
        raise ValueError("the two methods share no prompts")
    diff = pooled_tau_difference([a[i] for i in ids], [b[i] for i in ids], draws, seed)
    return {
        "prompts": len(ids),
        "diff": diff.mean,
        "low": diff.low,
        "high": diff.high,
        "a_wins": diff.above,
        "b_wins": sum(pooled_tau([a[i]]) < pooled_tau([b[i]]) for i in ids),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "results",
        type=Path,
        nargs="+",
        help="bench.json written by `sd2 bench`; several (same prompts, each its own --seed) are pooled",
    )
    parser.add_argument("--set", dest="prompt_set", default="chat")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--earlier",
        type=Path,
        default=None,
        help="a second bench.json on the same prompts (e.g. an earlier generation's, from git history): "
        "its methods join the comparison as METHOD@LABEL",
    )
    parser.add_argument("--earlier-label", default="earlier", help="the LABEL of --earlier's methods")
    args = parser.parse_args()
    table = pool_results(
        [(path, json.loads(path.read_text())) for path in args.results],
        args.prompt_set,
        args.k,
        args.temperature,
    )
    if args.earlier is not None:
        earlier_result = json.loads(args.earlier.read_text())
        earlier = per_prompt(earlier_result, args.prompt_set, args.k, args.temperature)
        if not earlier:
            raise SystemExit(
                missing_cell(args.earlier, earlier_result, args.prompt_set, args.k, args.temperature)
            )
        table.update({f"{method}@{args.earlier_label}": cells for method, cells in earlier.items()})
    if len(table) < 2:
        raise SystemExit(
            f"{', '.join(map(str, args.results))} has fewer than two methods for {args.prompt_set}, "
            f"k={args.k}, T={args.temperature}"
        )
    print(
        f"# Paired τ comparison — {', '.join(map(str, args.results))}"
        + (f" and {args.earlier} (methods @{args.earlier_label})" if args.earlier else "")
        + f", set {args.prompt_set}, k = {args.k}, T = {args.temperature:g}\n"
    )
    samples = sum(json.loads(path.read_text())["plan"].get("samples", 1) for path in args.results)
    if args.temperature > 0 and samples > 1:
        print(f"{samples} samples of each prompt pooled ({len(args.results)} result(s)).\n")
    print("| method | prompts | τ |\n|---|---|---|")
    for method, cells in table.items():
        print(f"| {method} | {len(cells)} | {pooled_tau(list(cells.values())):.3f} |")
    print(f"\n| A − B | Δτ | 95 % bootstrap interval ({args.draws} draws) | prompts A higher / B higher |")
    print("|---|---|---|---|")
    for a, b in itertools.combinations(table, 2):
        r = compare(table[a], table[b], args.draws, args.seed)
        print(
            f"| {a} − {b} | {r['diff']:+.3f} | [{r['low']:+.3f}, {r['high']:+.3f}] | "
            f"{r['a_wins']} / {r['b_wins']} of {r['prompts']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
