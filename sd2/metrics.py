"""Acceptance and speed metrics of a generation, each with its convention (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sd2.stats import mean_interval
from sd2.trace import Block, BlockKind, SteeringOutcome


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _judged_blocks(blocks: Sequence[Block]) -> list[Block]:
    """Blocks that count for τ (`sd2.trace.counts_for_tau`)."""
    return [b for b in blocks if b.counts_for_tau]


def block_efficiency(blocks: Sequence[Block]) -> float | None:
    """τ = tokens emitted per verifier forward = mean over complete blocks of (accepted drafts + 1).

    Verifier-only decoding has τ = 1. The prefill token and blocks cut short by EOS or the length
    limit are excluded, as in the paper, but they count in throughput.
    """
    return _mean([b.n_accepted + 1 for b in _judged_blocks(blocks)])


def acceptance_histogram(blocks: Sequence[Block], k: int) -> list[int]:
    """h[j] = number of complete speculative blocks that accepted exactly j drafts (j = 0..k)."""
    histogram = [0] * (k + 1)
    for block in _judged_blocks(blocks):
        if block.kind is BlockKind.SPECULATIVE:
            histogram[block.n_accepted] += 1
    return histogram


def per_position_acceptance(histogram: Sequence[int]) -> tuple[list[float], list[float]]:
    """(unconditional, conditional) acceptance at draft positions i = 1..k.

    Unconditional (vLLM's convention): P(at least i drafts accepted) = α^i under i.i.d. α.
    Conditional (EAGLE's n-α): P(draft i accepted | drafts 1..i−1 accepted) = uncond_i / uncond_{i−1}.
    """
    total = sum(histogram)
    if total == 0:
        return [], []
    unconditional = [sum(histogram[i:]) / total for i in range(1, len(histogram))]
    previous = [1.0, *unconditional[:-1]]
    conditional = [u / p if p > 0 else 0.0 for u, p in zip(unconditional, previous, strict=True)]
    return unconditional, conditional


def expected_block_tokens(alpha: float, k: float) -> float:
    """E[τ] = (1 − α^{k+1}) / (1 − α): tokens a block of k drafts emits under i.i.d. acceptance α."""
    return k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup_ceiling(alpha: float, k: float, cost_ratio: float) -> float:
    """Leviathan et al.'s expected speed-up S(α, k, c) = (1 − α^{k+1}) / ((1 − α)(1 + c·k)).

    Idealised: a (k+1)-token verify step is assumed to cost one verifier step (true on a GPU).
    """
    return expected_block_tokens(alpha, k) / (1 + cost_ratio * k)


def forward_ceiling(
    tau: float, k: int, verifier_step_s: float, drafter_step_s: float, verify_s: float
) -> float:
    """The machine's own ceiling S_fwd = τ · T_v(1) / (k · T_d(1) + T_v(k+1)) from isolated forward times."""
    return tau * verifier_step_s / (k * drafter_step_s + verify_s)


@dataclass
class SteeringGain:
    """Steered against unsteered drafts of the same blocks (docs/metrics.md#steering-gain): the mean
    expected accepted drafts per block of each, their paired difference with a 95 % t interval over
    blocks, and how many blocks steering won, tied and lost."""

    n_blocks: int  # speculative blocks with a counterfactual
    steered: float  # mean expected accepted drafts per block, the run's steered drafts
    unsteered: float  # the same for the unsteered counterfactual drafts
    gain: float  # mean paired difference steered − unsteered
    low: float | None  # its 95 % interval; None with a single block
    high: float | None
    won: int
    tied: int
    lost: int


def steering_gain(blocks: Sequence[Block]) -> SteeringGain | None:
    """The run's steering gain over its blocks that carry a counterfactual; None when none does.

    Every such block counts, also one cut by a stop token or the length limit: both drafts of a block
    have the same length and are judged by the same verifier, so each block is a fair pair.
    """
    pairs = [b.counterfactual for b in blocks if b.counterfactual is not None]
    if not pairs:
        return None
    interval = mean_interval([c.gain for c in pairs])
    outcomes = [c.outcome for c in pairs]
    return SteeringGain(
        n_blocks=len(pairs),
        steered=sum(c.steered_expected_accepted for c in pairs) / len(pairs),
        unsteered=sum(c.expected_accepted for c in pairs) / len(pairs),
        gain=interval.mean,
        low=interval.low,
        high=interval.high,
        won=outcomes.count(SteeringOutcome.WON),
        tied=outcomes.count(SteeringOutcome.TIED),
        lost=outcomes.count(SteeringOutcome.LOST),
    )


@dataclass
class GenerationMetrics:
    """Everything measured about one generation. Conventions in each field's comment."""

    n_tokens: int  # emitted tokens, the stop token included
    n_blocks: int  # verifier forwards after the prefill
    tau: float | None  # block efficiency, see `block_efficiency`; None without a complete block
    acceptance_rate: float | None  # accepted drafts / drafted tokens, over complete speculative blocks
    alpha_hat: float | None  # mean over judged positions of Σ min(p, q) = 1 − TV; argmax match at T = 0
    accepted: int  # accepted drafts in complete speculative blocks
    drafted: int  # drafted tokens in complete speculative blocks
    histogram: list[int]  # see `acceptance_histogram`
    per_position_unconditional: list[float]
    per_position_conditional: list[float]
    prefill_ms: float
    decode_ms: float  # everything after the prefill
    tokens_per_s: float | None  # decode throughput: tokens after the first / decode time
    tokens_per_s_e2e: float | None  # all tokens / (prefill + decode), tokenisation excluded
    drafter_step_ms: float | None  # mean time of one draft step (a cached drafter forward + sampling)
    verify_ms: float | None  # mean time of one verifier forward after the prefill
    cost_ratio: float | None  # c = drafter_step_ms / verify_ms, measured in this run
    speedup_ceiling: float | None  # S(α̂, k̄, c), k̄ the mean drafts per complete block; see `speedup_ceiling`
    counterfactual_ms: float = 0.0  # time spent on counterfactuals, left out of decode_ms and tokens/s
    steering_gain: SteeringGain | None = None  # see `steering_gain`; None without counterfactuals

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(blocks: Sequence[Block], k: int, wall_ms: float | None = None) -> GenerationMetrics:
    """Compute all metrics of one generation from its trace. k: the most drafts a block could hold
    (DecodeConfig.max_k), the histogram's length.

    wall_ms: measured wall time of the whole decode (prefill included). Without it the block
    timings are summed, which misses the time spent between blocks. Time spent on counterfactuals
    (`BlockTimings.counterfactual_ms`) is not decoding: it is taken out of wall_ms.
    """
    decode = [b for b in blocks if b.kind is not BlockKind.PREFILL]
    judged = [b for b in _judged_blocks(blocks) if b.kind is BlockKind.SPECULATIVE]
    histogram = acceptance_histogram(blocks, k)
    unconditional, conditional = per_position_acceptance(histogram)
    accepted, drafted = sum(b.n_accepted for b in judged), sum(b.k for b in judged)
    alpha_hat = _mean([o for b in blocks for o in b.overlaps])
    n_tokens = sum(len(b.emitted) for b in blocks)
    prefill_ms = sum(b.timings.total_ms for b in blocks if b.kind is BlockKind.PREFILL)
    counterfactual_ms = sum(b.timings.counterfactual_ms for b in blocks)
    if wall_ms is not None:
        decode_ms = wall_ms - counterfactual_ms - prefill_ms
    else:
        decode_ms = sum(b.timings.total_ms for b in decode)
    draft_steps = sum(b.k for b in decode)
    drafter_step_ms = sum(b.timings.draft_ms for b in decode) / draft_steps if draft_steps else None
    verify_ms = _mean([b.timings.verify_ms for b in decode])
    cost_ratio = drafter_step_ms / verify_ms if drafter_step_ms is not None and verify_ms else None
    mean_k = drafted / len(judged) if judged else k  # = k unless blocks drafted fewer (k = auto, threshold)
    ceiling = speedup_ceiling(alpha_hat, mean_k, cost_ratio) if alpha_hat is not None and cost_ratio else None
    return GenerationMetrics(
        n_tokens=n_tokens,
        n_blocks=len(decode),
        tau=block_efficiency(blocks),
        acceptance_rate=accepted / drafted if drafted else None,
        alpha_hat=alpha_hat,
        accepted=accepted,
        drafted=drafted,
        histogram=histogram,
        per_position_unconditional=unconditional,
        per_position_conditional=conditional,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        tokens_per_s=(n_tokens - 1) / (decode_ms / 1e3) if decode_ms > 0 and n_tokens > 1 else None,
        tokens_per_s_e2e=n_tokens / ((prefill_ms + decode_ms) / 1e3) if prefill_ms + decode_ms > 0 else None,
        drafter_step_ms=drafter_step_ms,
        verify_ms=verify_ms,
        cost_ratio=cost_ratio,
        speedup_ceiling=ceiling,
        counterfactual_ms=counterfactual_ms,
        steering_gain=steering_gain(blocks),
    )
