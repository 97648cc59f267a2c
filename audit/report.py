"""`ratchet audit report DIR`: one self-contained report.html (inline SVG, no script, no link) and summary.md.

Both lead with what a reviewer came for: whether the log verified and against which key, the isolation, best vs
stock with its interval and parity, and the verdict in words. Then the final comparison per cell, the
environment, every iteration (hypothesis, diff, per-cell intervals, parity evidence, the reason for its verdict)
and the gate's decisions. The facts come from `audit/facts.py`; nothing here reads the log itself.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from typing import Any

from audit.base import VerifyResult
from audit.facts import CampaignFacts, CellInterval, CellRoofline, IterationFacts, Ratio, campaign_facts
from audit.plots import decisions_plot, forest_plot, iterations_plot
from audit.verify import verify

__all__ = ["headline", "write_report"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1040px;margin:2em auto;color:#222;line-height:1.4}"
    "table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #ccc;padding:3px 7px;"
    "text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".ok{color:#2e7d32}.bad{color:#c62828;font-weight:bold}.muted{color:#666}"
    ".headline{border:2px solid #888;padding:8px 14px;margin:10px 0;border-radius:6px}"
    ".headline.good{border-color:#2e7d32}.headline.warn{border-color:#c62828}"
    "pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px}details{margin:4px 0 12px}"
    "summary{cursor:pointer}svg{display:block;margin:8px 0;max-width:100%;height:auto}"
)


def _tok(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} tok/s"


def _verified(result: VerifyResult) -> str:
    if result.evidence_problems:   # named on the evidence line below
        return (f"VERIFICATION FAILED: the log's records hold, the evidence beside it does not (first at seq "
                f"{result.bad_seq}); key: {result.key_source}")
    if not result.ok:
        return f"LOG VERIFICATION FAILED at seq {result.bad_seq}: {result.reason}"
    return (f"log verified: {result.records:,} records, {result.checkpoints} signed checkpoint(s), "
            f"key: {result.key_source}")


def _evidence(result: VerifyResult) -> str:
    """Whether the files beside the log (raw results, prompts, server logs, the parity reference) are as bound."""
    if result.evidence_problems:
        shown = "; ".join(result.evidence_problems[:5])
        more = f"; and {len(result.evidence_problems) - 5} more" if len(result.evidence_problems) > 5 else ""
        return f"EVIDENCE MISSING OR CHANGED ({len(result.evidence_problems)} file(s)): {shown}{more}"
    if not result.ok:
        return "evidence: not checked (the log itself did not verify)"
    if not result.evidence_records:
        return "evidence: none bound to this log (written before evidence records): the files beside it are not checked"
    return (f"evidence verified: {result.evidence_files:,} files beside the log (raw benchmark results, prompts, "
            "server logs, parity reference) are as the log bound them")


def _best_vs_stock(facts: CampaignFacts) -> str:
    if facts.final is not None:
        parity = {True: "parity ok", False: "PARITY FAILED", None: "parity not recorded"}[facts.final_parity_ok]
        return f"best vs stock {facts.final} ({parity})"
    if not any(it.accepted for it in facts.iterations):
        return "no change accepted: the campaign's result is stock vLLM"
    return "best vs stock: not measured (no final comparison in the log)"


def headline(facts: CampaignFacts, result: VerifyResult) -> list[str]:
    """The lines a reviewer reads first, in order (the HTML and markdown both start with them)."""
    verdict = (f"{facts.verdict_status}: {facts.verdict_text}" if facts.verdict_status
               else "the campaign has not ended (no campaign.end record)")
    return [
        f"Isolation: {facts.isolation or 'not recorded'}",
        f"Verdict: {verdict}",
        _best_vs_stock(facts),
        _verified(result),
        _evidence(result),
    ]


def _good(facts: CampaignFacts, result: VerifyResult) -> bool:
    return result.ok and facts.verdict_status not in ("not-shown", "") and facts.final_parity_ok is not False


def _table(head: list[str] | None, rows: list[list[str]], numeric: frozenset[int] | set[int] = frozenset()) -> str:
    th = f"<tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr>" if head else ""
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{th}{body}</table>"


def _cell_rows(cells: tuple[CellInterval, ...]) -> list[list[str]]:
    return [[c.cell, f"{c.speedup.ratio:.3f}×", f"[{c.speedup.low:.3f}, {c.speedup.high:.3f}]",
             _tok(c.incumbent), _tok(c.candidate)] for c in cells]


_CELL_HEAD = ["cell", "speedup B/A", "interval", "A (incumbent) median", "B (candidate) median"]


_ROOFLINE_HEAD = ["cell", "FLOPs served / least", "bytes", "floor s", "bound", "measured s", "MFU", "MBU",
                  "of roofline", "physics"]
ROOFLINE_NOTE = ("Each cell on the host's roofline: floor = max(least FLOPs / matmul rate, bytes / bandwidth) at the "
                 "ceilings measured when the campaign began; FLOPs served count every layer on every prompt token as "
                 "vLLM runs by default (MFU is on these), least skips what feeds no stored key or value. A cell "
                 "faster than its floor at the fastest ceiling sample is impossible and its candidate quarantined.")


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:,.1f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _roofline_rows(cells: tuple[CellRoofline, ...]) -> list[list[str]]:
    rows = []
    for c in cells:
        if c.omitted:
            rows.append([c.cell, *["–"] * 8, f"omitted: {c.omitted}"])
            continue
        physics = "IMPOSSIBLE" if c.impossible else "ok" if c.measured_s is not None else "no ceilings"
        rows.append([c.cell, f"{_si(c.flops, 'FLOP')} / {_si(c.min_flops, 'FLOP')}", _si(c.bytes, "B"),
                     "–" if c.floor_s is None else f"{c.floor_s:.3g}", c.bound or "–",
                     "–" if c.measured_s is None else f"{c.measured_s:.3g}", _share(c.mfu), _share(c.mbu),
                     _share(c.roofline), physics])
    return rows


def _roofline_html(facts: CampaignFacts) -> list[str]:
    if not (facts.ceilings or facts.baseline_roofline):
        return []
    parts = ["<h2>Roofline</h2>", f"<p>Ceilings: {escape(facts.ceilings or 'not recorded')}</p>",
             f"<p class=muted>{escape(ROOFLINE_NOTE)}</p>"]
    for title, cells in (("Stock", facts.baseline_roofline), ("Best (final comparison)", facts.final_roofline)):
        if cells:
            parts += [f"<h3>{title}</h3>", _table(_ROOFLINE_HEAD, _roofline_rows(cells), set(range(1, 9)))]
    return parts


def _roofline_md(facts: CampaignFacts) -> list[str]:
    if not (facts.ceilings or facts.baseline_roofline):
        return []
    lines = ["## Roofline", "", f"Ceilings: {_md(facts.ceilings or 'not recorded')}", "", ROOFLINE_NOTE, ""]
    for title, cells in (("Stock", facts.baseline_roofline), ("Best (final comparison)", facts.final_roofline)):
        if cells:
            lines += [f"### {title}", "", "| " + " | ".join(_ROOFLINE_HEAD) + " |",
                      "|---|" + "---:|" * 8 + "---|",
                      *("| " + " | ".join(_md(c) for c in row) + " |" for row in _roofline_rows(cells)), ""]
    return lines


def _environment(facts: CampaignFacts) -> list[list[str]]:
    env = dict(facts.environment)
    order = ["vllm", "torch", "transformers", "attention_backend", "gpu", "cpu", "cpus", "machine", "platform",
             "python", "ratchet_commit", "harness_sha256"]
    rows = [[k, env.pop(k)] for k in order if k in env] + [[k, v] for k, v in sorted(env.items())]
    rows.append(["engine args (stock)", ", ".join(f"{k}={v}" for k, v in sorted(facts.engine_args.items())) or "–"])
    rows.append(["spec / proposer", f"{facts.spec_name or '?'} / {facts.proposer or '?'}"])
    return rows


def _certificate_html(title: str, lines: tuple[str, ...]) -> str:
    return f"<p><b>{escape(title)}:</b></p><ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def _iteration_html(it: IterationFacts) -> str:
    status = it.status
    ratio = str(it.overall) if it.overall else "–"
    css = "ok" if it.accepted else "bad" if it.parity_broken or it.outcome in ("failed", "tampered") else "muted"
    parts = [f"<h3>Iteration {it.iteration}: <span class='{css}'>"
             f"{escape(status)}</span> — {escape(ratio)}</h3>",
             f"<p><b>Hypothesis:</b> {escape(it.hypothesis or '–')}</p>",
             f"<p><b>Verdict:</b> {escape(it.reason or '–')}</p>",
             f"<p><b>Parity:</b> {escape(it.parity or '–')}</p>"]
    if it.accepted and it.certificate:
        parts.append(_certificate_html("Parity certificate", it.certificate))
    if it.screen and it.overall and it.screen != it.overall:
        parts.append(f"<p class=muted>screen {escape(str(it.screen))}, confirmation {escape(str(it.overall))}</p>")
    if it.divergences:
        parts.append("<details><summary>Divergences (" + str(len(it.divergences)) + ")</summary>" + _table(
            ["where", "position", "reference token", "candidate token", "reference margin (nats)", "note"],
            [[d.where, str(d.position), str(d.reference_token), str(d.candidate_token),
              "–" if d.reference_margin is None else f"{d.reference_margin:.2f}", d.excused]
             for d in it.divergences], {1, 4}) + "</details>")
    if it.cells:
        parts.append("<details><summary>Per-cell results</summary>"
                     + _table(_CELL_HEAD, _cell_rows(it.cells), {1, 3, 4})
                     + "</details>")
    if it.roofline:
        parts.append("<details><summary>The candidate on the roofline</summary>"
                     + _table(_ROOFLINE_HEAD, _roofline_rows(it.roofline), set(range(1, 9))) + "</details>")
    if it.diff:   # an accepted change's diff is what a reviewer reads: open
        parts.append(f"<details{' open' if it.accepted else ''}><summary>Diff ({it.diff.count(chr(10))} lines)"
                     f"</summary><pre>{escape(it.diff)}</pre>"
                     "</details>")
    return "".join(parts)


def _html(facts: CampaignFacts, result: VerifyResult) -> str:
    head = headline(facts, result)
    # the verdict in words is the line to read; a log that does not verify is shouted
    box = "".join(f"<p class='{'bad' if i in (3, 4) and not result.ok else ''}'>"
                  + (f"<strong style='font-size:1.15em'>{escape(line)}</strong>" if i == 1 else escape(line)) + "</p>"
                  for i, line in enumerate(head))
    sections = [
        f"<h1>Campaign {escape(facts.campaign)} (isolation: {escape(facts.isolation or 'not recorded')})</h1>",
        f"<div class='headline {'good' if _good(facts, result) else 'warn'}'>{box}</div>",
    ]
    if facts.final is not None:
        sections += ["<h2>Final comparison: best vs stock</h2>",
                     forest_plot("Best vs stock per cell (paired speedup and interval)", facts.final_cells, facts.final,
                                 accept_lower_bound=facts.accept_lower_bound),
                     _table(_CELL_HEAD[:3], [r[:3] for r in _cell_rows(facts.final_cells)]
                            + [[label, f"{r.ratio:.3f}×", f"[{r.low:.3f}, {r.high:.3f}]"]
                               for label, r in _headlines(facts)], {1})]
        if facts.final_images is not None:
            sections.append(f"<p class=muted>{escape(IMAGE_CELLS_NOTE)}</p>")
        if facts.final_certificate:
            sections.append(_certificate_html("Parity certificate of the final comparison", facts.final_certificate))
    sections += ["<h2>Environment</h2>", _table(None, _environment(facts))]
    if facts.baseline:
        sections += ["<h2>Stock vLLM (baseline)</h2>",
                     _table(["cell", "headline throughput"], [[c, _tok(v)] for c, v in facts.baseline], {1})]
    sections += _roofline_html(facts)
    sections.append(f"<h2>Iterations ({len(facts.iterations)})</h2>")
    if facts.iterations:
        sections.append(iterations_plot(facts.iterations))
        sections += [_iteration_html(it) for it in facts.iterations]
    if facts.decisions:
        sections += ["<h2>Gate decisions</h2>", decisions_plot(facts.decisions),
                     _table(["rule", "decision", "count"], [[r, d, str(n)] for r, d, n in facts.decisions], {2})]
    kinds = ", ".join(f"{k}: {n}" for k, n in facts.kinds)
    sections.append(f"<p class=muted>{facts.records:,} records ({escape(kinds)}); policy sha256 "
                    f"{escape(', '.join(facts.policy_hashes) or 'none recorded')}; malformed records: {facts.malformed}"
                    f"{'; stop: ' + escape(facts.stop_reason) if facts.stop_reason else ''}</p>")
    return (f"<!DOCTYPE html><html lang=en><head><meta charset='utf-8'><title>ratchet · {escape(facts.campaign)}"
            f"</title><style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>\n")


def _md_cells(cells: tuple[CellInterval, ...], *, medians: bool = True) -> list[str]:
    width = len(_CELL_HEAD) if medians else 3
    return ["| " + " | ".join(_CELL_HEAD[:width]) + " |", "|---|---:|---|---:|---:|"[:4 * width + 1],
            *("| " + " | ".join(row[:width]) + " |" for row in _cell_rows(cells))]


def _md(text: str) -> str:
    """Candidate-written text (an LLM's hypothesis, a reason quoting it) as inert markdown: no HTML, no table break."""
    return escape(text, quote=False).replace("|", "/").replace("\n", " ")


IMAGE_CELLS_NOTE = ("Cells labelled imgNxS send N pictures of S px per request through the chat endpoint; their "
                    "throughput counts text and image tokens as the server counted them. The text cells' headline is "
                    "the claim; the image cells' is guarded (slower past the cell guard is not accepted).")


def _headlines(facts: CampaignFacts, overall: str = "overall (geo-mean)") -> list[tuple[str, Ratio]]:
    """The final comparison's headline rows: one overall, or one per kind of cell when the grid has pictures."""
    assert facts.final is not None
    if facts.final_images is None:
        return [(overall, facts.final)]
    return [("text cells (geo-mean)", facts.final), ("image cells (geo-mean)", facts.final_images)]


def _markdown(facts: CampaignFacts, result: VerifyResult) -> str:
    lines = [f"# Campaign {facts.campaign} (isolation: {facts.isolation or 'not recorded'})", "",
             *(f"- {line}" for line in headline(facts, result)), ""]
    if facts.final is not None:
        lines += ["## Final comparison: best vs stock", "", *_md_cells(facts.final_cells, medians=False),
                  *(f"| **{label}** | {r.ratio:.3f}× | [{r.low:.3f}, {r.high:.3f}] |"
                    for label, r in _headlines(facts, "overall")), ""]
        if facts.final_images is not None:
            lines += [IMAGE_CELLS_NOTE, ""]
        if facts.final_certificate:
            lines += ["Parity certificate of the final comparison:", "",
                      *(f"- {_md(line)}" for line in facts.final_certificate), ""]
    lines += ["## Environment", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in _environment(facts)), ""]
    lines += _roofline_md(facts)
    lines += [f"## Iterations ({len(facts.iterations)})", "",
              "| iteration | verdict | speedup [interval] | parity | reason |", "|---|---|---|---|---|"]
    for it in facts.iterations:
        status = it.status
        lines.append(f"| {it.iteration} | {status} | {it.overall or '–'} | {_md(it.parity)} | {_md(it.reason)} |")
    for it in facts.iterations:
        lines += ["", f"### Iteration {it.iteration}", "", f"Hypothesis: {_md(it.hypothesis) or '–'}", "",
                  f"Parity: {_md(it.parity) or '–'}", ""]
        if it.accepted and it.certificate:
            lines += ["Parity certificate:", "", *(f"- {_md(line)}" for line in it.certificate), ""]
        if it.divergences:
            lines += ["| diverged at | position | reference → candidate token | reference margin (nats) | note |",
                      "|---|---:|---|---:|---|",
                      *(f"| {_md(d.where)} | {d.position} | {d.reference_token} → {d.candidate_token} | "
                        f"{'–' if d.reference_margin is None else f'{d.reference_margin:.2f}'} | {_md(d.excused)} |"
                        for d in it.divergences[:10]), ""]
        if it.cells:
            lines += _md_cells(it.cells)
        if it.diff:   # a fence longer than any backtick run in the diff, so the diff cannot close it
            fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", it.diff)), default=0))
            lines += ["", "<details><summary>diff</summary>", "", f"{fence}diff", it.diff.rstrip("\n"), fence, "",
                      "</details>"]
    lines += ["", "## Gate decisions", "", "| rule | decision | count |", "|---|---|---:|",
              *(f"| {r} | {d} | {n} |" for r, d, n in facts.decisions), ""]
    return "\n".join(lines)


def write_report(directory: Path, *, out_dir: Path | None = None, verification: VerifyResult | None = None,
                 **verify_args: Any) -> tuple[Path, Path]:
    """Write report.html and summary.md (into `out_dir`, default the log dir); return their paths."""
    result = verification or verify(directory, **verify_args)
    facts = campaign_facts(directory)
    out = out_dir or directory
    out.mkdir(parents=True, exist_ok=True)
    html_path, md_path = out / "report.html", out / "summary.md"
    html_path.write_text(_html(facts, result), encoding="utf-8")
    md_path.write_text(_markdown(facts, result), encoding="utf-8")
    return html_path, md_path
