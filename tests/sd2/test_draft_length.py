"""Adaptive draft length: the confidence stop and k = auto change how much is drafted, never the output."""

import argparse

import pytest

from sd2.config import AUTO_MAX_K, DecodeConfig, parse_k
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.draft_length import AcceptanceEstimate, CostProfile, DraftLength, measure_costs, monotone_fit
from sd2.proposer import Proposer
from sd2.trace import DraftStop

PROMPT = [1, 40, 17, 99, 3, 250]
NO_STOP = frozenset()
FLAT = CostProfile(draft_cost=0.02, verify_ratio=(1.0,) * (AUTO_MAX_K + 1))  # GPU-like: a verify ≈ a step
STEEP = CostProfile(draft_cost=0.1, verify_ratio=tuple(1.0 + 0.3 * k for k in range(AUTO_MAX_K + 1)))


def _ids(blocks):
    return [t.token_id for b in blocks for t in b.emitted]


def _speculative(blocks):
    return [b for b in blocks if b.kind == "speculative"]


def _run(verifier, drafter, head, config, costs=None):
    length = DraftLength.of(config, costs) if costs is not None else None
    return list(
        SpeculativeDecoder(verifier, Proposer(drafter, head), config, NO_STOP, length=length).run(PROMPT)
    )


# --- the confidence stop --------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_threshold_of_zero_drafts_k_tokens(verifier, drafters, temperature):
    drafter, head = drafters["steered"]
    config = DecodeConfig(k=5, temperature=temperature, max_new_tokens=40, draft_threshold=0.0)
    blocks = _speculative(_run(verifier, drafter, head, config))
    assert all(b.k == 5 and b.draft_stop is DraftStop.K for b in blocks if b.complete)
    assert all(b.draft_stop is DraftStop.LENGTH and b.k < 5 for b in blocks if not b.complete)  # the end


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_threshold_of_one_drafts_one_token(verifier, drafters, temperature):
    drafter, head = drafters["steered"]
    config = DecodeConfig(k=5, temperature=temperature, max_new_tokens=40, draft_threshold=1.0)
    blocks = _speculative(_run(verifier, drafter, head, config))
    ended = [b for b in blocks if b.draft_stop is not DraftStop.LENGTH]  # the last two meet the limit
    assert all(len(b.drafts) == b.k <= 1 for b in blocks) and len(ended) >= len(blocks) - 2
    assert all(b.k == 1 for b in ended)
    assert all(b.draft_stop is DraftStop.CONFIDENCE and b.complete for b in ended)


