"""The kernel target of the campaign engine (agent/engine.py): the ratchet around one kernel file.

The engine's conventions: every action passes the gate and is logged before it runs; the workspace is a git repo of
the target with a campaign branch; a candidate is a patch, checked out beside the incumbent; it is kept only
if it passes every correctness check (before and after timing) and the lower bound of its paired speedup's interval
clears the threshold with no shape regressing past the guard, and then does so again in a fresh, independent
evaluation (the confirmation); over 10x is quarantined. What differs:
the measurement is one runner process per evaluation (harness/kernel/runner.py) instead of servers and a
benchmark client, and the baseline and final evaluations also measure the GPU's ceilings.

A new campaign (`start_kernel_campaign`) and a resumed one (agent/kernel_resume.py) run the engine's `run_to_end`:
the baseline and prelude unless the log holds them (`begin`), the loop, and the conclusion (final comparison,
serving stage) and campaign.end, a step already on record not run again.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.base import SHOWN_BUDGETS, CampaignState, HistoryEntry, Outcome, Proposal, Proposer
from agent.engine import Engine, Event, IterationOutcome, Pending
from agent.errors import CampaignError
from agent.evidence import bind_kernel_run, fresh
from agent.iteration import classify, record_outcome
from agent.iteration import commit as commit_change
from agent.kernel_serving import load_serving_stage, serve_best, serving_backend
from agent.kernel_spec import KernelSpec
from agent.measurements import HARNESS, Measurements
from agent.opening import file_sha256, open_campaign
from agent.proposers.kernel_search import KernelSearchProposer, read_tunables
from agent.spec import CampaignSpec
from agent.tools import GatedTools, to_unified_diff
from harness.errors import HarnessError
from harness.kernel.compare import KernelAB, compare, failures_of
from harness.kernel.config import ShapeConfig
from harness.kernel.evaluate import RESULT, runner_argv, runner_env
from harness.kernel.protocol import EvalRequest
from harness.stats import regressed_cells
from sandbox.errors import PatchRejected, SandboxError
from sandbox.workspace import Workspace

__all__ = ["KernelCampaign", "KernelEnd", "Recorded", "kernel_limits", "kernel_request", "start_kernel_campaign"]


@dataclass(frozen=True)
class KernelEnd:
    campaign_id: str
    log_dir: Path
    workspace: Path
    branch: str
    stop_reason: str
    baseline: dict[str, Any]            # the baseline.result payload
    final: dict[str, Any] | None        # the final.result payload (baseline vs best), when one ran
    history: list[HistoryEntry]
    serving: dict[str, Any] | None = None   # the serving.result payload (best served end to end), when one ran


@dataclass(frozen=True)
class Recorded:
    """What the log already holds of a campaign's steps outside its loop: nothing for a new campaign; for a resumed
    one (agent/kernel_resume.py), what ran before the kill. A step on record is not run again."""

    baseline: dict[str, Any] | None = None    # the baseline.result payload
    prelude: dict[str, Any] | None = None     # the prelude.result payload
    final: dict[str, Any] | None = None       # the final.result payload
    final_failed: bool = False                # the final comparison ran and failed (its error is recorded)
    served: dict[str, Any] | None = None      # the serving.result payload


def kernel_limits(spec: KernelSpec) -> dict[str, float]:
    """The spec's budget, as the gate meters it."""
    return {"wall_seconds": spec.budget.wall_seconds, "llm_tokens": spec.budget.llm_tokens,
            "llm_usd": spec.budget.llm_usd, "trials": spec.budget.trials}


