"""The run loop: warm-up, then repetitions with every method interleaved, then forward timings.

Order per prompt set and temperature:
    1. warm up   each cell on the first prompt (untimed, `plan.warmup` times; first set only)
    2. repeat    for r in 0..repeats−1: for each cell (order rotated by r, so no method always runs
                 first after a pause): for each prompt: one timed generation of each sample
                 (`plan.samples_at(T)`: one at T = 0)
    3. forwards  isolated T_v(1), T_v(k+1), T_d(1) on the set's first prompts
Then everything is aggregated into one BenchReport.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sd2.bench.aggregate import CellSummary, aggregate, best_k
from sd2.bench.forward import ForwardTimes, measure_forward_times
from sd2.bench.hf import hf_runner
from sd2.bench.measure import Measurement, Runner, ours_runner
from sd2.bench.plan import SAMPLE_SEED_STRIDE, SELF, BenchPlan, Cell
from sd2.bench.prompts import PromptSet
from sd2.config import DecodeConfig
from sd2.engine import Engine
from sd2.memory import release_freed_memory

log = logging.getLogger(__name__)


@dataclass
class BenchResult:
    """Raw measurements and their aggregation; `sd2.bench.report` turns it into files."""

    plan: BenchPlan
    prompt_sets: list[PromptSet]
    measurements: list[Measurement]
    forward_times: dict[str, ForwardTimes]
    summaries: list[CellSummary]
    best_k: list[dict]
    cost_profiles: dict[str, dict] = field(default_factory=dict)  # method → the profile k = auto used


trim_memory = release_freed_memory  # see sd2.memory: a parsed corpus leaves a heap that slows torch


def make_runner(engine: Engine, cell: Cell, counterfactual: bool = False) -> Runner:
    """The cell's runner; `counterfactual` (our loop only) records steered blocks' counterfactuals."""
    if cell.method.runner == "ours":
        return ours_runner(engine, cell, counterfactual)
    return hf_runner(engine, cell)


def decode_config(
    plan: BenchPlan, cell: Cell, temperature: float, prompt_index: int, sample: int = 0
) -> DecodeConfig:
    """Same lengths, filters and seeds for every method; baselines get the largest k (unused by them)
    so the prompt-length check keeps the same prompts for everyone."""
    return plan.decode(cell.k or plan.context_k, temperature, plan.generation_seed(prompt_index, sample))


def fitting_prompts(engine: Engine, plan: BenchPlan, prompt_set: PromptSet) -> PromptSet:
    """The set's first `plan.max_prompts` prompts that fit the verifier's context with the plan's lengths
    (the same prompts for every method); skipped ones are counted in `n_too_long`."""
    decode = DecodeConfig(k=plan.context_k, max_new_tokens=plan.max_new_tokens)
    kept, skipped = [], 0
    for prompt in prompt_set.prompts:
        if plan.max_prompts is not None and len(kept) == plan.max_prompts:
            break
        try:
            engine.encode(prompt.request("verifier", decode))
        except ValueError as err:
            if "too long" not in str(err):
                raise
            skipped += 1
            continue
        kept.append(prompt)
    if skipped:
        log.warning("%s: skipped %d prompts too long for the context", prompt_set.name, skipped)
    return replace(prompt_set, prompts=tuple(kept), n_too_long=skipped)


def run_prompt_set(
    engine: Engine,
    plan: BenchPlan,
    prompt_set: PromptSet,
    temperature: float,
    runners: dict[str, Runner],
    warmup: int | None = None,
) -> list[Measurement]:
    """Steps 1–2 of the module docstring for one prompt set at one temperature (warmup: default plan's)."""
    cells, measurements = plan.cells(), []

    def run(cell: Cell, index: int, repeat: int, sample: int = 0) -> Measurement:
        prompt = prompt_set.prompts[index]
        stats = runners[cell.label](prompt, decode_config(plan, cell, temperature, index, sample))
        return Measurement(
            cell.method.name, prompt_set.name, prompt.id, temperature, cell.k, repeat, stats, sample
        )

    samples = range(plan.samples_at(temperature))

    for cell in cells:  # 1. warm up
        for _ in range(plan.warmup if warmup is None else warmup):
            measurements.append(run(cell, 0, -1))
    for repeat in range(plan.repeats):  # 2. repeat, interleaved
        shift = repeat % len(cells)
        for cell in cells[shift:] + cells[:shift]:
            log.info(
                "%s T=%g rep %d/%d: %s", prompt_set.name, temperature, repeat + 1, plan.repeats, cell.label
            )
            measurements.extend(
                run(cell, i, repeat, j) for i in range(len(prompt_set.prompts)) for j in samples
            )
    return measurements


def forward_times(engine: Engine, plan: BenchPlan, prompt_set: PromptSet) -> ForwardTimes:
    """Step 3: isolated forwards on the first `plan.forward_prompts` prompts of the set."""
    drafters = {c.method.drafter for c in plan.cells() if c.method.drafter is not None}
    models = {name: engine.verifier if name == SELF else engine.drafters[name].model for name in drafters}
    decode = DecodeConfig(k=plan.context_k, max_new_tokens=plan.max_new_tokens)
    prompts = [
        engine.encode(p.request("verifier", decode)) for p in prompt_set.prompts[: plan.forward_prompts]
    ]
    return measure_forward_times(
        prompt_set.name, engine.verifier, models, prompts, plan.forward_ks, plan.forward_repeats
    )


def run_bench(
    engine: Engine,
    plan: BenchPlan,
    prompt_sets: Sequence[PromptSet],
    on_progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Run the whole plan in this process and aggregate it."""
    runners = {cell.label: make_runner(engine, cell, plan.counterfactual) for cell in plan.cells()}
    prompt_sets = [fitting_prompts(engine, plan, s) for s in prompt_sets]
    crowded = [s.name for s in prompt_sets if len(s.prompts) > SAMPLE_SEED_STRIDE]
    if plan.samples > 1 and crowded:
        raise ValueError(
            f"--samples {plan.samples} with more than {SAMPLE_SEED_STRIDE} prompts in {', '.join(crowded)} "
            "would give two generations the same seed; pass --max-prompts ≤ "
            f"{SAMPLE_SEED_STRIDE} or --samples 1"
        )
    trim_memory()
    measurements, forwards = [], {}
    for prompt_set in prompt_sets:
        for temperature in plan.temperatures:
            if on_progress:
                on_progress(f"{prompt_set.name} at T={temperature:g}")
            warmup = plan.warmup if not measurements else 0  # once per process is enough
            measurements += run_prompt_set(engine, plan, prompt_set, temperature, runners, warmup)
        forwards[prompt_set.name] = forward_times(engine, plan, prompt_set)
    summaries = aggregate(plan.cells(), measurements, forwards)
    profiles = {method: engine.cost_profile(method).to_dict() for method in engine.measured_cost_profiles}
    return BenchResult(
        plan, list(prompt_sets), measurements, forwards, summaries, best_k(summaries), profiles
    )