def test_a_threshold_stops_right_after_the_first_unconfident_draft(verifier, drafters):
    drafter, head = drafters["same"]  # a confident drafter: its probabilities spread over (0, 1)
    probs = [
        t.draft_prob
        for b in _run(verifier, drafter, None, DecodeConfig(k=8, max_new_tokens=60))
        for t in b.drafts
    ]
    threshold = sorted(probs)[len(probs) // 2]  # the median: some blocks stop early, some do not
    config = DecodeConfig(k=8, max_new_tokens=60, draft_threshold=threshold)
    blocks = _speculative(_run(verifier, drafter, head, config))
    stops = {b.draft_stop for b in blocks}
    assert DraftStop.CONFIDENCE in stops and DraftStop.K in stops
    for block in blocks:
        q = [t.draft_prob for t in block.drafts]
        assert all(p > threshold for p in q[:-1])  # drafting went on only while confident
        if block.draft_stop is DraftStop.CONFIDENCE:
            assert q[-1] <= threshold and block.k < 8
        elif block.draft_stop is DraftStop.K:
            assert block.k == 8


@pytest.mark.parametrize("threshold", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("kind", ["same", "steered"])
def test_greedy_output_is_identical_under_a_threshold(verifier, drafters, threshold, kind):
    drafter, head = drafters[kind]
    config = DecodeConfig(k=6, max_new_tokens=40, draft_threshold=threshold)
    expected = _ids(verifier_decode(verifier, PROMPT, config, NO_STOP))
    assert _ids(_run(verifier, drafter, head, config)) == expected


# --- k = auto -------------------------------------------------------------------------------------


def test_best_k_is_long_when_verifying_is_flat_and_short_when_it_is_steep():
    assert FLAT.best_k(0.95) > 8 > STEEP.best_k(0.95)
    assert FLAT.best_k(0.95) > FLAT.best_k(0.6) > FLAT.best_k(0.1)
    assert STEEP.best_k(0.0) == FLAT.best_k(0.0) == 1  # nothing is ever accepted: draft the minimum
    assert FLAT.best_k(1.0) == AUTO_MAX_K  # everything is accepted and verifying is free: the most
    assert STEEP.best_k(0.95, max_k=3) <= 3


def test_best_k_maximises_tokens_per_unit_of_time():
    alpha = 0.7
    rate = lambda k: (1 - alpha ** (k + 1)) / (1 - alpha) / STEEP.block_cost(k)  # noqa: E731
    assert rate(STEEP.best_k(alpha)) == max(rate(k) for k in range(1, AUTO_MAX_K + 1))


def test_the_acceptance_estimate_counts_judged_positions():
    estimate = AcceptanceEstimate(prior=0.5, weight=2.0)
    assert estimate.value == 0.5
    estimate.update(n_accepted=3, k=3)  # all accepted: 3 judged
    estimate.update(n_accepted=1, k=4)  # one accepted, the second rejected: 2 judged
    estimate.update(n_accepted=0, k=0)  # a block without drafts judges nothing
    assert estimate.value == pytest.approx((1 + 4) / (2 + 5))


def test_the_verify_fit_is_non_decreasing_and_one_slow_timing_does_not_pin_k_to_one():
    assert monotone_fit([1.0, 1.2, 1.1, 1.3]) == pytest.approx([1.0, 1.15, 1.15, 1.3])
    assert monotone_fit([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert monotone_fit([]) == [] and monotone_fit([1.0, 1.0, 2.0]) == [1.0, 1.0, 2.0]
    measured = [1.03] * AUTO_MAX_K
    measured[1] = 1.6  # one slow timing of a 3-token verify (a busy machine)
    fitted = CostProfile(0.09, (1.0, *monotone_fit(measured)))
    running_max = CostProfile(0.09, (1.0, 1.03, *[1.6] * (AUTO_MAX_K - 1)))
    assert list(fitted.verify_ratio) == sorted(fitted.verify_ratio)
    assert running_max.best_k(0.44) == 1  # what the running maximum did with it
    assert fitted.best_k(0.44) == CostProfile(0.09, (1.0, *[1.03] * AUTO_MAX_K)).best_k(0.44) > 1


def test_measured_costs_are_a_valid_profile(verifier, drafters):
    drafter, _ = drafters["steered"]
    profile = measure_costs(verifier, drafter, max_k=4, context=8, repeats=1)
    assert len(profile.verify_ratio) == 5 and profile.verify_ratio[0] == 1.0
    assert list(profile.verify_ratio) == sorted(profile.verify_ratio)
    assert profile.draft_cost > 0 and 1 <= profile.best_k(0.5) <= 4


def test_auto_drafts_long_for_a_perfect_drafter_and_short_for_a_poor_one(verifier, drafters):
    config = DecodeConfig(k="auto", max_new_tokens=120)
    perfect = _speculative(_run(verifier, *drafters["same"], config, costs=FLAT))
    poor = _speculative(_run(verifier, *drafters["steered"], config, costs=FLAT))
    assert max(b.k for b in perfect) == AUTO_MAX_K  # α̂ climbs from the prior towards 1
    assert all(1 <= b.k <= AUTO_MAX_K for b in perfect + poor if b.draft_stop is DraftStop.K)
    assert sum(b.k for b in poor) / len(poor) < 3  # a random drafter's α̂ falls towards 0


@pytest.mark.parametrize("kind", ["same", "steered"])
def test_greedy_output_is_identical_under_auto(verifier, drafters, kind):
    config = DecodeConfig(k="auto", max_new_tokens=50, draft_threshold=0.2)
    expected = _ids(verifier_decode(verifier, PROMPT, config, NO_STOP))
    blocks = _run(verifier, *drafters[kind], config)  # measures its own cost profile
    assert _ids(blocks) == expected
    assert len(_ids(blocks)) == 50


def test_k_is_parsed_as_auto_or_an_integer():
    assert parse_k("auto") == "auto" and parse_k("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match="k must be 'auto' or an integer"):
        parse_k("eight")
    assert DecodeConfig().auto_k and DecodeConfig().max_k == AUTO_MAX_K
    assert DecodeConfig(k=5).max_k == 5


# --- the policy object -----------------------------------------------------------------------------


def test_a_fixed_k_policy_drafts_k_until_the_room_runs_out():
    policy = DraftLength.of(DecodeConfig(k=5))
    assert policy.next(room=100) == (5, DraftStop.K) and policy.longest == 5
    assert policy.next(room=3) == (3, DraftStop.LENGTH)


def test_an_auto_policy_follows_its_acceptance_estimate():
    policy = DraftLength.of(DecodeConfig(k="auto"), STEEP)
    assert policy.longest == AUTO_MAX_K
    start, _ = policy.next(room=100)
    for _ in range(20):
        policy.update(n_accepted=0, k=start)  # every draft rejected: α̂ falls, so does k
    assert policy.next(room=100)[0] <= start
    for _ in range(40):
        policy.update(n_accepted=8, k=8)  # every draft accepted: α̂ near 1
    assert policy.next(room=100)[0] > start


def test_auto_needs_a_cost_profile():
    with pytest.raises(ValueError, match="cost profile"):
        DraftLength.of(DecodeConfig(k="auto"))
