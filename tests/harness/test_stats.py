from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scistats

from harness.config import StatsConfig
from harness.stats import (
    MIN_REPEATS,
    Physical,
    SpeedupCI,
    check_repeats,
    confirm_chance,
    cv,
    decide,
    overall_ci,
    speedup_ci,
)

CFG = StatsConfig()


def _noisy(mean: float, n: int, seed: int, sd: float = 0.03) -> list[float]:
    return list(mean * (1 + np.random.default_rng(seed).normal(0, sd, n)))


def test_a_no_op_comparison_has_a_ci_containing_one() -> None:
    a, b = _noisy(100, 12, 1), _noisy(100, 12, 2)
    ci = speedup_ci(a, b, CFG)
    assert ci.contains(1.0), ci


def test_a_ten_percent_slowdown_is_detected() -> None:
    a, b = _noisy(100, 10, 3), _noisy(90, 10, 4)
    ci = speedup_ci(a, b, CFG)
    assert ci.high < 0.97 and 0.85 < ci.ratio < 0.95, ci


def test_the_interval_is_student_t_on_the_paired_log_ratios() -> None:
    a, b = [100.0, 110.0, 90.0, 105.0], [110.0, 118.0, 101.0, 112.0]
    d = np.log(np.array(b) / np.array(a))
    half = 3.182446305284263 * d.std(ddof=1) / 2           # t(0.975, df=3) * s / sqrt(4)
    ci = speedup_ci(a, b, CFG)
    assert math.isclose(ci.ratio, math.exp(d.mean()))
    assert math.isclose(ci.low, math.exp(d.mean() - half)) and math.isclose(ci.high, math.exp(d.mean() + half))
    assert ci.df == 3 and ci.upper(0.95) < ci.high         # the one-sided 95 % bound is tighter


def test_at_three_repeats_the_interval_is_wider_than_the_range_of_the_ratios() -> None:
    """The percentile bootstrap returned [min, max] of the per-repeat ratios at n = 3: not a 95 % interval."""
    a, b = [100.0, 100.0, 100.0], [104.0, 106.0, 108.0]
    ci = speedup_ci(a, b, CFG)
    assert ci.low < 1.04 and ci.high > 1.08


def test_the_accept_rule_is_calibrated_under_the_null_at_campaign_size() -> None:
    """Simulated: true ratio 1.0, 10 % lognormal noise, 4 repeats, 9 cells. The issue measured 10.8 % of
    such geo-means passing the old rule; a t interval puts its lower bound above 1.0 in ~2.5 %."""
    rng = np.random.default_rng(0)
    above = 0
    trials = 2000
    for _ in range(trials):
        a = {f"c{k}": list(np.exp(rng.normal(0, 0.1, 4))) for k in range(9)}
        b = {f"c{k}": list(np.exp(rng.normal(0, 0.1, 4))) for k in range(9)}
        above += overall_ci(a, b, CFG).low > 1.0
    assert above / trials < 0.04


def test_identical_samples_give_a_zero_width_interval() -> None:
    ci = speedup_ci([5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 5.0, 5.0], CFG)
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


def test_the_guard_is_a_one_sided_test_not_the_optimistic_bound() -> None:
    """A cell 6 % slower whose two-sided upper bound just reaches 0.975 used to pass the guard (0.97)."""
    se = math.log(0.975 / 0.94) / 2.447                     # two-sided 95 % upper bound 0.975 at df = 6
    slow = SpeedupCI(0.94, 0.94 * math.exp(-2.447 * se), 0.975, 7, se_log=se, df=6)
    good = SpeedupCI(1.3, 1.2, 1.4, 7)
    assert slow.high > CFG.cell_guard > slow.upper(0.95)
    verdict = decide(good, {"fast": good, "slow": slow}, CFG)
    assert not verdict.accept and "slow" in verdict.reason and "one-sided 95% upper bound" in verdict.reason


def test_an_implausible_speedup_is_quarantined_not_accepted() -> None:
    huge = SpeedupCI(30.0, 25.0, 35.0, 10)
    verdict = decide(huge, {"c": huge}, CFG)
    assert verdict.quarantine and not verdict.accept


def test_one_implausible_cell_is_quarantined_though_the_geo_mean_is_plausible() -> None:
    """One 30x cell in a 9-cell grid gives a 1.46x geo-mean: accepted before, quarantined now."""
    plain = SpeedupCI(1.0, 0.99, 1.01, 4)
    cells = {f"c{k}": plain for k in range(8)} | {"c8": SpeedupCI(30.0, 29.0, 31.0, 4)}
    overall = SpeedupCI(30 ** (1 / 9), 1.4, 1.5, 4)
    verdict = decide(overall, cells, CFG)
    assert verdict.quarantine and not verdict.accept and "c8" in verdict.reason


@pytest.mark.parametrize("repeats", [1, 2, 3, 5])
def test_fewer_or_odd_repeats_are_refused_with_the_minimum(repeats: int) -> None:
    with pytest.raises(ValueError, match=f"set repeats: {max(MIN_REPEATS, repeats + repeats % 2)}"):
        check_repeats(repeats)
    check_repeats(MIN_REPEATS)
    check_repeats(6)


