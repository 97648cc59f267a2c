"""Replay: re-check a campaign's claims from its audit log alone, on a clean workspace.

An accepted patch is a claim: "on this build and hardware, this commit keeps token parity and is X×
faster (CI [a, b])". Replay verifies the log, rebuilds the accepted series at the recorded base (tree
hashes must match), re-runs parity on the held prompts against the recorded reference, and re-measures
each accepted patch against its predecessor on a reduced grid, interleaved: the speedup holds when the
replayed interval overlaps the recorded one (the grid's geo-mean; with `--cells`, each chosen cell's own)
and the replayed lower bound clears 1.0 (a gain the replay cannot show is gone, whatever was recorded).
Each step is a check with a distinct exit code, written as JUnit XML and a markdown summary. Decisions are
re-decided under the policies ratchet shipped (policies/known.py), so a log outlives a policy change.
A kernel campaign's log (its start record's kind "kernel") is replayed by agent/kernel_replay.py: the same checks
and exit codes, its claims being kernel A/Bs and the serving stage's end-to-end A/B.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import records
from agent.environment import describe_environment
from agent.kernel_spec import KernelSpec
from agent.measurements import HARNESS, Measurements
from agent.spec import CampaignSpec
from agent.target import target_record, workspace_source
from audit import verify
from audit.reader import payload_of, read_records
from harness.config import BenchmarkConfig
from harness.measure import Build
from harness.parity import load_reference
from harness.stats import SpeedupCI, check_repeats
from policies import load_policy, redecider
from policies.known import known_policies
from sandbox.base import Backend
from sandbox.errors import SandboxError
from sandbox.workspace import Workspace

__all__ = ["Exit", "Check", "CheckFn", "Claim", "ReplayResult", "replay", "claims", "rebuild", "reduced_grid",
           "speedup_holds", "ENV_KEYS"]

ENV_KEYS = ("vllm", "torch", "python", "machine", "cpu", "gpu")


class Exit(enum.IntEnum):
    OK = 0
    USAGE = 2
    HARNESS = 3
    LOG_UNVERIFIED = 10
    PATCH_FAILED = 11
    PARITY_BROKEN = 12
    SPEEDUP_GONE = 13
    ENV_DIFFERS = 14


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    code: Exit = Exit.OK       # the exit code when this check fails
    seconds: float = 0.0


@dataclass(frozen=True)
class Claim:
    iteration: int
    diff: str
    tree: str
    ratio: float
    low: float
    high: float
    cells: dict[str, dict[str, float]]
    hypothesis: str


CheckFn = Callable[[str, bool, str, Exit], bool]   # records a check (name, ok, detail, its exit code); returns ok


@dataclass
class ReplayResult:
    campaign: str
    checks: list[Check] = field(default_factory=list)

    @property
    def exit_code(self) -> Exit:
        return next((c.code for c in self.checks if not c.ok), Exit.OK)


def claims(log_dir: Path) -> tuple[dict[str, Any], list[Claim], dict[str, Any]]:
    """The campaign start record, the accepted patches in order, and the baseline record."""
    bodies = [(r, payload_of(log_dir, r)) for r in read_records(log_dir)]
    start = next(b for r, b in bodies if r["kind"] == records.CAMPAIGN_START)
    baseline = next(b for r, b in bodies if r["kind"] == records.BASELINE_RESULT)
    patches = {int(r["iteration"]): b for r, b in bodies if r["kind"] == records.ITERATION_PATCH}
    hyps = {int(r["iteration"]): b for r, b in bodies if r["kind"] == records.ITERATION_HYPOTHESIS}
    out = []
    for r, b in bodies:
        if r["kind"] == records.ITERATION_RESULT and b.get("accepted"):
            it = int(r["iteration"])
            # a serving A/B's cells, or a kernel A/B's shapes (agent/kernel_replay.py)
            cells = {label: per["headline"] for label, per in b.get("cells", {}).items()} or \
                {name: sh["speedup"] for name, sh in b.get("shapes", {}).items()}
            out.append(Claim(iteration=it, diff=patches[it]["diff"], tree=str(b["tree"]), ratio=float(b["speedup"]),
                             low=float(b["ci_low"]), high=float(b["ci_high"]), cells=cells,
                             hypothesis=str(hyps.get(it, {}).get("hypothesis", ""))))
    return start, out, baseline


def _overlaps(low: float, high: float, recorded_low: float, recorded_high: float, tolerance: float) -> bool:
    """The replayed interval must overlap the recorded one (widened by the tolerance)."""
    return high >= recorded_low * (1 - tolerance) and low <= recorded_high * (1 + tolerance)


def speedup_holds(claim: Claim, overall: SpeedupCI, cells: dict[str, SpeedupCI], tolerance: float) -> tuple[bool, str]:
    """Does the replay agree with the claim? On the campaign's whole grid: the geo-mean against the recorded
    geo-mean. On some of its cells (`--cells`): each replayed cell against that cell's recorded interval,
    since a subset's geo-mean is not the grid's (one fast cell of a 2.5x claim can replay at 5x)."""
    def fmt(ci: dict[str, float]) -> str:
        return f"{ci['ratio']:.3f}x [{ci['low']:.3f}, {ci['high']:.3f}]"

    # A gain that is gone is gone whatever the recorded interval says: the replay must show one of its own.
    gain = overall.low >= 1.0
    gained = "" if gain else f"; the replayed lower bound {overall.low:.3f} is below 1.0: no gain shown"
    if not claim.cells or set(cells) == set(claim.cells):
        ok = _overlaps(overall.low, overall.high, claim.low, claim.high, tolerance)
        recorded = fmt({"ratio": claim.ratio, "low": claim.low, "high": claim.high})
        return ok and gain, (f"replayed {overall} on cells {sorted(cells)}, recorded {recorded} "
                             f"(tolerance {tolerance:.0%}){'' if ok else ': disagrees'}{gained}")
    verdicts, ok = [], gain
    # Judged by its cells, a claim must first be its cells' claim: the recorded geo-mean is their geo-mean
    # (a log whose headline was inflated alone fails here).
    geo = math.exp(statistics.fmean(math.log(c["ratio"]) for c in claim.cells.values()))
    if abs(geo / claim.ratio - 1) > 0.01:
        ok = False
        verdicts.append(f"recorded {fmt({'ratio': claim.ratio, 'low': claim.low, 'high': claim.high})} is not the "
                        f"geo-mean of its recorded cells ({geo:.3f}x)")
    for label, ci in sorted(cells.items()):
        rec = claim.cells.get(label)
        if rec is None:
            ok = False
            verdicts.append(f"{label}: replayed {ci}, not a cell of the campaign's grid")
            continue
        agrees = _overlaps(ci.low, ci.high, rec["low"], rec["high"], tolerance)
        ok = ok and agrees
        verdicts.append(f"{label}: replayed {ci}, recorded {fmt(rec)}{'' if agrees else ' (disagrees)'}")
    return ok, "; ".join(verdicts) + f" (per cell, tolerance {tolerance:.0%}); the chosen cells together " \
        f"{overall}{gained}"


def replay(log_dir: Path, *, backend_for: Callable[[CampaignSpec], Backend], work_dir: Path,
           pubkey: Path | None = None, cells: list[str] | None = None, repeats: int = 4,
           tolerance: float = 0.05, allow_env_drift: bool = False,
           progress: Callable[[str], None] = lambda _: None, measure: Measurements = HARNESS) -> ReplayResult:
    check_repeats(repeats)   # ValueError: the CLI answers it as bad input
    log_dir = log_dir.resolve()
    result = ReplayResult(campaign=log_dir.name)

    def check(name: str, ok: bool, detail: str, code: Exit) -> bool:
        result.checks.append(Check(name=name, ok=ok, detail=detail, code=code))
        progress(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        return ok

    start_records = [r for r in read_records(log_dir) if r.get("kind") == records.CAMPAIGN_START]
    opening = payload_of(log_dir, start_records[0]) if start_records else None
    spec = _spec_of(opening)
    # the spec's policy as it is now, and every policy ratchet shipped (the log may predate a change)
    policy = spec.policy_file if isinstance(spec, KernelSpec) else spec.policy if spec else None
    policies = ([load_policy(policy)] if policy and policy.exists() else []) + known_policies()
    verdict = verify(log_dir, pubkey=pubkey, redecide=redecider(policies) if policies else None)
    if not check("log verifies", verdict.ok and spec is not None,
                 f"verified {verdict.records} records" if verdict.ok else
                 f"first bad seq {verdict.bad_seq}: {verdict.reason}", Exit.LOG_UNVERIFIED):
        return result
    assert spec is not None
    start, accepted, baseline = claims(log_dir)
    result.campaign = str(start_records[0]["campaign"])

    recorded_env, current_env = start.get("environment", {}), describe_environment()
    drift = {k: (recorded_env.get(k), current_env.get(k)) for k in ENV_KEYS
             if recorded_env.get(k) != current_env.get(k)}
    # vllm-image: the image's package as it is now, compared with the record
    source = spec.target.source_dir if isinstance(spec, KernelSpec) else workspace_source(spec)
    recorded_image, current_image = start.get("target_image") or {}, target_record(source).get("target_image") or {}
    drift |= {f"image {k}": (recorded_image.get(k), current_image.get(k)) for k in ("image_id", "version", "path")
              if recorded_image.get(k) != current_image.get(k)}
    env_detail = "same vLLM, torch, Python, machine" if not drift else \
        "; ".join(f"{k}: recorded {a!r}, here {b!r}" for k, (a, b) in drift.items())
    if not check("environment matches", not drift or allow_env_drift,
                 env_detail + (" (allowed by --allow-env-drift)" if drift and allow_env_drift else ""),
                 Exit.ENV_DIFFERS):
        return result
    if not accepted:
        check("accepted patches", True, "the campaign accepted nothing: no claim to replay", Exit.OK)
        return result
    if isinstance(spec, KernelSpec):
        from agent.kernel_replay import replay_kernel

        replay_kernel(log_dir, start, accepted, spec, check=check, backend_for=backend_for, work_dir=work_dir,
                      cells=cells, repeats=repeats, tolerance=tolerance, progress=progress, measure=measure)
        return result

    # Rebuild the accepted series on a clean workspace at the recorded base.
    ws_dir = work_dir / "workspace"
    shutil.rmtree(ws_dir, ignore_errors=True)
    ws = Workspace.create(ws_dir, serving=dict(spec.server.engine_args), package=spec.target.package, source=source)
    if not check("base tree matches", ws.tree_hash() == start["base_tree"],
                 f"base tree {ws.tree_hash()[:12]} vs recorded {str(start['base_tree'])[:12]}", Exit.PATCH_FAILED):
        return result
    commits = rebuild(ws, accepted, check)
    if commits is None:
        return result

    # Parity and speed: each accepted patch against its predecessor, parity of each candidate first.
    ref_path = log_dir / str(baseline["reference_file"])
    if hashlib.sha256(ref_path.read_bytes()).hexdigest() != baseline["reference_sha256"]:
        check("parity reference intact", False, f"{ref_path} does not match its recorded hash", Exit.LOG_UNVERIFIED)
        return result
    reference = load_reference(ref_path, prompts_path=spec.parity.prompts)
    bench = reduced_grid(spec.benchmark, cells, repeats)
    backend = backend_for(spec)
    for index, claim in enumerate(accepted):
        trees = [ws.checkout_copy(commits[index], work_dir / f"it{claim.iteration}-A"),
                 ws.checkout_copy(commits[index + 1], work_dir / f"it{claim.iteration}-B")]
        try:
            # content-keyed caches: claim k's B is claim k+1's A, which then starts warm
            a = Build(tag="A", tree=trees[0], engine_args=ws.serving_config(commits[index]), ref=commits[index],
                      cache_key=ws.tree_hash(commits[index]))
            b = Build(tag="B", tree=trees[1], engine_args=ws.serving_config(commits[index + 1]), ref=commits[index + 1],
                      cache_key=ws.tree_hash(commits[index + 1]))
            ab = measure.ab(backend, a, b, server=spec.server, bench=bench, stats_cfg=spec.stats, parity=spec.parity,
                            work_dir=work_dir / f"it{claim.iteration}", cache_dir=work_dir / "cache",
                            reference=reference, stop_on_parity_failure=True, progress=progress)
        finally:
            for tree in trees:
                ws.remove_copy(tree)
        assert ab.parity is not None
        if not check(f"parity of iteration {claim.iteration}", ab.parity.ok, ab.parity.summary(), Exit.PARITY_BROKEN):
            return result
        assert ab.overall is not None
        ok, detail = speedup_holds(claim, ab.overall, ab.headline(), tolerance)
        check(f"speedup of iteration {claim.iteration}", ok, detail, Exit.SPEEDUP_GONE)
    return result


def rebuild(ws: Workspace, accepted: list[Claim], check: CheckFn) -> list[str] | None:
    """Apply the accepted patches in order on `ws` (at the recorded base), each commit's tree checked against its
    recorded hash: [the head before them, then one commit per claim], or None when one fails (already checked)."""
    commits = [ws.head()]
    for claim in accepted:
        try:
            ws.apply_patch(claim.diff)
            commits.append(ws.commit(f"replay of iteration {claim.iteration}"))
        except SandboxError as exc:
            check(f"patch of iteration {claim.iteration} applies", False, str(exc), Exit.PATCH_FAILED)
            return None
        if not check(f"patch of iteration {claim.iteration} applies", ws.tree_hash() == claim.tree,
                     f"tree {ws.tree_hash()[:12]} vs recorded {claim.tree[:12]}", Exit.PATCH_FAILED):
            return None
    return commits


def _spec_of(opening: dict[str, Any] | None) -> CampaignSpec | KernelSpec | None:
    """The campaign's spec as its start record holds it: a kernel campaign's (kind "kernel") or a serving one's."""
    if opening is None:
        return None
    if opening.get("kind") == "kernel":
        return KernelSpec.model_validate(opening["spec"])
    return CampaignSpec.model_validate(opening["spec"])


