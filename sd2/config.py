"""Decoding settings, validated at the edge so every error names the field that was wrong."""

from __future__ import annotations

from dataclasses import dataclass

from sd2.sampling import Warp

MAX_K = 64  # beyond this a chain draft is all cost: acceptance of position i decays like α^i
# Below this a positive temperature samples like greedy anyway, while logits / T overflows float32
# and softmax returns NaN; use 0 for greedy.
MIN_TEMPERATURE = 1e-3


@dataclass(frozen=True)
class DecodeConfig:
    """How one generation runs. Errors raise ValueError naming the field."""

    k: int = 8  # drafts per block; the paper's default and a good choice for a ≈12× cheaper drafter
    temperature: float = 0.0  # 0 = greedy (output identical to the verifier's greedy decoding)
    top_k: int = 0  # 0 = off; applied to verifier and drafter identically, so decoding stays lossless
    top_p: float = 1.0  # 1 = off; same remark as top_k
    max_new_tokens: int = 128  # the paper evaluates 128 new tokens
    seed: int | None = 0  # seeds the one torch.Generator of a run; None draws a fresh seed

    def __post_init__(self) -> None:
        _check(
            isinstance(self.k, int) and 1 <= self.k <= MAX_K, "k", f"must be an integer in 1..{MAX_K}", self.k
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

    @property
    def warp(self) -> Warp:
        return Warp(self.temperature, self.top_k, self.top_p)


def _check(ok: bool, field: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field} {rule}, got {value!r}")
