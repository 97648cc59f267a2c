"""Statistics for A/B comparisons: Student-t intervals on paired log-ratios, and the accept rule.

Samples are paired by repeat: A and B measured back to back, the order alternating per (repeat, cell),
with the server not being measured frozen. Drift of this shared machine hits both sides of a pair, so
the unit of evidence is a pair's log-ratio d_i = log(B_i / A_i). A cell's speedup is exp(mean d), the
geometric mean of its pair ratios; its interval is the Student-t interval on the d_i (df = n - 1). The
overall speedup is the geometric mean over cells: per repeat, D_i = the mean over cells of d_ci, and the
same t interval on the D_i (a repeat's cells ran in one stretch of time, so they are not independent).

Why this method (measured; `experiments/calibrate_stats.py` reproduces the figures, README "Calibration"):
the percentile bootstrap used before returns [min, max] of the per-repeat ratios at three repeats, not a
95 % interval: 8.3 % of campaign-sized no-op comparisons cut from recorded A/A data passed the accept
rule. A t interval on log-ratios has its nominal coverage when the log-ratios are roughly normal, which
is what pairing buys; it needs an even number of repeats (so each cell ran A-first as often as B-first:
an order effect cancels in the mean instead of biasing it) and at least MIN_REPEATS of them (with fewer,
t's quantile explodes: 12.7 at two pairs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scistats

from harness.config import StatsConfig

__all__ = ["SpeedupCI", "Verdict", "speedup_ci", "overall_ci", "decide", "confirm_chance", "cv", "check_repeats",
           "MIN_REPEATS", "regressed_cells", "Physical", "impossible_cells"]

MIN_REPEATS = 4


def check_repeats(repeats: int) -> None:
    """Refuse a repeat count the interval cannot be trusted at (ValueError, with the minimum)."""
    if repeats < MIN_REPEATS or repeats % 2:
        raise ValueError(f"benchmark.repeats is {repeats}: an A/B verdict needs an even number of interleaved "
                         f"pairs, at least {MIN_REPEATS} (each cell A-first as often as B-first; Student-t on "
                         f"the paired log-ratios); set repeats: {max(MIN_REPEATS, repeats + repeats % 2)}")


@dataclass(frozen=True)
class SpeedupCI:
    ratio: float
    low: float
    high: float
    n: int
    se_log: float | None = None      # standard error of the mean log-ratio (None: not a t interval)
    df: int = 0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def upper(self, level: float) -> float:
        """One-sided upper confidence bound at `level` (e.g. 0.95); `high` when the SE is unknown."""
        if self.se_log is None or self.df < 1:
            return self.high
        return float(math.exp(math.log(self.ratio) + scistats.t.ppf(level, self.df) * self.se_log))

    def lower_at(self, confidence: float) -> float:
        """The lower end of the two-sided interval at `confidence` (e.g. 0.80); `low` when the SE is unknown."""
        if self.se_log is None or self.df < 1:
            return self.low
        return float(math.exp(math.log(self.ratio) - scistats.t.ppf(0.5 + confidence / 2, self.df) * self.se_log))

    def __str__(self) -> str:
        return f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Verdict:
    accept: bool
    quarantine: bool
    reason: str


@dataclass(frozen=True)
class Physical:
    """One cell of a candidate against the host's physics (harness/physics.py): the seconds its fastest run took,
    and the least time its work allows at the fastest ceilings measured on the host."""

    measured_s: float
    floor_s: float

    @property
    def impossible(self) -> bool:
        return self.measured_s < self.floor_s


def impossible_cells(physics: Mapping[str, Physical]) -> list[str]:
    """Cells that ran faster than the hardware can: each needed more than 100 % of a ceiling."""
    return [f"{label} took {p.measured_s:.3g} s, under its floor of {p.floor_s:.3g} s ({p.floor_s / p.measured_s:.0%} "
            "of the host's best measured ceiling)" for label, p in physics.items() if p.impossible]


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean); 0 for fewer than two values."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2 or arr.mean() == 0:
        return 0.0
    return float(arr.std(ddof=1) / arr.mean())


def _t_interval(d: np.ndarray, confidence: float) -> SpeedupCI:
    """exp of the Student-t interval of mean(d), d the per-repeat log-ratios."""
    n = int(d.size)
    mean = float(d.mean())
    if n < 2:
        return SpeedupCI(math.exp(mean), -math.inf, math.inf, n)
    se = float(d.std(ddof=1) / math.sqrt(n))
    half = float(scistats.t.ppf(0.5 + confidence / 2, n - 1)) * se
    return SpeedupCI(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, se_log=se, df=n - 1)


def speedup_ci(a: Sequence[float], b: Sequence[float], config: StatsConfig, *, seed: int = 0) -> SpeedupCI:
    """B over A for one cell: Student-t on the paired log-ratios (`seed` is unused, kept for callers)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need equal, non-empty paired samples, got {len(a)} and {len(b)}")
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if (xa <= 0).any() or (xb <= 0).any():
        raise ValueError("speedups are ratios of positive measurements; got a value <= 0")
    return _t_interval(np.log(xb / xa), config.confidence)


