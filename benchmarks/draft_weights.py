"""Drafters on int8 copies of their weights against the same drafters on their own weights: paired,
prompt by prompt, in one process, with the verifier alone as the baseline of both.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/draft_weights.py --drafters sd2 pretrained \
        --prompt-sets chat code summarize --max-prompts 24 --max-new-tokens 96 \
        --out assets/benchmarks/draft_weights.md

The engine loads every drafter on its full weights (`--draft-weights full`); each named drafter gets a
copy, NAME-int8, on int8 copies of its weights (sd2.int8_weights). For every held-out prompt the
verifier alone, NAME and NAME-int8 decode it in turn (the order rotating from prompt to prompt, after
one untimed warm-up run each: sd2.bench.paired), so a shared machine's drift falls on all three alike,
and the speed of the two weight kinds is compared as a paired ratio per prompt: decode ms per token on
full weights ÷ on int8, geometric mean over prompts with a 95 % bootstrap interval (with, in brackets
after it, on how many prompts int8 was faster). Also reported: τ (pooled over prompts), α̂, the draft
step's cost c in decoding (draft step ÷ verifier forward, each variant's own run), the speed-up over
the verifier alone, and on how many prompts both outputs were the verifier's own (T = 0).
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from sd2.bench.paired import run_paired, speedup
from sd2.bench.prompts import load_prompt_sets
from sd2.bench.report import machine_info
from sd2.cli_args import parse_drafters
from sd2.config import DecodeConfig
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
    parser.add_argument("--prompt-sets", nargs="+", default=["chat", "code", "summarize"])
    parser.add_argument("--max-prompts", type=int, default=24, help="held-out prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k", default="auto", help="draft length: an integer or auto")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    args = parser.parse_args()

    engine = Engine.load(drafters=parse_drafters(args.drafter), draft_weights="full")
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
    decode = DecodeConfig(k=args.k if args.k == "auto" else int(args.k), max_new_tokens=args.max_new_tokens)
    sets = load_prompt_sets(names=args.prompt_sets, max_prompts=args.max_prompts)
    methods = ["verifier", *(m for name in args.drafters for m in (name, f"{name}-int8"))]

    lines = [
        "# Drafters on int8 weights against full weights, paired prompt by prompt",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; {machine_info()['cpu_model']}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; precision {engine.precision}",
        f"- command: `python benchmarks/draft_weights.py --drafters {' '.join(args.drafters)} "
        f"--prompt-sets {' '.join(args.prompt_sets)} --max-prompts {args.max_prompts} "
        f"--max-new-tokens {args.max_new_tokens} --k {args.k}`",
        f"- T = 0, k = {args.k}; speed-up = the verifier's decode ms per token ÷ the method's (pooled over "
        "prompts); int8 ÷ full = paired per-prompt ratio of decode time per token, geometric mean [95 % "
        "bootstrap]; c = draft step ÷ verifier forward in decoding (median over prompts); identical = "
        "prompts where both emitted the verifier's own output",
        "",
        "| drafter | set | τ full | τ int8 | α̂ full | α̂ int8 | c full | c int8 | speed-up full "
        "| speed-up int8 | int8 ÷ full | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for prompt_set in sets:
        runs = run_paired(engine, prompt_set.prompts, methods, decode)
        verifier = runs["verifier"]
        for name in args.drafters:
            full, int8 = runs[name], runs[f"{name}-int8"]
            ratio = speedup(int8, full)
            identical = sum(
                a == b == v for a, b, v in zip(full.outputs, int8.outputs, verifier.outputs, strict=True)
            )
            base = verifier.total_ms_per_token
            lines.append(
                f"| {name} | {prompt_set.name} | {full.tau:.3f} | {int8.tau:.3f} | {full.alpha_hat:.3f} | "
                f"{int8.alpha_hat:.3f} | {full.cost:.3f} | {int8.cost:.3f} | "
                f"{base / full.total_ms_per_token:.3f}× | {base / int8.total_ms_per_token:.3f}× | {ratio} | "
                f"{identical}/{len(prompt_set.prompts)} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
