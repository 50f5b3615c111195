"""Terminal rendering of a trace with the paper's colours (Table 2)."""

from __future__ import annotations

from collections.abc import Iterable

from sd2.metrics import GenerationMetrics
from sd2.trace import Block, TokenStatus

_STYLE = {
    TokenStatus.ACCEPTED: "\033[32m",  # green
    TokenStatus.REJECTED: "\033[31;9m",  # red, struck through
    TokenStatus.DISCARDED: "\033[90m",  # grey
    TokenStatus.RESAMPLED: "\033[34m",  # blue
    TokenStatus.BONUS: "\033[34m",  # blue
}
_RESET = "\033[0m"


def render_blocks(blocks: Iterable[Block], colour: bool = True, show_drafts: bool = True) -> str:
    """The generated text with each token coloured by status; rejected/discarded drafts shown inline."""
    parts = []
    for block in blocks:
        tokens = [*block.drafts, *([block.extra] if block.extra else [])]
        for token in tokens:
            if not show_drafts and not token.emitted:
                continue
            parts.append(f"{_STYLE[token.status]}{token.text}{_RESET}" if colour else token.text)
    return "".join(parts)


def format_metrics(metrics: GenerationMetrics, method: str) -> str:
    """One line of headline numbers."""

    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    line = (
        f"[{method}] tokens {metrics.n_tokens} · τ {fmt(metrics.tau, '.2f')} · "
        f"acceptance {fmt(metrics.acceptance_rate, '.1%')} · α̂ {fmt(metrics.alpha_hat, '.3f')} · "
        f"{fmt(metrics.tokens_per_s, '.1f')} tok/s decode · {fmt(metrics.tokens_per_s_e2e, '.1f')} tok/s e2e"
    )
    gain = metrics.steering_gain
    if gain is not None:
        interval = f" [{fmt(gain.low, '+.2f')}, {fmt(gain.high, '+.2f')}]"
        line += (
            f"\nsteering gain {gain.gain:+.2f} tokens/block{interval} over {gain.n_blocks} blocks · "
            f"won {gain.won} · tied {gain.tied} · lost {gain.lost}"
        )
    return line
