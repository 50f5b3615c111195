"""Plotly figure builders for the UI. Pure: plain dicts from the API in, a `go.Figure` out.

Conventions (docs/metrics.md): τ = mean over complete blocks of (accepted drafts + 1); per-position
acceptance P(≥ i accepted) is unconditional. The cost model's figures are app.theory_plots.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figure_style import BLUE, GREEN, GREY, INK, PALETTE, empty, layout


def running_tau(blocks: Sequence[dict]) -> list[float | None]:
    """τ after each block: mean of (accepted + 1) over the complete decode blocks seen so far."""
    total, count, out = 0, 0, []
    for block in blocks:
        if block.get("counts_for_tau"):  # the API applies sd2's rule to every block
            total, count = total + block.get("n_accepted", 0) + 1, count + 1
        out.append(total / count if count else None)
    return out


def acceptance_plot(blocks: Sequence[dict]) -> go.Figure:
    """Accepted drafts per block (bars, red outline where a draft was rejected) and running τ (line)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    decode = [b for b in blocks if b.get("kind") != "prefill"]
    if not decode:
        return layout(
            empty(fig, "accepted tokens per block appear here while decoding"),
            "Accepted drafts per block · running τ",
        )
    x = [b["index"] for b in decode]
    accepted = [b.get("n_accepted", 0) for b in decode]
    colours = [GREEN if b.get("n_accepted", 0) == b.get("k", 0) else "#86efac" for b in decode]
    fig.add_bar(
        x=x,
        y=accepted,
        name="accepted drafts",
        marker_color=colours,
        customdata=[b.get("k", 0) for b in decode],
        hovertemplate="block %{x}: %{y}/%{customdata} accepted<extra></extra>",
    )
    fig.add_scatter(
        x=x,
        y=running_tau(decode),
        name="running τ",
        mode="lines",
        line={"color": BLUE, "width": 3},
        secondary_y=True,
        hovertemplate="τ = %{y:.2f}<extra></extra>",
    )
    k_max = max((b.get("k", 0) for b in decode), default=0)
    fig.update_yaxes(title_text="accepted drafts", range=[0, max(k_max, 1) + 0.5], secondary_y=False)
    fig.update_yaxes(
        title_text="τ (tokens / verifier forward)",
        range=[0, max(k_max, 1) + 1.5],
        secondary_y=True,
        showgrid=False,
    )
    fig.update_xaxes(title_text="block")
    return layout(fig, "Accepted drafts per block · running τ")


