"""Statistics for A/B comparisons: paired bootstrap CI of the speedup ratio, the accept rule.

Samples are paired by repeat (A and B measured back to back, order alternating), so drift of this
shared machine hits both sides of a pair. The speedup of a cell is mean(B)/mean(A) of a throughput.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scistats

from harness.config import StatsConfig

__all__ = ["SpeedupCI", "Verdict", "speedup_ci", "overall_ci", "decide", "cv"]


@dataclass(frozen=True)
class SpeedupCI:
    ratio: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Verdict:
    accept: bool
    quarantine: bool
    reason: str


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean); 0 for fewer than two values."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2 or arr.mean() == 0:
        return 0.0
    return float(arr.std(ddof=1) / arr.mean())


def _ratio_of_means(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(b, axis=axis) / np.mean(a, axis=axis)


def speedup_ci(a: Sequence[float], b: Sequence[float], config: StatsConfig, *, seed: int = 0) -> SpeedupCI:
    """Paired bootstrap (BCa, percentile if BCa degenerates) of mean(b)/mean(a)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need equal, non-empty paired samples, got {len(a)} and {len(b)}")
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratio = float(xb.mean() / xa.mean())
    if len(a) < 2:
        return SpeedupCI(ratio, -math.inf, math.inf, len(a))
    rng = np.random.default_rng(seed)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():  # BCa warns on zero-spread data; the fallback handles it
            warnings.simplefilter("ignore")
            res = scistats.bootstrap((xa, xb), _ratio_of_means, paired=True, vectorized=True,
                                     confidence_level=config.confidence, n_resamples=config.resamples,
                                     method=method, random_state=rng)
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return SpeedupCI(ratio, min(low, ratio), max(high, ratio), len(a))
    return SpeedupCI(ratio, ratio, ratio, len(a))  # all resamples identical: zero spread


def decide(overall: SpeedupCI, cells: Mapping[str, SpeedupCI], config: StatsConfig) -> Verdict:
    """Accept iff the overall lower bound clears the threshold and no cell's upper bound is below the
    guard (a cell is only called regressed when even its optimistic bound is worse than the guard)."""
    if overall.ratio > config.plausibility_ceiling:
        return Verdict(False, True, f"speedup {overall} above the plausibility ceiling "
                                    f"{config.plausibility_ceiling}x: quarantined for human review")
    regressed = [f"{label} {ci}" for label, ci in cells.items() if ci.high < config.cell_guard]
    if regressed:
        return Verdict(False, False, f"cells regressed past the guard {config.cell_guard}: " + "; ".join(regressed))
    if overall.low < config.accept_lower_bound:
        return Verdict(False, False, f"speedup {overall}: lower bound below {config.accept_lower_bound}")
    return Verdict(True, False, f"speedup {overall} clears {config.accept_lower_bound}")


def overall_ci(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], config: StatsConfig,
               *, seed: int = 0) -> SpeedupCI:
    """Geometric mean over cells of the per-cell ratio of means, bootstrapped over repeats jointly
    (repeat i of every cell is resampled together, since they ran in the same stretch of time)."""
    labels = sorted(a)
    xa = np.asarray([a[k] for k in labels], dtype=float)     # cells x repeats
    xb = np.asarray([b[k] for k in labels], dtype=float)
    n = xa.shape[1]

    def geo(idx: np.ndarray) -> float:
        idx = idx.astype(int)
        return float(np.exp(np.mean(np.log(xb[:, idx].mean(axis=1) / xa[:, idx].mean(axis=1)))))

    ratio = geo(np.arange(n))
    if n < 2:
        return SpeedupCI(ratio, -math.inf, math.inf, n)
    res = scistats.bootstrap((np.arange(n, dtype=float),), geo, vectorized=False, method="percentile",
                             confidence_level=config.confidence, n_resamples=min(config.resamples, 2000),
                             random_state=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        low = high = ratio
    return SpeedupCI(ratio, min(low, ratio), max(high, ratio), n)
