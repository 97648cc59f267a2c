"""The campaign's ending says only what its final best-vs-stock comparison bears out."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from agent.campaign import CampaignEnd, judge_ending
from agent.commands import run as run_command
from audit import AuditWriter, write_report
from harness.measure import ABResult, Build, GridResult
from harness.parity import ParityReport
from harness.stats import SpeedupCI

ROWS = [{"cell": "in128/out32", "input_len": 128, "output_len": 32, "total_token_throughput": 5000.0}]


def _final(overall: SpeedupCI, *, parity_ok: bool = True) -> ABResult:
    grid = GridResult(build=Build(tag="A", tree=Path("."), engine_args={}), startup_s=1.0, evidence={})
    parity = ParityReport((), "same", "same" if parity_ok else "other")   # digests differ: parity broken
    return ABResult(a=grid, b=grid, parity=parity, cells={"in128/out32": {"headline": overall}}, overall=overall)


def test_a_final_comparison_faster_than_physics_allows_is_not_an_improvement() -> None:
    impossible = ("in128/out32 took 0.1 s, under its floor of 0.2 s (200% of the host's best measured ceiling)",)
    ending = judge_ending(1, _final(SpeedupCI(1.29, 1.18, 1.40, 4)), impossible=impossible)
    assert ending.status == "not-shown" and "roofline" in ending.text and "in128/out32" in ending.text


def test_a_final_regression_is_not_an_improvement() -> None:
    """The README's main job once accepted max_num_seqs 32 at 1.120x and measured it at 0.905x [0.857, 0.976]."""
    ending = judge_ending(1, _final(SpeedupCI(0.905, 0.857, 0.976, 4)))
    assert ending.status == "not-shown" and not ending.ok and "0.905x [0.857, 0.976]" in ending.text


def test_a_final_interval_straddling_one_is_not_shown_either() -> None:
    assert judge_ending(1, _final(SpeedupCI(1.04, 0.99, 1.09, 4))).status == "not-shown"


def test_a_final_that_clears_one_with_parity_is_an_improvement() -> None:
    ending = judge_ending(2, _final(SpeedupCI(1.29, 1.18, 1.40, 4)))
    assert ending.status == "improved" and ending.ok


def test_a_missing_final_or_broken_parity_is_never_an_improvement() -> None:
    missing = judge_ending(1, None, "ServerCrashed: boom")
    assert missing.status == "not-shown" and "ServerCrashed: boom" in missing.text
    assert judge_ending(1, _final(SpeedupCI(1.3, 1.2, 1.4, 4), parity_ok=False)).status == "not-shown"
    assert judge_ending(0, None).status == "no-change" and judge_ending(0, None).ok


def test_a_screened_candidate_left_unconfirmed_for_time_is_named_in_the_verdict() -> None:
    """Seen on the main job under Docker: 1.279x at the screen, no wall time left to confirm it."""
    ending = judge_ending(0, None, unconfirmed=("iteration 3: screen 1.279x [1.158, 1.413]",))
    assert ending.status == "no-change"
    assert "iteration 3: screen 1.279x" in ending.text and "raise budget.wall_seconds" in ending.text


def _end(tmp_path: Path, final: ABResult | None, accepted: list[str]) -> CampaignEnd:
    return CampaignEnd(campaign_id="c", log_dir=tmp_path, workspace=tmp_path, branch="ratchet/c", stop_reason="done",
                       baseline_rows=ROWS, final=final, accepted=accepted, report=None,
                       verdict=judge_ending(len(accepted), final, "wall budget"))


def test_the_end_table_says_when_accepted_changes_were_not_borne_out(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    buffer = io.StringIO()
    monkeypatch.setattr(run_command, "console", Console(file=buffer, width=200, color_system=None))
    run_command.print_end(_end(tmp_path, _final(SpeedupCI(0.905, 0.857, 0.976, 4)), ["search:max_num_seqs=32"]))
    text = buffer.getvalue()
    assert "0.905x [0.857, 0.976]" in text and "verdict:  not-shown" in text and "NOT shown" in text
    buffer.truncate(0)
    run_command.print_end(_end(tmp_path, None, ["search:max_num_seqs=32"]))
    assert "final comparison did not run" in buffer.getvalue() and "no accepted change" not in buffer.getvalue()


def test_the_report_and_summary_lead_with_the_campaigns_verdict(tmp_path: Path) -> None:
    ending = judge_ending(1, _final(SpeedupCI(0.905, 0.857, 0.976, 4)))
    with AuditWriter.open(tmp_path / "log", campaign="c", anchor_dir=tmp_path / "anchors") as writer:
        writer.append("campaign.start", payload={"isolation": "docker"})
        writer.append("campaign.end", payload={"verdict": {"status": ending.status, "text": ending.text}})
        writer.checkpoint()
    html, md = write_report(tmp_path / "log")
    summary = md.read_text().splitlines()
    assert summary[0].endswith("(isolation: docker)") and summary[2] == "- Isolation: docker"
    assert summary[3].startswith("- Verdict: not-shown") and "0.905x" in summary[3]
    page = html.read_text()
    assert page.index("Verdict: not-shown") < page.index("Iterations") and "class='headline warn'" in page


def _spec_with(tmp_path: Path, **changes: object) -> Path:
    import yaml

    from tests.conftest import ROOT

    raw = yaml.safe_load((ROOT / "experiments" / "gemma4-tiny-cpu.yaml").read_text())
    raw["server"]["model"] = str(ROOT / "experiments" / "models" / "gemma4-tiny")
    raw["parity"] = {k: str(ROOT / "experiments" / v) if k.endswith("prompts") else v for k, v in raw["parity"].items()}
    raw["policy"] = str(ROOT / "policies" / "default.yaml")
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            raw[section][field] = value
        else:
            raw[section] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_campaign_with_too_few_repeats_or_no_final_comparison_is_refused_before_it_starts(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    for changes, expected in (({"benchmark.repeats": 3}, "set repeats: 4"),
                              ({"final_comparison": False}, "final_comparison: false is refused")):
        spec = _spec_with(tmp_path, **changes)
        proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", str(spec), "--log-dir", str(tmp_path / "logs"),
                               "--workspaces", str(tmp_path / "ws")], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and expected in " ".join(proc.stderr.split()), proc.stderr[-2000:]
        assert not (tmp_path / "logs").exists() and not (tmp_path / "ws").exists()   # nothing was created
