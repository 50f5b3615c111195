"""Headline cards (τ, acceptance rate, α̂, tokens/s, speed-up, and the steering gain of a run with
counterfactuals) and small status boxes, as HTML.

Each number carries its convention (docs/metrics.md) in a caption under it.
"""

from __future__ import annotations

import html
from typing import Any

from app.tokens import OUTCOMES


def _num(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _card(name: str, value: str, caption: str, key: str) -> str:
    return (
        f'<div class="sd2-card" data-metric="{key}"><div class="sd2-card-name">{html.escape(name)}</div>'
        f'<div class="sd2-card-value">{html.escape(value)}</div>'
        f'<div class="sd2-card-caption">{html.escape(caption)}</div></div>'
    )


def speedup_vs_verifier(metrics: dict | None, verifier_tps: float | None) -> float | None:
    """This run's decode tokens/s over the verifier's mean decode tokens/s on this server."""
    tps = (metrics or {}).get("tokens_per_s")
    return tps / verifier_tps if tps and verifier_tps else None


def cards_html(metrics: dict | None, verifier_tps: float | None = None, live: bool = False) -> str:
    """The five headline cards; `live` marks numbers still being decoded."""
    m = metrics or {}
    rate = m.get("acceptance_rate")
    ceiling = m.get("speedup_ceiling")
    speed = speedup_vs_verifier(m, verifier_tps)
    speed_caption = (
        "decode tok/s ÷ verifier's mean tok/s (stored runs)"
        if verifier_tps
        else "run the verifier once to measure it"
    )
    if ceiling is not None:
        speed_caption += f" · ceiling S(α̂,k,c) = {ceiling:.2f}×"
    cards = [
        _card("τ", _num(m.get("tau")), "tokens per verifier forward (complete blocks)", "tau"),
        _card("acceptance", _num(None if rate is None else 100 * rate, 0, "%"), "accepted ÷ drafted", "rate"),
        _card("α̂", _num(m.get("alpha_hat")), "mean Σ min(p, q) = 1 − TV", "alpha"),
        _card("tokens / s", _num(m.get("tokens_per_s"), 1), "decode, after the first token", "tps"),
        _card("speed-up", _num(speed, 2, "×"), speed_caption, "speedup"),
    ]
    if m.get("steering_gain"):
        cards.append(gain_card(m["steering_gain"]))
    state = " sd2-live" if live else ""
    return f'<div class="sd2-cards{state}">{"".join(cards)}</div>'


def gain_card(gain: dict) -> str:
    """The wide card of metrics.steering_gain: "steering gain +0.38 tokens/block [−0.63, +1.39]" with
    the blocks steering won, tied and lost (docs/metrics.md#steering-gain)."""
    interval = "" if gain.get("low") is None else f" [{gain['low']:+.2f}, {gain['high']:+.2f}]"
    counts = " · ".join(
        f'<span style="color:{colour};">{mark} {gain.get(key, 0)} {key}</span>'
        for key, (mark, colour, _words) in OUTCOMES.items()
    )
    caption = (
        f"expected accepted drafts per block, steered {gain['steered']:.2f} − unsteered "
        f"{gain['unsteered']:.2f}, over {gain['n_blocks']} blocks; 95 % interval"
    )
    return (
        f'<div class="sd2-card sd2-card-wide" data-metric="steering_gain">'
        f'<div class="sd2-card-name">steering gain</div>'
        f'<div class="sd2-card-value">{gain["gain"]:+.2f} tokens/block{html.escape(interval)}</div>'
        f'<div class="sd2-outcomes">{counts}</div>'
        f'<div class="sd2-card-caption">{html.escape(caption)}</div></div>'
    )


def status_html(message: str, kind: str = "info") -> str:
    """A one-line status: kind is info | ok | error (errors show the API's message verbatim)."""
    if not message:
        return ""
    icon = {"error": "⚠", "ok": "✓"}.get(kind, "ℹ")
    return f'<div class="sd2-status sd2-{kind}">{icon} {html.escape(message)}</div>'


def progress_html(progress: float, status: str, detail: str = "") -> str:
    """A training progress bar with the job's status and a short detail line."""
    pct = max(0.0, min(1.0, progress)) * 100
    return (
        f'<div class="sd2-progress" data-status="{html.escape(status)}">'
        f'<div class="sd2-progress-label"><b>{html.escape(status)}</b> · {pct:.0f}% '
        f"{html.escape(detail)}</div>"
        f'<div class="sd2-progress-track"><div class="sd2-progress-bar sd2-{html.escape(status)}" '
        f'style="width:{pct:.1f}%"></div></div></div>'
    )