def reduced_grid(bench: BenchmarkConfig, cells: list[str] | None, repeats: int) -> BenchmarkConfig:
    """The chosen cells of the grid (labels like in512/out64, in512/out1, in16/out32/img1x96) with k repeats;
    default: all cells. A label not in the grid is refused with the grid's labels."""
    if not cells:
        return bench.model_copy(update={"repeats": repeats})
    reduced = bench.model_copy(update={"only": list(cells), "repeats": repeats})
    reduced.cells()    # ValueError naming what the grid has
    return reduced


def write_junit(result: ReplayResult, path: Path) -> None:
    from xml.sax.saxutils import escape, quoteattr

    failures = sum(1 for c in result.checks if not c.ok)
    cases = []
    for c in result.checks:
        body = "" if c.ok else f"<failure message={quoteattr(c.detail[:500])}>{escape(c.detail)}</failure>"
        cases.append(f'  <testcase classname="ratchet.replay.{result.campaign}" name={quoteattr(c.name)}>'
                     f"{body}</testcase>")
    xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="ratchet-replay" tests="{len(result.checks)}" '
           f'failures="{failures}">\n' + "\n".join(cases) + "\n</testsuite>\n")
    path.write_text(xml)


def write_summary(result: ReplayResult, path: Path) -> None:
    lines = [f"# ratchet replay: {result.campaign}", "", f"exit code: {int(result.exit_code)} "
             f"({result.exit_code.name})", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail.replace('|', '/')} |" for c in result.checks]
    path.write_text("\n".join(lines) + "\n")


def to_json(result: ReplayResult) -> str:
    return json.dumps({"campaign": result.campaign, "exit_code": int(result.exit_code),
                       "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in result.checks]}, indent=1)
