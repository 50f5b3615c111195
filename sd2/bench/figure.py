"""A Plotly HTML figure of a result's JSON: measured speed-up against the machine's ceiling S_fwd.

Left: decode speed-up over `verifier` (else `hf-generate`) per cell and prompt set, with S_fwd as
markers. Right: mean speed-up against k for each speculative method (the k-sweep view).
plotly ships with the `app` extra; without it no figure is written.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from pathlib import Path

log = logging.getLogger(__name__)


def _speedup(cell: dict) -> float | None:
    value = cell["speedup_vs_verifier"]
    return value if value is not None else cell["speedup_vs_hf_generate"]


def build_figure(data: dict):
    """The plotly Figure for one result (first temperature of the plan)."""
    from plotly import graph_objects as go
    from plotly.subplots import make_subplots

    temperature = data["plan"]["temperatures"][0]
    cells = [c for c in data["cells"] if c["temperature"] == temperature]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("speed-up per cell (◆ = S_fwd)", "speed-up vs k"))
    for prompt_set in dict.fromkeys(c["prompt_set"] for c in cells):
        mine = [c for c in cells if c["prompt_set"] == prompt_set]
        labels = [c["method"] if c["k"] is None else f"{c['method']} k={c['k']}" for c in mine]
        figure.add_trace(go.Bar(name=prompt_set, x=labels, y=[_speedup(c) for c in mine]), row=1, col=1)
        figure.add_trace(
            go.Scatter(
                name=f"S_fwd {prompt_set}",
                x=labels,
                y=[c["forward_ceiling"] for c in mine],
                mode="markers",
                marker={"symbol": "diamond", "size": 10},
            ),
            row=1,
            col=1,
        )
    by_method: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        if isinstance(c["k"], int) and _speedup(c) is not None:  # the curve over k; auto is a bar
            by_method[c["method"]][c["k"]].append(_speedup(c))
    for method, per_k in by_method.items():
        ks = sorted(per_k)
        figure.add_trace(
            go.Scatter(name=method, x=ks, y=[statistics.fmean(per_k[k]) for k in ks], mode="lines+markers"),
            row=1,
            col=2,
        )
    figure.add_hline(y=1.0, line_dash="dot", row=1, col=1)
    demo = " — demo prompts" if any(s["demo"] for s in data["prompt_sets"]) else ""
    figure.update_layout(title=f"sd2 bench, T = {temperature:g}, {data['created_at']}{demo}", barmode="group")
    figure.update_xaxes(title_text="k", row=1, col=2)
    figure.update_yaxes(title_text="decode speed-up ×", row=1, col=1)
    return figure


def write_figure(data: dict, path: Path) -> Path | None:
    """Write a self-contained HTML file (plotly.js inlined: works offline); None without plotly."""
    try:
        figure = build_figure(data)
    except ImportError:
        log.warning("plotly is not installed (pip install -e '.[app]'): no HTML figure written")
        return None
    figure.write_html(path, include_plotlyjs=True, full_html=True)
    return path