def _rows(baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """The baseline's per-shape times, as the proposer sees them."""
    return [{"shape": n, "median_us": e["median_us"]} for n, e in baseline["shapes"].items()]


def _checks(entry: dict[str, Any]) -> dict[str, Any]:
    """The part of a build's shape entry worth a log line (the full result file is hashed into the log)."""
    keep = ("ok", "median_us", "timed_calls", "attainment", "timing_error")
    out = {k: entry[k] for k in keep if k in entry}
    out["pre"] = entry["pre"]
    if "post" in entry:
        out["post"] = entry["post"]
    return out


def kernel_request(spec: KernelSpec, builds: dict[str, Path], *, roofline: bool,
                   shapes: list[ShapeConfig] | None = None) -> EvalRequest:
    """One runner evaluation of `builds` (tag: tree) as the spec asks for it: the campaign's and its replay's."""
    return EvalRequest(builds=builds, module=spec.target.kernel_file, entry=spec.target.entry,
                       interface=spec.target.interface, shapes=shapes or spec.shapes, correctness=spec.correctness,
                       timing=spec.timing, roofline=spec.roofline if roofline else None, device=spec.device,
                       dtype=spec.dtype, seed=secrets.randbits(31))


@dataclass(kw_only=True)
class KernelCampaign(Engine[KernelEnd]):
    """The kernel target: candidates are patches of one kernel file; one runner process checks and times the
    incumbent (A) beside the candidate (B). The engine (agent/engine.py) runs the rounds, one candidate each."""

    spec: KernelSpec
    baseline_tunables: dict[str, int]
    baseline_rows: list[dict[str, Any]] = field(default_factory=list)
    last_iteration_s: float = 0.0    # the last iteration's wall time: the loop keeps room for one more
    evaluation_s: float = 0.0        # the last round's wall time per runner evaluation (a confirmation is one more)
    _round_evaluations: int = 0
    # What the log already holds of the steps outside the loop (a resumed campaign), and the serving stage's spec
    recorded: Recorded = field(default_factory=lambda: Recorded())
    serving: CampaignSpec | None = None
    _checks: int = 0
    # The conclusion, kept for the KernelEnd built after campaign.end
    baseline_payload: dict[str, Any] = field(default_factory=dict)
    final_payload: dict[str, Any] | None = None
    served_payload: dict[str, Any] | None = None

    @property
    def kernel_file(self) -> str:
        return self.spec.target.kernel_file

    # -- measuring -------------------------------------------------------------------------------
    def evaluate_builds(self, builds: dict[str, Path], *, iteration: int, name: str, roofline: bool,
                 shapes: list[ShapeConfig] | None = None) -> dict[str, Any]:
        """Gate and log the runner command, run it, log the result's digest and its per-build checks.
        `shapes`: a subset of the spec's (a check_kernel's), default all of them."""
        work = self.log_dir / "runs" / name
        self.gate.require({"kind": "run_command", "argv": runner_argv(work),
                           "env": runner_env(interpret=self.spec.interpret)}, iteration=iteration)
        s = self.spec
        request = kernel_request(s, builds, roofline=roofline, shapes=shapes)
        self.on_event("phase", {"phase": f"{name}: check, time, check ({', '.join(builds)})"})
        result = self.measure.kernel(request, work, timeout_s=s.runner_timeout_s, interpret=s.interpret)
        self._round_evaluations += 1
        bind_kernel_run(self.writer, work, step=name, iteration=iteration)
        self.writer.append(records.KERNEL_EVALUATION, iteration=iteration, payload={
            "name": name, "seed": request.seed, "result_file": str((work / RESULT).relative_to(self.log_dir)),
            "result_sha256": file_sha256(work / RESULT), "device": result["device"], "roofline": result["roofline"],
            "order": list(builds),   # the workers' start order and the first round's (canonical JSON sorts keys)
            "builds": result["builds"],
            "shapes": {n: {tag: _checks(e) for tag, e in sh["builds"].items()} for n, sh in result["shapes"].items()}})
        return result

    def baseline(self) -> dict[str, Any]:
        ws = self.workspace
        name = fresh(self.log_dir / "runs" / "baseline").name   # run again after a resume: a new folder
        result = self.evaluate_builds({"baseline": ws.root}, iteration=0, name=name, roofline=True)
        build = result["builds"]["baseline"]
        bad = {n: sh["builds"]["baseline"] for n, sh in result["shapes"].items() if not sh["builds"]["baseline"]["ok"]}
        if not build.get("loaded") or bad:
            detail = build.get("error") or "; ".join(f"{n}: {'; '.join(failures_of(e))}" for n, e in bad.items())
            self.writer.append(records.ERROR, iteration=0, payload={"phase": "baseline", "message": str(detail)[:4000]})
            raise CampaignError(f"the baseline kernel fails its own checks ({str(detail)[:600]}); fix the kernel or "
                                f"the shapes before running a campaign (log: {self.log_dir})")
        shapes = {n: {**_checks(sh["builds"]["baseline"]), "shape": sh["shape"]} for n, sh in result["shapes"].items()}
        payload = {"tunables": self.baseline_tunables, "ref": ws.head(), "device": result["device"],
                   "roofline": result["roofline"], "shapes": shapes}
        self.writer.append(records.BASELINE_RESULT, iteration=0, payload=payload)
        self.writer.checkpoint()
        return payload

    def candidate_trees(self, name: str, diff: str, on_applied: Callable[[str], object] = lambda canonical: None
                        ) -> tuple[Path, Path, str]:
        """The incumbent (A) and the incumbent with `diff` applied (B), checked out side by side under runs/`name`;
        `on_applied(canonical diff)` runs once the patch applied (a log record written before the action).
        Returns (tree A, tree B, canonical diff); the caller removes the trees."""
        ws, work = self.workspace, self.log_dir / "runs" / name
        tree_a = ws.checkout_copy(self.incumbent_ref, work / "tree-A")
        tree_b = ws.checkout_copy(self.incumbent_ref, work / "tree-B")
        try:
            canonical = Workspace.open(tree_b, ws.package).apply_patch(diff)
            on_applied(canonical)
        except BaseException:
            ws.remove_copy(tree_a)
            ws.remove_copy(tree_b)
            raise
        return tree_a, tree_b, canonical

    def measured_ab(self, i: int, name: str, tree_a: Path, tree_b: Path, *, shapes: list[ShapeConfig] | None = None,
                    b_first: bool = False) -> tuple[dict[str, Any], KernelAB]:
        """A and B checked and timed in one runner, and the result read as an A/B. `b_first`: B's worker is the
        first started and timed first in the first round (the positions the runner gives A otherwise)."""
        builds = {"B": tree_b, "A": tree_a} if b_first else {"A": tree_a, "B": tree_b}
        result = self.evaluate_builds(builds, iteration=i, name=name, roofline=False, shapes=shapes)
        ab = compare(result, a="A", b="B", stats=self.spec.stats,
                     expected_sha256={"A": file_sha256(tree_a / self.kernel_file),
                                      "B": file_sha256(tree_b / self.kernel_file)})
        return result, ab

    def patched_ab(self, i: int, name: str, diff: str, *, shapes: list[ShapeConfig] | None = None
                   ) -> tuple[str, dict[str, Any], KernelAB]:
        """`candidate_trees` and `measured_ab` at once (the prelude, check_kernel); the trees are gone afterwards.
        Returns (canonical diff, result, A/B)."""
        tree_a, tree_b, canonical = self.candidate_trees(name, diff)
        try:
            result, ab = self.measured_ab(i, name, tree_a, tree_b, shapes=shapes)
        finally:
            self.workspace.remove_copy(tree_a)
            self.workspace.remove_copy(tree_b)
        return canonical, result, ab

    def prelude(self, patch: str) -> dict[str, Any]:
        """The spec's prelude (e.g. vLLM's launch parameters named as tunables at values that keep its behaviour)
        against the incumbent (the stock file), gated and measured like a candidate. It is kept when it is
        correct on every shape and no shape regresses past the guard: it need not be faster. A prelude that
        fails is a campaign error: the search would then have no tunables to move."""
        ws = self.workspace
        diff = to_unified_diff(ws.root, patch, "diff")
        self.gate.require({"kind": "patch", "diff": diff}, iteration=0)
        canonical, _, ab = self.patched_ab(0, fresh(self.log_dir / "runs" / "prelude").name, diff)
        regressed = regressed_cells(ab.shapes, self.spec.stats)
        kept = ab.correct and ab.outcome != "quarantined" and not regressed
        reason = ab.reason if not kept and not regressed else (
            f"shapes regressed past the guard: {'; '.join(regressed)}" if regressed else "correct on every shape, "
            "no shape regressed")
        payload: dict[str, Any] = {"kept": kept, "reason": reason, "diff": canonical, "base": self.incumbent_ref,
                                   "overall": vars(ab.overall) if ab.overall else None,
                                   "shapes": {n: vars(ci) for n, ci in ab.shapes.items()}}
        if kept:
            ws.apply_patch(diff)
            self.incumbent_ref = ws.commit(
                f"ratchet: prelude\n\n{Path(self.spec.target.prelude or 'prelude').name}: {reason}\n\n"
                f"Ratchet-Campaign: {self.campaign_id}\nRatchet-Prelude: {ab.overall}\n"
                f"Ratchet-Audit-Seq: {self.writer.next_seq}")
            payload["commit"] = self.incumbent_ref
            payload["commit_object"] = ws.commit_object(self.incumbent_ref)   # a resume elsewhere writes it again
            self.baseline_tunables = read_tunables((ws.root / self.kernel_file).read_text())
            payload["tunables"] = self.baseline_tunables
        self.writer.append(records.PRELUDE_RESULT, iteration=0, payload=payload)
        self.writer.checkpoint()
        if not kept:
            raise CampaignError(f"the prelude patch {self.spec.target.prelude} was not kept: {reason[:600]} "
                                f"(log: {self.log_dir})")
        return payload

    # -- the engine's hooks -----------------------------------------------------------------------
    @property
    def max_iterations(self) -> int:
        return self.spec.budget.max_iterations

    def round_seconds(self, candidates: int) -> float:
        """A candidate's evaluation and, should it be accepted, its confirmation."""
        return max(self.last_iteration_s, 2 * self.evaluation_s)

    def reserve_seconds(self) -> float:
        """Room for the final comparison, which takes about one evaluation."""
        return (self.evaluation_s or self.last_iteration_s) if self.spec.final_comparison else 0.0

    def after_round(self, seconds: float, outcomes: Sequence[IterationOutcome]) -> None:
        self.last_iteration_s = seconds
        if self._round_evaluations:
            self.evaluation_s = seconds / self._round_evaluations
        self._round_evaluations = 0

    def state(self, i: int, pending: Sequence[HistoryEntry]) -> CampaignState:
        incumbent = read_tunables((self.workspace.root / self.kernel_file).read_text())
        return CampaignState(iteration=i, incumbent_ref=self.incumbent_ref, serving_config=dict(incumbent),
                             incumbent_metrics=tuple(self.baseline_rows), baseline_metrics=tuple(self.baseline_rows),
                             history=tuple(self.history) + tuple(pending),
                             baseline_serving_config=dict(self.baseline_tunables),
                             budget_left={r: self.gate.left(r) for r in SHOWN_BUDGETS},
                             allowed_paths=(self.kernel_file,), target="kernel",
                             environment={"kernel file": self.kernel_file, "entry": self.spec.target.entry,
                                          "interface": self.spec.target.interface,
                                          "device": self.spec.device, "dtype": self.spec.dtype,
                                          "shapes": "; ".join(f"{s.name}: {s.model_dump(exclude_none=True)}"
                                                              for s in self.spec.shapes)})

    def tools(self, i: int) -> GatedTools:
        return GatedTools(gate=self.gate, root=self.workspace.root, iteration=i, kernel_check=KernelChecks(self, i))

    def prepare(self, i: int, proposal: Proposal, earlier: Sequence[Pending]) -> tuple[Any, str]:
        diff = to_unified_diff(self.workspace.root, proposal.patch, proposal.patch_format)
        self.gate.require({"kind": "patch", "diff": diff}, iteration=i)

        def record(canonical: str) -> None:
            self.writer.append(records.ITERATION_PATCH, iteration=i,
                               payload={"diff": canonical, "base": self.incumbent_ref})

        tree_a, tree_b, _ = self.candidate_trees(f"it{i:03d}", diff, on_applied=record)
        return (tree_a, tree_b), diff

    def evaluate(self, items: Sequence[Pending]) -> dict[int, Any]:
        """Each candidate in its own runner, one after another; an error is the evaluation's value."""
        done: dict[int, Any] = {}
        for item in items:
            tree_a, tree_b = item.job
            try:
                done[item.iteration] = self.measured_ab(item.iteration, f"it{item.iteration:03d}", tree_a, tree_b)
            except Exception as exc:
                done[item.iteration] = exc
        return done

    def settle(self, items: Sequence[Pending], evaluations: dict[int, Any]) -> list[IterationOutcome]:
        outcomes = []
        for item in items:
            i, proposal, got = item.iteration, item.proposal, evaluations.get(item.iteration)
            if item.early is not None or got is None:
                outcomes.append(self.finish(i, *(item.early or ("failed", "not evaluated")), proposal))
            elif isinstance(got, BaseException):
                outcomes.append(self.finish(i, *classify(self.writer, i, got), proposal))
            else:
                assert proposal is not None
                result, ab = got
                outcome, reason, screen = ab.outcome, ab.reason, None
                if ab.outcome == "accepted":
                    screen = ab
                    confirmed = self._confirm(i, item.job)
                    if isinstance(confirmed, BaseException):
                        outcomes.append(self._finish(
                            i, "rejected", f"not confirmed: the confirmation failed ({type(confirmed).__name__}: "
                            f"{str(confirmed)[:600]}) (screen: {screen.overall})", proposal, screen=screen))
                        continue
                    result, ab = confirmed
                    outcome = ab.outcome
                    reason = (f"{'confirmed' if outcome == 'accepted' else 'not confirmed'}: {ab.reason} "
                              f"(screen: {screen.overall})")
                commit = None
                if outcome == "accepted":
                    self.workspace.apply_patch(item.diff)
                    commit = self._commit(i, proposal, ab)
                    self.incumbent_ref = commit
                outcomes.append(self._finish(i, outcome, reason, proposal, ab=ab, result=result, commit=commit,
                                             screen=screen))
        return outcomes

    def _confirm(self, i: int, trees: tuple[Path, Path]) -> tuple[dict[str, Any], KernelAB] | Exception:
        """A candidate the screen accepted, checked and timed again in a fresh runner (new worker processes, new
        input seeds, the two builds in each other's positions): it is kept only if this evaluation accepts it too,
        and its figures are the ones on record. One evaluation's two worker processes can differ by a few percent
        for the whole evaluation, which no number of rounds averages out, and the second position measured faster
        more often than not: on a CPU host, 40 A/A evaluations of the shipped CPU kernel spec put the copy in B's
        position ahead in 29 (sign test p = 0.006), and accepted 1 as 1.049x [1.034, 1.064]
        (experiments/results/kernel-aa-cpu.md). With the positions swapped, a commit needs the gain both ways."""
        self.on_event("phase", {"phase": f"it{i:03d}: confirm: a fresh, independent evaluation of the candidate"})
        try:
            return self.measured_ab(i, f"it{i:03d}-confirm", *trees, b_first=True)
        except Exception as exc:
            return exc

    def cleanup(self, items: Sequence[Pending]) -> None:
        for item in items:
            if item.job is not None:
                for tree in item.job:
                    self.workspace.remove_copy(tree)

    def finish(self, i: int, outcome: Outcome, reason: str, proposal: Proposal | None) -> IterationOutcome:
        return self._finish(i, outcome, reason, proposal)

    def begin(self) -> None:
        """The GPU's use gated, then the baseline and the prelude unless on record; their time comes off the wall
        budget."""
        spec, t0 = self.spec, time.monotonic()
        if spec.device == "cuda":
            self.gate.require({"kind": "use_gpu", "devices": 1, "minutes": self.gate.left("wall_seconds") / 60},
                              iteration=0)
        self.baseline_payload = self.recorded.baseline or self.baseline()
        self.baseline_rows = _rows(self.baseline_payload)
        if spec.target.prelude is not None and self.recorded.prelude is None:
            self.prelude(spec.target.prelude.read_text())
        self._round_evaluations = 0   # the loop's rounds count their own evaluations
        self.gate.spend("wall_seconds", time.monotonic() - t0, iteration=0)

    def conclude(self, base_commit: str, accepted: list[int]) -> dict[str, Any]:
        """Baseline vs best (when something was accepted), then the serving stage (when that comparison accepted
        the best); a step on record is not run again."""
        recorded = self.recorded
        final = recorded.final
        if final is None and not recorded.final_failed and accepted and self.spec.final_comparison:
            final = self.final(base_commit)
        served = recorded.served
        if served is None and self.serving is not None and final is not None and final["outcome"] == "accepted":
            served = serve_best(self, base_commit, self.serving, serving_backend(self.serving))
        self.final_payload, self.served_payload = final, served
        return {"final_outcome": final and final["outcome"], "serving_verdict": served and served["verdict"]}

    def ended(self, stop: str, branch: str) -> KernelEnd:
        return KernelEnd(campaign_id=self.campaign_id, log_dir=self.log_dir, workspace=self.workspace.root,
                         branch=branch, stop_reason=stop, baseline=self.baseline_payload, final=self.final_payload,
                         history=self.history, serving=self.served_payload)

    # -- check_kernel: the agent's inner loop ------------------------------------------------------------
    def shapes_named(self, names: list[str] | None) -> list[ShapeConfig]:
        by_name = {s.name: s for s in self.spec.shapes}
        unknown = [n for n in names or () if n not in by_name]
        if unknown:
            raise ValueError(f"unknown shape(s) {', '.join(unknown)}; the spec's shapes are {', '.join(by_name)}")
        return [by_name[n] for n in dict.fromkeys(names or ())] or list(self.spec.shapes)

    def check(self, i: int, diff: str, names: list[str] | None) -> str:
        """check_kernel: the patched kernel beside the incumbent through the same runner, checks and timing, on
        the named shapes. A hint for the agent: nothing here is a verdict, and the loop never reads it."""
        self._checks += 1
        t0 = time.monotonic()
        shapes = self.shapes_named(names)
        try:
            _, result, ab = self.patched_ab(i, f"it{i:03d}/check{self._checks}", diff, shapes=shapes)
            text = _check_text(result, ab)
        except (HarnessError, SandboxError, PatchRejected) as exc:
            text = f"correctness: not known\nhint: none\nerror: {type(exc).__name__}: {str(exc)[:4000]}"
        text = f"check_kernel ({time.monotonic() - t0:.0f} s, shapes {', '.join(s.name for s in shapes)})\n{text}"
        self.writer.append(records.note_kind("check_kernel"), iteration=i, payload={
            "patch_sha256": hashlib.sha256(diff.encode()).hexdigest(), "shapes": [s.name for s in shapes],
            "text": text[:8000], "seconds": round(time.monotonic() - t0, 1)})
        return text

    def _commit(self, i: int, proposal: Proposal, ab: KernelAB) -> str:
        title = (proposal.source.removeprefix("kernel-search:") if proposal.source.startswith("kernel-search:")
                 else proposal.hypothesis.splitlines()[0])[:120]
        return commit_change(self.workspace, self.writer, campaign_id=self.campaign_id, iteration=i,
                             proposal=proposal, title=title, speedup=ab.overall,
                             per=[f"Ratchet-Shape: {name} {ci}" for name, ci in ab.shapes.items()])

    def _finish(self, i: int, outcome: Outcome, reason: str, proposal: Proposal | None, *, ab: KernelAB | None = None,
                result: dict[str, Any] | None = None, commit: str | None = None,
                screen: KernelAB | None = None) -> IterationOutcome:
        """`ab`/`result`: the evaluation whose figures go on record (a confirmation's, where one ran); `screen`: the
        first evaluation of a candidate a confirmation then judged."""
        figures: dict[str, Any] = {}
        if screen is not None and screen.overall is not None:
            figures["screen"] = {"speedup": screen.overall.ratio, "ci_low": screen.overall.low,
                                 "ci_high": screen.overall.high, "speedup_text": str(screen.overall)}
        if ab is not None and ab.overall is not None and result is not None:
            medians = {n: {tag: sh["builds"][tag]["median_us"] for tag in ("A", "B")}
                       for n, sh in result["shapes"].items()}
            figures.update(speedup=ab.overall.ratio, ci_low=ab.overall.low, ci_high=ab.overall.high,
                           speedup_text=str(ab.overall),
                           shapes={n: {"speedup": vars(ci), "median_us_A": medians[n]["A"],
                                       "median_us_B": medians[n]["B"]} for n, ci in ab.shapes.items()})
        record_outcome(self.writer, self.history, self.on_event, i, outcome, reason, proposal, commit=commit,
                       parity_ok=ab.correct if ab else False,
                       tree=self.workspace.tree_hash(commit) if commit else None,
                       commit_object=self.workspace.commit_object(commit) if commit else None, figures=figures)
        return IterationOutcome(iteration=i, outcome=outcome, reason=reason, result=result, commit=commit)

    def final(self, base_commit: str) -> dict[str, Any] | None:
        """Baseline vs best, interleaved, with the ceilings measured again in the same run: the before/after."""
        ws, work = self.workspace, fresh(self.log_dir / "runs" / "final")   # run again after a resume: a new folder
        tree_a = ws.checkout_copy(base_commit, work / "tree-baseline")
        tree_b = ws.checkout_copy(self.incumbent_ref, work / "tree-best")
        tunables_before = read_tunables((tree_a / self.kernel_file).read_text())
        try:
            result = self.evaluate_builds({"baseline": tree_a, "best": tree_b}, iteration=self.next_iteration,
                                   name=work.name, roofline=True)
            ab = compare(result, a="baseline", b="best", stats=self.spec.stats,
                         expected_sha256={"baseline": file_sha256(tree_a / self.kernel_file),
                                          "best": file_sha256(tree_b / self.kernel_file)})
        except (HarnessError, SandboxError) as exc:   # recorded; accepted commits stand on their own A/Bs
            self.writer.append(records.ERROR,
                               payload={"phase": "final", "type": type(exc).__name__, "message": str(exc)})
            return None
        finally:
            ws.remove_copy(tree_a)
            ws.remove_copy(tree_b)
        shapes = {}
        for name, sh in result["shapes"].items():
            got = {tag: _checks(e) for tag, e in sh["builds"].items()}   # a build that did not load has no entry
            shapes[name] = {"shape": sh["shape"], "before": got.get("baseline"), "after": got.get("best"),
                            "speedup": vars(ab.shapes[name]) if name in ab.shapes else None}
        payload = {"outcome": ab.outcome, "reason": ab.reason, "overall": vars(ab.overall) if ab.overall else None,
                   "baseline_ref": base_commit, "best_ref": self.incumbent_ref, "device": result["device"],
                   "roofline": result["roofline"],
                   "tunables_before": tunables_before,
                   "tunables_after": read_tunables((ws.root / self.kernel_file).read_text()), "shapes": shapes}
        self.writer.append(records.FINAL_RESULT, iteration=self.next_iteration, payload=payload)
        return payload


@dataclass(frozen=True)
class KernelChecks:
    """check_kernel for one iteration's proposer (agent.tools.TrialRunner; its names are shape names)."""

    campaign: KernelCampaign
    iteration: int

    def check_cells(self, cells: list[str] | None) -> None:
        self.campaign.shapes_named(cells)

    def run(self, diff: str, cells: list[str] | None) -> str:
        return self.campaign.check(self.iteration, diff, cells)


def _check_text(result: dict[str, Any], ab: KernelAB) -> str:
    """What check_kernel hands back: `correctness:` per shape, `hint:` (timing), and any load error."""
    build = result["builds"].get("B", {})
    if not build.get("loaded"):
        return ("correctness: not run: the patched kernel did not load\nhint: none\n"
                f"error:\n{build.get('error', 'missing from the result')}")
    lines = []
    for name, shape in result["shapes"].items():
        entry = shape["builds"]["B"]
        lines.append(f"  {name}: ok" if entry["ok"] else f"  {name}: FAILED: {'; '.join(failures_of(entry))[:1500]}")
    bad = sum(1 for line in lines if "FAILED" in line)
    head = "correctness: ok on every shape (before and after timing)" if not bad else \
        f"correctness: {bad} of {len(lines)} shape(s) failed"
    if ab.overall is None:
        hint = f"hint: none ({ab.reason[:600]})"
    else:
        per = "; ".join(f"{name} {ci}" for name, ci in ab.shapes.items())
        hint = (f"hint: patched vs incumbent {ab.overall} ({per}); a hint, not a verdict (only the campaign's "
                "A/B decides)")
    return "\n".join([head, *lines, hint])


def start_kernel_campaign(spec: KernelSpec, spec_path: Path, *, log_root: Path, workspace_root: Path,
                          on_event: Event = lambda k, d: None, proposer: Proposer | None = None,
                          measure: Measurements = HARNESS) -> KernelEnd:
    """`proposer`: default the tunables search of `proposer.search`; an LLMProposer for `--proposer llm`.
    `measure`: the seam its evaluations go through (agent/measurements.py)."""
    proposer = proposer or KernelSearchProposer(spec.proposer.search, kernel_file=spec.target.kernel_file)
    serving = load_serving_stage(spec)

    def tunables_of(ws: Workspace) -> dict[str, int]:
        return read_tunables((ws.root / spec.target.kernel_file).read_text())

    with open_campaign(spec=spec, spec_path=spec_path, name=spec.name, policy_path=spec.policy_file, log_root=log_root,
                       workspace_dir=spec.target.workspace, workspace_root=workspace_root,
                       package=spec.target.package, source=spec.target.source_dir, serving={},
                       limits=kernel_limits(spec), proposer=proposer.name,
                       start=lambda ws: {"kind": "kernel", "kernel_file": spec.target.kernel_file,
                                         "interface": spec.target.interface, "tunables": tunables_of(ws)}) as opened:
        ws = opened.workspace
        camp = KernelCampaign(spec=spec, campaign_id=opened.campaign_id, log_dir=opened.log_dir, writer=opened.writer,
                              gate=opened.gate, workspace=ws, proposer=proposer, baseline_tunables=tunables_of(ws),
                              incumbent_ref=ws.head(), on_event=on_event, measure=measure, serving=serving)
        return camp.run_to_end(base_commit=ws.head(), branch=opened.branch)
