"""What a reviewer reads off a campaign's log, gathered once: the headline (verdict, best vs stock, isolation,
environment), each iteration's hypothesis, diff, parity evidence and per-cell intervals, and the gate's decisions.

The report (HTML, markdown) and the MLflow export render these facts; neither reads the log itself. A log written
by an older ratchet lacks some records: the facts are then absent (None / empty), never invented.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.reader import payload_of, read_records

__all__ = ["CampaignFacts", "CellInterval", "CellRoofline", "Divergence", "IterationFacts", "Ratio", "campaign_facts"]


@dataclass(frozen=True)
class Ratio:
    """A paired B/A speedup with its interval (`harness/stats.py`), over `n` interleaved pairs."""

    ratio: float
    low: float
    high: float
    n: int | None = None

    @classmethod
    def of(cls, body: Any) -> Ratio | None:
        keys = ("ratio", "low", "high")
        if not isinstance(body, dict) or not all(isinstance(body.get(k), int | float) for k in keys):
            return None
        n = body.get("n")
        return cls(float(body["ratio"]), float(body["low"]), float(body["high"]), n if isinstance(n, int) else None)

    def __str__(self) -> str:
        return f"{self.ratio:.3f}× [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class CellInterval:
    cell: str
    speedup: Ratio
    incumbent: float | None = None  # A's median of the headline metric in the same A/B
    candidate: float | None = None  # B's


@dataclass(frozen=True)
class CellRoofline:
    """A cell on the host's roofline (harness/physics.py): its work, its floor, what was reached of it."""

    cell: str
    flops: float | None = None         # as vLLM serves by default
    min_flops: float | None = None     # the least an exact implementation needs (the floor counts these)
    bytes: float | None = None
    floor_s: float | None = None
    measured_s: float | None = None
    mfu: float | None = None
    mbu: float | None = None
    roofline: float | None = None      # floor_s / measured_s
    bound: str = ""
    impossible: bool = False
    omitted: str = ""                  # why this cell has no roofline

    @classmethod
    def of(cls, cell: str, body: Any) -> CellRoofline | None:
        if not isinstance(body, dict):
            return None
        numbers = {k: _float(body.get(k)) for k in ("flops", "min_flops", "bytes", "floor_s", "measured_s", "mfu",
                                                    "mbu", "roofline")}
        return cls(cell, **numbers, bound=str(body.get("bound") or ""), impossible=body.get("impossible") is True,
                   omitted=str(body.get("omitted") or ""))


def _rooflines(rows: Any) -> tuple[CellRoofline, ...]:
    """The roofline column of a grid's rows (baseline.result cells, iteration.result cells_rows)."""
    out = [CellRoofline.of(str(r.get("cell")), r.get("roofline")) for r in rows or [] if isinstance(r, dict)]
    return tuple(sorted((r for r in out if r is not None), key=lambda r: _cell_key(r.cell)))


def _ceilings_line(body: Any) -> str:
    """The host's ceilings a campaign was judged against, in words ("" for a log from before them)."""
    if not isinstance(body, dict):
        return ""
    if body.get("omitted"):
        return f"not measured: {body['omitted']}"
    flop_s, bytes_s = _float(body.get("flop_s")), _float(body.get("bytes_s"))
    if flop_s is None or bytes_s is None:
        return ""
    rate = f"{flop_s / 1e12:,.1f} TFLOP/s" if flop_s >= 1e12 else f"{flop_s / 1e9:,.1f} GFLOP/s"
    parts = [f"{rate} ({body.get('dtype') or '?'} matmul), {bytes_s / 1e9:,.1f} GB/s", str(body.get("source") or "")]
    return "; ".join(p for p in parts + [str(body.get("spread") or "")] if p)


@dataclass(frozen=True)
class Divergence:
    """Where a candidate's greedy tokens left the reference's (held prompt or benchmark request)."""

    where: str  # "held-017" or "in512/out32 repeat 1 request 26"
    position: int | None
    reference_token: int | None
    candidate_token: int | None
    reference_margin: float | None
    excused: str = ""  # why it does not count, when it does not


