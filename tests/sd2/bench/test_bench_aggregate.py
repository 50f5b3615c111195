"""Aggregation arithmetic on hand-made measurements: medians, spreads, speed-ups, τ, ceilings."""

import pytest

from sd2.bench.aggregate import Spread, aggregate, best_k, repetition_throughput
from sd2.bench.forward import ForwardTimes
from sd2.bench.measure import GenerationStats, Measurement
from sd2.bench.plan import BenchPlan, resolve_methods
from sd2.metrics import speedup_ceiling


def stats(n_tokens, prefill_ms, wall_ms, ids=None, **extra) -> GenerationStats:
    judged = extra.pop("judged", (n_tokens - 1, n_tokens - 1))
    return GenerationStats(
        token_ids=tuple(ids if ids is not None else range(n_tokens)),
        prefill_ms=prefill_ms,
        wall_ms=wall_ms,
        judged_blocks=judged[0],
        judged_tokens=judged[1],
        **extra,
    )


def test_spread_median_range_and_relative():
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (spread.median, spread.low, spread.high, spread.n) == (2.5, 1.0, 10.0, 4)
    assert spread.relative == pytest.approx(9.0 / 2.5)


def test_repetition_throughput_is_a_ratio_of_sums():
    a = stats(11, prefill_ms=100, wall_ms=1100)  # 10 decode tokens in 1.0 s
    b = stats(21, prefill_ms=100, wall_ms=3100)  # 20 decode tokens in 3.0 s
    decode, e2e = repetition_throughput([a, b])
    assert decode == pytest.approx(30 / 4.0)  # not the mean of 10 and 6.67
    assert e2e == pytest.approx(32 / 4.2)


PLAN = BenchPlan(methods=resolve_methods(["verifier", "hf-generate", "self"], []), ks=(8,))


def measurements():
    """verifier at 10/20/30 tok/s over 3 repetitions, hf-generate at 20, self at 40 with τ = 4."""
    rows = []
    for repeat, seconds in enumerate([1.0, 0.5, 1 / 3]):  # verifier: 10, 20, 30 decode tok/s
        for prompt, ids in (("p0", (1, 2)), ("p1", (3, 4))):
            n = 11
            rows.append(
                Measurement(
                    "verifier",
                    "chat",
                    prompt,
                    0.0,
                    None,
                    repeat,
                    stats(n, 50, 50 + seconds * 1e3, ids=ids + tuple(range(n - 2))),
                )
            )
            rows.append(
                Measurement(
                    "hf-generate",
                    "chat",
                    prompt,
                    0.0,
                    None,
                    repeat,
                    stats(n, 50, 50 + 500, ids=ids + tuple(range(n - 2))),
                )
            )
            self_ids = ids if prompt == "p0" else (9, 9)  # one prompt differs from the verifier
            histogram = (0, 0, 1, 0, 0, 0, 0, 0, 1)  # blocks accepting 2 and 8 drafts: τ = (3 + 9) / 2 = 6
            rows.append(
                Measurement(
                    "self",
                    "chat",
                    prompt,
                    0.0,
                    8,
                    repeat,
                    stats(
                        n,
                        50,
                        50 + 250,
                        ids=self_ids + tuple(range(n - 2)),
                        judged=(2, 12),
                        accepted=10,
                        drafted=16,
                        histogram=histogram,
                        overlap_sum=15.0,
                        overlap_count=20,
                        draft_ms=16.0,
                        draft_steps=16,
                        verify_ms=20.0,
                        verify_count=2,
                    ),
                )
            )
    rows.append(Measurement("verifier", "chat", "p0", 0.0, None, -1, stats(11, 1, 1e6)))  # warm-up: ignored
    return rows


@pytest.fixture
def summaries():
    forward = {"chat": ForwardTimes("chat", verifier_ms={1: 60.0, 9: 120.0}, drafter_ms={"self": 5.0})}
    cells = aggregate(PLAN.cells(), measurements(), forward)
    return {(c.method, c.k): c for c in cells}


