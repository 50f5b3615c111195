"""Why a (k+1)-token verify costs far more than a 1-token step on CPU: torch's `F.linear` on a few
rows (x: [n, d_in], n = 2..9) takes a slow GEMM path, worst on the 49 152 × 576 LM head.

    .venv/bin/python benchmarks/small_batch_linear.py [--threads 2]

Compares F.linear(x, W) with the same product computed as (W @ xᵀ)ᵀ, for the embedded verifier's
MLP and LM-head shapes, n ∈ {1, 2, 5, 9}; median of 50 calls after a warm-up, in one process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = {"mlp up/gate 1536×576": (1536, 576), "lm_head 49152×576": (49152, 576)}


def median_ms(fn, calls: int = 50) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| shape | n | F.linear (ms) | (W @ xᵀ)ᵀ (ms) |\n|---|---|---|---|")
    for name, (d_out, d_in) in SHAPES.items():
        weight = torch.randn(d_out, d_in)
        for n in (1, 2, 5, 9):
            x = torch.randn(n, d_in)
            linear = median_ms(lambda x=x, w=weight: torch.nn.functional.linear(x, w))
            transposed = median_ms(lambda x=x, w=weight: (w @ x.T).T)
            print(f"| {name} | {n} | {linear:.2f} | {transposed:.2f} |")


if __name__ == "__main__":
    main()
