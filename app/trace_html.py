"""The per-token trace (docs/trace.md) as HTML spans, coloured as in the paper's Table 2.

accepted green, rejected red struck through, discarded grey, resampled/bonus blue. Colours are
inline styles (exact, independent of the theme); token text is always escaped; each block is one
`<span class="sd2-block">` with a visible boundary; hovering a token shows p, q, status, block and
position in its `title`. A block that carries an unsteered counterfactual (requests with
`counterfactual: true`) shows it as a second, fainter row under its tokens, with a ▲ won / = tied /
▼ lost mark; clicking a judged or counterfactual token opens the rejection explainer (app.explainer).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from app.explainer import (
    CLICK_HINT,
    can_explain,
    explain_counterfactual,
    explain_event,
    explainable,
    why_template,
)
from app.tokens import COLOURS, OUTCOMES, fmt_prob, token_style, visible_text

LEGEND = (
    ("accepted", "accepted draft"),
    ("rejected", "rejected draft"),
    ("discarded", "discarded (after a rejection)"),
    ("resampled", "resampled / bonus (verifier)"),
)
_TRACE_STYLE = (
    "white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.9;font-family:var(--font-mono,monospace);"
)


def token_span(token: dict, block: int, position: int, why: str = "") -> str:
    """One token: `<span class="sd2-tok sd2-<status>" title="...">text</span>`, followed by its
    explanation template when `why` is given (it is then clickable: `data-why`)."""
    status = str(token.get("status", "?"))
    rank = token.get("target_rank")
    tooltip = (
        f"{status} · block {block} · position {position}\n"
        f"p (verifier) = {fmt_prob(token.get('target_prob'))}   "
        f"q (drafter) = {fmt_prob(token.get('draft_prob'))}"
        + ("" if rank is None else f"   rank under p = {rank}")
        + f"\ntoken id {token.get('token_id')}: {token.get('text', '')!r}"
        + ("\nclick for why" if why else "")
    )
    return _span(f"sd2-tok sd2-{html.escape(status)}", token_style(status), tooltip, token, why)


def _span(classes: str, style: str, tooltip: str, token: dict, why: str) -> str:
    """A token's span with its tooltip, clickable (`data-why`) and followed by its explanation template
    when `why` is given."""
    clickable = ' data-why="1"' if why else ""
    return (
        f'<span class="{classes}" style="{style}"{clickable} '
        f'title="{html.escape(tooltip, quote=True)}">{visible_text(str(token.get("text", "")))}</span>'
        + (why_template(why) if why else "")
    )


def counterfactual_style(token: dict) -> str:
    """T = 0: the colour of what it would have got. T > 0 (no status): green, as opaque as its survival."""
    status = token.get("status")
    if status:
        return token_style(str(status)) + "border-bottom-style:dashed;opacity:.7;"
    survival = max(0.0, min(1.0, float(token.get("survival") or 0.0)))
    green = COLOURS["accepted"]
    return (
        f"color:{green};background:rgba(21,128,61,{0.3 * survival:.2f});"
        f"border-bottom:2px dashed {green};opacity:{0.25 + 0.75 * survival:.2f};"
    )


def counterfactual_span(token: dict, block: int, position: int, why: str = "") -> str:
    """One unsteered counterfactual token (class `sd2-cf`), clickable when it carries an explanation."""
    status = token.get("status")
    would = f"would be {status} (T = 0)" if status else "survival: P(this and every earlier one accepted)"
    tooltip = (
        f"unsteered counterfactual · block {block} · position {position}\n{would}\n"
        f"survival = {float(token.get('survival') or 0.0):.3f}   "
        f"p (verifier) = {fmt_prob(token.get('target_prob'))}   "
        f"q (unsteered) = {fmt_prob(token.get('draft_prob'))}\n"
        f"token id {token.get('token_id')}: {token.get('text', '')!r}" + ("\nclick for why" if why else "")
    )
    kind = html.escape(str(status or "sampled"))
    return _span(f"sd2-cf sd2-cf-{kind}", counterfactual_style(token), tooltip, token, why)


def outcome_mark(record: dict) -> str:
    """The block's ▲ won / = tied / ▼ lost mark, its expected accepted drafts in the tooltip."""
    outcome = str(record.get("outcome", "tied"))
    mark, colour, words = OUTCOMES.get(outcome, ("?", "#64748b", outcome))
    steered, unsteered = record.get("steered_expected_accepted", 0.0), record.get("expected_accepted", 0.0)
    tooltip = (
        f"{words}: expected accepted drafts steered {steered:.2f} vs unsteered {unsteered:.2f} "
        f"(gain {steered - unsteered:+.2f})"
    )
    return (
        f'<span class="sd2-mark sd2-{html.escape(outcome)}" data-outcome="{html.escape(outcome)}" '
        f'style="color:{colour};font-weight:700;padding:0 3px 0 1px;opacity:1;" '
        f'title="{html.escape(tooltip, quote=True)}">{mark}</span>'
    )


