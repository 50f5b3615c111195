"""Plotly figure builders for the UI. Pure: plain dicts from the API in, a `go.Figure` out.

Conventions (docs/metrics.md): τ = mean over complete blocks of (accepted drafts + 1); per-position
acceptance P(≥ i accepted) is unconditional; S(α, k, c) = (1 − α^{k+1}) / ((1 − α)(1 + c·k)).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

GREEN, BLUE, RED, GREY, INK = "#15803d", "#2563eb", "#dc2626", "#8b939e", "#0f172a"
PALETTE = ("#2563eb", "#15803d", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#db2777", "#4b5563")
MEASURED = ("#facc15", "#f472b6", "#22d3ee", "#a3e635", "#fb923c")  # markers, distinct from the curves
MARKERS = ("diamond", "star", "square", "triangle-up", "circle")
HEIGHT = 320


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=height,
        margin={"l": 50, "r": 50, "t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.18, "x": 0},
        uirevision="keep",  # streaming updates keep the user's zoom
    )
    return fig


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(
        text=message,
        showarrow=False,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        font={"color": GREY, "size": 14},
    )
    return fig


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
        return _layout(
            _empty(fig, "accepted tokens per block appear here while decoding"),
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
    return _layout(fig, "Accepted drafts per block · running τ")


def steering_plot(blocks: Sequence[dict]) -> go.Figure:
    """‖g‖ of the steering vector per block and the per-layer bias norms ‖W_s^(l) g‖."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steered = [b for b in blocks if b.get("steering_norm") is not None]
    if not steered:
        return _layout(
            _empty(fig, "no steering vector: this drafter has no SD² head (or steering is off)"),
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
    return _layout(fig, "Steering vector norm per block · per-layer bias norms")


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
        return _layout(_empty(fig, message), title)
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
    return _layout(fig, title)


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
    return _layout(fig, "")


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
        _empty(fig, "no speculative blocks: the verifier alone drafts nothing")
    fig.update_yaxes(title_text="acceptance", range=[0, 1.05])
    fig.update_xaxes(title_text="draft position i", dtick=1)
    return _layout(fig, "Per-position acceptance")


def expected_tau(alpha: float, k: int) -> float:
    """E[τ] under i.i.d. acceptance α: (1 − α^{k+1}) / (1 − α) (k + 1 at α = 1)."""
    return k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al.'s S(α, k, c) = E[τ] / (1 + c·k)."""
    return expected_tau(alpha, k) / (1 + cost_ratio * k)


def _alphas(n: int = 101) -> list[float]:
    return [i / (n - 1) for i in range(n)]


def _measured(fig: go.Figure, points: Iterable[dict], y_key: str, name: str, hollow: bool = False) -> None:
    """Measured points as markers, one trace per method: dicts with alpha_hat, method, k, id and
    y_key. `hollow` draws open markers (stored benchmark cells, beside the filled stored runs)."""
    by_method: dict[str, list[dict]] = {}
    for p in points:
        if p.get("alpha_hat") is not None and p.get(y_key) is not None:
            by_method.setdefault(p.get("method", "?"), []).append(p)
    for i, (method, rows) in enumerate(sorted(by_method.items())):
        fig.add_scatter(
            x=[p["alpha_hat"] for p in rows],
            y=[p[y_key] for p in rows],
            mode="markers",
            name=f"{name}: {method}",
            marker={
                "size": 13,
                "symbol": MARKERS[i % len(MARKERS)] + ("-open" if hollow else ""),
                "color": MEASURED[i % len(MEASURED)],
                "line": {"width": 1.5, "color": INK},
            },
            customdata=[[p.get("k"), p.get("id")] for p in rows],
            hovertemplate=("%{customdata[1]}" if hollow else "run %{customdata[1]}")
            + " (k=%{customdata[0]}): α̂ %{x:.2f}, %{y:.2f}<extra>"
            + method
            + "</extra>",
        )


def theory_tau(ks: Sequence[int], measured: Iterable[dict] = (), bench: Iterable[dict] = ()) -> go.Figure:
    """E[τ](α) for several k, with measured runs and stored benchmark cells (α̂, τ) on top."""
    fig, alphas = go.Figure(), _alphas()
    for i, k in enumerate(ks):
        fig.add_scatter(
            x=alphas,
            y=[expected_tau(a, k) for a in alphas],
            name=f"k = {k}",
            mode="lines",
            line={"color": PALETTE[i % len(PALETTE)], "width": 2.5},
        )
    _measured(fig, measured, "tau", "measured")
    _measured(fig, bench, "tau", "bench", hollow=True)
    fig.update_xaxes(title_text="α (expected acceptance, 1 − TV(p, q))", range=[0, 1])
    fig.update_yaxes(title_text="τ (tokens / verifier forward)", rangemode="tozero")
    return _layout(fig, "Block efficiency E[τ](α, k) = (1 − αᵏ⁺¹) / (1 − α)", height=380)


def theory_speedup(
    k: int, costs: Sequence[float], measured: Iterable[dict] = (), bench: Iterable[dict] = ()
) -> go.Figure:
    """S(α, k, c) for several cost ratios c, the break-even line S = 1, and measured speed-ups."""
    fig, alphas = go.Figure(), _alphas()
    for i, c in enumerate(costs):
        fig.add_scatter(
            x=alphas,
            y=[speedup(a, k, c) for a in alphas],
            name=f"c = {c:g}",
            mode="lines",
            line={"color": PALETTE[i % len(PALETTE)], "width": 2.5},
        )
    fig.add_hline(y=1, line={"color": GREY, "dash": "dash"}, annotation_text="verifier alone")
    _measured(fig, measured, "speedup", "measured")
    _measured(fig, bench, "speedup", "bench", hollow=True)
    fig.update_xaxes(title_text="α", range=[0, 1])
    fig.update_yaxes(title_text="speed-up over the verifier", rangemode="tozero")
    return _layout(fig, f"Speed-up S(α, k = {k}, c) = τ / (1 + c·k)", height=380)


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
        return _layout(_empty(fig, "loss and validation τ appear here while the job trains"), "Training")
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
    return _layout(fig, "Training curves")
