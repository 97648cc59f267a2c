"""The one seam through which a campaign measures anything: the baseline grid, every A/B (screens,
confirmations, trials, the final comparison, replay), the incumbent's profile, vLLM's view of its engine
args, a kernel campaign's evaluations, the host's ceilings (the served roofline's), and the digest of the
measurement path they are all taken with. The
real implementation is the harness (`HARNESS`); the unit suite passes a fake (tests/fake_measurements.py),
so a whole campaign, a resume and a replay run in seconds without vLLM.

Only the campaign's drivers (agent/campaign.py, serving_campaign.py, executor.py, trial.py,
incumbent_profile.py, replay.py, kernel_campaign.py) take measurements, and they take them through here: nothing
else in agent/ calls the harness's measuring functions (tests/test_style.py checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from harness.ceilings import Ceilings, served_ceilings
from harness.config import ServerConfig
from harness.engine_defaults import effective_engine_args
from harness.integrity import MeasurementDigest, digest_roots, measurement_roots
from harness.kernel.evaluate import run_evaluation
from harness.kernel.protocol import EvalRequest
from harness.measure import ABResult, Build, GridResult, ab_compare, compare_arms, measure_grid
from harness.profiling import Profile, profile_cell
from sandbox.base import Backend

__all__ = ["HARNESS", "HarnessMeasurements", "Measurements"]


class Measurements(Protocol):
    def digest(self) -> MeasurementDigest:
        """harness.integrity: the measurement path (harness, pristine client, interpreter) as it is now."""
        ...

    def grid(self, backend: Backend, build: Build, **kw: Any) -> GridResult:
        """harness.measure.measure_grid: one build's grid, and its parity generations when asked for."""
        ...

    def ab(self, backend: Backend, a: Build, b: Build, **kw: Any) -> ABResult:
        """harness.measure.ab_compare: parity first, then both builds interleaved."""
        ...

    def arms(self, backend: Backend, a: Build, bs: list[Build], **kw: Any) -> list[ABResult]:
        """harness.measure.compare_arms: several candidates against one incumbent, one start-up, runs interleaved."""
        ...

    def profile(self, backend: Backend, **kw: Any) -> list[Profile]:
        """harness.profiling.profile_cell: top ops of one build at one cell."""
        ...

    def engine_defaults(self, model: Path, serving: Mapping[str, object], *, env: Mapping[str, str]
                        ) -> dict[str, object]:
        """harness.engine_defaults.effective_engine_args: the engine args vLLM resolves for a serving config."""
        ...

    def kernel(self, request: EvalRequest, work_dir: Path, *, timeout_s: float, interpret: bool) -> dict[str, Any]:
        """harness.kernel.evaluate.run_evaluation: a kernel campaign's checks and timings, in one runner process."""
        ...

    def ceilings(self, server: ServerConfig, *, hardware: str) -> Ceilings:
        """harness.ceilings.served_ceilings: this host's matmul rate and bandwidth at the served dtype (raises
        CeilingsUnavailable when they cannot be measured)."""
        ...


class HarnessMeasurements:
    """The harness itself. Stateless, so the copy a Ray task carries to its worker (agent/executor.py) is the
    harness of that worker's host."""

    def digest(self) -> MeasurementDigest:
        return digest_roots(measurement_roots())

    def grid(self, backend: Backend, build: Build, **kw: Any) -> GridResult:
        return measure_grid(backend, build, **kw)

    def ab(self, backend: Backend, a: Build, b: Build, **kw: Any) -> ABResult:
        return ab_compare(backend, a, b, **kw)

    def arms(self, backend: Backend, a: Build, bs: list[Build], **kw: Any) -> list[ABResult]:
        return compare_arms(backend, a, bs, **kw)

    def profile(self, backend: Backend, **kw: Any) -> list[Profile]:
        return profile_cell(backend, **kw)

    def engine_defaults(self, model: Path, serving: Mapping[str, object], *, env: Mapping[str, str]
                        ) -> dict[str, object]:
        return effective_engine_args(model, dict(serving), env=dict(env))

    def kernel(self, request: EvalRequest, work_dir: Path, *, timeout_s: float, interpret: bool) -> dict[str, Any]:
        return run_evaluation(request, work_dir, timeout_s=timeout_s, interpret=interpret)

    def ceilings(self, server: ServerConfig, *, hardware: str) -> Ceilings:
        return served_ceilings(server, hardware=hardware)


HARNESS = HarnessMeasurements()
