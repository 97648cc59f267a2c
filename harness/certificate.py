"""A parity certificate: everything a kept change's parity rests on, in one block.

A reviewer should not have to assemble it from five records: the held prompts' greedy match, the logprob drift on
the held prompts and on the benchmark's own requests against their tolerance and the A/A comparisons that tolerance
was calibrated on, the answer-flip test on the benchmark's known answers, and (where the roofline could be computed)
the fraction of the host's ceilings each measured cell reached. The campaign records it with an accepted change
(agent/serving_campaign.py), its commit carries its one-line form as a trailer, and the report and summary show it
(audit/facts.py reads it back from the log).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.parity import Drift, ParityReport

__all__ = ["parity_certificate", "certificate_line", "certificate_lines"]

# How the certificate names the roofline figures it carries (harness/physics.py's keys).
ROOFLINE_NAMES = {"mfu": "MFU", "mbu": "bandwidth used", "roofline": "share of the floor reached"}


def _drift(nats: float | None, tolerance: float | None, where: str | None) -> dict[str, Any]:
    return {"nats": nats, "tolerance": tolerance, "at": where,
            "within": None if tolerance is None or nats is None else nats <= tolerance}


def _where(drift: Drift | None) -> str | None:
    return f"{drift.prompt_id} token {drift.position}" if drift is not None else None


def parity_certificate(report: ParityReport, *, tolerance_basis: str,
                       roofline: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """The certificate of one A/B's parity (the confirmation's, for a kept change), as plain JSON. `roofline`:
    per cell, the fractions of the host's ceilings the candidate's measurement reached (omitted when none)."""
    held = {"prompts": len(report.verdicts), "identical": sum(v.match for v in report.verdicts),
            "excused": len(report.excused), "mismatches": len(report.mismatches),
            "drift": _drift(report.drift.nats if report.drift else None, report.tolerance, _where(report.drift))}
    cert: dict[str, Any] = {"ok": report.ok, "held": held, "tolerance_basis": tolerance_basis}
    work = report.workload
    if work is not None:
        cert["benchmark"] = {"requests": work.requests, "identical": work.identical, "positions": work.positions,
                             "divergences": len(work.divergences), "ties": len(work.ties) if work.judged else None,
                             "drift": _drift(work.drift.nats if work.drift else None, work.tolerance,
                                             _where(work.drift))}
        if work.scores is not None:
            s = work.scores
            cert["answers"] = {"reference_wrong": s.reference_wrong, "candidate_wrong": s.candidate_wrong,
                               "candidate_only": s.candidate_only, "reference_only": s.reference_only,
                               "p_value": s.p_value, "alpha": s.alpha, "worse": s.worse}
    if roofline:
        cert["roofline"] = {cell: dict(fractions) for cell, fractions in roofline.items()}
    # The reviewer's lines travel with the figures: the report (audit/, which imports nothing of ours) shows them.
    cert["lines"] = certificate_lines(cert)
    cert["line"] = certificate_line(cert)
    return cert


def _drift_text(drift: Mapping[str, Any]) -> str:
    nats, tol = drift.get("nats"), drift.get("tolerance")
    if nats is None:
        return "drift not measured"
    if tol is None:
        return f"drift {nats:.2g} (not judged)"
    return f"drift {nats:.2g} " + ("within" if drift.get("within") else "ABOVE") + f" the tolerance {tol:g}"


def certificate_line(cert: Mapping[str, Any]) -> str:
    """One line (a commit trailer): held, benchmark, answers."""
    held = cert["held"]
    parts = [f"held {held['identical']}/{held['prompts']} identical, {_drift_text(held['drift'])}"]
    bench = cert.get("benchmark")
    if bench:
        parts.append(f"benchmark {bench['identical']}/{bench['requests']} identical, {_drift_text(bench['drift'])} "
                     f"over {bench['positions']} positions")
    answers = cert.get("answers")
    if answers:
        parts.append(f"wrong answers {answers['reference_wrong']} vs {answers['candidate_wrong']} "
                     f"(p {answers['p_value']:.2g})")
    return ("ok: " if cert.get("ok") else "BROKEN: ") + "; ".join(parts)


def certificate_lines(cert: Mapping[str, Any]) -> list[str]:
    """The block a reviewer reads (report, summary): one line per piece of evidence."""
    held, lines = cert["held"], []
    lines.append(f"held prompts (never shown to the proposer): {held['identical']}/{held['prompts']} identical "
                 f"greedy ids" + (f", {held['excused']} excused (the reference was wrong)" if held["excused"] else "")
                 + f"; logprob {_drift_text(held['drift'])} nats" + (f", largest at {held['drift']['at']}"
                                                                      if held["drift"].get("at") else ""))
    bench = cert.get("benchmark")
    if bench:
        lines.append(f"benchmark requests (the measured traffic, every run): {bench['identical']}/{bench['requests']} "
                     f"identical; logprob {_drift_text(bench['drift'])} nats over {bench['positions']:,} positions")
    answers = cert.get("answers")
    if answers:
        lines.append(f"answer flips: wrong only on the candidate {answers['candidate_only']}, only on the reference "
                     f"{answers['reference_only']} (one-sided sign test p = {answers['p_value']:.3g}, alpha "
                     f"{answers['alpha']:g}): " + ("WORSE" if answers["worse"] else "no worse"))
    lines.append(f"tolerance basis: {cert.get('tolerance_basis', '')}")
    for cell, fractions in (cert.get("roofline") or {}).items():
        named = (f"{ROOFLINE_NAMES.get(k, k)} {v:.1%}" for k, v in fractions.items())
        lines.append(f"roofline {cell}: " + ", ".join(named))
    return lines
