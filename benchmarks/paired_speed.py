"""Speed-ups over the verifier alone, paired prompt by prompt, in one process (sd2.bench.paired).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/paired_speed.py --methods verifier pretrained sd2 \
        --prompt-sets chat code summarize --max-prompts 16 --max-new-tokens 96 --k auto \
        --out assets/benchmarks/paired_speed.md
    # a candidate drafter against the shipped sd2:
    ... --methods verifier sd2 cut4 --drafter cut4=assets/drafters/next/cut4-sd2 --against sd2

For every held-out prompt each method decodes it once, in an order rotating from prompt to prompt (after
one untimed warm-up run each), so the machine's drift falls on all methods alike. Per prompt set and
method: τ (pooled), α̂, c in decoding (median over prompts), the pooled speed-up (Σ verifier ms per token ÷
Σ the method's), the paired speed-up (geometric mean of per-prompt ratios, 95 % bootstrap interval), the
same against `--against` with the difference of τ (pooled, 95 % bootstrap interval), and at T = 0 on
how many prompts the output was the verifier's own. The last rows pool every set's prompts. `sd2 bench`
stays the benchmark of record for its tables (hf-* peers, forward ceilings, k sweeps); this is the
measurement to quote when a speed-up is close to a target.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import torch

from sd2.bench.paired import Interval, MethodRuns, run_paired, speedup, tau_difference
from sd2.bench.prompts import load_prompt_sets
from sd2.bench.report import machine_info
from sd2.cli_args import parse_drafters
from sd2.config import DecodeConfig
from sd2.devices import cpu_has_native_bf16
from sd2.engine import Engine

BASELINE = "verifier"


def pooled(runs: list[MethodRuns]) -> MethodRuns:
    """Several sets' runs of one method as one (their prompts side by side, in the sets' order)."""
    out = MethodRuns()
    for part in runs:
        for name in ("ms_per_token", "judged_blocks", "accepted", "alphas", "costs", "outputs"):
            getattr(out, name).extend(getattr(part, name))
    return out


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _interval(value: Interval | None) -> str:
    if value is None:
        return "–"
    return f"{value}{' *' if value.outside_noise else ''} ({value.above}/{value.n})"


def rows(label: str, runs: dict[str, MethodRuns], against: str | None, greedy: bool) -> list[str]:
    """One table row per method of one prompt set (or of all of them pooled)."""
    base = runs[BASELINE]
    out = []
    for method, mine in runs.items():
        if method == BASELINE:
            continue
        other = runs[against] if against and method != against else None
        versus = speedup(mine, other) if other is not None else None
        tau_versus = tau_difference(mine, other) if other is not None and other.tau and mine.tau else None
        identical = sum(a == b for a, b in zip(mine.outputs, base.outputs, strict=True))
        out.append(
            f"| {method} | {label} | {_fmt(mine.tau)} | {_fmt(mine.alpha_hat)} | {_fmt(mine.cost)} | "
            f"{base.total_ms_per_token / mine.total_ms_per_token:.3f}× | {_interval(speedup(mine, base))} | "
            f"{_interval(versus)} | {_interval(tau_versus)} | "
            f"{f'{identical}/{len(base.outputs)}' if greedy else '–'} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", nargs="+", default=[BASELINE, "pretrained", "sd2"])
    parser.add_argument(
        "--drafter", action="append", default=[], metavar="NAME=PATH", help="load this folder too"
    )
    parser.add_argument("--against", default=None, help="also compare every method with this one")
    parser.add_argument(
        "--verifier", default=None, help="a verifier folder or hub id (default: the embedded one)"
    )
    parser.add_argument("--prompt-sets", nargs="+", default=["chat", "code", "summarize"])
    parser.add_argument(
        "--prompts-dir", type=Path, default=None, help="default: the repository's assets/prompts"
    )
    parser.add_argument("--max-prompts", type=int, default=16, help="held-out prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k", default="auto", help="draft length: an integer or auto")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (T > 0)")
    parser.add_argument("--dtype", default=None, help="auto, bf16 or fp32 (default: $SD2_DTYPE, else auto)")
    parser.add_argument("--draft-weights", default=None, help="auto, int8 or full")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    parser.add_argument("--json", type=Path, default=None, help="also write per-prompt numbers here")
    args = parser.parse_args()
    methods = list(dict.fromkeys([BASELINE, *args.methods]))
    if args.against is not None and args.against not in methods:
        parser.error(f"--against {args.against!r} is not one of --methods {methods}")

    engine = Engine.load(
        args.verifier, parse_drafters(args.drafter), dtype=args.dtype, draft_weights=args.draft_weights
    )
    k = args.k if args.k == "auto" else int(args.k)
    decode = DecodeConfig(
        k=k, temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens
    )
    sets = load_prompt_sets(args.prompts_dir, args.prompt_sets, args.max_prompts)
    greedy = args.temperature == 0
    by_set = {}
    for prompt_set in sets:
        by_set[prompt_set.name] = run_paired(engine, prompt_set.prompts, methods, decode)
        print(f"{prompt_set.name}: {len(prompt_set.prompts)} prompts done", flush=True)

    machine = machine_info()
    command = (
        "python benchmarks/paired_speed.py "
        + (f"--verifier {args.verifier} " if args.verifier else "")
        + f"--methods {' '.join(args.methods)} "
        + "".join(f"--drafter {d} " for d in args.drafter)
        + (f"--against {args.against} " if args.against else "")
        + f"--prompt-sets {' '.join(args.prompt_sets)} --max-prompts {args.max_prompts} "
        f"--max-new-tokens {args.max_new_tokens} --k {args.k} --temperature {args.temperature:g}"
    )
    lines = [
        "# Speed-ups over the verifier alone, paired prompt by prompt",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; CPU {machine['cpu_model']} "
        f"({machine['cpu_count']} cores, native bf16: {'yes' if cpu_has_native_bf16() else 'no'}), "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, transformers "
        f"{machine['transformers']}; engine {engine.precision}, draft step {engine.draft_step_kind}, "
        f"drafter weights {engine.draft_weights}",
        f"- command: `{command}`",
        f"- T = {args.temperature:g}, k = {args.k}, {args.max_new_tokens} new tokens; speed-up pooled = Σ "
        "verifier decode ms per token ÷ Σ the method's; paired = geometric mean over prompts of the "
        "per-prompt ratio [95 % bootstrap] (on how many prompts the method was faster), * where the "
        "interval excludes 1; Δτ = difference of pooled τ [95 % bootstrap over prompts] (on how many "
        "prompts the method's τ was the higher), * where it excludes 0; c = draft step ÷ verifier "
        "forward in decoding (median over prompts); identical = prompts whose output was the "
        "verifier's own (T = 0)",
        "",
        f"| method | set | τ | α̂ | c | speed-up pooled | speed-up paired | speed-up vs {args.against or '–'} "
        f"| Δτ vs {args.against or '–'} | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in by_set.items():
        lines += rows(name, runs, args.against, greedy)
    if len(by_set) > 1:
        everything = {m: pooled([runs[m] for runs in by_set.values()]) for m in methods}
        lines += rows("all sets", everything, args.against, greedy)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        per_prompt = {
            name: {m: {key: v for key, v in vars(r).items() if key != "outputs"} for m, r in runs.items()}
            for name, runs in by_set.items()
        }
        args.json.write_text(json.dumps({"command": command, "machine": machine, "sets": per_prompt}))


if __name__ == "__main__":
    main()
