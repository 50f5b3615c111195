"""The t interval behind the steering gain (sd2.stats)."""

import math
import statistics

import pytest

from sd2.stats import mean_interval, t975


@pytest.mark.parametrize(
    ("df", "quantile"), [(1, 12.706), (9, 2.262), (30, 2.042), (40, 2.021), (120, 1.980)]
)
def test_t975_matches_the_tables(df, quantile):
    assert t975(df) == pytest.approx(quantile, abs=1e-3)


def test_t975_tends_to_the_normal_quantile():
    assert t975(100_000) == pytest.approx(1.95996, abs=1e-4)


def test_mean_interval_is_mean_plus_minus_t_times_standard_error():
    values = [0.0, 1.0, 0.0, 2.0, 1.0, -1.0]
    interval = mean_interval(values)
    half = 2.571 * statistics.stdev(values) / math.sqrt(len(values))
    assert interval.mean == pytest.approx(0.5) and interval.n == 6
    assert (interval.low, interval.high) == pytest.approx((0.5 - half, 0.5 + half))


def test_one_value_has_no_interval_and_none_is_refused():
    single = mean_interval([0.25])
    assert single.mean == 0.25 and single.low is None and single.high is None
    with pytest.raises(ValueError, match="at least one"):
        mean_interval([])
    with pytest.raises(ValueError, match="≥ 1"):
        t975(0)
