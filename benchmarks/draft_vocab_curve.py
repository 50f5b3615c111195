"""Coverage / speed curve of a reduced draft vocabulary (issue 19 §3a): for each N, the share of the
verifier's held-out greedy output inside the top-N tokens (a draft can only be accepted there) and the
drafter step time with its head cut to N rows, against the full head, on the shipped drafter.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/draft_vocab_curve.py SYNTH.jsonl [...] \
        --out assets/benchmarks/draft_vocab_curve.md

The ranking comes from `sd2 data synth` answers to training prompts (sd2.data.draft_vocab_build); the
coverage is measured on held-out prompts (assets/prompts), the same ones `sd2 bench` uses. Step times
are medians of cached 1-token steps after a prompt prefill, the sizes interleaved round by round.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from transformers import DynamicCache

from sd2.bench.prompts import load_prompt_sets
from sd2.config import DecodeConfig
from sd2.data.draft_vocab_build import ranked_vocab, recorded_replies, synth_answers
from sd2.decoding import cached_forward
from sd2.devices import cpu_model
from sd2.draft_step import next_logits
from sd2.draft_vocab import coverage, reduced_head_for
from sd2.engine import Engine
from sd2.models import load_tokenizer, resolve_model_path

SIZES = (1024, 2048, 4096, 8192, 16384, 24576)


def held_out_outputs(engine: Engine, per_set: int, max_new_tokens: int) -> dict[str, list[list[int]]]:
    """The verifier's greedy answers (through the sd2 drafter: the same tokens, faster) per prompt set."""
    decode = DecodeConfig(k=3, max_new_tokens=max_new_tokens)
    method = "sd2" if "sd2" in engine.drafter_names() else "verifier"
    sets = load_prompt_sets(names=["chat", "code", "summarize"], max_prompts=per_set)
    return {s.name: [engine.generate(p.request(method, decode)).token_ids for p in s.prompts] for s in sets}


@torch.inference_mode()
def step_times(engine: Engine, drafter_name: str, vocabs: dict, rounds: int) -> dict[str, float]:
    """Median ms of one cached drafter step per head size ("full" = the model's own head)."""
    model = engine.drafter(drafter_name).model
    prompt = engine.encode(
        load_prompt_sets(names=["chat"], max_prompts=1)[0].prompts[0].request("verifier", DecodeConfig())
    )
    heads = {"full": None, **{str(n): reduced_head_for(model, v) for n, v in vocabs.items()}}
    samples: dict[str, list[float]] = {name: [] for name in heads}
    for _ in range(rounds):
        for name, head in heads.items():
            cache = DynamicCache(config=model.config)
            cached_forward(model, prompt, cache, last_only=True)
            start = time.perf_counter()
            next_logits(model, head, torch.tensor([prompt[-1:]]), cache)  # head None: the full one
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("synth_files", type=Path, nargs="+")
    parser.add_argument("--drafter", default="pretrained", help="shipped drafter whose step is timed")
    parser.add_argument("--per-set", type=int, default=12, help="held-out prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    engine = Engine.load(dtype=args.dtype, draft_vocab=False)  # full heads: the curve cuts them itself
    answers = list(synth_answers(args.synth_files))
    tokenizer = load_tokenizer(resolve_model_path(None))  # the embedded verifier's, as `sd2 data draft-vocab`
    fallback = list(recorded_replies(tokenizer, 2000))
    vocabs = {n: ranked_vocab(answers, fallback, n, [tokenizer.eos_token_id], "curve") for n in SIZES}
    outputs = held_out_outputs(engine, args.per_set, args.max_new_tokens)
    times = step_times(engine, args.drafter, vocabs, args.rounds)
    verifier_ms = statistics.median(_verifier_steps(engine, args.rounds))

    machine = cpu_model() or platform.processor() or platform.machine()
    lines = [
        "# Reduced draft vocabulary: coverage and drafter step time",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine}, "
        f"{torch.get_num_threads()} torch threads; precision {engine.precision}",
        f"- command: `python benchmarks/draft_vocab_curve.py {' '.join(str(p) for p in args.synth_files)} "
        f"--per-set {args.per_set} --max-new-tokens {args.max_new_tokens} --rounds {args.rounds}`",
        f"- ranking: {len(answers)} verifier answers to training prompts, then recorded replies of 2000 "
        "training conversations; coverage: the verifier's greedy output on held-out prompts "
        f"({args.per_set} per set × {args.max_new_tokens} tokens)",
        f"- drafter `{args.drafter}` step (cached, 1 token, median of {args.rounds}); verifier step "
        f"{verifier_ms:.2f} ms in the same process",
        "",
        "| N | coverage chat | coverage code | coverage summarize | drafter step ms | step ÷ full head "
        "| c = step ÷ verifier step |",
        "|---|---|---|---|---|---|---|",
    ]
    full = times["full"]
    for n in (*SIZES, "full"):
        label = str(n)
        covered = [
            1.0 if n == "full" else coverage(vocabs[n], outputs[s]) for s in ("chat", "code", "summarize")
        ]
        step = times[label]
        lines.append(
            f"| {label} | {covered[0]:.4f} | {covered[1]:.4f} | {covered[2]:.4f} | {step:.2f} | "
            f"{step / full:.2f} | {step / verifier_ms:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


@torch.inference_mode()
def _verifier_steps(engine: Engine, rounds: int) -> list[float]:
    prompt = engine.encode(
        load_prompt_sets(names=["chat"], max_prompts=1)[0].prompts[0].request("verifier", DecodeConfig())
    )
    cache = DynamicCache(config=engine.verifier.config)
    cached_forward(engine.verifier, prompt, cache, last_only=True)
    times = []
    for _ in range(max(8, rounds // 4)):
        start = time.perf_counter()
        cached_forward(engine.verifier, prompt[-1:], cache, last_only=True)
        times.append((time.perf_counter() - start) * 1e3)
        cache.crop(-1)
    return times


if __name__ == "__main__":
    main()
