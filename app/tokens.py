"""How one token looks, wherever the UI shows it (trace, counterfactual row, explainer): the paper's
Table 2 colours, the inline style, the visible text and the probability format."""

from __future__ import annotations

import html

COLOURS: dict[str, str] = {
    "accepted": "#15803d",
    "rejected": "#dc2626",
    "discarded": "#8b939e",
    "resampled": "#2563eb",
    "bonus": "#2563eb",
}
# A block's steered draft against its unsteered counterfactual, by expected accepted drafts:
# outcome → (mark, colour, words).
OUTCOMES: dict[str, tuple[str, str, str]] = {
    "won": ("▲", "#15803d", "steering won"),
    "tied": ("=", "#64748b", "tied"),
    "lost": ("▼", "#dc2626", "steering lost"),
}
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


def shown_text(text: str) -> str:
    """Token text with newlines/tabs/control characters made visible (not escaped); empty shows as ∅."""
    if text == "":
        return "∅"
    return "".join(_VISIBLE.get(ch) or _control(ch) for ch in text)


def visible_text(text: str) -> str:
    """`shown_text`, escaped for HTML."""
    return html.escape(shown_text(text), quote=False)


def _control(ch: str) -> str:
    """Other control characters (byte-level tokens emit them) as their visible Unicode pictures."""
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)
    return "␡" if code == 0x7F else ch


def fmt_prob(value: float | None) -> str:
    """A probability with three decimals; below 0.001 (but not 0) in scientific notation, so a rank-655
    token's p reads 2.7e-06 rather than 0.000."""
    if value is None:
        return "—"
    return f"{value:.1e}" if 0 < value < 5e-4 else f"{value:.3f}"