def test_cv() -> None:
    assert cv([1.0]) == 0.0
    assert abs(cv([9.0, 11.0]) - 0.1414) < 1e-3


def test_the_screen_is_looser_than_the_verdict_it_leads_to() -> None:
    """A 6 % gain at n = 4: its 80 % lower bound clears 1.0 (worth confirming), its 95 % one not 1.02."""
    a, b = [100.0, 102.0, 98.0, 101.0], [101.0, 112.0, 103.0, 108.0]
    overall = speedup_ci(a, b, CFG)
    assert overall.lower_at(0.80) > 1.0 and overall.low < CFG.accept_lower_bound
    assert decide(overall, {"c": overall}, CFG, stage="screen").accept
    assert "to be confirmed" in decide(overall, {"c": overall}, CFG, stage="screen").reason
    assert not decide(overall, {"c": overall}, CFG).accept


def _ci(ratio: float, low: float, high: float, n: int = 4) -> SpeedupCI:
    """A t interval as the harness reports it: its standard error recovered from its 95 % bounds."""
    t = float(scistats.t.ppf(0.975, n - 1))
    return SpeedupCI(ratio, low, high, n, se_log=math.log(high / low) / (2 * t), df=n - 1)


def test_a_marginal_screen_does_not_spend_a_confirmation_that_could_hardly_succeed() -> None:
    """The main job's run 9: max_num_seqs 32 screened at 1.021x [0.987, 1.055]. Its 80 % lower bound clears 1.0, but
    8 pairs at that ratio and spread clear 1.02 about 1 % of the time; its confirmation took 938 s and rejected it.
    enforce_eager false (1.307x [1.202, 1.421]) and the H200's stream_interval 8 (1.052x [1.028, 1.076]) still earn
    theirs."""
    marginal = _ci(1.021, 0.987, 1.055)
    assert marginal.lower_at(0.80) > 1.0 and decide(marginal, {"c": marginal}, CFG, stage="screen").accept
    chance = confirm_chance(marginal, 8, CFG)
    assert chance is not None and chance < 0.05
    verdict = decide(marginal, {"c": marginal}, CFG, stage="screen", confirm_pairs=8)
    assert not verdict.accept and "not worth its time" in verdict.reason and "8 pairs" in verdict.reason
    for strong in (_ci(1.307, 1.202, 1.421), _ci(1.052, 1.028, 1.076)):
        assert confirm_chance(strong, 8, CFG) > 0.99   # type: ignore[operator]
        assert decide(strong, {"c": strong}, CFG, stage="screen", confirm_pairs=8).accept
    off = CFG.model_copy(update={"screen_confirm_chance": 0.0})
    assert decide(marginal, {"c": marginal}, off, stage="screen", confirm_pairs=8).accept


def test_the_confirmations_chance_is_its_power_at_the_screens_ratio() -> None:
    """At the bar's own ratio plus t * se the chance is one half; it grows with the ratio and the pairs."""
    se4 = 0.02
    pairs = 8
    se = se4 * math.sqrt(4 / pairs)
    at_half = CFG.accept_lower_bound * math.exp(float(scistats.t.ppf(0.975, pairs - 1)) * se)
    screen = SpeedupCI(at_half, 0.0, 0.0, 4, se_log=se4, df=3)
    assert abs(confirm_chance(screen, pairs, CFG) - 0.5) < 1e-9   # type: ignore[operator]
    higher = SpeedupCI(at_half * 1.02, 0.0, 0.0, 4, se_log=se4, df=3)
    assert confirm_chance(higher, pairs, CFG) > confirm_chance(screen, pairs, CFG)   # type: ignore[operator]
    assert confirm_chance(screen, 16, CFG) > 0.5                                       # type: ignore[operator]
    assert confirm_chance(SpeedupCI(1.5, 1.4, 1.6, 4), 8, CFG) is None               # no standard error: no check


def test_a_cell_faster_than_its_physical_floor_is_quarantined_before_any_ratio_is_judged() -> None:
    good = SpeedupCI(1.10, 1.05, 1.15, 8, se_log=0.02, df=7)
    cells = {"in512/out1": good, "in512/out64": good}
    under = {"in512/out1": Physical(measured_s=2.0, floor_s=1.0), "in512/out64": Physical(4.0, 1.0)}
    assert decide(good, cells, CFG, physics=under).accept
    over = {**under, "in512/out1": Physical(measured_s=0.5, floor_s=1.0)}
    for stage in ("screen", "confirm"):
        verdict = decide(good, cells, CFG, stage=stage, physics=over)
        assert verdict.quarantine and not verdict.accept, verdict
        assert verdict.reason.startswith("impossible") and "in512/out1" in verdict.reason
        assert "in512/out64" not in verdict.reason
    huge = SpeedupCI(20.0, 19.0, 21.0, 8, se_log=0.01, df=7)     # the ratio ceiling stays the second rule
    assert decide(huge, {"in512/out1": huge}, CFG, physics=under).reason.count("plausibility ceiling") == 1
