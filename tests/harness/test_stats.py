from __future__ import annotations

import numpy as np

from harness.config import StatsConfig
from harness.stats import SpeedupCI, cv, decide, overall_ci, speedup_ci

CFG = StatsConfig()


def _noisy(mean: float, n: int, seed: int) -> list[float]:
    return list(mean * (1 + np.random.default_rng(seed).normal(0, 0.03, n)))


def test_a_no_op_comparison_has_a_ci_containing_one() -> None:
    a, b = _noisy(100, 12, 1), _noisy(100, 12, 2)
    ci = speedup_ci(a, b, CFG)
    assert ci.contains(1.0), ci


def test_a_ten_percent_slowdown_is_detected() -> None:
    a, b = _noisy(100, 10, 3), _noisy(90, 10, 4)
    ci = speedup_ci(a, b, CFG)
    assert ci.high < 0.97 and 0.85 < ci.ratio < 0.95, ci


def test_identical_samples_give_a_zero_width_interval() -> None:
    ci = speedup_ci([5.0, 5.0, 5.0], [5.0, 5.0, 5.0], CFG)
    assert (ci.low, ci.ratio, ci.high) == (1.0, 1.0, 1.0)


def test_overall_is_the_geometric_mean_of_cell_ratios() -> None:
    a = {"x": [100.0, 100.0, 100.0], "y": [10.0, 10.0, 10.0]}
    b = {"x": [200.0, 200.0, 200.0], "y": [5.0, 5.0, 5.0]}
    assert abs(overall_ci(a, b, CFG).ratio - 1.0) < 1e-9


def test_accept_needs_the_lower_bound_above_the_threshold() -> None:
    good = SpeedupCI(1.2, 1.1, 1.3, 10)
    assert decide(good, {"c": good}, CFG).accept
    marginal = SpeedupCI(1.05, 0.99, 1.1, 10)
    assert not decide(marginal, {"c": marginal}, CFG).accept


def test_a_regressed_cell_blocks_acceptance() -> None:
    good = SpeedupCI(1.5, 1.4, 1.6, 10)
    bad = SpeedupCI(0.8, 0.75, 0.85, 10)
    verdict = decide(good, {"a": good, "b": bad}, CFG)
    assert not verdict.accept and "b" in verdict.reason


def test_an_implausible_speedup_is_quarantined_not_accepted() -> None:
    huge = SpeedupCI(30.0, 25.0, 35.0, 10)
    verdict = decide(huge, {"c": huge}, CFG)
    assert verdict.quarantine and not verdict.accept


def test_cv() -> None:
    assert cv([1.0]) == 0.0
    assert abs(cv([9.0, 11.0]) - 0.1414) < 1e-3
