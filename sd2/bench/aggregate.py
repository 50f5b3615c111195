"""Aggregation per method × prompt set × temperature × k: medians, spreads, τ, speed-ups and ceilings.

Conventions (each number in the output follows these):
- tokens/s of one repetition = Σ tokens / Σ time over the set's prompts (a ratio of sums, so long
  generations weigh more). Decode tokens/s counts the tokens after the first over wall − prefill;
  end-to-end counts all tokens over the wall time. A cell reports the median and the range over
  its repetitions.
- speed-up over a baseline = median tokens/s of the method ÷ median tokens/s of the baseline, same
  prompt set and temperature, measured in the same run (decode; `_e2e` variants end to end).
- τ = Σ tokens of judged forwards ÷ judged forwards (ours: complete blocks, as sd2.metrics; HF
  assisted: every verifier forward but the last, which EOS or the length limit usually cuts).
  Acceptance rate, α̂ and the histogram are pooled over every timed generation of the cell (ours only),
  every sample of every prompt included (`--samples`: independent draws at T > 0).
- c = drafter step time ÷ verifier forward time measured in the run (sd2.metrics convention);
  c_fwd = T_d(1) ÷ T_v(1) from isolated forwards. S(α̂, k, c) uses the run's c.
- efficiency = measured decode speed-up over `verifier` (else over `hf-generate`) ÷ S_fwd.
- forward_efficiency = the share of decode time spent in model forwards: forward time per token
  (T_v(1) for baselines, (k·T_d(1) + T_v(k+1))/τ otherwise) × median decode tokens/s. 1 = no
  overhead at all; it is the profile behind `efficiency` (a slow baseline loop inflates that one).
- time_profile (ours only) = where the decode time (wall − prefill) goes, in ms per emitted decode
  token: drafter steps, verifier forwards, steering-vector computation, and `other` = the rest
  (sampling, acceptance tests, KV-cache crops, trace and metric bookkeeping, Python).
- greedy_match (T = 0 only) = fraction of prompts whose first-repetition ids equal the reference's
  (`verifier`, else `hf-generate`); None for the reference itself and at T > 0.
- steering_gain (`--counterfactual`, steered methods only) = steered against unsteered expected
  accepted drafts per block, pooled over blocks, with a 95 % interval over per-prompt mean gains
  (sd2.bench.gain). Its time is out of every speed figure (sd2.bench.measure).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sd2.bench.forward import ForwardTimes
from sd2.bench.gain import CellGain, cell_gain
from sd2.bench.measure import GenerationStats, Measurement
from sd2.bench.plan import HF_GENERATE, VERIFIER, Cell
from sd2.metrics import per_position_acceptance, speedup_ceiling


@dataclass(frozen=True)
class Spread:
    """Median and range of a quantity over repetitions."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        """(high − low) / median: the spread as a fraction of the median."""
        return (self.high - self.low) / self.median if self.median else 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), len(values))


@dataclass(frozen=True)
class CellSummary:
    """Every reported number of one method × prompt set × temperature × k (conventions: module doc)."""

    method: str
    runner: str
    drafter: str | None
    prompt_set: str
    temperature: float
    k: int | str | None  # drafts per block, "auto", or None for the baselines
    n_prompts: int
    n_generations: int
    n_samples: int  # independent samples per prompt (1 at T = 0)
    mean_new_tokens: float
    tau: float | None
    acceptance_rate: float | None
    alpha_hat: float | None
    histogram: list[int]
    per_position_unconditional: list[float]
    per_position_conditional: list[float]
    tokens_per_s: Spread
    tokens_per_s_e2e: Spread
    prefill_ms: float  # median over generations
    speedup_vs_verifier: float | None = None
    speedup_vs_hf_generate: float | None = None
    speedup_e2e_vs_verifier: float | None = None
    speedup_e2e_vs_hf_generate: float | None = None
    cost_ratio: float | None = None
    cost_ratio_fwd: float | None = None
    speedup_ceiling: float | None = None
    forward_ceiling: float | None = None
    efficiency: float | None = None
    mean_k: float | None = None  # drafts per complete block (= k unless k = auto or a threshold cut it)
    forward_efficiency: float | None = None
    greedy_match: float | None = None
    time_profile: dict[str, float] | None = None
    steering_gain: CellGain | None = None  # with --counterfactual, for steered methods only


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def repetition_throughput(stats: Iterable[GenerationStats]) -> tuple[float, float]:
    """(decode tokens/s, end-to-end tokens/s) of one repetition over a prompt set (ratios of sums)."""
    stats = list(stats)
    decode_s = sum(s.decode_ms for s in stats) / 1e3
    wall_s = sum(s.wall_ms for s in stats) / 1e3
    decode_tokens = sum(max(s.n_tokens - 1, 0) for s in stats)
    return (decode_tokens / decode_s if decode_s > 0 else 0.0), (
        sum(s.n_tokens for s in stats) / wall_s if wall_s > 0 else 0.0
    )


def time_profile(stats: Sequence[GenerationStats]) -> dict[str, float] | None:
    """ms per emitted decode token spent drafting, verifying, steering and elsewhere (module doc)."""
    decode_tokens = sum(max(s.n_tokens - 1, 0) for s in stats)
    if not decode_tokens or not any(s.verify_count for s in stats):
        return None
    parts = {
        "draft": sum(s.draft_ms for s in stats),
        "verify": sum(s.verify_ms for s in stats),
        "steer": sum(s.steer_ms for s in stats),
    }
    parts["other"] = sum(s.decode_ms for s in stats) - sum(parts.values())
    parts = {name: ms / decode_tokens for name, ms in parts.items()}
    return {**parts, "total": sum(parts.values())}


def summarize_cell(
    cell: Cell, prompt_set: str, temperature: float, runs: Sequence[Measurement]
) -> CellSummary:
    """The acceptance and speed statistics of one cell from its timed measurements (no baselines yet)."""
    stats = [m.stats for m in runs]
    by_repeat: dict[int, list[GenerationStats]] = defaultdict(list)
    for m in runs:
        by_repeat[m.repeat].append(m.stats)
    throughput = [repetition_throughput(group) for group in by_repeat.values()]
    judged = sum(s.judged_blocks for s in stats)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    overlaps = sum(s.overlap_count for s in stats)
    histogram = [sum(col) for col in zip(*(s.histogram for s in stats), strict=True)] if stats else []
    unconditional, conditional = per_position_acceptance(histogram) if any(histogram) else ([], [])
    draft_steps, verify_count = sum(s.draft_steps for s in stats), sum(s.verify_count for s in stats)
    drafter_step = _ratio(sum(s.draft_ms for s in stats), draft_steps)
    verify_step = _ratio(sum(s.verify_ms for s in stats), verify_count)
    cost_ratio = _ratio(drafter_step, verify_step) if drafter_step is not None and verify_step else None
    return CellSummary(
        method=cell.method.name,
        runner=cell.method.runner,
        drafter=cell.method.drafter,
        prompt_set=prompt_set,
        temperature=temperature,
        k=cell.k,
        n_prompts=len({m.prompt_id for m in runs}),
        n_generations=len(runs),
        n_samples=len({m.sample for m in runs}),
        mean_new_tokens=statistics.fmean(s.n_tokens for s in stats),
        tau=_ratio(sum(s.judged_tokens for s in stats), judged),
        acceptance_rate=_ratio(accepted, drafted),
        alpha_hat=_ratio(sum(s.overlap_sum for s in stats), overlaps),
        histogram=histogram,
        per_position_unconditional=unconditional,
        per_position_conditional=conditional,
        tokens_per_s=Spread.of([t[0] for t in throughput]),
        tokens_per_s_e2e=Spread.of([t[1] for t in throughput]),
        prefill_ms=statistics.median(s.prefill_ms for s in stats),
        cost_ratio=cost_ratio,
        time_profile=time_profile(stats) if cell.method.runner == "ours" else None,
        mean_k=_ratio(drafted, judged) if cell.method.runner == "ours" and cell.k is not None else None,
        steering_gain=cell_gain(runs),
    )


def with_baselines(
    cell: CellSummary, baselines: dict[str, CellSummary], forward: ForwardTimes | None, match: float | None
) -> CellSummary:
    """Add speed-ups over the same set's and temperature's baselines, the ceilings and efficiency."""
    verifier, hf = baselines.get(VERIFIER), baselines.get(HF_GENERATE)

    def speedup(base: CellSummary | None, e2e: bool) -> float | None:
        if base is None:
            return None
        ours, theirs = (
            (cell.tokens_per_s_e2e, base.tokens_per_s_e2e) if e2e else (cell.tokens_per_s, base.tokens_per_s)
        )
        return _ratio(ours.median, theirs.median)

    extra = {
        "speedup_vs_verifier": speedup(verifier, False),
        "speedup_vs_hf_generate": speedup(hf, False),
        "speedup_e2e_vs_verifier": speedup(verifier, True),
        "speedup_e2e_vs_hf_generate": speedup(hf, True),
        "greedy_match": match,
    }
    # The ceilings need a number of drafts: k, or under k = auto the mean drafts per block, rounded
    # for the isolated forward times (measured at whole token counts).
    k = cell.k if isinstance(cell.k, int) or cell.k is None else cell.mean_k
    k_forward = None if k is None else max(1, round(k))
    if forward is not None:
        ms_per_token = forward.ms_per_token(cell.tau, k_forward, cell.drafter)
        if ms_per_token is not None:
            extra["forward_efficiency"] = ms_per_token * cell.tokens_per_s.median / 1e3
    if k is not None and cell.drafter is not None:
        if cell.alpha_hat is not None and cell.cost_ratio is not None:
            extra["speedup_ceiling"] = speedup_ceiling(cell.alpha_hat, k, cell.cost_ratio)
        if forward is not None:
            extra["cost_ratio_fwd"] = forward.cost_ratio(cell.drafter)
            extra["forward_ceiling"] = forward.ceiling(cell.tau, k_forward, cell.drafter)
        measured = extra["speedup_vs_verifier"] or extra["speedup_vs_hf_generate"]
        if measured is not None and extra.get("forward_ceiling"):
            extra["efficiency"] = measured / extra["forward_ceiling"]
    return replace(cell, **extra)


def greedy_match(runs: Sequence[Measurement], reference: Sequence[Measurement]) -> float | None:
    """Fraction of prompts whose first-repetition token ids equal the reference method's."""
    ref = {m.prompt_id: m.stats.token_ids for m in reference if m.repeat == 0 and m.sample == 0}
    mine = {m.prompt_id: m.stats.token_ids for m in runs if m.repeat == 0 and m.sample == 0}
    shared = [p for p in mine if p in ref]
    return sum(mine[p] == ref[p] for p in shared) / len(shared) if shared else None


