"""Answers per hour of `sd2 data synth`: the settings the shipped drafters' data was made with against
today's defaults, on the same training prompts, in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/synth_rate.py [--prompts 512] [--max-new-tokens 160]

Settings compared (the embedded verifier, T = 0, `run_synth` into a throw-away file, 2 threads):
  before   fp32, batch 32, prompts batched as given (the shipped drafters' recipe, docs/drafters.md)
  bf16     bf16, batch 32, as given (what the precision alone buys)
  after    the defaults: bf16, batch 128, batches cut from length-sorted groups, a token budget
Each setting answers the same prompts, settings alternating chunk by chunk (`--chunks`), so a load
change on the machine hits all of them alike. Prints answers/h, generated tok/s, the share of row-steps
that produced a kept token (the rest is padding and rows that had already stopped), and the ratio
against `before`.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

import torch

from sd2.data.cli import training_pool
from sd2.data.synth import SynthConfig, plan_batches, run_synth, synth_prompts
from sd2.engine import Engine


@dataclass
class Tally:
    seconds: float = 0.0
    answers: int = 0
    tokens: int = 0
    row_steps: int = 0  # Σ over batches of rows × the longest answer: what a generate call computes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=512, help="training ShareGPT prompts (the first N)")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--chunks", type=int, default=1, help="alternate the settings over this many chunks")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    defaults = SynthConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    settings = {
        "before": ("fp32", replace(defaults, batch_size=32, sort_batches=0, max_batch_tokens=0)),
        "bf16": ("bf16", replace(defaults, batch_size=32, sort_batches=0, max_batch_tokens=0)),
        "after": ("bf16", defaults),
    }
    engines = {  # stock kernels, as `sd2 data synth` loads them
        dtype: Engine.load(None, device="cpu", shipped=False, dtype=dtype, batch_invariant=False)
        for dtype in ("fp32", "bf16")
    }
    tokenizer = engines["fp32"].tokenizer
    prompts = synth_prompts(training_pool("sharegpt", "train"), tokenizer, defaults.max_prompt_tokens)
    prompts = prompts[: args.prompts]
    size = -(-len(prompts) // args.chunks)
    tallies = {name: Tally() for name in settings}
    with tempfile.TemporaryDirectory() as folder:
        for name, (dtype, config) in settings.items():  # warm-up: first calls of each shape are slow
            engine, warm = engines[dtype], replace(config, max_new_tokens=4)
            run_synth(
                engine.verifier,
                tokenizer,
                prompts[:2],
                Path(folder) / f"warm-{name}.jsonl",
                warm,
                engine.stop_ids,
                progress=False,
            )
        for c in range(args.chunks):
            chunk = prompts[c * size : (c + 1) * size]
            for name, (dtype, config) in settings.items():
                engine, out = engines[dtype], Path(folder) / f"{name}-{c}.jsonl"
                start = time.perf_counter()
                run_synth(engine.verifier, tokenizer, chunk, out, config, engine.stop_ids, progress=False)
                tally = tallies[name]
                tally.seconds += time.perf_counter() - start
                rows = [json.loads(line) for line in out.read_text().splitlines()]
                lengths = {r["id"]: len(r["response_ids"]) for r in rows}
                tally.answers += len(lengths)
                tally.tokens += sum(lengths.values())
                tally.row_steps += sum(
                    len(batch) * max(lengths[p.id] for p in batch) for batch in plan_batches(chunk, config)
                )
                print(f"chunk {c + 1}/{args.chunks} {name}: {tally.seconds:.0f} s so far", flush=True)

    print(
        f"\n{date.today()}, {platform.processor() or platform.machine()}, {args.threads} threads, torch "
        f"{torch.__version__}; {len(prompts)} training ShareGPT prompts, T = 0, max_new_tokens "
        f"{args.max_new_tokens}\n"
    )
    print("| setting | dtype | batch | sorted | answers/h | tok/s | useful row-steps | vs before |")
    print("|---|---|---|---|---|---|---|---|")
    base = tallies["before"].answers / tallies["before"].seconds
    for name, (dtype, config) in settings.items():
        t = tallies[name]
        rate = t.answers / t.seconds
        print(
            f"| {name} | {dtype} | {config.batch_size} | {'yes' if config.sort_batches else 'no'} | "
            f"{rate * 3600:.0f} | {t.tokens / t.seconds:.0f} | {t.tokens / t.row_steps:.2f} | "
            f"{rate / base:.2f}× |"
        )


if __name__ == "__main__":
    main()
