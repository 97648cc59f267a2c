"""The end-to-end stage of a kernel campaign on vLLM's kernel (a kernel spec's `serving:`): the kernel stage's best
and the stock tree served side by side from the campaign's vLLM workspace, with a serving spec's server, parity and
grid. The campaign's verdict rests on this A/B, as a serving campaign's rests on its final comparison."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import records
from agent.evidence import bind_step, fresh
from agent.kernel_spec import KernelSpec
from agent.measurements import Measurements
from agent.replay import reduced_grid
from agent.server_gate import gate_servers, parity_server_alongside
from agent.spec import CampaignSpec
from harness.errors import HarnessError
from harness.measure import ABResult, Build
from sandbox.base import Backend
from sandbox.errors import SandboxError
from sandbox.workspace import Workspace

if TYPE_CHECKING:
    from agent.kernel_campaign import KernelCampaign

__all__ = ["load_serving_stage", "serving_backend", "serve_best", "served_ab", "stage_servers"]


def load_serving_stage(spec: KernelSpec) -> CampaignSpec | None:
    """The end-to-end stage's serving spec, checked before the campaign starts (its parity must cover its grid,
    its parity checkpoint must have weights), with its sandbox resolved (`auto`: the strongest isolation here)."""
    if spec.serving is None:
        return None
    from agent.campaign import check_checkpoints, check_parity_coverage, with_resolved_sandbox
    from agent.spec import load_spec

    serving = load_spec(spec.serving)
    check_parity_coverage(serving)
    check_checkpoints(serving)
    return with_resolved_sandbox(serving, "search")


def serving_backend(serving: CampaignSpec) -> Backend:
    from sandbox.factory import backend_from_config

    return backend_from_config(serving.sandbox)


def stage_servers(serving: CampaignSpec) -> list[tuple[str, dict[str, object]]]:
    """The servers of the stage's A/B (tag, engine args): stock and best with the serving spec's engine args (the same
    for both), and each one's parity server beside it when parity runs on a checkpoint of its own: no reference
    generations here, so both builds' parity servers start with the speed servers, on ports of their own, instead of
    running first (one start-up of ~2.5 minutes on an H200 saved)."""
    engine_args = dict(serving.server.engine_args)
    servers = [("A", engine_args), ("B", engine_args)]
    if parity_server_alongside(serving):
        parity_args = {**engine_args, **serving.parity.engine_args}
        servers += [("A-parity", parity_args), ("B-parity", parity_args)]
    return servers


def served_ab(measure: Measurements, backend: Backend, serving: CampaignSpec, ws: Workspace, stock_ref: str,
              best_ref: str, *, ports: dict[str, int], work_dir: Path, cache_dir: Path, repeats: int,
              only: list[str] | None = None, progress: Callable[[str], None] = lambda _: None) -> ABResult:
    """Stock (A) and best (B) checked out of `ws` and served side by side with the serving spec's server, parity
    (held prompts and workload) and grid at `repeats` pairs (`only`: some of its cells): the campaign's serving
    stage and its replay. The two trees are gone afterwards."""
    engine_args = dict(serving.server.engine_args)
    tree_a = ws.checkout_copy(stock_ref, work_dir / "tree-A")
    tree_b = ws.checkout_copy(best_ref, work_dir / "tree-B")
    try:
        a = Build(tag="A", tree=tree_a, engine_args=engine_args, ref=stock_ref, cache_key=ws.tree_hash(stock_ref))
        b = Build(tag="B", tree=tree_b, engine_args=engine_args, ref=best_ref, cache_key=ws.tree_hash(best_ref))
        bench = reduced_grid(serving.benchmark, only, repeats)   # ValueError naming the grid's cells
        return measure.ab(backend, a, b, server=serving.server, bench=bench, stats_cfg=serving.stats,
                          parity=serving.parity, work_dir=work_dir, cache_dir=cache_dir, ports=ports,
                          progress=progress)
    finally:
        ws.remove_copy(tree_a)
        ws.remove_copy(tree_b)


def serve_best(camp: KernelCampaign, base_commit: str, serving: CampaignSpec, backend: Backend) -> dict[str, Any]:
    """The kernel stage's best, end to end (`served_ab`, its servers gated), at the serving spec's strong repeats.
    The campaign's verdict rests on this A/B, as a serving campaign's rests on its final comparison. The serving
    spec is recorded whole, so that a replay needs only the log."""
    from agent.campaign import judge_ending

    camp.on_event("phase", {"phase": "serving: stock vs best, end to end"})
    work, it = fresh(camp.log_dir / "runs" / "serving"), camp.next_iteration   # run again after a resume: a new folder
    result, why = None, ""
    try:
        ports = gate_servers(camp.gate, serving, stage_servers(serving), it)
        result = served_ab(camp.measure, backend, serving, camp.workspace, base_commit, camp.incumbent_ref,
                           ports=ports, work_dir=work, cache_dir=camp.log_dir / "cache",
                           repeats=serving.benchmark.strong_repeats,
                           progress=lambda m: camp.on_event("phase", {"phase": f"  {m}"}))
        bind_step(camp.writer, work, step="serving", iteration=it)   # the verdict's evidence, before its record
    except (HarnessError, SandboxError) as exc:   # recorded; the verdict then says the gain is not shown
        camp.writer.append(records.ERROR, iteration=it,
                           payload={"phase": "serving", "type": type(exc).__name__, "message": str(exc)[:4000]})
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
    ending = judge_ending(1, result, why)
    payload: dict[str, Any] = {
        "verdict": {"status": ending.status, "text": ending.text}, "stock_ref": base_commit,
        "best_ref": camp.incumbent_ref, "engine_args": dict(serving.server.engine_args),
        "repeats": serving.benchmark.strong_repeats, "spec": json.loads(serving.model_dump_json()),
        "overall": vars(result.overall) if result and result.overall else None,
        "cells": {label: vars(per["headline"]) for label, per in result.cells.items()} if result else {},
        "parity_ok": bool(result and result.parity and result.parity.ok),
        "parity": result.parity.summary() if result and result.parity else None}
    camp.writer.append(records.SERVING_RESULT, iteration=it, payload=payload)
    camp.writer.checkpoint()
    return payload
