"""Starting, resuming and ending a campaign around the loop: the audit log, the workspace and its
branch, the baseline (parity reference + grid), the final best-vs-baseline comparison, the report."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from agent import records
from agent.base import Proposer
from agent.engine import Event, reopen
from agent.errors import CampaignError
from agent.evidence import bind_step, fresh
from agent.executor import Executor, make_executor, preflight
from agent.fresh_host import (
    arrive,
    check_inputs,
    check_measurement,
    check_parity_checkpoint,
    checkpoint_digest,
    continuation,
    measurement_parts,
    recipe_of,
    resumed_limits,
)
from agent.gatekeeper import Gatekeeper
from agent.host import HostProbe, probe_host
from agent.incumbent_profile import profile_incumbent
from agent.journal import read_journal, verify_for_resume
from agent.measurements import HARNESS, Measurements
from agent.opening import file_sha256, new_campaign_id, open_campaign
from agent.rebuild import open_or_rebuild
from agent.server_gate import gate_server, parity_server_alongside
from agent.serving_campaign import Campaign
from agent.spec import CampaignSpec, SpecError
from agent.target import served_environment, target_record, workspace_source
from audit import AuditWriter, write_report
from harness.ceilings import Ceilings
from harness.errors import CeilingsUnavailable
from harness.measure import ABResult, Build
from harness.parity import load_prompts, load_reference, save_reference
from harness.physics import roofline_rows, served_model
from harness.stats import check_repeats
from sandbox.base import Backend
from sandbox.factory import UNISOLATED, isolation_label
from sandbox.factory import resolve as resolve_sandbox
from sandbox.workspace import Workspace

__all__ = ["CampaignEnd", "Ending", "judge_ending", "start_campaign", "resume_campaign", "new_campaign_id",
           "check_runnable", "checkpoint_digest"]

REFERENCE_FILE = "parity-reference.json"


@dataclass(frozen=True)
class CampaignEnd:
    campaign_id: str
    log_dir: Path
    workspace: Path
    branch: str
    stop_reason: str
    baseline_rows: list[dict[str, Any]]
    final: ABResult | None
    accepted: list[str]
    report: Path | None
    verdict: Ending


@dataclass(frozen=True)
class Ending:
    """What the campaign may claim. `improved` only when the final best-vs-stock comparison's lower bound
    clears 1.0 with parity; anything accepted that the final comparison does not bear out is `not-shown`."""

    status: str            # "improved" | "no-change" | "not-shown"
    text: str

    @property
    def ok(self) -> bool:
        return self.status != "not-shown"


def judge_ending(accepted: int, final: ABResult | None, why_missing: str = "",
                 unconfirmed: tuple[str, ...] = (), impossible: tuple[str, ...] = ()) -> Ending:
    """`unconfirmed`: candidates that passed the screen but found no wall time for their confirmation.
    `impossible`: cells where the final comparison measured best faster than the host's roofline allows."""
    if not accepted:
        text = "nothing was accepted: the best configuration is stock"
        if unconfirmed:
            text += (f"; {len(unconfirmed)} candidate(s) passed the screen but the wall budget left no time to "
                     f"confirm them ({'; '.join(unconfirmed)}): raise budget.wall_seconds and run again")
        return Ending("no-change", text)
    if final is None or final.overall is None or final.parity is None:
        return Ending("not-shown", f"{accepted} change(s) accepted, but the final best-vs-stock comparison "
                                   f"did not run to the end ({why_missing or 'no result'}): the branch is NOT "
                                   "shown to be an improvement")
    if impossible:
        return Ending("not-shown", f"the final comparison measured best faster than this host's roofline allows "
                                   f"({'; '.join(impossible)}): tokens were skipped or miscounted, and the branch "
                                   "is NOT shown to be an improvement")
    if not final.parity.ok:
        return Ending("not-shown", f"the final comparison broke parity ({final.parity.summary()}): the branch "
                                   "is NOT an improvement")
    if final.overall.low < 1.0:
        return Ending("not-shown", f"the final comparison measured best vs stock at {final.overall}: its lower "
                                   "bound is below 1.0, so the accepted change(s) are NOT shown to be an "
                                   "improvement")
    if final.images is not None and final.images.high < 1.0:
        return Ending("not-shown", f"the final comparison measured the image cells slower, best vs stock "
                                   f"{final.images} (text cells {final.overall}): the accepted change(s) are NOT "
                                   "an improvement for requests with images")
    return Ending("improved", f"best vs stock {final.overall} (lower bound above 1.0); {final.parity.summary()}")


