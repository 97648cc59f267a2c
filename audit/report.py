"""`ratchet audit report DIR`: a self-contained report.html (inline SVG, no JS) plus summary.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from audit.base import KIND_ITERATION_RESULT, VerifyResult
from audit.reader import payload_of, read_records
from audit.schema import IterationResult
from audit.svg import Point, bars, hbars, points
from audit.verify import verify

__all__ = ["Summary", "summarize", "write_report"]

_COLORS = {"allow": "#2e7d32", "deny": "#c62828", "ask": "#f9a825"}


@dataclass(frozen=True)
class Summary:
    campaign: str
    records: int
    iterations: tuple[tuple[int, IterationResult], ...]
    decisions: tuple[tuple[str, str, int], ...]  # (rule, decision, count), most frequent first
    kinds: tuple[tuple[str, int], ...]
    policy_hashes: tuple[str, ...]
    malformed_results: int
    ending: str = ""    # the campaign's own verdict on itself (campaign.end), first thing a reader sees
    isolation: str = ""


def summarize(directory: Path) -> Summary:
    records = read_records(directory)
    iterations: list[tuple[int, IterationResult]] = []
    malformed = 0
    ending = isolation = ""
    decisions: Counter[tuple[str, str]] = Counter()
    for record in records:
        if record.get("kind") == KIND_ITERATION_RESULT:
            try:
                result = IterationResult.model_validate(payload_of(directory, record))
                iterations.append((int(record.get("iteration") or len(iterations)), result))
            except (ValidationError, TypeError, ValueError):
                malformed += 1
        if record.get("decision"):
            decisions[(str(record.get("rule") or "-"), str(record["decision"]))] += 1
        if record.get("kind") in ("campaign.end", "campaign.start"):
            body = payload_of(directory, record)
            if isinstance(body.get("verdict"), dict):
                ending = f"{body['verdict'].get('status')}: {body['verdict'].get('text')}"
            if body.get("isolation"):
                isolation = str(body["isolation"])
    return Summary(
        campaign=str(records[0].get("campaign")) if records else "?",
        records=len(records),
        iterations=tuple(iterations),
        decisions=tuple((rule, verdict, n) for (rule, verdict), n in decisions.most_common()),
        kinds=tuple(Counter(str(r.get("kind")) for r in records).most_common()),
        policy_hashes=tuple(sorted({str(r["policy_sha256"]) for r in records if r.get("policy_sha256")})),
        malformed_results=malformed,
        ending=ending,
        isolation=isolation,
    )


def _color(result: IterationResult) -> str:
    if result.accepted:
        return "#2e7d32"
    return "#c62828" if not result.parity_ok else "#9e9e9e"


def _charts(summary: Summary) -> list[str]:
    its = summary.iterations
    throughput = [
        Point(float(i), r.throughput_tok_s, _color(r), f"it {i}: {r.throughput_tok_s:g} tok/s {r.reason}")
        for i, r in its
        if r.throughput_tok_s is not None
    ]
    baseline = next((r.incumbent_tok_s for _, r in its if r.incumbent_tok_s is not None), None)
    speedup = [
        Point(float(i), r.speedup, _color(r), f"it {i}: x{r.speedup:g} CI [{r.ci_low}, {r.ci_high}]")
        for i, r in its
        if r.speedup is not None
    ]
    accepted = sum(1 for _, r in its if r.accepted)
    parity_fail = sum(1 for _, r in its if not r.parity_ok)
    rejected = len(its) - accepted
    return [
        points(
            "Throughput per iteration (tok/s; green accepted, red parity fail)",
            throughput,
            y_label="tok/s",
            baseline=baseline,
        ),
        points("Speedup vs incumbent per iteration", speedup, y_label="x", baseline=1.0),
        bars("Accepted vs rejected", [("accepted", accepted, "#2e7d32"), ("rejected", rejected, "#9e9e9e")]),
        bars(
            "Parity",
            [("parity ok", len(its) - parity_fail, "#2e7d32"), ("parity fail", parity_fail, "#c62828")],
        ),
        hbars(
            "Decisions by rule",
            [(f"{rule} ({v})", n, _COLORS.get(v, "#555")) for rule, v, n in summary.decisions],
        ),
    ]


def _status(result: VerifyResult) -> str:
    if result.ok:
        return (
            f"verified {result.records} records, {result.checkpoints} checkpoint(s); key: {result.key_source}"
        )
    return f"VERIFICATION FAILED at seq {result.bad_seq}: {result.reason}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _rows(summary: Summary) -> list[list[str]]:
    return [
        [
            str(i),
            "yes" if r.accepted else "no",
            "ok" if r.parity_ok else "FAIL",
            _num(r.throughput_tok_s),
            _num(r.speedup),
            f"[{_num(r.ci_low)}, {_num(r.ci_high)}]",
            r.commit or "",
            r.reason,
        ]
        for i, r in summary.iterations
    ]


_HEAD = ["iteration", "accepted", "parity", "tok/s", "speedup", "CI", "commit", "reason"]


def _html(summary: Summary, status: str, ok: bool) -> str:
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
        ".ok{color:#2e7d32}.bad{color:#c62828;font-weight:bold}svg{margin:8px 0;display:block}"
    )
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in _rows(summary))
    head = "".join(f"<th>{escape(h)}</th>" for h in _HEAD)
    kinds = ", ".join(f"{escape(k)}: {n}" for k, n in summary.kinds)
    hashes = "<br>".join(escape(h) for h in summary.policy_hashes) or "none recorded"
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ratchet report {escape(summary.campaign)}"
        f"</title><style>{style}</style></head><body><h1>Campaign {escape(summary.campaign)}"
        f"{' (isolation: ' + escape(summary.isolation) + ')' if summary.isolation else ''}</h1>"
        f"<p class='{'ok' if ok else 'bad'}'>{escape(status)}</p>"
        + (f"<p class='{'bad' if summary.ending.startswith('not-shown') else 'ok'}'>Verdict: "
           f"{escape(summary.ending)}</p>" if summary.ending else "<p>Verdict: the campaign has not ended</p>")
        + (f"<p>Isolation: {escape(summary.isolation)}</p>" if summary.isolation else "")
        +
        f"<p>{summary.records} records ({kinds}).</p><p>Policy sha256:<br><code>{hashes}</code></p>"
        + "".join(_charts(summary))
        + f"<h2>Iterations</h2><table><tr>{head}</tr>{rows}</table></body></html>\n"
    )


def _markdown(summary: Summary, status: str) -> str:
    accepted = [i for i, r in summary.iterations if r.accepted]
    lines = [
        f"# Campaign {summary.campaign}" + (f" (isolation: {summary.isolation})" if summary.isolation else ""),
        "",
        f"- Verdict: {summary.ending or 'the campaign has not ended'}",
        f"- Log: {status}",
        *([f"- Isolation: {summary.isolation}"] if summary.isolation else []),
        f"- Records: {summary.records}; iterations: {len(summary.iterations)}; accepted: {len(accepted)}"
        f" ({', '.join(map(str, accepted)) or 'none'}); malformed results: {summary.malformed_results}",
        f"- Policy sha256: {', '.join(summary.policy_hashes) or 'none recorded'}",
        "",
        "| " + " | ".join(_HEAD) + " |",
        "|" + "---|" * len(_HEAD),
        *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in _rows(summary)),
        "",
        "## Decisions by rule",
        "",
        "| rule | decision | count |",
        "|---|---|---|",
        *(f"| {rule} | {v} | {n} |" for rule, v, n in summary.decisions),
        "",
    ]
    return "\n".join(lines)


def write_report(
    directory: Path,
    *,
    out_dir: Path | None = None,
    verification: VerifyResult | None = None,
    **verify_args: Any,
) -> tuple[Path, Path]:
    """Write report.html and summary.md (into `out_dir`, default the log dir); return their paths."""
    result = verification or verify(directory, **verify_args)
    summary = summarize(directory)
    out = out_dir or directory
    out.mkdir(parents=True, exist_ok=True)
    html_path, md_path = out / "report.html", out / "summary.md"
    html_path.write_text(_html(summary, _status(result), result.ok), encoding="utf-8")
    md_path.write_text(_markdown(summary, _status(result)), encoding="utf-8")
    return html_path, md_path
