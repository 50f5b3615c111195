"""The steering gain of a cell (sd2.bench.gain) on hand-made measurements: pooled block means and
counts, the t interval over per-prompt mean gains (not over blocks), the first repetition only, and the
"Steering gain" table built from them."""

import math

import pytest

from sd2.bench.aggregate import aggregate
from sd2.bench.gain import cell_gain, per_prompt_sums
from sd2.bench.harness import BenchResult
from sd2.bench.measure import CounterfactualSums, GenerationStats, Measurement
from sd2.bench.plan import BenchPlan, MethodSpec, resolve_methods
from sd2.bench.report import RunInfo, to_json
from sd2.bench.table import gain_table, markdown_report
from sd2.trace import Block, BlockKind, Counterfactual, SteeringOutcome, TokenEvent, TokenStatus

# per prompt: (blocks, Σ steered, Σ unsteered, won, tied, lost); mean gains per block 0.5, −0.25, 0.25
PROMPTS = {
    "p0": CounterfactualSums(4, 8.0, 6.0, 2, 1, 1),
    "p1": CounterfactualSums(2, 3.0, 3.5, 0, 1, 1),
    "p2": CounterfactualSums(4, 6.0, 5.0, 2, 2, 0),
}
BOGUS = CounterfactualSums(100, 0.0, 100.0, 0, 0, 100)  # what a repetition or warm-up must not add


def _stats(counterfactual: CounterfactualSums | None) -> GenerationStats:
    return GenerationStats(tuple(range(11)), 50.0, 550.0, 4, 10, counterfactual=counterfactual)


def _runs(method: str = "s", k: int | None = 4, prompts=PROMPTS) -> list[Measurement]:
    rows = [Measurement(method, "chat", p, 0.0, k, 0, _stats(sums)) for p, sums in prompts.items()]
    rows += [Measurement(method, "chat", p, 0.0, k, 1, _stats(BOGUS)) for p in prompts]  # repeat 1
    rows.append(Measurement(method, "chat", "p0", 0.0, k, -1, _stats(BOGUS)))  # warm-up
    return rows


def test_pooled_means_and_counts_are_over_blocks():
    gain = cell_gain(_runs())
    assert (gain.n_prompts, gain.n_blocks) == (3, 10)
    assert gain.steered == pytest.approx(17.0 / 10) and gain.unsteered == pytest.approx(14.5 / 10)
    assert gain.gain == pytest.approx(0.25)
    assert (gain.won, gain.tied, gain.lost) == (4, 4, 2)


def test_the_interval_is_over_per_prompt_mean_gains():
    gain = cell_gain(_runs())
    means = [0.5, -0.25, 0.25]  # each prompt one paired sample, whatever its number of blocks
    mean = sum(means) / 3
    half = 4.303 * math.sqrt(sum((m - mean) ** 2 for m in means) / 2 / 3)  # t975(2) · s / √n
    assert gain.prompt_gain == pytest.approx(1 / 6)  # ≠ the pooled 0.25: p1 has fewer blocks
    assert (gain.low, gain.high) == pytest.approx((mean - half, mean + half))
    assert (gain.low, gain.high) == pytest.approx((-0.782, 1.115), abs=1e-3)


def test_one_prompt_gives_a_mean_without_an_interval():
    gain = cell_gain(_runs(prompts={"p0": PROMPTS["p0"]}))
    assert (gain.prompt_gain, gain.low, gain.high) == (pytest.approx(0.5), None, None)


def test_samples_of_a_prompt_pool_into_one_paired_sample():
    rows = [
        Measurement("s", "chat", "p0", 1.0, 4, 0, _stats(PROMPTS["p0"]), sample=0),
        Measurement("s", "chat", "p0", 1.0, 4, 0, _stats(PROMPTS["p1"]), sample=1),
        Measurement("s", "chat", "p1", 1.0, 4, 0, _stats(PROMPTS["p2"]), sample=0),
    ]
    assert per_prompt_sums(rows) == {"p0": CounterfactualSums(6, 11.0, 9.5, 2, 2, 2), "p1": PROMPTS["p2"]}
    gain = cell_gain(rows)
    assert gain.n_prompts == 2 and gain.prompt_gain == pytest.approx((1.5 / 6 + 0.25) / 2)


def test_runs_without_counterfactuals_have_no_gain():
    assert cell_gain(_runs(prompts={p: None for p in PROMPTS})) is None
    assert cell_gain(_runs(prompts={"p0": CounterfactualSums()})) is None  # no block had one
    assert cell_gain([]) is None


def _block(steered: float, unsteered: float, outcome: SteeringOutcome | None) -> Block:
    extra = TokenEvent(1, TokenStatus.BONUS, None, 0.5)
    block = Block(1, BlockKind.SPECULATIVE, [], extra, 0, 0, complete=True)
    if outcome is not None:
        block.counterfactual = Counterfactual([], None, unsteered, steered, outcome)
    return block


def test_counterfactual_sums_of_blocks():
    blocks = [
        _block(2.0, 1.0, SteeringOutcome.WON),
        _block(1.0, 1.0, SteeringOutcome.TIED),
        _block(0.5, 1.5, SteeringOutcome.LOST),
        _block(3.0, 0.0, None),  # no counterfactual (k = 0, or an unsteered run): not counted
    ]
    sums = CounterfactualSums.of(blocks)
    assert sums == CounterfactualSums(3, 3.5, 3.5, 1, 1, 1) and sums.gain == 0.0
    assert CounterfactualSums.of(blocks[3:]) is None


def _cells():
    plan = BenchPlan(
        methods=(*resolve_methods(["verifier"], []), MethodSpec("s", "ours", "s")), ks=(4,), repeats=2
    )
    rows = _runs() + _runs("verifier", None, {p: None for p in PROMPTS})
    return plan, aggregate(plan.cells(), rows, {})


def test_aggregate_gives_a_gain_to_steered_cells_only():
    _, cells = _cells()
    gains = {c.method: c.steering_gain for c in cells}
    assert gains["verifier"] is None and gains["s"] == cell_gain(_runs())


def test_the_steering_gain_table_from_hand_made_runs(synthetic_result):
    plan, cells = _cells()
    result = BenchResult(plan, synthetic_result.prompt_sets[:1], [], {}, cells, [])
    data = to_json(result, RunInfo(command="sd2 bench --counterfactual", verifier="tiny"))
    lines = gain_table(data["cells"]).splitlines()
    assert lines[0] == (
        "| Method | Set | T | k | prompts | blocks | steered | unsteered | gain (blocks) "
        "| gain per prompt [95 % CI] | won / tied / lost |"
    )
    assert lines[2:] == [
        "| s | chat | 0 | 4 | 3 | 10 | 1.700 | 1.450 | +0.250 | +0.167 [-0.782, +1.115] | 4 / 4 / 2 |"
    ]
    report = markdown_report(data)
    assert "## Steering gain" in report and "not over blocks" in report
    assert "command: `sd2 bench --counterfactual`" in report


def test_a_report_without_gains_has_no_gain_section(synthetic_result):
    data = to_json(synthetic_result, RunInfo(command="sd2 bench", verifier="tiny"))
    assert "Steering gain" not in markdown_report(data)
    for cell in data["cells"]:  # a result from before schema version 6 has no such key
        del cell["steering_gain"]
    del data["plan"]["counterfactual"]
    assert "Steering gain" not in markdown_report(data) and gain_table(data["cells"]).count("\n") == 2