@dataclass(frozen=True)
class IterationFacts:
    iteration: int
    accepted: bool
    parity_ok: bool
    outcome: str = ""
    reason: str = ""
    hypothesis: str = ""
    source: str = ""
    diff: str = ""
    overall: Ratio | None = None
    screen: Ratio | None = None
    cells: tuple[CellInterval, ...] = ()
    parity: str = ""  # one line: held prompts identical / diverged, drift, workload
    divergences: tuple[Divergence, ...] = ()
    commit: str | None = None
    certificate: tuple[str, ...] = ()   # the parity certificate's lines (harness/certificate.py), when recorded
    roofline: tuple[CellRoofline, ...] = ()   # the candidate's cells on the host's roofline (its A/B's evidence)

    @property
    def parity_broken(self) -> bool:
        """Parity was checked and failed (old logs have no outcome: then `parity_ok` alone says it)."""
        return self.outcome == "parity-broken" or (not self.outcome and not self.accepted and not self.parity_ok)

    @property
    def status(self) -> str:
        """What a reader sees: an iteration that failed, was denied or gave up before parity ran says that,
        not "parity failed"."""
        if self.accepted:
            return "accepted"
        return "parity failed" if self.parity_broken else self.outcome or "rejected"


@dataclass(frozen=True)
class CampaignFacts:
    campaign: str
    records: int
    isolation: str = ""
    spec_name: str = ""
    proposer: str = ""
    metric: str = "total_token_throughput"
    accept_lower_bound: float | None = None  # the spec's accept rule, drawn on the final comparison's plot
    environment: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    baseline: tuple[tuple[str, float], ...] = ()  # (cell, stock's headline tok/s)
    ceilings: str = ""                             # the host's ceilings the cells were placed against, in words
    baseline_roofline: tuple[CellRoofline, ...] = ()
    final_roofline: tuple[CellRoofline, ...] = ()  # best's cells in the final comparison
    verdict_status: str = ""
    verdict_text: str = ""
    stop_reason: str = ""
    wall_seconds: float | None = None
    final: Ratio | None = None
    final_images: Ratio | None = None       # the image cells' own headline (then `final` is the text cells')
    final_cells: tuple[CellInterval, ...] = ()
    final_parity_ok: bool | None = None
    final_certificate: tuple[str, ...] = ()   # the final comparison's parity certificate (its lines)
    iterations: tuple[IterationFacts, ...] = ()
    decisions: tuple[tuple[str, str, int], ...] = ()  # (rule, decision, count), most frequent first
    kinds: tuple[tuple[str, int], ...] = ()
    policy_hashes: tuple[str, ...] = ()
    malformed: int = 0


def _cells(body: Any, a_rows: Any = None, b_rows: Any = None, metric: str = "") -> tuple[CellInterval, ...]:
    """Per-cell headline intervals of an A/B (`cells` of iteration.result or of the final comparison)."""
    if not isinstance(body, dict):
        return ()
    a = {r.get("cell"): r for r in a_rows or [] if isinstance(r, dict)}
    b = {r.get("cell"): r for r in b_rows or [] if isinstance(r, dict)}
    out = []
    for cell, stats in sorted(body.items(), key=lambda kv: _cell_key(kv[0])):
        ratio = Ratio.of(stats.get("headline") if isinstance(stats, dict) and "headline" in stats else stats)
        if ratio is None:
            continue
        metric_of = _headline_metric(cell, metric)
        out.append(CellInterval(cell, ratio, _float(a.get(cell, {}).get(metric_of)),
                                _float(b.get(cell, {}).get(metric_of))))
    return tuple(out)


def _headline_metric(cell: str, metric: str) -> str:
    # prefill cells (output 1) are judged on prefill throughput, the others on the spec's metric
    return "prefill_tok_s" if cell.split("/")[1:2] == ["out1"] else metric


def _cell_key(cell: str) -> tuple[int, int, int, str]:
    """Text cells first, then image cells (`in16/out32/img1x96`), each by input then output length."""
    try:
        i, o, *media = cell.split("/")
        return len(media), int(i.removeprefix("in")), int(o.removeprefix("out")), cell
    except ValueError:
        return 1 << 30, 0, 0, cell


