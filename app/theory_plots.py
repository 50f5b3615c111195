"""Plotly figures of the cost model, with measured points on top. Pure: plain dicts in, a `go.Figure` out.

S(α, k, c) = E[τ] / (1 + c·k) with E[τ] = (1 − α^{k+1}) / (1 − α) under i.i.d. acceptance α (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from app.figure_style import GREY, INK, MARKERS, MEASURED, PALETTE, layout


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
    return layout(fig, "Block efficiency E[τ](α, k) = (1 − αᵏ⁺¹) / (1 − α)", height=380)


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
    return layout(fig, f"Speed-up S(α, k = {k}, c) = τ / (1 + c·k)", height=380)
