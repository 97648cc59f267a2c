"""`ratchet export mlflow DIR`: a campaign as one MLflow run, where research teams already track experiments.

The run holds the campaign's params (spec, proposer, stock engine args, versions, the host's ceilings), per-iteration
metrics (step = iteration: the speedup and its interval, accepted, parity, each cell's place on the roofline), the
final best-vs-stock table, and as artifacts the audit log itself, its public key, the evidence files it binds (raw
benchmark results, prompts, server logs, the parity reference), the report and every accepted diff. Only a log that
verifies is exported (the
tags say against which key): MLflow is a place to look, the log stays the evidence.

MLflow is an optional extra (`pip install 'ratchet[mlflow]'`); any tracking URI MLflow takes works (a local
`file:` store, `sqlite:`, a tracking server's `http(s)://` URL).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from audit.base import VerifyResult
from audit.evidence import bound_paths
from audit.facts import CampaignFacts, CellRoofline, campaign_facts

__all__ = ["ExportError", "export_mlflow"]

CAMPAIGN_TAG = "ratchet.campaign"
_ARTIFACTS = ("log.jsonl", "audit-key.pub", "parity-reference.json")
_BATCH = 100  # MLflow takes at most 100 params / 1,000 metrics per log_batch call


class ExportError(Exception):
    """Nothing was exported, with what to do (exit 2 at the CLI)."""


def _key(name: str) -> str:
    # MLflow keys: alphanumerics, _ - . space / only
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), _BATCH):
        yield items[i:i + _BATCH]


def _artifacts_beside(tracking_uri: str | None) -> str | None:
    """A local sqlite store keeps its artifacts beside its database file (MLflow's own default is ./mlruns in
    whatever directory the export ran from); a server decides for itself."""
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()
    return None


def _params(facts: CampaignFacts) -> dict[str, str]:
    params = {"spec": facts.spec_name, "proposer": facts.proposer, "metric": facts.metric,
              "isolation": facts.isolation, "verdict": facts.verdict_status, "stop_reason": facts.stop_reason}
    params.update({f"engine.{k}": str(v) for k, v in facts.engine_args.items()})
    params.update({f"env.{k}": v for k, v in facts.environment.items()})
    params["ceilings"] = facts.ceilings
    return {_key(k): v[:6000] for k, v in params.items() if v != ""}


def _metrics(facts: CampaignFacts) -> list[tuple[str, float, int]]:
    """(key, value, step) triples."""
    out: list[tuple[str, float, int]] = []
    for it in facts.iterations:
        step = it.iteration
        out += [("accepted", float(it.accepted), step), ("parity_ok", float(it.parity_ok), step)]
        if it.overall:
            out += [("speedup", it.overall.ratio, step), ("speedup_low", it.overall.low, step),
                    ("speedup_high", it.overall.high, step)]
        for c in it.cells:
            out.append((_key(f"cell/{c.cell}/speedup"), c.speedup.ratio, step))
        out += _roofline_metrics("cell", it.roofline, step)
    if facts.final:
        last = max((it.iteration for it in facts.iterations), default=0)
        out += [("final/speedup", facts.final.ratio, last), ("final/low", facts.final.low, last),
                ("final/high", facts.final.high, last)]
        out += [(_key(f"final/{c.cell}/speedup"), c.speedup.ratio, last) for c in facts.final_cells]
        out += _roofline_metrics("final", facts.final_roofline, last)
    for cell, tok_s in facts.baseline:
        out.append((_key(f"stock/{cell}/tok_s"), tok_s, 0))
    out += _roofline_metrics("stock", facts.baseline_roofline, 0)
    if facts.wall_seconds is not None:
        out.append(("wall_seconds", facts.wall_seconds, 0))
    return out


def _roofline_metrics(prefix: str, cells: tuple[CellRoofline, ...], step: int) -> list[tuple[str, float, int]]:
    """Each cell's place on the host's roofline: MFU, bandwidth utilisation, the share of its floor reached,
    and 1.0 where it ran faster than physics allows."""
    out: list[tuple[str, float, int]] = []
    for c in cells:
        for name, value in (("mfu", c.mfu), ("mbu", c.mbu), ("roofline", c.roofline), ("floor_s", c.floor_s)):
            if value is not None:
                out.append((_key(f"{prefix}/{c.cell}/{name}"), value, step))
        if c.measured_s is not None:
            out.append((_key(f"{prefix}/{c.cell}/impossible"), float(c.impossible), step))
    return out


def _final_table(facts: CampaignFacts) -> dict[str, list[Any]]:
    cells = list(facts.final_cells)
    return {"cell": [c.cell for c in cells] + (["overall"] if facts.final else []),
            "speedup": [c.speedup.ratio for c in cells] + ([facts.final.ratio] if facts.final else []),
            "low": [c.speedup.low for c in cells] + ([facts.final.low] if facts.final else []),
            "high": [c.speedup.high for c in cells] + ([facts.final.high] if facts.final else [])}


def export_mlflow(directory: Path, *, verification: VerifyResult, tracking_uri: str | None = None,
                  experiment: str = "ratchet", replace: bool = False, report_dir: Path | None = None
                  ) -> tuple[str, str]:
    """Export one verified campaign log as one MLflow run; return (run id, tracking URI used)."""
    try:
        import mlflow
        from mlflow.entities import Metric, Param, RunTag
    except ImportError:
        raise ExportError("MLflow is not installed: pip install 'ratchet[mlflow]'") from None
    if not verification.ok:
        raise ExportError(f"the log does not verify ({verification.summary()}): nothing exported")
    facts = campaign_facts(directory)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(
        experiment, artifact_location=_artifacts_beside(tracking_uri))
    existing = client.search_runs([experiment_id], filter_string=f"tags.`{CAMPAIGN_TAG}` = '{facts.campaign}'")
    if existing and not replace:
        raise ExportError(f"campaign {facts.campaign} is already run {existing[0].info.run_id} in experiment "
                          f"{experiment!r}: pass --replace to write it again")
    for run in existing:
        client.delete_run(run.info.run_id)
    tags = {CAMPAIGN_TAG: facts.campaign, "ratchet.verified": "true", "ratchet.key": verification.key_source,
            "ratchet.isolation": facts.isolation, "ratchet.verdict": facts.verdict_status,
            "mlflow.note.content": facts.verdict_text or facts.verdict_status}
    run = client.create_run(experiment_id, run_name=facts.campaign, tags=tags)
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        params = [Param(k, v) for k, v in _params(facts).items()]
        metrics = [Metric(k, v, now, step) for k, v, step in _metrics(facts)]
        for chunk in _chunks(params):
            client.log_batch(run_id, params=chunk)
        for chunk in _chunks(metrics):
            client.log_batch(run_id, metrics=chunk)
        client.log_batch(run_id, tags=[RunTag("ratchet.iterations", str(len(facts.iterations)))])
        client.log_dict(run_id, _final_table(facts), "final_comparison.json")
        for name in _ARTIFACTS:   # enough to verify the log again from the artifacts alone
            if (directory / name).is_file():
                client.log_artifact(run_id, str(directory / name), artifact_path="audit")
        if (directory / "blobs").is_dir():
            client.log_artifacts(run_id, str(directory / "blobs"), artifact_path="audit/blobs")
        for rel in bound_paths(directory):   # the evidence files the log binds: verify checks them there too
            if rel not in _ARTIFACTS:
                parent = Path(rel).parent.as_posix()
                client.log_artifact(run_id, str(directory / rel),
                                    artifact_path="audit" if parent == "." else f"audit/{parent}")
        for name in ("report.html", "summary.md"):
            source = (report_dir or directory) / name
            if source.is_file():
                client.log_artifact(run_id, str(source))
        for it in facts.iterations:
            if it.accepted and it.diff:
                client.log_text(run_id, it.diff, f"accepted/iteration-{it.iteration}.diff")
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id, str(mlflow.get_tracking_uri() if tracking_uri is None else tracking_uri)