def _counterfactual_row(block: dict, greedy: bool | None, explain: bool) -> str:
    record, index = block["counterfactual"], int(block.get("index", 0))
    spans = "".join(
        counterfactual_span(
            t, index, pos, explain_counterfactual(block, pos, greedy) if explain and can_explain(t) else ""
        )
        for pos, t in enumerate(record.get("drafts", []))
    )
    style = "font-size:.8em;line-height:1.7;"
    return f'<span class="sd2-cf-row" style="{style}">{outcome_mark(record)}{spans}</span>'


def block_html(block: dict, greedy: bool | None = None, explain: bool = True) -> str:
    """All tokens of one block (drafts, then the extra resampled/bonus token) inside a bordered span;
    with a counterfactual, the block is two rows: its tokens, and the unsteered draft under them.
    `explain`: give judged tokens their explanation (a few kB each; left out while a run streams)."""
    index = int(block.get("index", 0))
    tokens = [*block.get("drafts", []), *([block["extra"]] if block.get("extra") else [])]
    spans = "".join(
        token_span(t, index, pos, explain_event(block, pos, greedy) if explain and can_explain(t) else "")
        for pos, t in enumerate(tokens)
    )
    kind = html.escape(str(block.get("kind", "")))
    summary = f"block {index} ({kind}): {block.get('n_accepted', 0)}/{block.get('k', 0)} drafts accepted"
    style = "border-left:2px solid #94a3b8;padding-left:2px;margin-left:1px;"
    record = block.get("counterfactual")
    if record:
        outcome = html.escape(str(record.get("outcome", "")))
        return (
            f'<span class="sd2-block sd2-has-cf" data-block="{index}" data-kind="{kind}" '
            f'data-outcome="{outcome}" title="{html.escape(summary)}" '
            f'style="{style}display:inline-flex;flex-direction:column;">'
            f'<span class="sd2-row">{spans}</span>{_counterfactual_row(block, greedy, explain)}</span>'
        )
    return (
        f'<span class="sd2-block" data-block="{index}" data-kind="{kind}" title="{html.escape(summary)}" '
        f'style="{style}">{spans}</span>'
    )


def legend_html(counterfactual: bool = False) -> str:
    chips = "".join(
        f'<span class="sd2-tok sd2-{s}" style="{token_style(s)}padding:0 4px;">{html.escape(label)}</span> '
        for s, label in LEGEND
    )
    extra = ""
    if counterfactual:
        marks = " ".join(
            f'<span style="color:{colour};font-weight:700;">{mark}</span> {words}'
            for mark, colour, words in OUTCOMES.values()
        )
        extra = (
            '<div class="sd2-legend-cf">fainter row under a block: what the drafter would have drafted '
            f"unsteered, coloured by what it would have got (T &gt; 0: opacity = survival) · {marks}</div>"
        )
    return (
        f'<div class="sd2-legend" style="font-size:.85em;margin-bottom:6px;">{chips}'
        '<span style="color:#64748b;">a grey bar starts each block · '
        f"hover a token for p, q, status, position · {CLICK_HINT}</span>{extra}"
        "</div>"
    )


def _greedy(temperature: float | None, blocks: Sequence[dict]) -> bool | None:
    """Whether the rule compared argmaxes (T = 0): from the run's temperature, else from a
    counterfactual (its exact `accepted` count exists only at T = 0), else unknown."""
    if temperature is not None:
        return float(temperature) == 0.0
    records = [b["counterfactual"] for b in blocks if b.get("counterfactual")]
    return records[0].get("accepted") is not None if records else None


