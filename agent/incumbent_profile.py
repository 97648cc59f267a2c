"""Where the incumbent spends its time, for the proposer: taken at baseline and again after each accepted
patch (an accepted change moves the hot spots), at the grid's own shapes (harness/profiling.py). Optional:
a failed profile is recorded and leaves the proposer with the previous one.

Proposers get it twice: as text (`CampaignState.profile`: the median engine step per phase, then the top ops;
the LLM agent's prompt and its view_profile tool) and as numbers (`CampaignState.profile_steps`: phase -> row ->
median µs, e.g. `{"decode": {"wall": 9120.0, "GPU idle": 2830.0, ...}}`; the search cites them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.gatekeeper import Gatekeeper
from agent.measurements import HARNESS, Measurements
from agent.server_gate import gate_server
from agent.spec import CampaignSpec
from audit import AuditWriter
from harness.config import Cell
from harness.errors import HarnessError
from harness.profiling import Profile, render_profiles
from sandbox.base import Backend
from sandbox.workspace import Workspace

__all__ = ["IncumbentProfile", "profile_incumbent", "profiled_cell", "step_medians"]


@dataclass(frozen=True)
class IncumbentProfile:
    text: str
    steps: dict[str, dict[str, float]] = field(default_factory=dict)   # phase -> row -> median µs


def profiled_cell(spec: CampaignSpec) -> Cell:
    """The grid's largest end-to-end cell (its prefill phase is profiled at the same input length)."""
    return max((c for c in spec.benchmark.cells() if not c.is_prefill and not c.has_images),
        key=lambda c: (c.input_len, c.output_len))


def profile_incumbent(*, spec: CampaignSpec, writer: AuditWriter, gate: Gatekeeper, ws: Workspace, backend: Backend,
                      log_dir: Path, iteration: int, on_event: Callable[[str, dict[str, Any]], None],
                      reads_profile: bool, measure: Measurements = HARNESS) -> IncumbentProfile | None:
    """Profile the workspace's head; recorded as `baseline.profile` (iteration 0) or `incumbent.profile`.
    Taken when the spec says so, else when the proposer reads profiles (`reads_profile`)."""
    wanted = spec.profile_baseline if spec.profile_baseline is not None else reads_profile
    if not wanted:
        return None
    what = "baseline" if iteration == 0 else "incumbent"
    on_event("phase", {"phase": f"{what}: profile at the grid's shapes"})
    cell = profiled_cell(spec)
    port = gate_server(gate, spec, ws.serving_config(), iteration)
    work = log_dir / "runs" / ("profile" if iteration == 0 else f"it{iteration:03d}" / Path("profile"))
    try:
        profiles = measure.profile(backend, tree=ws.root, engine_args=ws.serving_config(),
                                server=spec.server.model_copy(update={"port": port}), bench=spec.benchmark,
                                cell=cell, work_dir=work, cache_dir=log_dir / "cache")
    except HarnessError as exc:   # a missing profile weakens the proposer's view; it does not stop the campaign
        writer.append(records.ERROR, iteration=iteration,
                      payload={"phase": f"{what} profile", "type": type(exc).__name__, "message": str(exc)[:2000]})
        return None
    text, steps = render_profiles(profiles), step_medians(profiles)
    writer.append(records.BASELINE_PROFILE if iteration == 0 else records.INCUMBENT_PROFILE, iteration=iteration,
                  payload={"cell": cell.label, "text": text, "steps": steps, "incumbent": ws.head()})
    return IncumbentProfile(text=text, steps=steps)


def step_medians(profiles: list[Profile]) -> dict[str, dict[str, float]]:
    """The median step per phase, as numbers: the end-to-end run's phases, and the prefill run's prefill steps
    (the grid's prompts alone) in place of the end-to-end run's."""
    out: dict[str, dict[str, float]] = {}
    for prof in sorted(profiles, key=lambda p: p.phase == "prefill"):
        for table in prof.steps.phases if prof.steps else ():
            out[table.phase] = {row.name: round(row.median_us, 1) for row in table.rows}
    return out
