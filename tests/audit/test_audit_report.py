"""show and report: a readable timeline, a self-contained HTML report with inline SVG, a summary."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from audit import show, write_report
from audit.report import summarize


def test_show_prints_every_record_with_its_decision(campaign: Any) -> None:
    buffer = io.StringIO()
    count = show(campaign.dir, console=Console(file=buffer, width=200, color_system=None))
    text = buffer.getvalue()
    assert count == 25
    assert "deny-tests" in text and "checkpoint" in text and "ACCEPTED" in text


def test_the_report_is_self_contained_with_the_four_plots(campaign: Any) -> None:
    html_path, md_path = write_report(campaign.dir, pubkey=campaign.key, anchor=campaign.anchor)
    html = html_path.read_text()
    assert html.count("<svg") == 5
    for title in ("Throughput per iteration", "Accepted vs rejected", "Parity", "Decisions by rule"):
        assert title in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert set(re.findall(r"https?://[^\"' ]+", html)) <= {"http://www.w3.org/2000/svg"}
    assert "verified 25 records" in html
    summary = md_path.read_text()
    assert "| deny-tests | deny | 3 |" in summary and "accepted: 1 (1)" in summary


def test_the_report_says_when_the_log_does_not_verify(campaign: Any, tools: dict[str, Any]) -> None:
    lines = tools["lines"](campaign.dir)
    tools["write"](campaign.dir, lines[:-1])
    html_path, _ = write_report(campaign.dir)
    assert "VERIFICATION FAILED" in html_path.read_text()


def test_summaries_count_iterations_and_decisions(campaign: Any) -> None:
    summary = summarize(campaign.dir)
    assert [i for i, _ in summary.iterations] == [0, 1, 2]
    assert [r.parity_ok for _, r in summary.iterations] == [True, True, False]
    assert dict(((rule, v), n) for rule, v, n in summary.decisions)[("builtin-shell", "deny")] == 3
    assert len(summary.policy_hashes) == 1
