"""The UI figures' shared look: colours, markers and the common layout (app.plots, app.theory_plots)."""

from __future__ import annotations

import plotly.graph_objects as go

GREEN, BLUE, GREY, INK = "#15803d", "#2563eb", "#8b939e", "#0f172a"
PALETTE = ("#2563eb", "#15803d", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#db2777", "#4b5563")
MEASURED = ("#facc15", "#f472b6", "#22d3ee", "#a3e635", "#fb923c")  # markers, distinct from the curves
MARKERS = ("diamond", "star", "square", "triangle-up", "circle")
HEIGHT = 320


def layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=height,
        margin={"l": 50, "r": 50, "t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.18, "x": 0},
        uirevision="keep",  # streaming updates keep the user's zoom
    )
    return fig


def empty(fig: go.Figure, message: str) -> go.Figure:
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