def test_medians_and_speedups(summaries):
    verifier, hf, spec = (
        summaries[("verifier", None)],
        summaries[("hf-generate", None)],
        summaries[("self", 8)],
    )
    assert verifier.tokens_per_s.median == pytest.approx(20.0)  # warm-up excluded
    assert (verifier.tokens_per_s.low, verifier.tokens_per_s.high) == pytest.approx((10.0, 30.0))
    assert verifier.n_generations == 6 and verifier.n_prompts == 2
    assert hf.tokens_per_s.median == pytest.approx(20.0)
    assert spec.tokens_per_s.median == pytest.approx(40.0)
    assert spec.speedup_vs_verifier == pytest.approx(2.0)
    assert spec.speedup_vs_hf_generate == pytest.approx(2.0)
    assert verifier.speedup_vs_hf_generate == pytest.approx(1.0)
    assert spec.speedup_e2e_vs_hf_generate == pytest.approx((11 / 0.3) / (11 / 0.55))


def test_acceptance_statistics_pool_generations(summaries):
    spec = summaries[("self", 8)]
    assert spec.tau == pytest.approx(6.0)
    assert spec.acceptance_rate == pytest.approx(10 / 16)
    assert spec.alpha_hat == pytest.approx(0.75)
    assert spec.histogram == [0, 0, 6, 0, 0, 0, 0, 0, 6]
    assert spec.per_position_unconditional == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert spec.per_position_conditional[2] == pytest.approx(0.5)
    assert summaries[("verifier", None)].tau == pytest.approx(1.0)


def test_ceilings_and_efficiency(summaries):
    spec = summaries[("self", 8)]
    assert spec.cost_ratio == pytest.approx(1.0 / 10.0)  # 1 ms per draft step / 10 ms per verify
    assert spec.speedup_ceiling == pytest.approx(speedup_ceiling(0.75, 8, 0.1))
    s_fwd = 6.0 * 60.0 / (8 * 5.0 + 120.0)  # τ · T_v(1) / (k · T_d(1) + T_v(k+1)) = 2.25
    assert spec.forward_ceiling == pytest.approx(s_fwd)
    assert spec.efficiency == pytest.approx(2.0 / s_fwd)
    assert spec.cost_ratio_fwd == pytest.approx(5.0 / 60.0)
    assert spec.forward_efficiency == pytest.approx((8 * 5.0 + 120.0) / 6.0 * 40.0 / 1e3)
    assert summaries[("verifier", None)].forward_efficiency == pytest.approx(60.0 * 20.0 / 1e3)
    assert summaries[("verifier", None)].forward_ceiling is None


def test_greedy_match_against_the_verifier(summaries):
    assert summaries[("self", 8)].greedy_match == pytest.approx(0.5)
    assert summaries[("hf-generate", None)].greedy_match == pytest.approx(1.0)
    assert summaries[("verifier", None)].greedy_match is None  # the reference itself


def test_best_k_takes_the_highest_mean_speedup(summaries):
    from dataclasses import replace

    spec = summaries[("self", 8)]
    cells = [replace(spec, k=4, speedup_vs_verifier=1.5), spec, replace(spec, k=12, speedup_vs_verifier=1.9)]
    assert best_k(cells) == [{"method": "self", "temperature": 0.0, "k": 8, "speedup": pytest.approx(2.0)}]


def test_time_profile_splits_decode_time_per_emitted_token():
    from sd2.bench.aggregate import time_profile
    from sd2.bench.measure import GenerationStats

    # 11 tokens → 10 decode tokens; decode = 300 − 50 = 250 ms: 40 drafting, 150 verifying, 10 steering
    run = GenerationStats(
        tuple(range(11)), 50.0, 300.0, 4, 10, draft_ms=40.0, draft_steps=8, verify_ms=150.0,
        verify_count=5, steer_ms=10.0,
    )  # fmt: skip
    profile = time_profile([run, run])  # pooled: the same ratios
    assert profile == pytest.approx({"draft": 4.0, "verify": 15.0, "steer": 1.0, "other": 5.0, "total": 25.0})
    hf_like = GenerationStats(tuple(range(11)), 50.0, 300.0, 9, 10)  # no per-forward timings
    assert time_profile([hf_like]) is None
