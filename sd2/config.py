"""Decoding settings, validated at the edge so every error names the field that was wrong."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sd2.errors import InvalidValue

if TYPE_CHECKING:  # sd2.sampling imports torch; the command line imports this module before it needs torch
    from sd2.sampling import Warp

MAX_K = 64  # beyond this a chain draft is all cost: acceptance of position i decays like α^i
AUTO_K = "auto"  # k = auto: each block's k from the measured cost model and the run's α̂ (sd2.draft_length)
AUTO_MAX_K = 16  # the longest draft k = auto considers
# Below this a positive temperature samples like greedy anyway, while logits / T overflows float32
# and softmax returns NaN; use 0 for greedy.
MIN_TEMPERATURE = 1e-3


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """How one generation runs. Errors raise `sd2.errors.InvalidValue` naming the field."""

    k: int | str = AUTO_K  # drafts per block, or "auto" (the best k for this machine and this run so far)
    temperature: float = 0.0  # 0 = greedy (output identical to the verifier's greedy decoding)
    top_k: int = 0  # 0 = off; applied to verifier and drafter identically, so decoding stays lossless
    top_p: float = 1.0  # 1 = off; same remark as top_k
    max_new_tokens: int = 128  # the paper evaluates 128 new tokens
    seed: int | None = 0  # seeds the one torch.Generator of a run; None draws a fresh seed
    # Stop a block's draft early once the drafter's probability of its latest draft is ≤ this
    # (0 = never, 1 = always after one draft); see sd2.draft_length.
    draft_threshold: float = 0.0

    def __post_init__(self) -> None:
        _check(
            self.k == AUTO_K
            or (isinstance(self.k, int) and not isinstance(self.k, bool) and 1 <= self.k <= MAX_K),
            "k",
            f"must be {AUTO_K!r} or an integer in 1..{MAX_K}",
            self.k,
        )
        _check(
            self.temperature == 0 or self.temperature >= MIN_TEMPERATURE,
            "temperature",
            f"must be 0 (greedy) or ≥ {MIN_TEMPERATURE}",
            self.temperature,
        )
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an integer ≥ 0", self.top_k)
        _check(0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        _check(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            "max_new_tokens",
            "must be an integer ≥ 1",
            self.max_new_tokens,
        )
        _check(0 <= self.draft_threshold <= 1, "draft_threshold", "must be in [0, 1]", self.draft_threshold)

    @property
    def warp(self) -> Warp:
        from sd2.sampling import Warp

        return Warp(self.temperature, self.top_k, self.top_p)

    @property
    def auto_k(self) -> bool:
        return self.k == AUTO_K

    @property
    def max_k(self) -> int:
        """The most drafts a block of this run can hold."""
        return AUTO_MAX_K if self.auto_k else int(self.k)


def parse_k(text: str) -> int | str:
    """--k as typed on a command line (an argparse type): "auto" or an integer, range checked by
    DecodeConfig. Raises argparse.ArgumentTypeError, whose message argparse shows as is."""
    if text == AUTO_K:
        return AUTO_K
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be {AUTO_K!r} or an integer, got {text!r}") from None


def _check(ok: bool, field: str, rule: str, value: object) -> None:
    if not ok:
        raise InvalidValue(field, f"{field} {rule}, got {value!r}")


# The one source of the decode defaults: the CLI's flags, the API's schema and (through GET /defaults)
# the UI's controls read them from here.
DECODE_DEFAULTS = DecodeConfig()
