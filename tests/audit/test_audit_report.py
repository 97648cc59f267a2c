"""show and report: a readable timeline; a self-contained HTML report and a summary that lead with the headline
(isolation, verdict, best vs stock, which key verified the log); the facts they are drawn from."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from audit import show, verify, write_report
from audit.facts import campaign_facts
from tests.audit.conftest import unpack_run1


@pytest.fixture(scope="module")
def real_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_run1(tmp_path_factory.mktemp("run1"))


def test_show_prints_every_record_with_its_decision(campaign: Any) -> None:
    buffer = io.StringIO()
    count = show(campaign.dir, console=Console(file=buffer, width=200, color_system=None))
    text = buffer.getvalue()
    assert count == 25
    assert "deny-tests" in text and "checkpoint" in text and "ACCEPTED" in text


def test_the_report_is_self_contained(campaign: Any) -> None:
    html_path, md_path = write_report(campaign.dir, pubkey=campaign.key, anchor=campaign.anchor)
    html = html_path.read_text()
    assert html.count("<svg") == 2  # iterations and gate decisions (no final comparison in this log)
    assert "Speedup vs incumbent per iteration" in html and "Gate decisions by rule" in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    # only the SVG namespaces: nothing is fetched
    assert set(re.findall(r"https?://[^\"' ]+", html)) <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    assert f"log verified: 25 records, 2 signed checkpoint(s), key: given public key {campaign.key}" in html
    summary = md_path.read_text()
    assert "| deny-tests | deny | 3 |" in summary
    assert "| 1 | accepted | 1.070× [1.050, 1.090] |" in summary


def test_the_report_says_when_the_log_does_not_verify(campaign: Any, tools: dict[str, Any]) -> None:
    lines = tools["lines"](campaign.dir)
    tools["write"](campaign.dir, lines[:-1])
    html_path, md_path = write_report(campaign.dir)
    assert "LOG VERIFICATION FAILED" in html_path.read_text()
    assert "- LOG VERIFICATION FAILED" in md_path.read_text()


def test_the_facts_of_a_real_campaign(real_log: Path) -> None:
    facts = campaign_facts(real_log)
    assert facts.verdict_status == "improved" and facts.final is not None
    assert (round(facts.final.ratio, 3), round(facts.final.low, 3), round(facts.final.high, 3)) == (1.367, 1.281, 1.459)
    assert len(facts.final_cells) == 9 and facts.final_parity_ok is True
    assert facts.environment["vllm"] == "0.32.0" and facts.environment["cpus"] == "2"
    assert [it.accepted for it in facts.iterations] == [False, False, True]
    accepted = facts.iterations[2]
    assert accepted.diff.startswith("diff --git") and "enforce_eager" in accepted.diff
    assert "held prompts 64/64 identical" in accepted.parity and len(accepted.cells) == 9
    assert all(c.incumbent and c.candidate for c in accepted.cells)  # A's and B's medians of the same A/B


def test_a_real_campaigns_report_leads_with_its_headline(real_log: Path, tmp_path: Path) -> None:
    html_path, md_path = write_report(real_log, out_dir=tmp_path)
    html = html_path.read_text()
    order = [html.index(s) for s in ("Isolation: local", "Verdict: improved", "best vs stock 1.367× [1.281, 1.459]",
                                     "log verified: 48 records", "Final comparison: best vs stock", "Environment",
                                     "Iteration 3: <span class='ok'>accepted")]
    assert order == sorted(order)
    assert html.count("<svg") == 3 and "accept bound 1.02×" in html
    assert "<details open><summary>Diff" in html  # the accepted change's diff is open; the others are folded
    assert "16,783 tok/s" in html  # thousands separators, units
    summary = md_path.read_text().splitlines()
    assert summary[2:6] == ["- Isolation: local", summary[3], "- best vs stock 1.367× [1.281, 1.459] (parity ok)",
                            summary[5]] and summary[3].startswith("- Verdict: improved: best vs stock 1.367x")
    assert "| **overall** | 1.367× | [1.281, 1.459] |" in md_path.read_text()


def test_two_reports_of_one_log_are_identical(real_log: Path, tmp_path: Path) -> None:
    a, _ = write_report(real_log, out_dir=tmp_path / "a")
    b, _ = write_report(real_log, out_dir=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


def test_the_real_log_verifies(real_log: Path) -> None:
    assert verify(real_log).ok


def test_the_attention_backend_is_read_from_the_server_log(tmp_path: Path) -> None:
    from harness.server import attention_backend

    log = tmp_path / "server.log"
    log.write_text("INFO [cuda.py:1] Using AttentionBackendEnum.TRITON_ATTN backend.\n")
    assert attention_backend(log) == "TRITON_ATTN"
    log.write_text("INFO forcing TRITON_ATTN backend.\nINFO [cpu.py:178] Cannot use AttentionBackendEnum.TRITON_ATTN "
                   "backend on CPU.\n")
    assert attention_backend(log).startswith("CPU_ATTN")
    log.write_text("nothing about attention\n")
    assert attention_backend(log) == "not logged"


def test_candidate_text_cannot_inject_markup(tmp_path: Path) -> None:
    """An LLM's hypothesis and diff are the agent's words: inert in both the page and the summary."""
    from audit import AuditWriter

    evil = "<script>alert(1)</script> | ```"
    with AuditWriter.open(tmp_path / "log", campaign="c", anchor_dir=tmp_path / "anchors") as writer:
        writer.append("iteration.hypothesis", iteration=1, payload={"hypothesis": evil})
        writer.append("iteration.patch", iteration=1, payload={"diff": "+ x = 1 # ``` </pre><script>x</script>\n"})
        writer.append("iteration.result", iteration=1, payload={"accepted": True, "parity_ok": True, "reason": evil})
        writer.checkpoint()
    html, md = write_report(tmp_path / "log")
    assert "<script" not in html.read_text().lower()
    summary = md.read_text()
    # the diff sits in a fence longer than any backtick run in it (code, shown literally); nothing else has markup
    before, fenced = summary.split("````diff\n")
    code, after = fenced.split("\n````\n")
    assert "<script" in code and "<script" not in (before + after).lower()


def test_divergences_are_named_with_position_and_margin(tmp_path: Path) -> None:
    from audit import AuditWriter

    with AuditWriter.open(tmp_path / "log", campaign="c", anchor_dir=tmp_path / "anchors") as writer:
        writer.append("iteration.parity", iteration=1, payload={
            "ok": False, "verdicts": [
                {"prompt_id": "held-007", "match": False, "first_divergence": 12, "reference_token": 40,
                 "candidate_token": 41, "reference_margin": 9.5},
                {"prompt_id": "held-008", "match": True}],
            "workload": {"divergence_count": 1, "divergences": [
                {"cell": "in512/out32", "repeat": 1, "request": 26, "position": 21, "reference_token": 67,
                 "candidate_token": 60, "reference_margin": 11.18, "candidate_wrong_only": True}]}})
        writer.append("iteration.result", iteration=1, payload={"accepted": False, "parity_ok": False,
                                                                 "outcome": "parity-broken", "reason": "diverged"})
        writer.checkpoint()
    html, md = write_report(tmp_path / "log")
    summary = md.read_text()
    assert "held prompts 1/2 identical; benchmark requests: 1 diverged" in summary
    assert "| held-007 | 12 | 40 → 41 | 9.50 |" in summary
    assert "| in512/out32 repeat 1 request 26 | 21 | 67 → 60 | 11.18 |" in summary
    page = html.read_text()
    assert "Divergences (2)" in page and "<td>held-007</td><td class=n>12</td>" in page


def test_an_iteration_that_failed_before_parity_ran_is_not_reported_as_a_parity_failure(tmp_path: Path) -> None:
    """A server that lost its port (or crashed, or a denied patch) never reached parity: the page and the
    summary name its outcome; only a parity-broken iteration is a parity failure (old logs: parity_ok)."""
    from audit import AuditWriter
    from audit.facts import IterationFacts

    with AuditWriter.open(tmp_path / "log", campaign="c", anchor_dir=tmp_path / "anchors") as writer:
        for i, outcome in enumerate(("failed", "parity-broken", "denied"), 1):
            writer.append("iteration.result", iteration=i, payload={
                "accepted": False, "parity_ok": False, "outcome": outcome, "reason": f"reason {i}"})
        writer.checkpoint()
    html, md = write_report(tmp_path / "log")
    rows = [line for line in md.read_text().splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
            or line.startswith("| 3 |")]
    assert [row.split(" | ")[1] for row in rows] == ["failed", "parity failed", "denied"]
    page = html.read_text()
    assert "Iteration 1: <span class='bad'>failed" in page and "Iteration 3: <span class='muted'>denied" in page
    assert "Iteration 2: <span class='bad'>parity failed" in page
    assert IterationFacts(iteration=1, accepted=False, parity_ok=False).status == "parity failed"   # an old log