def aggregate(
    cells: Sequence[Cell], measurements: Sequence[Measurement], forward_times: dict[str, ForwardTimes]
) -> list[CellSummary]:
    """One CellSummary per (cell, prompt set, temperature) that has timed measurements."""
    groups: dict[tuple, list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.repeat >= 0:
            groups[(m.method, m.k, m.prompt_set, m.temperature)].append(m)
    by_label = {(c.method.name, c.k): c for c in cells}
    base = {
        key: summarize_cell(by_label[key[:2]], key[2], key[3], runs)
        for key, runs in groups.items()
        if key[:2] in by_label
    }
    summaries = []
    for (method, k, prompt_set, temperature), cell in base.items():
        baselines = {
            name: base[(name, None, prompt_set, temperature)]
            for name in (VERIFIER, HF_GENERATE)
            if (name, None, prompt_set, temperature) in base
        }
        reference = next((name for name in (VERIFIER, HF_GENERATE) if name in baselines), None)
        match = None
        if temperature == 0 and reference is not None and method != reference:
            match = greedy_match(
                groups[(method, k, prompt_set, temperature)],
                groups[(reference, None, prompt_set, temperature)],
            )
        summaries.append(with_baselines(cell, baselines, forward_times.get(prompt_set), match))
    return summaries


def best_k(summaries: Sequence[CellSummary]) -> list[dict]:
    """For each speculative method and temperature, the k with the highest mean decode speed-up over
    the prompt sets (over `verifier`, else `hf-generate`)."""
    means: dict[tuple[str, float], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in summaries:
        speedup = s.speedup_vs_verifier or s.speedup_vs_hf_generate
        if s.k is not None and speedup is not None:
            means[(s.method, s.temperature)][s.k].append(speedup)
    result = []
    for (method, temperature), per_k in means.items():
        k, values = max(per_k.items(), key=lambda item: statistics.fmean(item[1]))
        result.append(
            {"method": method, "temperature": temperature, "k": k, "speedup": statistics.fmean(values)}
        )
    return result