def _dict(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    return value if isinstance(value, dict) else {}


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _certificate(body: dict[str, Any]) -> tuple[str, ...]:
    lines = _dict(body, "certificate").get("lines")
    return tuple(str(line) for line in lines) if isinstance(lines, list) else ()


def _parity_line(body: dict[str, Any]) -> tuple[str, tuple[Divergence, ...]]:
    verdicts = [v for v in body.get("verdicts") or [] if isinstance(v, dict)]
    same = sum(1 for v in verdicts if v.get("match"))
    divergences = [
        Divergence(str(v.get("prompt_id")), v.get("first_divergence"), v.get("reference_token"),
                   v.get("candidate_token"), _float(v.get("reference_margin")),
                   "the reference was wrong, the candidate right" if v.get("reference_wrong") else "")
        for v in verdicts if not v.get("match")]
    parts = [f"held prompts {same}/{len(verdicts)} identical"]
    drift = body.get("drift")
    if isinstance(drift, dict) and _float(drift.get("nats")) is not None:
        tol = _float(body.get("logprob_tolerance"))
        parts.append(f"logprob drift {drift['nats']:.2g} nats at {drift.get('prompt_id')} token {drift.get('position')}"
                     + (f" (tolerance {tol:g})" if tol is not None else " (not checked)"))
    workload = body.get("workload")
    if isinstance(workload, dict):
        n = workload.get("divergence_count", 0)
        total = f" of {workload['requests']:,}" if isinstance(workload.get("requests"), int) else ""
        scores = workload.get("scores") if isinstance(workload.get("scores"), dict) else {}
        judged = (f"; wrong answers: reference {scores.get('reference_wrong')}, candidate "
                  f"{scores.get('candidate_wrong')} (sign test p = {scores.get('p_value', float('nan')):.3g})"
                  if scores else "")
        verdict = workload.get("ok")
        ok = (", no worse" if verdict is True else ", WORSE" if verdict is False else "") if scores else ""
        parts.append(f"benchmark requests: {n}{total} diverged{judged}{ok}")
        for d in (workload.get("divergences") or [])[:20]:
            if isinstance(d, dict):
                divergences.append(Divergence(
                    f"{d.get('cell')} repeat {d.get('repeat')} request {d.get('request')}", d.get("position"),
                    d.get("reference_token"), d.get("candidate_token"), _float(d.get("reference_margin")),
                    "" if d.get("candidate_wrong_only") else "both or neither wrong"))
    return "; ".join(parts), tuple(divergences)


def _end_facts(body: dict[str, Any], *, metric: str) -> dict[str, Any]:
    """What campaign.end says: the verdict, why the loop stopped, and the final best-vs-stock comparison."""
    verdict = _dict(body, "verdict")
    facts: dict[str, Any] = {
        "verdict_status": str(verdict.get("status") or ""), "verdict_text": str(verdict.get("text") or ""),
        "stop_reason": str(body.get("stop_reason") or ""),
        "wall_seconds": _float((body.get("spent") or {}).get("wall_seconds"))}
    final = _dict(body, "final")
    if final:
        roofline = _dict(final, "roofline")
        facts.update(final=Ratio.of(final.get("overall")), final_images=Ratio.of(final.get("images")),
                     final_cells=_cells(final.get("cells"), metric=metric),
                     final_parity_ok=final.get("parity_ok") if isinstance(final.get("parity_ok"), bool) else None,
                     final_certificate=_certificate(final),
                     final_roofline=_rooflines([{"cell": c, "roofline": r} for c, r in roofline.items()]))
    return facts


def campaign_facts(directory: Path) -> CampaignFacts:
    records = read_records(directory)
    by_it: dict[int, dict[str, Any]] = {}
    facts: dict[str, Any] = {}
    decisions: Counter[tuple[str, str]] = Counter()
    malformed = 0
    for record in records:
        kind = str(record.get("kind"))
        if record.get("decision"):
            decisions[(str(record.get("rule") or "-"), str(record["decision"]))] += 1
        try:
            body = payload_of(directory, record)
        except (OSError, ValueError):
            malformed += 1
            continue
        it = record.get("iteration")
        slot = by_it.setdefault(int(it), {}) if isinstance(it, int) else {}
        if kind == "campaign.start":
            facts["isolation"] = str(body.get("isolation") or "")
            spec = _dict(body, "spec")
            facts["spec_name"] = str(spec.get("name") or "")
            stats = spec.get("stats") or {}
            facts["metric"] = str(stats.get("metric") or "total_token_throughput")
            facts["accept_lower_bound"] = _float(stats.get("accept_lower_bound"))
            facts["proposer"] = str(body.get("proposer") or "")
            env = _dict(body, "environment")
            facts["environment"] = {k: str(v) for k, v in env.items() if v is not None}
        elif kind == "baseline.result":
            facts["engine_args"] = dict(body.get("engine_args") or {})
            facts["ceilings"] = _ceilings_line(body.get("ceilings"))
            facts["baseline_roofline"] = _rooflines(body.get("cells"))
            evidence = _dict(body, "evidence")
            if evidence.get("attention_backend"):
                facts.setdefault("environment", {})["attention_backend"] = str(evidence["attention_backend"])
            metric = facts.get("metric", "total_token_throughput")
            facts["baseline"] = tuple(sorted((
                (str(r.get("cell")), float(r[_headline_metric(str(r.get("cell")), metric)]))
                for r in body.get("cells") or [] if isinstance(r, dict)
                and _float(r.get(_headline_metric(str(r.get("cell")), metric))) is not None),
                key=lambda row: _cell_key(row[0])))
        elif kind == "iteration.hypothesis":
            slot.update(hypothesis=str(body.get("hypothesis") or ""), source=str(body.get("source") or ""))
        elif kind == "iteration.patch":
            slot["diff"] = str(body.get("diff") or "")
        elif kind == "iteration.parity":
            slot["parity"], slot["divergences"] = _parity_line(body)  # the last A/B's parity (confirm after screen)
        elif kind == "iteration.result":
            if not isinstance(body.get("accepted"), bool) or not isinstance(body.get("parity_ok"), bool):
                malformed += 1
                continue
            metric = facts.get("metric", "total_token_throughput")
            screen = _dict(body, "screen")
            overall = (Ratio(float(body["speedup"]), float(body["ci_low"]), float(body["ci_high"]))
                       if all(_float(body.get(k)) is not None for k in ("speedup", "ci_low", "ci_high")) else None)
            slot.update(
                accepted=body["accepted"], parity_ok=body["parity_ok"], outcome=str(body.get("outcome") or ""),
                reason=str(body.get("reason") or ""), commit=body.get("commit"), overall=overall,
                screen=Ratio.of({"ratio": screen.get("speedup"), "low": screen.get("ci_low"),
                                 "high": screen.get("ci_high")}),
                cells=_cells(body.get("cells"), body.get("incumbent_rows"), body.get("cells_rows"), metric),
                certificate=_certificate(body), roofline=_rooflines(body.get("cells_rows")), result=True)
        elif kind == "campaign.end":
            facts.update(_end_facts(body, metric=facts.get("metric", "")))
    iterations = tuple(
        IterationFacts(iteration=i, accepted=s["accepted"], parity_ok=s["parity_ok"], outcome=s["outcome"],
                       reason=s["reason"], hypothesis=s.get("hypothesis", ""), source=s.get("source", ""),
                       diff=s.get("diff", ""), overall=s["overall"], screen=s["screen"], cells=s["cells"],
                       parity=s.get("parity", ""), divergences=s.get("divergences", ()), commit=s["commit"],
                       certificate=s.get("certificate", ()), roofline=s.get("roofline", ()))
        for i, s in sorted(by_it.items()) if s.get("result"))
    return CampaignFacts(
        campaign=str(records[0].get("campaign")) if records else "?",
        records=len(records),
        iterations=iterations,
        decisions=tuple((rule, verdict, n) for (rule, verdict), n in decisions.most_common()),
        kinds=tuple(Counter(str(r.get("kind")) for r in records).most_common()),
        policy_hashes=tuple(sorted({str(r["policy_sha256"]) for r in records if r.get("policy_sha256")})),
        malformed=malformed,
        **facts,
    )