def steering_plot(blocks: Sequence[dict]) -> go.Figure:
    """‖g‖ of the steering vector per block and the per-layer bias norms ‖W_s^(l) g‖."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steered = [b for b in blocks if b.get("steering_norm") is not None]
    if not steered:
        return layout(
            empty(fig, "no steering vector: this drafter has no SD² head (or steering is off)"),
            "Steering vector norm per block",
        )
    x = [b["index"] for b in steered]
    fig.add_scatter(
        x=x,
        y=[b["steering_norm"] for b in steered],
        name="‖g‖",
        mode="lines+markers",
        line={"color": INK, "width": 3},
        hovertemplate="block %{x}: ‖g‖ = %{y:.3f}<extra></extra>",
    )
    n_layers = max(len(b.get("layer_bias_norms") or []) for b in steered)
    for layer in range(n_layers):
        y = [(b.get("layer_bias_norms") or [None] * n_layers)[layer] for b in steered]
        fig.add_scatter(
            x=x,
            y=y,
            name=f"bias layer {layer}",
            mode="lines",
            secondary_y=True,
            line={"color": PALETTE[layer % len(PALETTE)], "width": 1.2},
            opacity=0.55,
            hovertemplate=f"layer {layer}: %{{y:.3f}}<extra></extra>",
        )
    fig.update_yaxes(title_text="‖g‖", secondary_y=False)
    fig.update_yaxes(title_text="‖bias_l‖", secondary_y=True, showgrid=False)
    fig.update_xaxes(title_text="block")
    return layout(fig, "Steering vector norm per block · per-layer bias norms")


def running_gain(blocks: Sequence[dict]) -> list[float]:
    """Mean steering gain (steered − unsteered expected accepted drafts) over the blocks so far; blocks:
    those with a counterfactual (metrics.steering_gain's point estimate after the last one)."""
    total, out = 0.0, []
    for n, block in enumerate(blocks, start=1):
        record = block["counterfactual"]
        total += record["steered_expected_accepted"] - record["expected_accepted"]
        out.append(total / n)
    return out


def steering_gain_plot(blocks: Sequence[dict]) -> go.Figure:
    """Expected accepted drafts per block of the steered draft and of its unsteered counterfactual
    (bars), and the running gain (line, right axis, 0 dashed)."""
    title = "Steered vs unsteered: expected accepted drafts"
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    paired = [b for b in blocks if b.get("counterfactual")]
    if not paired:
        message = "no counterfactual: tick Counterfactual with a steered drafter"
        return layout(empty(fig, message), title)
    x = [b["index"] for b in paired]
    records = [b["counterfactual"] for b in paired]
    for key, name, colour in (
        ("steered_expected_accepted", "steered", GREEN),
        ("expected_accepted", "unsteered", GREY),
    ):
        fig.add_bar(
            x=x,
            y=[r[key] for r in records],
            name=name,
            marker_color=colour,
            customdata=[r.get("outcome") for r in records],
            hovertemplate=f"block %{{x}}: {name} %{{y:.2f}} (steering %{{customdata}})<extra></extra>",
        )
    fig.add_scatter(
        x=x,
        y=running_gain(paired),
        name="running gain",
        mode="lines",
        line={"color": BLUE, "width": 3},
        secondary_y=True,
        hovertemplate="gain so far %{y:+.2f} tokens/block<extra></extra>",
    )
    fig.add_hline(y=0, line={"color": BLUE, "dash": "dot", "width": 1}, secondary_y=True)
    k_max = max(len(r.get("drafts", [])) for r in records)
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_yaxes(title_text="expected accepted drafts", range=[0, max(k_max, 1) + 0.3], secondary_y=False)
    fig.update_yaxes(title_text="running gain (tokens / block)", secondary_y=True, showgrid=False)
    fig.update_xaxes(title_text="block")
    return layout(fig, title)


def compare_bars(results: Sequence[dict]) -> go.Figure:
    """τ and decode tokens/s per method, side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("τ (tokens / verifier forward)", "decode tokens / s"))
    methods = [r.get("method", "?") for r in results]
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(methods))]
    for col, key, fmt in ((1, "tau", ".2f"), (2, "tokens_per_s", ".1f")):
        values = [r.get("metrics", {}).get(key) for r in results]
        fig.add_bar(
            x=methods,
            y=values,
            marker_color=colours,
            showlegend=False,
            row=1,
            col=col,
            text=[None if v is None else format(v, fmt) for v in values],
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{x}: %{y:" + fmt + "}<extra></extra>",
        )
    fig.update_yaxes(rangemode="tozero")
    return layout(fig, "")


def position_curves(results: Sequence[dict]) -> go.Figure:
    """Per-position acceptance P(≥ i drafts accepted) per method (solid) and conditional (dotted)."""
    fig = go.Figure()
    for i, result in enumerate(results):
        metrics, colour = result.get("metrics", {}), PALETTE[i % len(PALETTE)]
        unconditional = metrics.get("per_position_unconditional") or []
        if not unconditional:
            continue
        x = list(range(1, len(unconditional) + 1))
        name = result.get("method", "?")
        fig.add_scatter(
            x=x,
            y=unconditional,
            name=f"{name} P(≥ i)",
            mode="lines+markers",
            line={"color": colour, "width": 3},
        )
        fig.add_scatter(
            x=x,
            y=metrics.get("per_position_conditional") or [],
            name=f"{name} P(i | i−1)",
            mode="lines",
            line={"color": colour, "dash": "dot"},
        )
    if not fig.data:
        empty(fig, "no speculative blocks: the verifier alone drafts nothing")
    fig.update_yaxes(title_text="acceptance", range=[0, 1.05])
    fig.update_xaxes(title_text="draft position i", dtick=1)
    return layout(fig, "Per-position acceptance")


def _train_axis(name: str) -> str | None:
    """Left axis for losses, right axis for validation τ and agreement, nothing for counters and lr."""
    if "loss" in name:
        return "left"
    return "right" if any(key in name for key in ("tau", "agree", "accept")) else None


def train_plot(points: Sequence[dict]) -> go.Figure:
    """Training curves: losses (left axis); validation τ, the τ proxies and agreement (right axis)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    series: dict[str, list[tuple[int, float]]] = {}
    for p in points:
        if _train_axis(p["name"]) is not None:
            series.setdefault(p["name"], []).append((p["step"], p["value"]))
    if not series:
        return layout(empty(fig, "loss and validation τ appear here while the job trains"), "Training")
    for i, (name, xy) in enumerate(sorted(series.items(), key=lambda item: (item[0] != "loss", item[0]))):
        right = _train_axis(name) == "right"
        fig.add_scatter(
            x=[s for s, _ in xy], y=[v for _, v in xy], name=name, secondary_y=right,
            mode="lines+markers" if len(xy) > 1 else "markers",
            line={"color": PALETTE[i % len(PALETTE)], "width": 2.5}, marker={"size": 10 if right else 4},
        )  # fmt: skip
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss", secondary_y=False)
    fig.update_yaxes(
        title_text="τ (validation, proxy) · agreement", secondary_y=True, showgrid=False, rangemode="tozero"
    )
    return layout(fig, "Training curves")
