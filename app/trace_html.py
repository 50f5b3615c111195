"""The per-token trace (docs/trace.md) as HTML spans, coloured as in the paper's Table 2.

accepted green, rejected red struck through, discarded grey, resampled/bonus blue. Colours are
inline styles (exact, independent of the theme); token text is always escaped; each block is one
`<span class="sd2-block">` with a visible boundary; hovering a token shows p, q, status, block and
position in its `title`.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

COLOURS: dict[str, str] = {
    "accepted": "#15803d",
    "rejected": "#dc2626",
    "discarded": "#8b939e",
    "resampled": "#2563eb",
    "bonus": "#2563eb",
}
LEGEND = (
    ("accepted", "accepted draft"),
    ("rejected", "rejected draft"),
    ("discarded", "discarded (after a rejection)"),
    ("resampled", "resampled / bonus (verifier)"),
)
# Whitespace stays readable: a newline shows as ↵ and breaks the line, a tab as →.
_VISIBLE = {"\n": "↵\n", "\t": "→\t", "\r": "␍"}


def token_style(status: str) -> str:
    """Inline style of one token: coloured text on a light tint of the same colour."""
    colour = COLOURS.get(status, "#6b7280")
    style = f"color:{colour};background:{colour}1f;border-bottom:2px solid {colour};"
    if status == "rejected":
        style += "text-decoration:line-through;text-decoration-thickness:2px;"
    if status == "discarded":
        style += "opacity:.75;"
    return style


def visible_text(text: str) -> str:
    """Escaped token text with newlines/tabs made visible; an empty token shows as ∅."""
    if text == "":
        return "∅"
    shown = "".join(_VISIBLE.get(ch) or _control(ch) for ch in text)
    return html.escape(shown, quote=False)


def _control(ch: str) -> str:
    """Other control characters (byte-level tokens emit them) as their visible Unicode pictures."""
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)
    return "␡" if code == 0x7F else ch


def _prob(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def token_span(token: dict, block: int, position: int) -> str:
    """One token: `<span class="sd2-tok sd2-<status>" title="...">text</span>`."""
    status = str(token.get("status", "?"))
    tooltip = (
        f"{status} · block {block} · position {position}\n"
        f"p (verifier) = {_prob(token.get('target_prob'))}   q (drafter) = {_prob(token.get('draft_prob'))}\n"
        f"token id {token.get('token_id')}: {token.get('text', '')!r}"
    )
    return (
        f'<span class="sd2-tok sd2-{html.escape(status)}" style="{token_style(status)}" '
        f'title="{html.escape(tooltip, quote=True)}">{visible_text(str(token.get("text", "")))}</span>'
    )


def block_html(block: dict) -> str:
    """All tokens of one block (drafts, then the extra resampled/bonus token) inside a bordered span."""
    index = int(block.get("index", 0))
    tokens = [*block.get("drafts", []), *([block["extra"]] if block.get("extra") else [])]
    spans = "".join(token_span(t, index, pos) for pos, t in enumerate(tokens))
    kind = html.escape(str(block.get("kind", "")))
    summary = f"block {index} ({kind}): {block.get('n_accepted', 0)}/{block.get('k', 0)} drafts accepted"
    return (
        f'<span class="sd2-block" data-block="{index}" data-kind="{kind}" title="{html.escape(summary)}" '
        f'style="border-left:2px solid #94a3b8;padding-left:2px;margin-left:1px;">{spans}</span>'
    )


def legend_html() -> str:
    chips = "".join(
        f'<span class="sd2-tok sd2-{s}" style="{token_style(s)}padding:0 4px;">{html.escape(label)}</span> '
        for s, label in LEGEND
    )
    return (
        f'<div class="sd2-legend" style="font-size:.85em;margin-bottom:6px;">{chips}'
        '<span style="color:#64748b;">a grey bar starts each block · '
        "hover a token for p, q, status, position</span>"
        "</div>"
    )


def trace_html(blocks: Sequence[dict], placeholder: str = "The token trace appears here.") -> str:
    """The whole trace with its legend; `placeholder` when there are no blocks yet."""
    if not blocks:
        return f'<div class="sd2-trace sd2-empty" style="color:#64748b;">{html.escape(placeholder)}</div>'
    body = "".join(block_html(b) for b in blocks)
    return (
        f'<div class="sd2-trace-wrap">{legend_html()}<div class="sd2-trace" data-blocks="{len(blocks)}" '
        f'style="white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.9;font-family:var(--font-mono,monospace);">{body}</div></div>'
    )


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


# What a Compare column says while its comparison streams (a column without a state is a finished run).
COLUMN_STATES = {"waiting": "waiting for its turn…", "decoding": "decoding…", "done": ""}


def columns_html(results: Iterable[dict]) -> str:
    """Compare view: one column per method, each with its headline numbers and its own trace. A column
    may carry `state` (waiting / decoding / done, or a run's failed / cancelled status with `error`)."""
    cols = []
    for result in results:
        m = result.get("metrics", {})
        stats = (
            f"τ {_fmt(m.get('tau'))} · accept {_fmt(_pct(m.get('acceptance_rate')), 0, '%')} · "
            f"α̂ {_fmt(m.get('alpha_hat'))} · {_fmt(m.get('tokens_per_s'), 1)} tok/s"
        )
        state = str(result.get("state", "done"))
        said = COLUMN_STATES.get(state, f"{state}: {result.get('error') or ''}")
        note = f'<div class="sd2-col-state" style="color:#64748b;">{html.escape(said)}</div>' if said else ""
        body = "".join(block_html(b) for b in result.get("blocks", []))
        cols.append(
            f'<div class="sd2-col" data-method="{html.escape(str(result.get("method", "")))}" '
            f'data-state="{html.escape(state)}">'
            f'<div class="sd2-col-head"><b>{html.escape(str(result.get("method", "?")))}</b>'
            f'<div class="sd2-col-stats">{html.escape(stats)}</div>{note}</div>'
            f'<div class="sd2-trace" style="white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.9;'
            f'font-family:var(--font-mono,monospace);">{body}</div></div>'
        )
    if not cols:
        return '<div class="sd2-empty" style="color:#64748b;">Pick methods and press Compare.</div>'
    grid = f"display:grid;grid-template-columns:repeat({len(cols)},minmax(0,1fr));gap:12px;"
    head = f'<div class="sd2-columns" data-columns="{len(cols)}" style="{grid}">'
    return f"{legend_html()}{head}{''.join(cols)}</div>"


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value
