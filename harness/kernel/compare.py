"""Reading a runner result as an A/B comparison: correctness first, then the paired speedup per shape and
overall, then the accept rule of harness/stats.py, with one rule of its own: any shape faster than the
plausibility ceiling (10x by default) is quarantined for review, not only the geometric mean.

Speedup = time(A) / time(B) over the per-round medians (rounds are paired: the same stretch of time, order
alternating), so > 1 means B is faster; `speedup_ci` computes mean(b)/mean(a), hence the swapped arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness.config import StatsConfig
from harness.stats import SpeedupCI, decide, overall_ci, speedup_ci

__all__ = ["KernelAB", "compare", "failures_of"]

Outcome = Literal["accepted", "rejected", "parity-broken", "failed", "quarantined"]


@dataclass(frozen=True)
class KernelAB:
    outcome: Outcome
    reason: str
    shapes: dict[str, SpeedupCI] = field(default_factory=dict)
    overall: SpeedupCI | None = None

    @property
    def correct(self) -> bool:
        return self.outcome not in ("parity-broken", "failed")


def failures_of(entry: dict[str, Any]) -> list[str]:
    out = [f"before timing: {f}" for f in entry["pre"]["failures"]]
    if "timing_error" in entry:
        out.append(f"while timed: {entry['timing_error']}")
    out += [f"the timed calls' own output: {f}" for f in entry.get("timed_outputs", {}).get("failures", [])]
    out += [f"after timing: {f}" for f in entry.get("post", {}).get("failures", [])]
    return out


def compare(result: dict[str, Any], *, a: str, b: str, stats: StatsConfig,
            expected_sha256: dict[str, str]) -> KernelAB:
    for tag in (a, b):
        build = result["builds"].get(tag, {})
        if not build.get("loaded"):
            return KernelAB("failed", f"build {tag} did not load: {build.get('error', 'missing from the result')}")
        if build["sha256"] != expected_sha256[tag]:
            return KernelAB("failed", f"build {tag}: the runner loaded a file with sha256 {build['sha256'][:12]}, "
                                      f"not the checked-out {expected_sha256[tag][:12]}")
    times_a: dict[str, list[float]] = {}
    times_b: dict[str, list[float]] = {}
    for name, shape in result["shapes"].items():
        ea, eb = shape["builds"][a], shape["builds"][b]
        if not ea["ok"]:
            return KernelAB("failed", f"{a} (the incumbent) failed on {name}: {'; '.join(failures_of(ea))[:800]}")
        if not eb["ok"]:
            raised = any(f.startswith("raised ") for f in eb["pre"]["failures"])
            return KernelAB("failed" if raised else "parity-broken",
                            f"{b} on {name}: {'; '.join(failures_of(eb))[:800]}")
        times_a[name], times_b[name] = ea["round_medians_us"], eb["round_medians_us"]
    cells = {name: speedup_ci(times_b[name], times_a[name], stats) for name in times_a}
    overall = overall_ci(times_b, times_a, stats)
    implausible = [f"{name} {ci}" for name, ci in cells.items() if ci.ratio > stats.plausibility_ceiling]
    if implausible:
        return KernelAB("quarantined", f"shape speedups above the plausibility ceiling {stats.plausibility_ceiling}x: "
                                       + "; ".join(implausible) + " (quarantined for human review)", cells, overall)
    verdict = decide(overall, cells, stats)
    if verdict.quarantine:
        return KernelAB("quarantined", verdict.reason, cells, overall)
    return KernelAB("accepted" if verdict.accept else "rejected", verdict.reason, cells, overall)
