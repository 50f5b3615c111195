"""The rejection explainer: click a judged token of the trace (or a counterfactual one) and a panel says
why the verifier accepted, rejected or resampled it (docs/trace.md#the-rejection-explainer).

Each explainable token is followed by an inert `<template class="sd2-why">` holding its explanation,
rendered here from the token event's own fields: q(x) against p(x), the acceptance rule (min(1, p/q)
at T > 0, the argmax at T = 0), x's rank under p, the verifier's and the drafter's top-5 side by side,
and for a resampled token the residual norm(max(0, p − q)) it was drawn from. One inline `onclick` on
the trace's wrapper (`explainable`) copies a clicked token's template into the wrapper's panel, so the
trace HTML works as is inside a Gradio HTML component: no script element, no server round trip.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from app.tokens import COLOURS, fmt_prob, shown_text

# Delegated click handler of one `.sd2-explain` wrapper (`this`): a token with `data-why` shows the
# template right after it in the wrapper's panel, which theme.CSS positions absolutely (the trace does
# not move): just under the token, or just over it when only there it fits the window. Under it, the
# wrapper grows to hold the panel (a short trace's box would clip it). Clicking the token again, or ×,
# closes it.
_ONCLICK = (
    "const root=this,panel=root.querySelector('.sd2-why-panel');"
    "const hide=()=>{panel.hidden=true;root.style.minHeight='';"
    "root.querySelectorAll('.sd2-picked').forEach(t=>t.classList.remove('sd2-picked'));};"
    "if(event.target.closest('.sd2-why-close')){hide();return;}"
    "const tok=event.target.closest('[data-why]');"
    "if(!tok||!root.contains(tok))return;"
    "const again=tok.classList.contains('sd2-picked');hide();if(again)return;"
    "const tpl=tok.nextElementSibling;if(!tpl||tpl.tagName!=='TEMPLATE')return;"
    "panel.replaceChildren(tpl.content.cloneNode(true));panel.hidden=false;"
    "tok.classList.add('sd2-picked');"
    "const t=tok.getBoundingClientRect(),top=root.getBoundingClientRect().top,h=panel.offsetHeight;"
    "const over=t.bottom+h+6>innerHeight&&t.top-h-6>=0&&t.top-top-h-6>=0;"
    "panel.style.top=(over?t.top-top-h-6:t.bottom-top+6)+'px';"
    "if(!over)root.style.minHeight=(t.bottom-top+h+12)+'px';"
    "panel.scrollIntoView({block:'nearest'});"
)
_PANEL = '<div class="sd2-why-panel" hidden></div>'
CLICK_HINT = "click a judged token (or a counterfactual one) for why"


def explainable(inner: str) -> str:
    """`inner` (a trace, or Compare's columns) in a wrapper whose tokens open its explainer panel."""
    return f'<div class="sd2-explain" onclick="{html.escape(_ONCLICK, quote=True)}">{_PANEL}{inner}</div>'


def why_template(content: str) -> str:
    """The explanation that follows its token, inert until clicked (see `_ONCLICK`)."""
    return f'<template class="sd2-why">{content}</template>'


def can_explain(token: dict) -> bool:
    """Judged positions carry the verifier's top-5, so they can say why (discarded drafts cannot)."""
    return bool(token.get("target_top"))


def _q(text: object) -> str:
    return f"“{shown_text(str(text))}”"


def _rank(token: dict) -> str:
    return "?" if token.get("target_rank") is None else f"#{token['target_rank']}"


def _ratio(p: float | None, q: float | None) -> str:
    """min(1, p/q) written out with its value."""
    if p is None or not q:
        return "min(1, p/q)"
    return f"min(1, p/q) = min(1, {fmt_prob(p)} / {fmt_prob(q)}) = {min(1.0, p / q):.3f}"


def _argmax(token: dict) -> str:
    top = (token.get("target_top") or [{}])[0]
    return f"the verifier's argmax is {_q(top.get('text', ''))} (p = {fmt_prob(top.get('prob'))})"


def verdict(token: dict, greedy: bool | None) -> str:
    """Why a token of the run got its status, under the rule of its temperature (None: unknown)."""
    status, p, q = token.get("status"), token.get("target_prob"), token.get("draft_prob")
    if status == "accepted":
        if greedy:
            return "Accepted: at T = 0 a draft is kept exactly when it is the verifier's argmax — it is."
        return f"Accepted: kept with probability {_ratio(p, q)}."
    if status == "rejected":
        if greedy:
            return f"Rejected: argmax differs — {_argmax(token)}; this draft is its {_rank(token)}."
        return f"Rejected: kept only with probability {_ratio(p, q)}, and the uniform draw fell above it."
    if status == "resampled":
        if greedy:
            return (
                "Resampled: the draft at this position was rejected, so the verifier's own argmax is "
                "emitted (at T = 0 the residual is one-hot on it)."
            )
        return (
            "Resampled: the draft at this position was rejected, so this token was drawn from the "
            "residual norm(max(0, p − q)): the mass the verifier wants and the drafter under-proposed."
        )
    if status == "bonus":
        pick = "its argmax" if greedy else "a sample of p"
        return f"Bonus: every draft of the block was accepted, so the verifier's next position adds {pick}."
    return f"{status}: nothing was judged here."


def counterfactual_verdict(token: dict, greedy: bool | None) -> str:
    """What an unsteered draft would have got (T = 0), or how likely it was to survive (T > 0)."""
    status = token.get("status")
    if greedy or (greedy is None and status is not None):
        if status == "accepted":
            return "Would have been accepted: it is the verifier's argmax (T = 0)."
        if status == "rejected":
            return f"Would have been rejected: argmax differs — {_argmax(token)}; this is its {_rank(token)}."
        return (
            "Would have been discarded: an earlier unsteered draft would already have been rejected "
            f"(the verifier ranks this one {_rank(token)})."
        )
    return (
        f"Would have survived with probability {float(token.get('survival') or 0.0):.3f}: this and every "
        "earlier unsteered draft accepted, Π min(1, pᵢ/qᵢ). At this position alone: "
        f"{_ratio(token.get('target_prob'), token.get('draft_prob'))}."
    )


def _head(text: str, colour: str, what: str) -> str:
    return (
        f'<div class="sd2-why-head"><b class="sd2-why-token" style="color:{colour};">'
        f"{html.escape(_q(text), quote=False)}</b> <span>{html.escape(what)}</span>"
        '<button type="button" class="sd2-why-close" title="close">×</button></div>'
    )


def _para(text: str, cls: str = "sd2-why-verdict") -> str:
    return f'<div class="{cls}">{html.escape(text, quote=False)}</div>'


def _bar(value: float | None) -> str:
    width = 0.0 if value is None else max(0.0, min(1.0, float(value))) * 100
    return f'<td><i style="width:{width:.0f}%"></i></td>'


def _bars(rows: Sequence[tuple[str, str, float | None]]) -> str:
    """Labelled horizontal bars, widths ∝ probability: q(x) against p(x) at a glance. Rows are
    (who: p | q | r, label, value); `who` colours the bar (verifier, drafter, residual)."""
    cells = "".join(
        f'<tr data-who="{who}"><th>{html.escape(label)}</th>{_bar(value)}<td>{fmt_prob(value)}</td></tr>'
        for who, label, value in rows
    )
    return f'<table class="sd2-why-bars">{cells}</table>'


def top_list(
    who: str, title: str, candidates: Sequence[dict], token_id: int | None, crossed: int | None = None
) -> str:
    """A top-5 table (rank, token, bar, probability) of p, q or the residual (`who`: p | q | r); the
    explained token's row is `sd2-why-self`, `crossed` (a resampled token's rejected draft) struck."""
    rows = []
    for rank, cand in enumerate(candidates, start=1):
        marks = ["sd2-why-self"] if cand.get("token_id") == token_id else []
        marks += ["sd2-why-crossed"] if crossed is not None and cand.get("token_id") == crossed else []
        cls = f' class="{" ".join(marks)}"' if marks else ""
        rows.append(
            f"<tr{cls}><td>{rank}</td><td>{html.escape(_q(cand.get('text', '')), quote=False)}</td>"
            f"{_bar(cand.get('prob'))}<td>{fmt_prob(cand.get('prob'))}</td></tr>"
        )
    body = "".join(rows) or "<tr><td>—</td></tr>"
    return (
        f'<table class="sd2-why-list" data-who="{who}"><caption>{html.escape(title)}</caption>{body}</table>'
    )


def _facts(bars: str, notes: Sequence[str]) -> str:
    """The bars and the notes side by side (they wrap under each other in a narrow panel)."""
    said = "".join(_para(note, "sd2-why-note") for note in notes)
    return f'<div class="sd2-why-facts">{bars}<div>{said}</div></div>'


def _lists(columns: Sequence[str]) -> str:
    return f'<div class="sd2-why-lists">{"".join(columns)}</div>'


def explain_event(block: dict, position: int, greedy: bool | None) -> str:
    """The panel of the run's own token at `position` of `block` (its drafts, then the extra token)."""
    drafts = block.get("drafts", [])
    token = drafts[position] if position < len(drafts) else block["extra"]
    status, token_id = str(token.get("status")), token.get("token_id")
    what = {"resampled": "resampled by the verifier", "bonus": "bonus token"}.get(status, f"{status} draft")
    where = f"{what} · block {block.get('index', 0)} · position {position}"
    parts = [
        _head(token.get("text", ""), COLOURS.get(status, "#6b7280"), where),
        _para(verdict(token, greedy)),
    ]
    rank = f"rank of {_q(token.get('text', ''))} under the verifier's p: {_rank(token)}"
    if status == "resampled":
        rejected = next((d for d in drafts if d.get("status") == "rejected"), {})
        residual = {c.get("token_id"): c.get("prob") for c in token.get("residual_top", [])}.get(token_id)
        lists = (
            ("p", "verifier p top-5", token.get("target_top", [])),
            ("q", "drafter q top-5 (at the rejected draft)", rejected.get("draft_top", [])),
            ("r", "residual norm(max(0, p − q)) top-5", token.get("residual_top", [])),
        )
        crossed = rejected.get("token_id")
        bars = [("p", "p(x) verifier", token.get("target_prob")), ("r", "residual(x)", residual)]
        parts += [
            _facts(_bars(bars), [rank]),
            _lists([top_list(who, title, top, token_id, crossed) for who, title, top in lists]),
        ]
        return "".join(parts)
    bars = [("q", "q(x) drafter", token["draft_prob"])] if token.get("draft_prob") is not None else []
    columns = [top_list("p", "verifier p top-5", token.get("target_top", []), token_id)]
    if token.get("draft_top"):
        columns.append(top_list("q", "drafter q top-5", token["draft_top"], token_id))
    bars.append(("p", "p(x) verifier", token.get("target_prob")))
    parts += [_facts(_bars(bars), [rank]), _lists(columns)]
    return "".join(parts)


def explain_counterfactual(block: dict, position: int, greedy: bool | None) -> str:
    """The panel of the unsteered counterfactual's token at `position`, beside the steered draft."""
    record = block["counterfactual"]
    token, drafts = record["drafts"][position], block.get("drafts", [])
    colour = COLOURS.get(str(token.get("status")), COLOURS["accepted"])
    where = f"unsteered counterfactual · block {block.get('index', 0)} · position {position}"
    notes = [f"rank of {_q(token.get('text', ''))} under the verifier's p: {_rank(token)}"]
    same_prefix = position < len(drafts) and all(
        d.get("token_id") == c.get("token_id")
        for d, c in zip(drafts[:position], record["drafts"][:position], strict=True)
    )
    if same_prefix:  # after the same prefix the two drafters saw the same context
        steered = drafts[position]
        notes.append(
            f"the steered drafter drafted {_q(steered.get('text', ''))} here ({steered.get('status')})"
        )
    steered_mean, unsteered_mean = (
        record.get("steered_expected_accepted", 0.0),
        record.get("expected_accepted", 0.0),
    )
    notes.append(
        f"this block: steered {steered_mean:.2f} vs unsteered {unsteered_mean:.2f} expected accepted "
        f"drafts → steering {record.get('outcome')}"
    )
    bars = [
        ("q", "q(x) unsteered", token.get("draft_prob")),
        ("p", "p(x) verifier", token.get("target_prob")),
    ]
    return "".join([
        _head(token.get("text", ""), colour, where),
        _para(counterfactual_verdict(token, greedy)),
        _facts(_bars(bars), notes),
        _lists([
            top_list("p", "verifier p top-5", token.get("target_top", []), token.get("token_id")),
            top_list("q", "unsteered drafter q top-5", token.get("draft_top", []), token.get("token_id")),
        ]),
    ])  # fmt: skip
