"""Plot builders: the figures carry the numbers they claim to show."""

from __future__ import annotations

import math

import pytest

from app import plots, theory_plots
from app.figure_style import GREEN


def _block(index: int, accepted: int, k: int = 4, kind: str = "speculative", complete: bool = True, **extra):
    """A block as the API sends it: `counts_for_tau` is sd2's rule (sd2.trace.counts_for_tau)."""
    counts = complete and kind != "prefill"
    return {
        "index": index,
        "kind": kind,
        "k": k,
        "n_accepted": accepted,
        "complete": complete,
        "counts_for_tau": counts,
        **extra,
    }


def test_running_tau_counts_only_complete_decode_blocks():
    blocks = [_block(0, 0, k=0, kind="prefill"), _block(1, 3), _block(2, 1), _block(3, 4, complete=False)]
    assert plots.running_tau(blocks) == [None, 4.0, 3.0, 3.0]


def test_running_tau_follows_the_apis_flag_not_its_own_rule():
    blocks = [_block(1, 3), _block(2, 1, counts_for_tau=False), _block(3, 0)]
    assert plots.running_tau(blocks) == [4.0, 4.0, 2.5]


def test_acceptance_plot_has_one_bar_per_decode_block_and_the_running_tau():
    blocks = [_block(0, 0, k=0, kind="prefill"), _block(1, 3), _block(2, 4), _block(3, 0)]
    fig = plots.acceptance_plot(blocks)
    bars, tau = fig.data
    assert list(bars.x) == [1, 2, 3] and list(bars.y) == [3, 4, 0]
    assert list(tau.y) == pytest.approx([4.0, 4.5, 10 / 3])
    assert bars.marker.color[1] == GREEN  # a fully accepted block is the strong green


def test_empty_figures_explain_themselves():
    for fig in (plots.acceptance_plot([]), plots.steering_plot([_block(1, 2)]), plots.train_plot([])):
        assert not fig.data and fig.layout.annotations


def test_steering_plot_has_the_norm_and_one_line_per_layer():
    blocks = [_block(i, 1, steering_norm=1.0 + i, layer_bias_norms=[0.1 * i, 0.2 * i]) for i in (1, 2, 3)]
    fig = plots.steering_plot(blocks)
    assert [t.name for t in fig.data] == ["‖g‖", "bias layer 0", "bias layer 1"]
    assert list(fig.data[0].y) == [2.0, 3.0, 4.0] and list(fig.data[2].y) == pytest.approx([0.2, 0.4, 0.6])


def _result(method: str, tau: float, tps: float, unconditional: list[float]) -> dict:
    conditional = [u / p for u, p in zip(unconditional, [1.0, *unconditional[:-1]], strict=True)]
    metrics = {"tau": tau, "tokens_per_s": tps, "per_position_unconditional": unconditional,
               "per_position_conditional": conditional}  # fmt: skip
    return {"method": method, "metrics": metrics}


def test_compare_bars_and_position_curves():
    results = [_result("pretrained", 1.5, 20.0, [0.4, 0.1]), _result("sd2", 3.0, 35.0, [0.9, 0.8])]
    bars = plots.compare_bars(results)
    assert [list(t.y) for t in bars.data] == [[1.5, 3.0], [20.0, 35.0]]
    curves = plots.position_curves(results)
    assert [t.name for t in curves.data][::2] == ["pretrained P(≥ i)", "sd2 P(≥ i)"]
    assert list(curves.data[2].y) == [0.9, 0.8] and list(curves.data[3].y) == pytest.approx([0.9, 0.8 / 0.9])


@pytest.mark.parametrize(("alpha", "k", "tau"), [(0.0, 8, 1.0), (1.0, 8, 9.0), (0.5, 2, 1.75)])
def test_expected_tau_closed_form(alpha, k, tau):
    assert theory_plots.expected_tau(alpha, k) == pytest.approx(tau)


def test_speedup_matches_leviathan_and_theory_plots_carry_measured_runs():
    assert theory_plots.speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    measured = [
        {"id": 1, "method": "sd2", "k": 8, "alpha_hat": 0.7, "tau": 2.9, "speedup": 1.4},
        {"id": 2, "method": "pretrained", "k": 8, "alpha_hat": 0.3, "tau": 1.3, "speedup": None},
    ]
    tau_fig = theory_plots.theory_tau([2, 8], measured)
    assert [t.name for t in tau_fig.data] == ["k = 2", "k = 8", "measured: pretrained", "measured: sd2"]
    curve = tau_fig.data[1]
    assert curve.y[50] == pytest.approx(theory_plots.expected_tau(curve.x[50], 8))
    speed_fig = theory_plots.theory_speedup(8, [0.0, 0.1], measured)
    points = [t for t in speed_fig.data if t.mode == "markers"]
    assert [(t.name, list(t.y)) for t in points] == [("measured: sd2", [1.4])]  # no speed-up, no dot
    assert not any(math.isnan(v) for v in speed_fig.data[0].y)


