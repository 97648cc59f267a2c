"""The end-to-end stage of a kernel campaign on vLLM's kernel (a kernel spec's `serving:`): the kernel stage's best
and the stock tree served side by side from the campaign's vLLM workspace, with a serving spec's server, parity and
grid. The campaign's verdict rests on this A/B, as a serving campaign's rests on its final comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent import records
from agent.kernel_spec import KernelSpec
from agent.spec import CampaignSpec
from harness.errors import HarnessError
from harness.measure import Build
from sandbox.base import Backend
from sandbox.errors import SandboxError

if TYPE_CHECKING:
    from agent.kernel_campaign import KernelCampaign

__all__ = ["load_serving_stage", "serving_backend", "serve_best"]


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


def serve_best(camp: KernelCampaign, base_commit: str, serving: CampaignSpec, backend: Backend) -> dict[str, Any]:
    """The kernel stage's best, end to end: the stock tree and the best one served side by side with the
    serving spec's server (engine args as it sets them, the same for both), its held-prompt and workload
    parity, and its grid at the strong repeats. The campaign's verdict rests on this A/B, as a serving
    campaign's rests on its final comparison."""
    from agent.campaign import judge_ending
    from agent.server_gate import gate_servers, parity_server_alongside

    camp.on_event("phase", {"phase": "serving: stock vs best, end to end"})
    ws, work, it = camp.workspace, camp.log_dir / "runs" / "serving", camp.next_iteration
    engine_args = dict(serving.server.engine_args)
    tree_a = ws.checkout_copy(base_commit, work / "tree-A")
    tree_b = ws.checkout_copy(camp.incumbent_ref, work / "tree-B")
    result, why = None, ""
    try:
        a = Build(tag="A", tree=tree_a, engine_args=engine_args, ref=base_commit,
                  cache_key=ws.tree_hash(base_commit))
        b = Build(tag="B", tree=tree_b, engine_args=engine_args, ref=camp.incumbent_ref,
                  cache_key=ws.tree_hash(camp.incumbent_ref))
        servers = [("A", engine_args), ("B", engine_args)]
        if parity_server_alongside(serving):
            # no reference generations here: both builds' parity servers start beside the speed servers, on
            # ports of their own, instead of running first (one start-up of ~2.5 minutes on an H200 saved)
            parity_args = {**engine_args, **serving.parity.engine_args}
            servers += [("A-parity", parity_args), ("B-parity", parity_args)]
        ports = gate_servers(camp.gate, serving, servers, it)
        bench = serving.benchmark.model_copy(update={"repeats": serving.benchmark.strong_repeats})
        result = camp.measure.ab(backend, a, b, server=serving.server, bench=bench, stats_cfg=serving.stats,
                                 parity=serving.parity, work_dir=work, cache_dir=camp.log_dir / "cache",
                                 ports=ports, progress=lambda m: camp.on_event("phase", {"phase": f"  {m}"}))
    except (HarnessError, SandboxError) as exc:   # recorded; the verdict then says the gain is not shown
        camp.writer.append(records.ERROR, iteration=it,
                           payload={"phase": "serving", "type": type(exc).__name__, "message": str(exc)[:4000]})
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        ws.remove_copy(tree_a)
        ws.remove_copy(tree_b)
    ending = judge_ending(1, result, why)
    payload: dict[str, Any] = {
        "verdict": {"status": ending.status, "text": ending.text}, "stock_ref": base_commit,
        "best_ref": camp.incumbent_ref, "engine_args": engine_args, "repeats": serving.benchmark.strong_repeats,
        "overall": vars(result.overall) if result and result.overall else None,
        "cells": {label: vars(per["headline"]) for label, per in result.cells.items()} if result else {},
        "parity_ok": bool(result and result.parity and result.parity.ok),
        "parity": result.parity.summary() if result and result.parity else None}
    camp.writer.append(records.SERVING_RESULT, iteration=it, payload=payload)
    camp.writer.checkpoint()
    return payload
