"""What a shipped reduced draft vocabulary costs in acceptance and buys in speed: each drafter with its
`draft_vocab.json` against the same drafter with its full head, side by side in one process, on the
held-out prompt sets at T = 0 (outputs are checked equal to the verifier's).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/draft_vocab_tau.py --out assets/benchmarks/draft_vocab_tau.md

The variants alternate prompt by prompt, after one untimed warm-up run each, so drift of a shared
machine hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from sd2.bench.prompts import load_prompt_sets
from sd2.config import DecodeConfig
from sd2.engine import Engine

SETS = ("chat", "code", "summarize")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drafters", nargs="+", default=["pretrained", "sd2"])
    parser.add_argument("--per-set", type=int, default=8, help="held-out prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3, help="a fixed k, so only the head differs")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    engine = Engine.load(dtype=args.dtype)
    for name in args.drafters:
        drafter = engine.drafter(name)
        if drafter.draft_head is None:
            raise SystemExit(f"{name} ships no draft_vocab.json")
        engine.add_drafter(replace(drafter, name=f"{name}/full", draft_head=None))
    decode = DecodeConfig(k=args.k, max_new_tokens=args.max_new_tokens)
    sets = load_prompt_sets(names=list(SETS), max_prompts=args.per_set)
    warmup = sets[0].prompts[0]  # the first calls of each shape are slow: one untimed run per variant
    for method in ("verifier", *args.drafters, *(f"{name}/full" for name in args.drafters)):
        engine.generate(warmup.request(method, decode))
    rows = []
    for name in args.drafters:
        size = engine.drafter(name).draft_head.token_ids.numel()
        for prompt_set in sets:
            stats = {
                variant: {"tokens": 0, "blocks": 0, "ms": 0.0, "draft_ms": 0.0, "drafts": 0}
                for variant in (name, f"{name}/full")
            }
            matches = 0
            for prompt in prompt_set.prompts:
                reference = engine.generate(prompt.request("verifier", decode)).token_ids
                outputs = []
                for variant in (name, f"{name}/full"):
                    result = engine.generate(prompt.request(variant, decode))
                    outputs.append(result.token_ids)
                    judged = [b for b in result.blocks if b.complete and b.kind == "speculative"]
                    s = stats[variant]
                    s["tokens"] += sum(b.n_accepted + 1 for b in judged)
                    s["blocks"] += len(judged)
                    s["ms"] += result.metrics.decode_ms
                    s["draft_ms"] += sum(b.timings.draft_ms for b in result.blocks)
                    s["drafts"] += sum(b.k for b in result.blocks)
                matches += outputs[0] == outputs[1] == reference
            reduced, full = stats[name], stats[f"{name}/full"]
            rows.append(
                (
                    name,
                    size,
                    prompt_set.name,
                    full["tokens"] / full["blocks"],
                    reduced["tokens"] / reduced["blocks"],
                    full["draft_ms"] / full["drafts"],
                    reduced["draft_ms"] / reduced["drafts"],
                    full["ms"] / reduced["ms"],
                    f"{matches}/{len(prompt_set.prompts)}",
                )
            )
    lines = [
        "# Shipped draft vocabularies: τ and speed against the full head",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; precision {engine.precision}, "
        f"{torch.get_num_threads()} torch threads",
        f"- command: `python benchmarks/draft_vocab_tau.py --drafters {' '.join(args.drafters)} "
        f"--per-set {args.per_set} --max-new-tokens {args.max_new_tokens} --k {args.k}`",
        f"- T = 0, k = {args.k}, {args.per_set} held-out prompts per set × {args.max_new_tokens} tokens; "
        "τ over complete blocks; decode speed-up = full-head decode time ÷ reduced; identical = prompts "
        "where both variants emitted the verifier's own greedy output",
        "",
        "| drafter | N | set | τ full head | τ reduced | draft step ms full | reduced | decode speed-up "
        "| identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, size, set_name, tau_full, tau_reduced, step_full, step_reduced, speedup, identical in rows:
        lines.append(
            f"| {name} | {size} | {set_name} | {tau_full:.3f} | {tau_reduced:.3f} | {step_full:.2f} | "
            f"{step_reduced:.2f} | {speedup:.3f}× | {identical} |"
        )
    mean = statistics.fmean(r[7] for r in rows)
    lines += ["", f"Mean decode speed-up of the reduced head: {mean:.3f}×."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