def overall_ci(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], config: StatsConfig,
               *, seed: int = 0) -> SpeedupCI:
    """Geometric mean over cells; the t interval on each repeat's mean log-ratio over the cells."""
    labels = sorted(a)
    xa = np.asarray([a[k] for k in labels], dtype=float)     # cells x repeats
    xb = np.asarray([b[k] for k in labels], dtype=float)
    if xa.shape != xb.shape or xa.size == 0:
        raise ValueError(f"need equal, non-empty paired grids, got {xa.shape} and {xb.shape}")
    return _t_interval(np.log(xb / xa).mean(axis=0), config.confidence)


def regressed_cells(cells: Mapping[str, SpeedupCI], config: StatsConfig) -> list[str]:
    """Cells a one-sided test calls slower than the guard: the upper confidence bound at
    `guard_confidence` is below `cell_guard` (at 0.95 a cell 3 % slower with a 2 % SE is caught)."""
    return [f"{label} {ci} (one-sided {config.guard_confidence:.0%} upper bound "
            f"{ci.upper(config.guard_confidence):.3f})"
            for label, ci in cells.items() if ci.upper(config.guard_confidence) < config.cell_guard]


def confirm_chance(screen: SpeedupCI, pairs: int, config: StatsConfig) -> float | None:
    """The chance that a confirmation of `pairs` pairs clears `accept_lower_bound`, were the screen's ratio the
    truth: its standard error is the screen's scaled by sqrt(screen pairs / pairs), and it passes when its mean
    log-ratio exceeds log(bound) + t(df) * that error. None when the screen has no standard error."""
    if screen.se_log is None or screen.df < 1 or pairs < 2:
        return None
    se = screen.se_log * math.sqrt(screen.n / pairs)
    if se == 0:
        return 1.0 if screen.ratio >= config.accept_lower_bound else 0.0
    need = math.log(config.accept_lower_bound) + float(scistats.t.ppf(0.5 + config.confidence / 2, pairs - 1)) * se
    return float(scistats.norm.sf((need - math.log(screen.ratio)) / se))


def decide(overall: SpeedupCI, cells: Mapping[str, SpeedupCI], config: StatsConfig, *,
           stage: str = "confirm", images: SpeedupCI | None = None, confirm_pairs: int | None = None,
           physics: Mapping[str, Physical] | None = None) -> Verdict:
    """Quarantine when any of the candidate's cells ran faster than the host's roofline allows (`physics`, per
    cell, judged before any ratio: a result the hardware cannot produce is no evidence of a speedup), or when the
    overall speedup or any cell's is above the plausibility ceiling; reject when a cell regressed (one-sided
    test) or the overall lower bound is below the threshold; else accept.

    `stage="screen"` is the looser first look of a campaign's A/B (the lower end of the
    `screen_confidence` interval at least `screen_lower_bound`): it only decides which candidate earns a
    confirmation, which is judged at `confidence` against `accept_lower_bound` on twice the repeats. With
    `confirm_pairs` (the confirmation's), a candidate whose confirmation could hardly clear that bar
    (`confirm_chance` below `screen_confirm_chance`) does not earn one.

    `images`: the image cells' own headline, when the grid also has text cells (then `overall` is the text
    cells'). It is guarded like a cell: slower past the guard rejects, above the ceiling quarantines."""
    impossible = impossible_cells(physics or {})
    if impossible:
        return Verdict(False, True, f"impossible: {'; '.join(impossible)}: tokens were skipped or miscounted; "
                                    "quarantined for human review")
    if images is not None:
        cells = {**cells, "image cells (geometric mean)": images}
    implausible = [f"{label} {ci}" for label, ci in cells.items() if ci.ratio > config.plausibility_ceiling]
    if overall.ratio > config.plausibility_ceiling or implausible:
        where = f"cells {'; '.join(implausible)}" if implausible else f"speedup {overall}"
        return Verdict(False, True, f"{where} above the plausibility ceiling {config.plausibility_ceiling}x: "
                                    "quarantined for human review")
    regressed = regressed_cells(cells, config)
    if regressed:
        return Verdict(False, False, f"cells regressed past the guard {config.cell_guard}: " + "; ".join(regressed))
    if stage == "screen":
        low = overall.lower_at(config.screen_confidence)
        bar = f"{config.screen_confidence:.0%} lower bound {low:.3f}"
        if low < config.screen_lower_bound:
            return Verdict(False, False, f"speedup {overall}: screen {bar} below {config.screen_lower_bound}")
        chance = confirm_chance(overall, confirm_pairs, config) if confirm_pairs else None
        if chance is not None and chance < config.screen_confirm_chance:
            return Verdict(False, False, (
                f"speedup {overall}: screen {bar} clears {config.screen_lower_bound}, but a confirmation of "
                f"{confirm_pairs} pairs would clear {config.accept_lower_bound} with an estimated chance of "
                f"{chance:.0%} (< {config.screen_confirm_chance:.0%}): not worth its time"))
        return Verdict(True, False, f"speedup {overall}: screen {bar} clears {config.screen_lower_bound}; "
                                    "to be confirmed")
    if overall.low < config.accept_lower_bound:
        return Verdict(False, False, f"speedup {overall}: lower bound below {config.accept_lower_bound}")
    return Verdict(True, False, f"speedup {overall} clears {config.accept_lower_bound}")
