"""Paired speed measurement (sd2.bench.paired): the ratio's arithmetic, the rotation, and a real run."""

import math

import pytest

from sd2.bench.paired import MethodRuns, paired_ratio, rotated, run_paired, speedup, tau_difference
from sd2.bench.prompts import BenchPrompt
from sd2.config import DecodeConfig
from sd2.engine import Engine

PROMPTS = [
    BenchPrompt("a", prompt="Tell me a short story about a cat."),
    BenchPrompt("b", messages=({"role": "user", "content": "def add(a, b):"},)),
    BenchPrompt("c", prompt="Name three rivers."),
]


def test_a_constant_ratio_is_its_own_mean_and_interval():
    ratio = paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (ratio.mean, ratio.low, ratio.high) == pytest.approx((2.0, 2.0, 2.0))
    assert ratio.above == 3 and ratio.n == 3 and ratio.outside_noise


def test_the_mean_is_geometric_and_the_interval_holds_it():
    num, den = [1.0, 4.0, 2.0, 1.0], [2.0, 1.0, 2.0, 1.0]  # ratios 0.5, 4, 1, 1
    ratio = paired_ratio(num, den)
    assert ratio.mean == pytest.approx(math.prod([0.5, 4.0, 1.0, 1.0]) ** 0.25)
    assert ratio.low <= ratio.mean <= ratio.high
    assert ratio.above == 1  # only prompt 1's ratio is above 1
    assert not ratio.outside_noise
    assert paired_ratio(num, den) == ratio  # seeded: the same interval every time


@pytest.mark.parametrize(("num", "den"), [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0]), ([1.0], [-1.0])])
def test_paired_ratio_refuses_what_it_cannot_pair(num, den):
    with pytest.raises(ValueError, match="paired_ratio"):
        paired_ratio(num, den)


def test_each_method_leads_once_in_every_round():
    methods = ["verifier", "x", "y"]
    orders = [rotated(methods, i) for i in range(6)]
    assert orders[:3] == [["verifier", "x", "y"], ["x", "y", "verifier"], ["y", "verifier", "x"]]
    assert orders[3:] == orders[:3]
    assert all(sorted(order) == sorted(methods) for order in orders)


def test_speedup_is_the_baseline_time_over_the_methods():
    fast, slow = MethodRuns(ms_per_token=[10.0, 20.0]), MethodRuns(ms_per_token=[30.0, 60.0])
    assert speedup(fast, slow).mean == pytest.approx(3.0)


def test_tau_pools_blocks_over_prompts():
    runs = MethodRuns(judged_blocks=[2, 6], accepted=[4, 0])  # per-prompt τ 3 and 1; pooled 12 / 8
    assert runs.tau == pytest.approx(1.5)
    assert MethodRuns(judged_blocks=[0], accepted=[0]).tau is None


def test_tau_difference_pools_each_side_over_the_same_prompts():
    a = MethodRuns(judged_blocks=[2, 2, 4], accepted=[2, 4, 4])  # per prompt τ 2, 3, 2; pooled 18 / 8
    b = MethodRuns(judged_blocks=[4, 2, 2], accepted=[0, 2, 2])  # per prompt τ 1, 2, 2; pooled 12 / 8
    diff = tau_difference(a, b)
    assert diff.mean == pytest.approx(18 / 8 - 12 / 8)
    assert diff.low <= diff.mean <= diff.high
    assert diff.above == 2 and diff.n == 3  # prompt 2 is a tie
    same = tau_difference(a, a)
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0) and not same.outside_noise
    with pytest.raises(ValueError, match="same prompts"):
        tau_difference(a, MethodRuns(judged_blocks=[1], accepted=[0]))


@pytest.fixture(scope="module")
def engine(tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    return Engine.load(str(verifier_dir), {"d": str(drafter_dir)}, device="cpu")


def test_a_paired_run_decodes_every_prompt_with_every_method(engine):
    decode = DecodeConfig(k=3, max_new_tokens=10)
    runs = run_paired(engine, PROMPTS, ["verifier", "d"], decode)
    for method in ("verifier", "d"):
        assert len(runs[method].ms_per_token) == len(PROMPTS)
        assert all(ms > 0 for ms in runs[method].ms_per_token)
    assert runs["d"].outputs == runs["verifier"].outputs  # greedy: speculative output is the verifier's
    assert runs["verifier"].tau is None and runs["verifier"].cost is None
    assert runs["d"].tau >= 1 and runs["d"].cost > 0 and 0 <= runs["d"].alpha_hat <= 1
    assert speedup(runs["d"], runs["verifier"]).n == len(PROMPTS)


def test_run_paired_refuses_repeated_methods_and_empty_input(engine):
    decode = DecodeConfig(k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="distinct"):
        run_paired(engine, PROMPTS, ["d", "d"], decode)
    with pytest.raises(ValueError, match="at least one prompt"):
        run_paired(engine, [], ["d"], decode)
