"""Small statistics for paired comparisons: a mean with its Student-t 95 % interval (no SciPy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t 0.975 quantiles for 1..30 degrees of freedom (standard tables)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """Student's t 0.975 quantile: the table to 30 degrees of freedom, then the Cornish-Fisher series in
    1/df (error below 1e-4 from 30 on)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class MeanInterval:
    """A sample mean and its two-sided 95 % Student-t interval (None bounds with fewer than 2 values)."""

    mean: float
    low: float | None
    high: float | None
    n: int


def mean_interval(values: Sequence[float]) -> MeanInterval:
    """The mean of `values` (at least one) with its 95 % t interval, mean ± t975(n−1)·s/√n."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = math.fsum(values) / n
    if n < 2:
        return MeanInterval(mean, None, None, n)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t975(n - 1) * math.sqrt(variance / n)
    return MeanInterval(mean, mean - half, mean + half, n)
