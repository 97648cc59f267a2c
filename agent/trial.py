"""`try_patch`: a quick, isolated try of a patch before the costly verdict, for an agent that needs to see
what its change does (does the server start? the traceback if not; parity on prompts it may see; a rough
speed figure) before it proposes anything.

A trial is a small A/B on the campaign's own backend (isolated by default): the incumbent and the
candidate (the incumbent with the patch applied) on fresh servers, parity of the candidate against the
incumbent on `parity.visible_prompts` (never the held prompts, which stay held), then two interleaved runs
per chosen cell. Its figure is a hint, and says so: nothing a trial measures is a verdict, and the loop
never reads it. Each trial is gated (the patch, both server starts), charged to `budget.trials` before it
starts, and recorded (`agent.try_patch`) with its patch's hash, its cells and what it found.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent import records
from agent.gatekeeper import Gatekeeper
from agent.measurements import HARNESS, Measurements
from agent.server_gate import gate_servers
from agent.spec import CampaignSpec
from audit import AuditWriter
from harness.config import Cell
from harness.errors import HarnessError, PortInUse
from harness.integrity import MeasurementDigest
from harness.measure import ABResult, Build
from harness.server import failure_excerpt
from sandbox.base import Backend
from sandbox.errors import PatchRejected, SandboxError
from sandbox.workspace import Workspace

__all__ = ["IterationTrials", "TrialReport", "Trials", "TRIAL_REPEATS", "MAX_TRIAL_CELLS"]

TRIAL_REPEATS = 2        # interleaved runs per build and cell: enough for a rough ratio, far from a verdict
MAX_TRIAL_CELLS = 2
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class TrialReport:
    """What the agent reads back. `text()` always holds `parity:` and `hint:`, and on failure `server log:`."""

    parity: str
    hint: str
    server_log: str = ""
    failure: str = ""
    seconds: float = 0.0
    cells: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failure

    def text(self) -> str:
        lines = [f"try_patch ({self.seconds:.0f} s, cells {', '.join(self.cells)})",
                 f"parity: {self.parity}", f"hint: {self.hint}"]
        if self.failure:
            lines.append(f"failure: {self.failure}")
        if self.server_log:
            lines.append(f"server log:\n{self.server_log}")
        return "\n".join(lines)

    def record(self, diff: str) -> dict[str, object]:
        return {"patch_sha256": hashlib.sha256(diff.encode()).hexdigest(), "cells": list(self.cells),
                "parity": self.parity, "hint": self.hint, "failure": self.failure[:4000],
                "server_log": self.server_log, "seconds": round(self.seconds, 1)}


@dataclass
class Trials:
    """Runs the trials of one campaign, against whatever its incumbent is when a trial starts."""

    spec: CampaignSpec
    workspace: Workspace
    backend: Backend
    gate: Gatekeeper
    writer: AuditWriter
    log_dir: Path
    measurement: MeasurementDigest | None = None
    measure: Measurements = HARNESS
    log_chars: int = 8_000                     # of the server log's traceback a failed trial hands back
    count: int = field(default=0)

    def cells(self, names: list[str] | None) -> list[Cell]:
        """The cells a trial measures: those named (labels of the spec's grid), else the grid's first."""
        grid = {cell.label: cell for cell in self.spec.benchmark.cells()}
        if not names:
            return [next(iter(grid.values()))]
        unknown = [n for n in names if n not in grid]
        if unknown:
            raise ValueError(f"unknown cell(s) {', '.join(unknown)}; the grid's cells are {', '.join(grid)}")
        if len(set(names)) > MAX_TRIAL_CELLS:
            raise ValueError(f"a trial measures at most {MAX_TRIAL_CELLS} cells; got {len(set(names))}")
        return [grid[n] for n in dict.fromkeys(names)]

    def run(self, iteration: int, incumbent_ref: str, diff: str, cells: list[Cell]) -> TrialReport:
        """`diff` has passed the gate and `git apply --check` (GatedTools.try_patch). Harness and sandbox
        failures come back as the report (the agent's to fix); only an unwritable log raises."""
        self.count += 1
        t0 = time.monotonic()
        folder = self.log_dir / "runs" / f"it{iteration:03d}"
        # a fresh folder per trial, also for an iteration resumed after a crash (its earlier trials stay)
        work = next(folder / f"try{k}" for k in range(1, 10_000) if not (folder / f"try{k}").exists())
        ws = self.workspace
        labels = tuple(c.label for c in cells)
        trees = (work / "tree-A", work / "tree-B")
        try:
            tree_a, tree_b = (ws.checkout_copy(incumbent_ref, t) for t in trees)
            Workspace.open(tree_b, ws.package).apply_patch(diff)
            a = Build(tag="A", tree=tree_a, engine_args=ws.serving_config(), ref=incumbent_ref,
                      cache_key=ws.tree_hash(incumbent_ref))
            candidate = Workspace.open(tree_b)
            b = Build(tag="B", tree=tree_b, engine_args=candidate.serving_config(), ref="trial",
                      cache_key=candidate.content_hash())
            for attempt in range(1, PORT_ATTEMPTS + 1):
                ports = gate_servers(self.gate, self.spec, ((a.tag, a.engine_args), (b.tag, b.engine_args)),
                                     iteration)
                try:
                    result = self._measure(a, b, cells, ports, work if attempt == 1 else work / f"ports{attempt}")
                    break
                except PortInUse:   # another campaign on this host took a port first: pick again
                    if attempt == PORT_ATTEMPTS:
                        raise
            report = self._report(result, labels, time.monotonic() - t0)
        except (HarnessError, SandboxError, PatchRejected, OSError) as exc:
            report = TrialReport(parity="not known: the trial did not get that far",
                                 hint="none: the trial failed before it measured anything",
                                 failure=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:500]}",
                                 server_log=self._crash_log(work), seconds=time.monotonic() - t0, cells=labels)
        finally:
            for tree in trees:
                ws.remove_copy(tree)
        self.writer.append(records.note_kind("try_patch"), iteration=iteration, payload=report.record(diff))
        return report

    def _measure(self, a: Build, b: Build, cells: list[Cell], ports: dict[str, int], work: Path) -> ABResult:
        spec = self.spec
        visible = spec.parity.visible_prompts
        parity = spec.parity.model_copy(update={"prompts": visible}) if visible else None
        bench = spec.benchmark.model_copy(update={"repeats": TRIAL_REPEATS, "num_warmups": 1})
        return self.measure.ab(self.backend, a, b, server=spec.server, bench=bench, stats_cfg=spec.stats, parity=parity,
                          work_dir=work, cache_dir=self.log_dir / "cache", stop_on_parity_failure=True, ports=ports,
                          cells=cells, measurement=self.measurement)

    def _report(self, result: ABResult, labels: tuple[str, ...], seconds: float) -> TrialReport:
        if result.parity is None:
            parity = "not checked: the spec has no parity.visible_prompts (the held prompts are never used here)"
        else:
            parity = (f"{result.parity.summary()} (visible prompts, candidate vs the incumbent; the verdict "
                      "checks held prompts you cannot see)")
        if result.overall is None:
            hint = "none: parity broke, so the trial did not measure speed"
        else:
            cells = "; ".join(f"{label} {ci}" for label, ci in result.headline().items())
            hint = (f"candidate vs incumbent {result.overall} ({cells}); {TRIAL_REPEATS} short runs per side: "
                    "a hint, not a verdict (only the campaign's A/B decides)")
        return TrialReport(parity=parity, hint=hint, seconds=seconds, cells=labels)

    def _crash_log(self, work: Path) -> str:
        """The candidate's server log (the incumbent's when only it ran), from its first traceback."""
        logs = sorted(work.rglob("server-B*.log"), key=lambda p: p.stat().st_mtime) or \
            sorted(work.rglob("server-A*.log"), key=lambda p: p.stat().st_mtime)
        return failure_excerpt(logs[-1], self.log_chars) if logs else ""

    def for_iteration(self, iteration: int, incumbent_ref: str) -> IterationTrials:
        return IterationTrials(self, iteration, incumbent_ref)


@dataclass(frozen=True)
class IterationTrials:
    """The trials of one iteration's proposer, against the incumbent it was shown (agent.tools.TrialRunner)."""

    trials: Trials
    iteration: int
    incumbent_ref: str

    def check_cells(self, cells: list[str] | None) -> None:
        self.trials.cells(cells)

    def run(self, diff: str, cells: list[str] | None) -> str:
        return self.trials.run(self.iteration, self.incumbent_ref, diff, self.trials.cells(cells)).text()