def _limits(spec: CampaignSpec) -> dict[str, float]:
    b = spec.budget
    limits = {"llm_tokens": b.llm_tokens, "llm_usd": float(b.llm_usd), "wall_seconds": b.wall_seconds,
              "trials": b.trials}
    if b.gpu_minutes > 0:   # 0: GPU time is recorded but not limited
        limits["gpu_minutes"] = b.gpu_minutes
    return limits


def host_ceilings(spec: CampaignSpec, measure: Measurements, on_event: Event) -> tuple[Ceilings | None, str]:
    """This host's ceilings, measured once before the baseline's servers start (the host idle); a host that cannot
    measure them runs the campaign without the physical check, and its baseline record says why."""
    on_event("phase", {"phase": "ceilings: this host's matmul rate at the served dtype and memory bandwidth "
                                "(a few seconds)"})
    try:
        return measure.ceilings(spec.server, hardware=spec.hardware), ""
    except CeilingsUnavailable as exc:
        on_event("progress", {"message": f"ceilings not measured: {exc}; cells are not checked against physics"})
        return None, str(exc)


def _baseline(*, spec: CampaignSpec, writer: AuditWriter, gate: Gatekeeper, ws: Workspace, backend: Backend,
              log_dir: Path, on_event: Event, measure: Measurements
              ) -> tuple[list[Any], list[Any], tuple[float, float], Ceilings | None]:
    """The parity reference, the grid's rows (with their roofline), what the loop plans its rounds with (the
    server's start-up and the seconds its grid took) and the host's ceilings, all recorded."""
    ceilings, no_ceilings = host_ceilings(spec, measure, on_event)
    on_event("phase", {"phase": "baseline: parity reference + grid"})
    port = gate_server(gate, spec, ws.serving_config(), 0)
    server = spec.server.model_copy(update={"port": port})
    # a parity server on the real checkpoint starts alongside the speed server: a port of its own, gated too
    parity_port = gate_server(gate, spec, ws.serving_config(), 0, exclude=(port,)) \
        if parity_server_alongside(spec) else None
    build = Build(tag="baseline", tree=ws.root, engine_args=ws.serving_config(), ref=ws.head(),
                  cache_key=ws.content_hash())
    # a baseline run again after a resume writes beside what a killed one left (perhaps bound already)
    work, reference = fresh(log_dir / "runs" / "baseline"), fresh(log_dir / REFERENCE_FILE)
    grid = measure.grid(backend, build, server=server, bench=spec.benchmark, work_dir=work,
                        cache_dir=log_dir / "cache", parity=spec.parity, parity_port=parity_port,
                        progress=lambda m: on_event("progress", {"message": m}))
    save_reference(reference, grid.generations, prompts_path=spec.parity.prompts,
                   meta={"ref": build.ref, "engine_args": build.engine_args})
    served = served_model(spec.server.model, {**spec.server.engine_args, **build.engine_args})
    rows = roofline_rows(grid.table(spec.benchmark.cells()), served, ceilings, spec.benchmark)
    grid_s = sum(run.wall_s for run in grid.runs)
    bind_step(writer, work, step="baseline", iteration=0, extra=(reference.name,))
    writer.append(records.BASELINE_RESULT, iteration=0, payload={
        "cells": rows, "startup_s": grid.startup_s, "grid_s": round(grid_s, 1),
        "ceilings": ceilings.to_json() if ceilings else {"omitted": no_ceilings},
        "evidence": grid.evidence, "ref": build.ref,
        "engine_args": build.engine_args, "reference_file": reference.name,
        "reference_sha256": file_sha256(reference),
        # the weights the reference was recorded from (a GPU host may train its own parity checkpoint)
        "parity_checkpoint": checkpoint_digest(spec.parity.model or spec.server.model),
        "parity_checkpoint_recipe": recipe_of(spec.parity.model or spec.server.model)})   # a resume names it
    writer.checkpoint()
    return grid.generations, rows, (grid.startup_s, grid_s), ceilings


def check_checkpoints(spec: CampaignSpec) -> None:
    """Parity needs real weights: a parity checkpoint without them is refused before anything starts."""
    model = spec.parity.model or spec.server.model
    if spec.parity.model is None and spec.server.engine_args.get("load_format") == "dummy":
        return  # refused by the spec itself (dummy weights prove nothing)
    if not (model / "config.json").is_file() or not any(model.glob("*.safetensors")):
        hint = f"; {model / 'README.md'} says how to make it" if (model / "README.md").is_file() else ""
        raise SpecError(f"parity checkpoint {model} has no weights (config.json and *.safetensors){hint}")