def trace_html(
    blocks: Sequence[dict],
    placeholder: str = "The token trace appears here.",
    temperature: float | None = None,
    explain: bool = True,
) -> str:
    """The whole trace with its legend and explainer; `placeholder` when there are no blocks yet.
    `temperature`: the run's, which says which acceptance rule the explainer describes; `explain`:
    False while a run streams (each update re-sends the whole trace; explanations come at the end)."""
    if not blocks:
        return f'<div class="sd2-trace sd2-empty" style="color:#64748b;">{html.escape(placeholder)}</div>'
    greedy = _greedy(temperature, blocks)
    body = "".join(block_html(b, greedy, explain) for b in blocks)
    legend = legend_html(any(b.get("counterfactual") for b in blocks))
    trace = f'<div class="sd2-trace" data-blocks="{len(blocks)}" style="{_TRACE_STYLE}">{body}</div>'
    return f'<div class="sd2-trace-wrap">{legend}{explainable(trace)}</div>'


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def gain_line(gain: dict | None) -> str:
    """A run's steering gain in one line: "steering gain +0.38 tokens/block [−0.63, +1.39] · ▲3 =0 ▼1"."""
    if not gain:
        return ""
    interval = "" if gain.get("low") is None else f" [{gain['low']:+.2f}, {gain['high']:+.2f}]"
    counts = " ".join(f"{OUTCOMES[o][0]}{gain.get(o, 0)}" for o in OUTCOMES)
    return f"steering gain {gain['gain']:+.2f} tokens/block{interval} · {counts}"


# What a Compare column says while its comparison streams (a column without a state is a finished run).
COLUMN_STATES = {"waiting": "waiting for its turn…", "decoding": "decoding…", "done": ""}


def columns_html(results: Iterable[dict], temperature: float | None = None, explain: bool = True) -> str:
    """Compare view: one column per method, each with its headline numbers (and steering gain, for a
    steered column with counterfactuals) and its own trace. A column may carry `state` (waiting /
    decoding / done, or a run's failed / cancelled status with `error`). `temperature` and `explain` as
    in `trace_html`; a finished column's own config gives its temperature."""
    cols, any_cf = [], False
    for result in results:
        m = result.get("metrics", {})
        stats = (
            f"τ {_fmt(m.get('tau'))} · accept {_fmt(_pct(m.get('acceptance_rate')), 0, '%')} · "
            f"α̂ {_fmt(m.get('alpha_hat'))} · {_fmt(m.get('tokens_per_s'), 1)} tok/s"
        )
        gain = gain_line(m.get("steering_gain"))
        gain_div = f'<div class="sd2-col-gain"><b>{html.escape(gain)}</b></div>' if gain else ""
        state = str(result.get("state", "done"))
        said = COLUMN_STATES.get(state, f"{state}: {result.get('error') or ''}")
        note = f'<div class="sd2-col-state" style="color:#64748b;">{html.escape(said)}</div>' if said else ""
        blocks = result.get("blocks", [])
        any_cf = any_cf or any(b.get("counterfactual") for b in blocks)
        run_t = result.get("config", {}).get("temperature", temperature)
        body = "".join(block_html(b, _greedy(run_t, blocks), explain) for b in blocks)
        cols.append(
            f'<div class="sd2-col" data-method="{html.escape(str(result.get("method", "")))}" '
            f'data-state="{html.escape(state)}">'
            f'<div class="sd2-col-head"><b>{html.escape(str(result.get("method", "?")))}</b>'
            f'<div class="sd2-col-stats">{html.escape(stats)}</div>{gain_div}{note}</div>'
            f'<div class="sd2-trace" style="{_TRACE_STYLE}">{body}</div></div>'
        )
    if not cols:
        return '<div class="sd2-empty" style="color:#64748b;">Pick methods and press Compare.</div>'
    grid = f"display:grid;grid-template-columns:repeat({len(cols)},minmax(0,1fr));gap:12px;"
    head = f'<div class="sd2-columns" data-columns="{len(cols)}" style="{grid}">'
    return f"{legend_html(any_cf)}{explainable(head + ''.join(cols) + '</div>')}"


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value
