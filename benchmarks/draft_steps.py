"""The drafter's one-token step, each kind side by side in one process: eager, direct, compiled.

    python benchmarks/draft_steps.py                       # the shipped drafters of the embedded pair
    python benchmarks/draft_steps.py --kinds eager direct  # leave the compiled step out (its compile)
    python benchmarks/draft_steps.py --context 200 --steps 200 --rounds 7 > step.md
    python benchmarks/draft_steps.py --drafter cut=PATH --only cut sd2 --kinds eager direct

Each drafter gets a step of every kind on the same prompt of `--context` tokens; then, round after round,
each kind times `--steps` steered one-token steps (each followed by a rollback, as a block ends), the
kinds alternating inside a round so that machine noise falls on all of them alike. Reported: the median
and range over rounds in ms, and c = step ÷ the verifier's one-token forward (timed in the same rounds,
on the same context), the draft cost k = auto weighs (docs/math.md#the-draft-length). Before timing,
every kind's logits on 16 steered calls are compared with the eager step's: direct must equal them bit
for bit; compiled runs transformers' stock kernels, so the table gives its largest logit difference and
on how many calls the argmax agrees (a near-tie may flip). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from datetime import date

import torch

from sd2.direct_step import DirectDraftStep
from sd2.draft_step import CompiledDraftStep, EagerDraftStep
from sd2.engine import Engine
from sd2.invariant import make_stock
from sd2.kv_cache import rollback_cache

KINDS = {"eager": EagerDraftStep, "direct": DirectDraftStep, "compiled": CompiledDraftStep}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--context", type=int, default=200, help="prompt tokens before the timed steps")
    parser.add_argument("--steps", type=int, default=200, help="steps per kind and round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--drafter", action="append", default=[], metavar="NAME=PATH", help="also time this drafter folder"
    )
    parser.add_argument("--only", nargs="+", help="time only these drafters (default: all loaded)")
    args = parser.parse_args()
    extra = dict(spec.split("=", 1) for spec in args.drafter)
    engine = Engine.load(drafters=extra, draft_step="eager")  # invariant kernels, as eager and direct run
    prompt = [
        int(t) for t in torch.randint(3, 40000, (args.context,), generator=torch.Generator().manual_seed(0))
    ]
    print(f"# Draft steps, {date.today()}\n")
    print(
        f"- machine: {platform.platform()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}"
    )
    print(
        f"- verifier {engine.verifier_name} on {engine.precision}; context {args.context} tokens, "
        f"{args.steps} steered steps per kind and round, {args.rounds} rounds (kinds alternating)\n"
    )
    print("| drafter | step | ms per step (median) | range | c | logits |")
    print("|---|---|---|---|---|---|")
    verifier_ms = _verifier_ms(engine, prompt, args.steps // 4)
    for drafter in engine.loaded_drafters():
        if args.only and drafter.name not in args.only:
            continue
        steps = {kind: _step(kind, drafter) for kind in args.kinds}
        biases = {
            layer: 0.1 * torch.randn(2, mlp.up_proj.out_features).to(drafter.model.dtype)
            for layer, mlp in enumerate(layer.mlp for layer in drafter.model.get_decoder().layers)
        }
        checks = _check(steps, prompt, biases)
        times: dict[str, list[float]] = {kind: [] for kind in steps}
        verifier_times = []
        for _ in range(args.rounds):
            for kind, step in steps.items():
                times[kind].append(_time(step, prompt, biases, args.steps))
            verifier_times.append(verifier_ms())
        verifier = statistics.median(verifier_times)
        for kind, values in times.items():
            median = statistics.median(values)
            print(
                f"| {drafter.name} | {kind} | {median:.2f} | {min(values):.2f}–{max(values):.2f} | "
                f"{median / verifier:.3f} | {checks[kind]} |"
            )
        for step in steps.values():
            getattr(step, "close", lambda: None)()
    print(
        f"\nThe verifier's one-token forward on the same context: {verifier:.1f} ms (median, last drafter's "
        "rounds)."
    )


def _step(kind: str, drafter):
    """A step of that kind for the drafter; the compiled one on a copy on the stock kernels, as an engine
    with --draft-step compiled runs it (torch.compile does not trace the packed products)."""
    if kind != "compiled":
        return KINDS[kind](drafter.model, drafter.draft_head)
    return CompiledDraftStep(make_stock(copy.deepcopy(drafter.model)), drafter.draft_head)


@torch.inference_mode()
def _check(steps: dict, prompt: list[int], biases: dict) -> dict[str, str]:
    """Every kind's logits on the same calls against the eager step's, in words for the table."""
    outputs = {}
    for kind, step in steps.items():
        step.start(prompt, room=64)
        with step.steering(biases):
            outputs[kind] = [step.logits([t]) for t in prompt[:16]]
    result = {}
    for kind, logits in outputs.items():
        pairs = list(zip(logits, outputs.get("eager", logits), strict=True))
        if kind == "eager":
            result[kind] = "reference"
        elif all(torch.equal(a, b) for a, b in pairs):
            result[kind] = "bit for bit"
        else:
            gap = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
            same = sum(int(a.argmax()) == int(b.argmax()) for a, b in pairs)
            result[kind] = f"max abs diff {gap:.3g}, argmax equal in {same}/{len(pairs)}"
    return result


@torch.inference_mode()
def _time(step, prompt: list[int], biases: dict, n: int) -> float:
    step.start(prompt, room=8)
    start = time.perf_counter()
    for i in range(n):
        with step.steering(biases):
            step.logits([prompt[i % len(prompt)]])
        step.crop_to(len(prompt))
    return (time.perf_counter() - start) / n * 1e3


def _verifier_ms(engine: Engine, prompt: list[int], n: int):
    """A timer of the verifier's one-token forward (ms) on a cache holding the prompt."""
    verifier = engine.verifier
    cache = rollback_cache(verifier)
    with torch.inference_mode():
        verifier(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def timer() -> float:
        start = time.perf_counter()
        for i in range(n):
            verifier(input_ids=torch.tensor([[prompt[i]]]), cache=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)
        return (time.perf_counter() - start) / n * 1e3

    return timer


if __name__ == "__main__":
    main()