def check_parity_coverage(spec: CampaignSpec) -> None:
    """Parity must see the lengths and batch shapes the benchmark measures, or the spec must say why not."""
    if spec.parity.uncovered:
        return
    prompts = load_prompts(spec.parity.prompts)
    gaps = spec.parity.coverage_gaps(spec.benchmark, [len(p.token_ids) for p in prompts if not p.has_images],
                                     with_images=sum(p.has_images for p in prompts))
    if gaps:
        raise SpecError(f"the held prompts ({spec.parity.prompts}) do not cover the grid: {'; '.join(gaps)}. Add "
                        "prompts that long, or set parity.uncovered to the reason (it is recorded)")


def check_runnable(spec: CampaignSpec) -> None:
    """What a new campaign refuses before it creates anything (older logs with these settings still load)."""
    check_parity_coverage(spec)
    check_checkpoints(spec)
    try:
        check_repeats(spec.benchmark.repeats)
        check_repeats(spec.benchmark.strong_repeats)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if not spec.final_comparison:
        raise SpecError("final_comparison: false is refused: a campaign that accepts a change always measures "
                        "best vs stock at the end (its wall budget reserves the time); remove the key")


def with_resolved_sandbox(spec: CampaignSpec, proposer_name: str) -> CampaignSpec:
    """The spec with `sandbox.backend: auto` replaced by what this host isolates with (recorded in the log,
    rebuilt by Ray workers and by `resume`); an LLM proposer never runs with unisolated candidates."""
    spec = spec.model_copy(update={"sandbox": resolve_sandbox(spec.sandbox)})
    if proposer_name == "llm" and spec.sandbox.backend in UNISOLATED:
        raise SpecError("the llm proposer refuses sandbox.backend: unisolated: a model's patches run as code on "
                        "this host; use auto (docker or bwrap)")
    return spec


def start_campaign(spec: CampaignSpec, spec_path: Path, *, proposer: Proposer, backend: Backend, log_root: Path,
                   workspace_root: Path, on_event: Event = lambda k, d: None,
                   measure: Measurements = HARNESS, probe: HostProbe = probe_host) -> CampaignEnd:
    """A new campaign, to its end. `measure`: the seam every measurement goes through (a fake in unit tests);
    `probe`: what this host is (recorded; a resume compares its own with it)."""
    check_runnable(spec)
    spec = with_resolved_sandbox(spec, proposer.name)
    preflight(spec.executor)
    measurement = measure.digest()   # before anything of the target runs
    isolation = isolation_label(spec.sandbox)
    source = workspace_source(spec)   # a vllm-image target: located in its image before the log opens
    with open_campaign(spec=spec, spec_path=spec_path, name=spec.name, policy_path=spec.policy, log_root=log_root,
                       workspace_dir=None, workspace_root=workspace_root, package=spec.target.package,
                       source=source, serving=spec.server.engine_args, limits=_limits(spec),
                       proposer=proposer.name, header={"isolation": isolation}, probe=probe,
                       start=lambda ws: {"isolation": isolation, "measurement_sha256": measurement.sha256,
                                         "measurement_parts": measurement_parts(measurement)}) as opened:
        campaign_id, log_dir, writer, ws, branch, gate = (opened.campaign_id, opened.log_dir, opened.writer,
                                                          opened.workspace, opened.branch, opened.gate)
        executor = _executor(spec, writer, measure)   # before the baseline: a cluster that is not there fails fast
        try:
            reference, rows, basis, ceilings = _baseline(spec=spec, writer=writer, gate=gate, ws=ws,
                                                         backend=backend, log_dir=log_dir, on_event=on_event,
                                                         measure=measure)
            profile = profile_incumbent(spec=spec, writer=writer, gate=gate, ws=ws, backend=backend,
                                        log_dir=log_dir, iteration=0, on_event=on_event,
                                        reads_profile=proposer.reads_profile, measure=measure)
        except BaseException:
            executor.close()
            raise
        camp = Campaign(spec=spec, spec_path=spec_path, campaign_id=campaign_id, log_dir=log_dir, writer=writer,
                        gate=gate, workspace=ws, backend=backend, proposer=proposer, reference=reference,
                        baseline_rows=rows, incumbent_ref=ws.head(), incumbent_rows=rows,
                        profile=profile.text if profile else None, profile_steps=profile.steps if profile else {},
                        on_event=on_event, executor=executor, measurement=measurement, measure=measure,
                        round_basis=basis, served=served_environment(target_record(source).get("target_image")),
                        ceilings=ceilings)
        camp.resolve_defaults()
        return camp.run_to_end(base_commit=camp.incumbent_ref, branch=branch)


