"""The embedded verifier's cached forward of T tokens on three sets of kernels, in one process:
batch-invariant with packed weights (today's default where oneDNN has them: fp32, or bf16 on CPUs with
native bf16), batch-invariant without them (`make_batch_invariant(packed=False)`: the padded layouts, or
`rows` where no padded layout is invariant), and transformers' stock kernels.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/verifier_kernels.py \
        --out assets/benchmarks/verifier_kernels.md
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/verifier_kernels.py --dtype fp32 --rows 1 2 3 5 9 32 100 \
        --out assets/benchmarks/verifier_kernels_fp32.md

Each variant keeps its own cache over the same prompt (200 tokens by default); a step forwards T tokens
and crops them off again, and the variants take turns step by step, so machine noise falls on all of
them alike. Also checks, on the packed variant, that a T-token forward's logits equal T 1-token ones.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path

import torch
from transformers import DynamicCache

from sd2.bench.prompts import load_prompt_sets
from sd2.config import DecodeConfig
from sd2.decoding import cached_forward
from sd2.devices import cpu_model
from sd2.engine import Engine
from sd2.invariant import RowInvariantLinear, make_batch_invariant, stock_kernels

ROWS = (1, 2, 3, 5, 9)  # a verify of k drafts forwards k + 1 tokens; a short prefill, up to 128, too


def prompt_ids(engine: Engine, length: int, rows: tuple[int, ...]) -> list[int]:
    """At least `length` + max(rows) tokens of held-out chat prompts, chat-templated."""
    ids: list[int] = []
    for prompt in load_prompt_sets(names=["chat"])[0].prompts:
        ids += engine.encode(prompt.request("verifier", DecodeConfig()))
        if len(ids) >= length + max(rows):
            return ids
    raise SystemExit("the chat prompts hold too few tokens for this context")


@torch.inference_mode()
def forward(model, ids: list[int], cache) -> torch.Tensor:
    return cached_forward(model, ids, cache, last_only=False)  # [T, V]


def kernels(name: str, model):
    """The variant's kernels for a while: "stock" swaps transformers' own in, the others keep theirs."""
    return stock_kernels(model) if name == "stock" else nullcontext()


def prefilled(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    forward(model, ids, cache)
    return cache


@torch.inference_mode()
def packed_is_invariant(model, ids: list[int], context: int, rows: tuple[int, ...]) -> bool:
    cache = prefilled(model, ids[:context])
    new = ids[context : context + max(rows)]
    block = forward(model, new, cache)
    cache.crop(-len(new))
    singles = torch.cat([forward(model, [token], cache) for token in new])
    return torch.equal(block, singles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="tokens per forward (≤ 128)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    row_counts = tuple(args.rows)

    engine = Engine.load(dtype=args.dtype, shipped=False)  # batch-invariant, packed where oneDNN has it
    packed = engine.verifier
    with stock_kernels(packed):
        padded = make_batch_invariant(copy.deepcopy(packed), packed=False)
    ids = prompt_ids(engine, args.context, row_counts)
    context, new = ids[: args.context], ids[args.context :]
    variants = {"invariant, packed": packed, "invariant, padded": padded, "stock": packed}
    caches = {}
    for name, model in variants.items():
        with kernels(name, model):
            caches[name] = prefilled(model, context)

    medians: dict[int, dict[str, float]] = {}
    for rows in row_counts:
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, model in variants.items():
                with kernels(name, model):
                    start = time.perf_counter()
                    forward(model, new[:rows], caches[name])
                    samples[name].append(time.perf_counter() - start)
                    caches[name].crop(-rows)
        medians[rows] = {name: 1e3 * statistics.median(times) for name, times in samples.items()}
        print(rows, {name: round(ms, 2) for name, ms in medians[rows].items()}, flush=True)

    invariant = packed_is_invariant(packed, ids, args.context, row_counts)
    layouts = {"invariant, packed": layouts_of(packed), "invariant, padded": layouts_of(padded)}
    report = render(args, medians, invariant, max(row_counts), layouts)
    print(report)
    if args.out:
        args.out.write_text(report)


def layouts_of(model) -> str:
    """The layouts the probe chose for a model's linears, with how many linears take each."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, RowInvariantLinear):
            counts[module.layout] = counts.get(module.layout, 0) + 1
    return ", ".join(f"`{layout}` × {n}" for layout, n in sorted(counts.items()))


def render(
    args, medians: dict[int, dict[str, float]], invariant: bool, widest: int, layouts: dict[str, str]
) -> str:
    names = list(next(iter(medians.values())))
    lines = [
        "# The verifier's cached forward: packed, padded and stock kernels",
        "",
        f"`HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/verifier_kernels.py --context {args.context} "
        f"--rounds {args.rounds} --threads {args.threads} --dtype {args.dtype} "
        f"--rows {' '.join(map(str, args.rows))}`",
        "",
        f"{datetime.now(UTC):%Y-%m-%d}, {platform.machine()} ({cpu_model() or 'CPU model unknown'}), "
        f"{torch.get_num_threads()} threads, "
        f"torch {torch.__version__}; the embedded SmolLM2-135M-Instruct in {args.dtype}, a "
        f"{args.context}-token context, median ms of {args.rounds} forwards per cell, the variants taking "
        "turns.",
        "",
        "| tokens | " + " | ".join(names) + " | packed ÷ padded | packed ÷ stock |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for rows, cell in medians.items():
        ratio_padded = cell["invariant, packed"] / cell["invariant, padded"]
        ratio_stock = cell["invariant, packed"] / cell["stock"]
        lines.append(
            f"| {rows} | "
            + " | ".join(f"{cell[n]:.2f}" for n in names)
            + f" | {ratio_padded:.2f} | {ratio_stock:.2f} |"
        )
    base = {name: medians[1][name] for name in names}
    lines += [
        "",
        "T_v(T)/T_v(1): "
        + "; ".join(
            f"{name} " + ", ".join(f"{medians[r][name] / base[name]:.2f}" for r in medians if r > 1)
            for name in names
        )
        + f" (T = {', '.join(str(r) for r in medians if r > 1)}).",
        "",
        "Layouts the probe chose: " + "; ".join(f"{name}: {text}" for name, text in layouts.items()) + ".",
        "",
        f"Packed: a {widest}-token forward's logits equal {widest} 1-token forwards bit for bit: "
        f"{'yes' if invariant else 'NO'}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