def test_train_plot_puts_losses_left_validation_right_and_skips_counters():
    points = [{"step": s, "name": n, "value": v} for s in (1, 2) for n, v in
              (("loss", 3.0 / s), ("lr", 1e-4), ("tokens", 200.0), ("agreement", 0.1 * s))]  # fmt: skip
    points.append({"step": 2, "name": "val_tau", "value": 2.5})
    fig = plots.train_plot(points)
    assert [t.name for t in fig.data] == ["loss", "agreement", "val_tau"]
    assert list(fig.data[0].y) == [3.0, 1.5] and fig.data[0].yaxis == "y"
    assert fig.data[2].yaxis == "y2" and fig.data[2].mode == "markers"


def test_benchmark_points_and_rows_from_stored_results():
    from app.views import benchmark_points, benchmark_rows

    cell = {"method": "sd2", "prompt_set": "chat", "temperature": 0.0, "k": 4, "alpha_hat": 0.6, "tau": 2.1}
    stored = {
        "id": 7,
        "cells": [
            {**cell, "speedup_vs_verifier": 1.3},
            {**cell, "method": "verifier", "k": None, "alpha_hat": None, "speedup_vs_verifier": 1.0},
            {**cell, "method": "hf-assisted", "alpha_hat": None, "speedup_vs_verifier": 1.1},
        ],
    }
    assert benchmark_points([stored]) == [
        {"id": "bench 7, chat, T=0", "method": "sd2", "k": 4, "alpha_hat": 0.6, "tau": 2.1, "speedup": 1.3}
    ]
    summary = {
        "id": 7, "measured_at": "2026-11-29T17:00:00+00:00", "label": None, "methods": ["verifier", "sd2"],
        "prompt_sets": ["chat", "code"], "n_cells": 4, "machine": {"cpu_count": 2, "cuda": None},
        "command": "sd2 bench --quick",
    }  # fmt: skip
    assert benchmark_rows({"items": [summary]}) == [
        [
            7,
            "2026-11-29 17:00:00",
            "",
            "verifier, sd2",
            "chat, code",
            4,
            "2 CPUs, GPU: none",
            "sd2 bench --quick",
        ]
    ]
    fig = theory_plots.theory_tau([4], [], benchmark_points([stored]))
    (bench,) = [t for t in fig.data if t.name == "bench: sd2"]
    assert bench.marker.symbol.endswith("-open") and list(bench.y) == [2.1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_steering_gain_plot_pairs_steered_and_unsteered_and_ends_at_the_runs_gain(real_runs, temperature):
    run = real_runs[temperature]
    paired = [b for b in run["blocks"] if b.get("counterfactual")]
    fig = plots.steering_gain_plot(run["blocks"])
    steered, unsteered, gain = fig.data
    assert (steered.name, unsteered.name, gain.name) == ("steered", "unsteered", "running gain")
    assert list(steered.x) == list(unsteered.x) == [b["index"] for b in paired]
    assert list(steered.y) == [b["counterfactual"]["steered_expected_accepted"] for b in paired]
    assert list(unsteered.y) == [b["counterfactual"]["expected_accepted"] for b in paired]
    assert gain.yaxis == "y2" and fig.layout.barmode == "group"
    assert gain.y[-1] == pytest.approx(run["metrics"]["steering_gain"]["gain"])  # the API's own figure
    assert list(steered.customdata) == [b["counterfactual"]["outcome"] for b in paired]


def test_running_gain_is_the_mean_difference_so_far():
    blocks = [{"counterfactual": {"steered_expected_accepted": s, "expected_accepted": u}} for s, u in
              ((2.0, 1.0), (0.0, 1.0), (3.0, 0.0))]  # fmt: skip
    assert plots.running_gain(blocks) == pytest.approx([1.0, 0.0, 1.0])
    empty = plots.steering_gain_plot([_block(1, 2)])
    assert not empty.data and "tick Counterfactual" in empty.layout.annotations[0].text


def test_the_gain_card_says_gain_interval_and_won_tied_lost(real_runs):
    from app.cards import cards_html

    gain = real_runs[1.0]["metrics"]["steering_gain"]
    html = cards_html(real_runs[1.0]["metrics"])
    card = html.split('data-metric="steering_gain"')[1]
    assert f"{gain['gain']:+.2f} tokens/block [{gain['low']:+.2f}, {gain['high']:+.2f}]" in card
    for mark, key in (("▲", "won"), ("=", "tied"), ("▼", "lost")):
        assert f"{mark} {gain[key]} {key}" in card
    assert f"over {gain['n_blocks']} blocks" in card
    assert "steering_gain" not in cards_html({**real_runs[1.0]["metrics"], "steering_gain": None})