# What a serving spec reads from the host (agent/fresh_host.py checks each is there before a resume writes anything)
SPEC_INPUTS = ("policy", "server.model", "parity.prompts", "parity.visible_prompts", "parity.model", "target.source",
               "proposer.patches")


def resume_campaign(log_dir: Path, *, proposer_for: Callable[[CampaignSpec, str], Proposer],
                    backend_for: Callable[[CampaignSpec], Backend], on_event: Event = lambda k, d: None,
                    measure: Measurements = HARNESS, wall_seconds: float | None = None,
                    probe: HostProbe = probe_host, checkout: Path | None = None) -> CampaignEnd:
    """The campaign of `log_dir` from where its log ends, on this host or another like it (agent/fresh_host.py):
    refused, with nothing written, unless the log verifies and this host has what it needs. `wall_seconds`: what this
    run may spend from now (a campaign whose loop ended on its wall budget continues with it); `checkout`: where the
    spec's own checkout is here, when it is not ratchet's."""
    log_dir = log_dir.resolve()
    journal = read_journal(log_dir)
    continued = continuation(journal, wall_seconds, log_dir)
    here = arrive(log_dir, journal.start, journal.spec, campaign=journal.campaign, last_host=journal.host,
                  spec_path=journal.spec_path, workspace=journal.workspace, probe=probe, checkout=checkout)
    spec = CampaignSpec.model_validate(here.spec)
    verify_for_resume(log_dir, journal, spec.policy)   # an edited log is refused before anything is done
    check_inputs(here.spec, SPEC_INPUTS, (here.record or {}).get("moved", {}))
    check_parity_checkpoint(journal.baseline, spec.parity.model or spec.server.model)
    preflight(spec.executor)
    measurement = measure.digest()
    check_measurement(journal.start, measurement, same_machine=here.same_machine)
    spec = with_resolved_sandbox(spec, journal.proposer)   # the log's own backend, or fail closed
    limits, budget = resumed_limits(_limits(spec), journal, wall_seconds)
    place = partial(open_or_rebuild, journal, here.workspace, package=spec.target.package,
                    serving=spec.server.engine_args, source=lambda: workspace_source(spec))
    with reopen(log_dir, journal, policy_path=spec.policy, package=spec.target.package, limits=limits,
                header={"isolation": isolation_label(spec.sandbox)}, host=here.record, workspace=place,
                resume={**budget, **({"continued": True} if continued else {})}) as opened:
        writer, ws, gate = opened.writer, opened.workspace, opened.gate
        backend = backend_for(spec)
        proposer = proposer_for(spec, journal.proposer)
        executor = _executor(spec, writer, measure)
        try:
            if journal.baseline is None:
                reference, rows, basis, ceilings = _baseline(spec=spec, writer=writer, gate=gate, ws=ws,
                                                             backend=backend, log_dir=log_dir, on_event=on_event,
                                                             measure=measure)
            else:
                # the ceilings the campaign began with (a log written before them has none: no physical check)
                ceilings = Ceilings.from_json(journal.baseline.get("ceilings"))
                basis = (float(journal.baseline.get("startup_s") or 0.0), float(journal.baseline.get("grid_s") or 0.0))
                ref_file = log_dir / str(journal.baseline.get("reference_file") or REFERENCE_FILE)
                if file_sha256(ref_file) != journal.baseline["reference_sha256"]:
                    raise CampaignError(f"{ref_file} does not match its recorded hash: tampered with")
                reference = load_reference(ref_file, prompts_path=spec.parity.prompts)
                rows = list(journal.baseline["cells"])
        except BaseException:
            executor.close()
            raise
        camp = Campaign(spec=spec, spec_path=here.spec_path, campaign_id=journal.campaign, log_dir=log_dir,
                        writer=writer, gate=gate, workspace=ws, backend=backend, proposer=proposer,
                        reference=reference, baseline_rows=rows, incumbent_ref=journal.incumbent_ref,
                        incumbent_rows=journal.incumbent_rows or rows, history=list(journal.history),
                        profile=journal.profile, profile_steps=journal.profile_steps,
                        next_iteration=opened.next_iteration, on_event=on_event,
                        executor=executor, measurement=measurement, measure=measure, round_basis=basis,
                        served=served_environment(journal.target_image), ceilings=ceilings)
        camp.close_interrupted(journal.open_iterations)   # crashed mid-round: each open iteration closed, go on
        camp.resolve_defaults()
        return camp.run_to_end(base_commit=journal.base_commit, branch=journal.branch)


