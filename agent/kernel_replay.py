"""Replay of a kernel campaign (agent/replay.py hands over a log whose start record is of kind "kernel"), from the
log alone, on a clean workspace, with replay's checks and exit codes:

- the accepted series is rebuilt at the recorded base: the stock tree, the prelude when the campaign kept it, then
  each accepted patch, every tree checked against its recorded hash;
- each accepted patch is checked and timed against its predecessor in one runner process, as the campaign did: it
  must be correct on every shape (a kernel's parity) and its paired speedup must overlap the recorded one with a
  lower bound of at least 1.0;
- the final comparison, stock vs best (the campaign's per-shape table), the same way;
- the serving stage, when the campaign's verdict rested on one: stock vs best served end to end with the recorded
  serving spec, its held-prompt and workload parity, and its grid at `repeats` pairs (`cells`: some of its cells).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import records
from agent.kernel_campaign import kernel_request
from agent.kernel_serving import served_ab, stage_servers
from agent.kernel_spec import KernelSpec
from agent.measurements import Measurements
from agent.opening import file_sha256
from agent.replay import CheckFn, Claim, Exit, rebuild, reduced_grid, speedup_holds
from agent.server_gate import pick_port
from agent.spec import CampaignSpec
from audit.reader import payload_of, read_records
from harness.kernel.compare import KernelAB, compare
from sandbox.base import Backend
from sandbox.errors import SandboxError
from sandbox.workspace import Workspace

__all__ = ["replay_kernel"]


def replay_kernel(log_dir: Path, start: dict[str, Any], accepted: list[Claim], spec: KernelSpec, *, check: CheckFn,
                  backend_for: Callable[[CampaignSpec], Backend], work_dir: Path, cells: list[str] | None,
                  repeats: int, tolerance: float, progress: Callable[[str], None], measure: Measurements) -> None:
    bodies = [(r, payload_of(log_dir, r)) for r in read_records(log_dir)]
    prelude = next((b for r, b in bodies if r["kind"] == records.PRELUDE_RESULT), None)
    final = next((b for r, b in bodies if r["kind"] == records.FINAL_RESULT), None)
    served = next((b for r, b in bodies if r["kind"] == records.SERVING_RESULT), None)
    claimed = served is not None and (served.get("verdict") or {}).get("status") == "improved" \
        and bool(served.get("overall"))
    serving = _serving_spec(served, spec) if claimed and served is not None else None
    if claimed and serving is None:
        check("serving stage's spec", False, f"the log does not hold the serving spec and {spec.serving} is not "
                                             "here", Exit.USAGE)
        return
    if serving is not None and cells:
        reduced_grid(serving.benchmark, cells, repeats)   # ValueError naming the grid's cells, before anything runs

    ws_dir = work_dir / "workspace"
    shutil.rmtree(ws_dir, ignore_errors=True)
    ws = Workspace.create(ws_dir, serving={}, package=spec.target.package, source=spec.target.source_dir)
    if not check("base tree matches", ws.tree_hash() == start["base_tree"],
                 f"base tree {ws.tree_hash()[:12]} vs recorded {str(start['base_tree'])[:12]}", Exit.PATCH_FAILED):
        return
    stock = ws.head()
    if prelude is not None and prelude.get("kept"):
        try:
            ws.apply_patch(str(prelude["diff"]))
            ws.commit("replay of the prelude")
        except SandboxError as exc:
            check("prelude applies", False, str(exc), Exit.PATCH_FAILED)
            return
    commits = rebuild(ws, accepted, check)   # the prelude's tree is checked with the first accepted patch's
    if commits is None:
        return

    for index, claim in enumerate(accepted):
        progress(f"iteration {claim.iteration}: its kernel vs its predecessor, checked and timed in one runner")
        ab = _kernel_ab(spec, ws, commits[index], commits[index + 1], work_dir / f"it{claim.iteration}", measure)
        if not _kernel_holds(check, f"iteration {claim.iteration}", claim, ab, tolerance):
            return

    if final is not None and final.get("outcome") == "accepted" and final.get("overall"):
        progress("the final comparison: stock vs best, checked and timed in one runner")
        claim = _claim(final, {name: sh["speedup"] for name, sh in final["shapes"].items() if sh.get("speedup")})
        ab = _kernel_ab(spec, ws, stock, commits[-1], work_dir / "final", measure, tags=("baseline", "best"))
        if not _kernel_holds(check, "the kernel stage (stock vs best)", claim, ab, tolerance):
            return

    if served is None:
        return
    if serving is None:
        check("serving stage", True, f"the campaign's end-to-end A/B claimed no gain "
                                     f"({(served.get('verdict') or {}).get('text', 'no verdict')[:300]}): "
                                     "nothing to replay there", Exit.OK)
        return
    progress("the serving stage: stock vs best served end to end, parity first")
    ports: dict[str, int] = {}
    for tag, _ in stage_servers(serving):
        ports[tag] = pick_port(exclude=ports.values())
    ab = served_ab(measure, backend_for(serving), serving, ws, stock, commits[-1], ports=ports,
                   work_dir=work_dir / "serving", cache_dir=work_dir / "cache", repeats=repeats, only=cells,
                   progress=progress)
    assert ab.parity is not None
    if not check("parity of the serving stage", ab.parity.ok, ab.parity.summary(), Exit.PARITY_BROKEN):
        return
    if ab.overall is None:
        check("speedup of the serving stage (stock vs best, end to end)", False, "nothing was measured",
              Exit.SPEEDUP_GONE)
        return
    ok, detail = speedup_holds(_claim(served, served.get("cells") or {}), ab.overall, ab.headline(), tolerance)
    check("speedup of the serving stage (stock vs best, end to end)", ok, detail, Exit.SPEEDUP_GONE)


def _claim(payload: dict[str, Any], cells: dict[str, dict[str, float]]) -> Claim:
    overall = payload["overall"]
    return Claim(iteration=-1, diff="", tree="", ratio=float(overall["ratio"]), low=float(overall["low"]),
                 high=float(overall["high"]), cells=cells, hypothesis="")


def _kernel_ab(spec: KernelSpec, ws: Workspace, ref_a: str, ref_b: str, work: Path, measure: Measurements, *,
               tags: tuple[str, str] = ("A", "B")) -> KernelAB:
    """`ref_a` and `ref_b` checked and timed in one runner and read as an A/B, as the campaign read its own."""
    trees = {tag: ws.checkout_copy(ref, work / f"tree-{tag}") for tag, ref in zip(tags, (ref_a, ref_b), strict=True)}
    try:
        result = measure.kernel(kernel_request(spec, trees, roofline=False), work, timeout_s=spec.runner_timeout_s,
                                interpret=spec.interpret)
        expected = {tag: file_sha256(tree / spec.target.kernel_file) for tag, tree in trees.items()}
        return compare(result, a=tags[0], b=tags[1], stats=spec.stats, expected_sha256=expected)
    finally:
        for tree in trees.values():
            ws.remove_copy(tree)


def _kernel_holds(check: CheckFn, what: str, claim: Claim, ab: KernelAB, tolerance: float) -> bool:
    """Correct on every shape (else False: nothing after it can be trusted), then the speedup against the claim."""
    if not check(f"correctness of {what}", ab.correct, "correct on every shape, before and after timing"
                 if ab.correct else ab.reason, Exit.PARITY_BROKEN):
        return False
    if ab.overall is None:
        check(f"speedup of {what}", False, ab.reason, Exit.SPEEDUP_GONE)
        return True
    ok, detail = speedup_holds(claim, ab.overall, ab.shapes, tolerance)
    check(f"speedup of {what}", ok, detail, Exit.SPEEDUP_GONE)
    return True


def _serving_spec(served: dict[str, Any], spec: KernelSpec) -> CampaignSpec | None:
    """The serving stage's spec: recorded whole in its result (since 2026-12-03), else the kernel spec's file."""
    from agent.campaign import with_resolved_sandbox
    from agent.spec import load_spec

    if served.get("spec"):
        return CampaignSpec.model_validate(served["spec"])
    if spec.serving is None or not Path(spec.serving).is_file():
        return None
    return with_resolved_sandbox(load_spec(spec.serving), "search")