def _executor(spec: CampaignSpec, writer: AuditWriter, measure: Measurements) -> Executor:
    """The executor, with its cluster on record (a campaign's numbers depend on where they were measured)."""
    executor = make_executor(spec.executor, gpus_per_eval=float(spec.sandbox.gpus), measure=measure)
    info: dict[str, Any] = {"kind": executor.name, "slots": executor.slots}
    if executor.name == "ray":
        import ray

        info["nodes"] = [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
                          "resources": n["Resources"]} for n in ray.nodes()]
    writer.append(records.EXECUTOR_START, payload=info)
    return executor


def campaign_end(camp: Campaign, stop: str, branch: str) -> CampaignEnd:
    """After campaign.end: the report, the cache removed, and what the command prints."""
    assert camp.ending is not None   # set by the conclusion, before campaign.end
    report = None
    try:
        report, _ = write_report(camp.log_dir)
    except Exception as exc:  # a report failure must not hide the campaign's result
        camp.on_event("progress", {"message": f"report not written: {exc}"})
    shutil.rmtree(camp.log_dir / "cache", ignore_errors=True)
    accepted = [h for h in camp.history if h.outcome == "accepted"]
    return CampaignEnd(campaign_id=camp.campaign_id, log_dir=camp.log_dir, workspace=camp.workspace.root,
                       branch=branch, stop_reason=stop, baseline_rows=camp.baseline_rows, final=camp.final,
                       accepted=[h.source or h.hypothesis for h in accepted], report=report, verdict=camp.ending)


def final_comparison(camp: Campaign, base_commit: str) -> tuple[ABResult | None, str]:
    """Best vs stock: the incumbent measured once more against the baseline, interleaved, at the strong
    repeats (the campaign's verdict rests on it)."""
    camp.on_event("phase", {"phase": "final: best vs baseline"})
    ws, work = camp.workspace, fresh(camp.log_dir / "runs" / "final")   # run again after a resume: a new folder
    tree_a = ws.checkout_copy(base_commit, work / "tree-A")
    tree_b = ws.checkout_copy(camp.incumbent_ref, work / "tree-B")
    try:
        a = Build(tag="A", tree=tree_a, engine_args=ws.serving_config(base_commit), ref=base_commit,
                  cache_key=ws.tree_hash(base_commit))
        b = Build(tag="B", tree=tree_b, engine_args=ws.serving_config(camp.incumbent_ref), ref=camp.incumbent_ref,
                  cache_key=ws.tree_hash(camp.incumbent_ref))
        it = camp.next_iteration
        port_a = gate_server(camp.gate, camp.spec, a.engine_args, it)
        port_b = gate_server(camp.gate, camp.spec, b.engine_args, it, exclude=(port_a,))
        ports = {"A": port_a, "B": port_b}
        if parity_server_alongside(camp.spec):   # B's parity server beside them
            ports["B-parity"] = gate_server(camp.gate, camp.spec, b.engine_args, it, exclude=(port_a, port_b))
        bench = camp.spec.benchmark.model_copy(update={"repeats": camp.spec.benchmark.strong_repeats})
        result = camp.measure.ab(camp.backend, a, b, server=camp.spec.server, bench=bench,
                            stats_cfg=camp.spec.stats, parity=camp.spec.parity, work_dir=work,
                            cache_dir=camp.log_dir / "cache", reference=camp.reference,
                            ports=ports, measurement=camp.measurement,
                            progress=lambda m: camp.on_event("progress", {"message": m}))
        bind_step(camp.writer, work, step="final", iteration=it)   # the verdict's evidence, before campaign.end
    except Exception as exc:  # recorded, and the ending then says the branch is not shown to be better
        camp.writer.append(records.ERROR, payload={"phase": "final", "type": type(exc).__name__, "message": str(exc)})
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        ws.remove_copy(tree_a)
        ws.remove_copy(tree_b)
    return result, ""
