"""Committed results reproduce from the committed logs they were made from."""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"
sys.path.insert(0, str(ROOT / "experiments"))

from campaign_time import summarise  # noqa: E402
from iteration_cells import iteration_cells, to_markdown  # noqa: E402


def _redecided_log(tmp_path: Path, tgz: str, records: int) -> Path:
    """A kernel campaign's committed log, unpacked: it verifies here with every gate decision re-decided under the
    policies ratchet knows (no anchor: that stayed on the GPU host), and holds `records` records."""
    from audit import verify
    from policies import redecider
    from policies.known import known_policies

    with tarfile.open(RESULTS / tgz) as tar:
        tar.extractall(tmp_path, filter="data")
    (log_dir,) = tmp_path.glob("vllm-unified-attention-e2b-*")
    checked = verify(log_dir, redecide=redecider(known_policies()))
    assert checked.ok and checked.records == records, checked
    return log_dir


def test_the_h200_campaign_tables_come_from_its_verified_log(tmp_path: Path) -> None:
    with tarfile.open(RESULTS / "h200-serving-campaign-log.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (log_dir,) = tmp_path.glob("gemma4-e2b-gpu-campaign-*")
    summary = iteration_cells(log_dir)                       # exits unless the log verifies
    committed = json.loads((RESULTS / "h200-serving-campaign.json").read_text())
    assert summary["iterations"] == committed["iterations"]
    assert summary["verified_records"] == committed["verified_records"] == 19
    (it,) = summary["iterations"]
    assert it["outcome"] == "rejected" and it["parity_ok"] is True
    cells = {c["cell"]: c for c in it["cells"]}
    assert cells["in2048/out1"]["low"] > 1.02 > cells["in2048/out128"]["low"]   # what the md says of them
    assert "| in2048/out1 | 101,728 | 103,753 | 1.023× [1.022, 1.025] |" in to_markdown(summary)
    timing = summarise(log_dir)
    assert timing["server_windows_from"].startswith("vLLM log timestamps")     # unpacked: copies, not originals
    assert timing["wall_s"] == 973.3 and timing["loop_s"] == 591.1
    assert 0 < timing["outside_vllm_share"] < 0.1 and 0.5 < timing["vllm_startup_share"] < 0.8


def test_the_vllm_kernel_table_comes_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-campaign-h200.md: its log verifies here (no anchor: that stayed on the GPU
    host), the final comparison in the log is the summary's, and the table's figures are the summary's."""
    from audit.reader import payload_of, read_records

    log_dir = _redecided_log(tmp_path, "vllm-kernel-campaign-h200-log.tgz", 99)
    records = read_records(log_dir)
    prelude = payload_of(log_dir, next(r for r in records if r["kind"] == "prelude.result"))
    assert prelude["kept"] and prelude["overall"]["low"] < 1.0 < prelude["overall"]["high"]
    final = payload_of(log_dir, next(r for r in records if r["kind"] == "final.result"))
    summary = json.loads((RESULTS / "vllm-kernel-campaign-h200.json").read_text())
    assert final["tunables_before"] == summary["tunables_before"] == {}
    assert final["tunables_after"] == summary["tunables_after"]
    text = (RESULTS / "vllm-kernel-campaign-h200.md").read_text()
    for row in summary["shapes"]:
        assert row["speedup"] == final["shapes"][row["shape"]]["speedup"]["ratio"]
        before, after = f"{row['before_median_us']:,.1f}", f"{row['after_median_us']:,.1f}"
        ci = f"{row['speedup']:.3f}x"
        line = next(line for line in text.splitlines() if f"| {before} | {after} |" in line)
        assert ci in line and f"{row['before_pct_hbm']:.1f}" in line, line


def _kernel_run_table(tmp_path: Path, tgz: str, summary_file: str, section: str, records: dict[str, int]) -> None:
    """A run of results/vllm-kernel-campaign-h200.md: its logs verify, and its table rows are its summary's."""
    from audit import verify
    from audit.reader import payload_of, read_records
    from policies import redecider
    from policies.known import known_policies

    with tarfile.open(RESULTS / tgz) as tar:
        tar.extractall(tmp_path, filter="data")
    counts = {}
    for log_dir in tmp_path.glob("vllm-unified-attention-e2b*-2026*"):
        checked = verify(log_dir, redecide=redecider(known_policies()))
        assert checked.ok, checked
        counts[log_dir.name.split("-2026")[0]] = checked.records
    assert counts == records
    summary = json.loads((RESULTS / summary_file).read_text())
    run = tmp_path / summary["campaign_id"]
    final = payload_of(run, next(r for r in read_records(run) if r["kind"] == "final.result"))
    assert final["tunables_after"] == summary["tunables_after"] and summary["tunables_before"] == {}
    text = (RESULTS / "vllm-kernel-campaign-h200.md").read_text().split(section)[1].split("\n## ")[0]
    for row in summary["shapes"]:
        assert row["speedup"] == final["shapes"][row["shape"]]["speedup"]["ratio"]
        before, after = f"{row['before_median_us']:,.1f}", f"{row['after_median_us']:,.1f}"
        line = next(line for line in text.splitlines() if f"| {before} | {after} |" in line).replace("**", "")
        assert f"{row['speedup']:.3f}x [{row['ci_low']:.3f}, {row['ci_high']:.3f}]" in line, line


def test_the_vllm_kernel_run3_table_comes_from_its_verified_log(tmp_path: Path) -> None:
    _kernel_run_table(tmp_path, "vllm-kernel-campaign-h200-runs2-3-log.tgz", "vllm-kernel-campaign-h200-run3.json",
                      "## Run 3", {"vllm-unified-attention-e2b-prefill": 90, "vllm-unified-attention-e2b-combined": 27})


def test_the_vllm_kernel_run4_table_comes_from_its_verified_log(tmp_path: Path) -> None:
    """Run 4: the window-segments code change and the tunables, proposed as patch files."""
    _kernel_run_table(tmp_path, "vllm-kernel-campaign-h200-run4-log.tgz", "vllm-kernel-campaign-h200-run4.json",
                      "## Run 4", {"vllm-unified-attention-e2b": 37})


def test_the_workload_test_table_of_main_job_run5_comes_from_the_committed_logs(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 5: the rejected confirmation and the same change's other comparisons."""
    from workload_tests import tests_of

    found = []
    for run in (2, 3, 4, 5):
        with tarfile.open(RESULTS / f"main-job-run{run}-log.tgz") as tar:
            tar.extractall(tmp_path / str(run), filter="data")
        (log,) = (tmp_path / str(run)).glob("*/")
        found += [(run, comparison, cand, ref) for what, comparison, cand, ref in tests_of(log)
                  if what.startswith("enforce_eager") or comparison == "final"]
    assert (5, "confirmation", 12, 3) in found
    others = [t for t in found if t != (5, "confirmation", 12, 3)]
    assert len(others) == 8 and sum(t[2] for t in others) == 26 and sum(t[3] for t in others) == 35


def test_the_h200_kernel_serving_table_comes_from_its_recorded_runs(tmp_path: Path) -> None:
    """vllm-kernel-serving-h200.md's table: recomputed from the runs in its log (harness/stats.py intervals)."""
    import subprocess

    results = RESULTS
    with tarfile.open(results / "vllm-kernel-serving-h200-log.tgz") as tar:
        tar.extract("runs.jsonl", tmp_path, filter="data")
    out = tmp_path / "table.json"
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu-kernel-serving.sh"), "analyze", str(tmp_path / "runs.jsonl"),
                    str(out)], check=True, capture_output=True, timeout=300, cwd=ROOT)
    table = json.loads(out.read_text())
    recorded = json.loads((results / "vllm-kernel-serving-h200.json").read_text())
    assert table["cells"] == recorded["cells"] and table["overall"] == recorded["overall"]
    prefill = table["cells"]["in8192/out1"]["prefill_tok_s"]
    text = (results / "vllm-kernel-serving-h200.md").read_text()
    assert f"**{prefill['ratio']:.3f}x [{prefill['low']:.3f}, {prefill['high']:.3f}]**" in text


def test_the_h200_round_of_three_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/h200-arms-campaign.md: the cut-short campaign's log verifies, and its cost and per-cell
    figures are what the two scripts compute from it."""
    from comparison_runs import summarise as comparison

    from audit import verify

    with tarfile.open(RESULTS / "h200-arms-campaign-log.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (log_dir,) = tmp_path.glob("gemma4-e2b-gpu-campaign-*")
    checked = verify(log_dir)
    assert checked.ok and checked.records == 30, checked
    timing = summarise(log_dir)
    committed = json.loads((RESULTS / "h200-arms-campaign-time.json").read_text())
    assert {k: v for k, v in timing.items() if k != "log_dir"} == {k: v for k, v in committed.items() if k != "log_dir"}
    assert timing["vllm_startup_share"] < 0.30 and timing["outcomes"] == []     # cut short: no verdicts
    round1 = comparison(log_dir / "runs" / "it001")
    saved = json.loads((RESULTS / "h200-arms-campaign-round1.json").read_text())
    assert round1["candidates"] == saved["candidates"] and (round1["runs"], round1["planned_runs"]) == (54, 64)
    text = (RESULTS / "h200-arms-campaign.md").read_text()
    cell = saved["candidates"]["B1"]["cells"]["in512/out256"]
    assert f"**{cell['ratio']:.3f}× [{cell['low']:.3f}, {cell['high']:.3f}]**" in text
    overall = saved["candidates"]["B3"]["overall"]
    assert f"{overall['ratio']:.3f}× [{overall['low']:.3f}, {overall['high']:.3f}]" in text


def test_the_h200_stream_interval_round_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/h200-stream-interval-round.md: the log verifies, its two verdicts are the ones the
    page states, and the cost and per-cell figures are what the two scripts compute from it."""
    from comparison_runs import summarise as comparison

    from audit import verify

    with tarfile.open(RESULTS / "h200-stream-interval-round-log.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (log_dir,) = tmp_path.glob("gemma4-e2b-gpu-campaign-*")
    checked = verify(log_dir)
    assert checked.ok and checked.records == 32, checked
    timing = summarise(log_dir)
    committed = json.loads((RESULTS / "h200-stream-interval-round-time.json").read_text())
    assert {k: v for k, v in timing.items() if k != "log_dir"} == {k: v for k, v in committed.items() if k != "log_dir"}
    assert timing["outcomes"] == ["rejected", "rejected"] and timing["candidates_per_hour_in_loop"] == 11.42
    results = [json.loads(line)["payload"] for line in (log_dir / "log.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "iteration.result"]
    assert "not confirmed" in results[0]["reason"] and "1.052x [1.028, 1.076]" in results[0]["reason"]
    assert results[1]["reason"].startswith("speedup 0.990x [0.930, 1.054]")
    round1 = comparison(log_dir / "runs" / "it001")
    saved = json.loads((RESULTS / "h200-stream-interval-round1.json").read_text())
    assert round1["candidates"] == saved["candidates"] and (round1["runs"], round1["planned_runs"]) == (48, 48)
    text = (RESULTS / "h200-stream-interval-round.md").read_text()
    for build in ("B1", "B2"):
        for cell in saved["candidates"][build]["cells"].values():
            assert f"{cell['ratio']:.3f}× [{cell['low']:.3f}, {cell['high']:.3f}]" in text


def _main_job_records(tmp_path: Path, run: int, verified: int) -> list[dict]:
    """Main job run `run`'s committed log, unpacked: it verifies (iteration_cells exits unless it does) with
    `verified` records; its records, in order."""
    with tarfile.open(RESULTS / f"main-job-run{run}-log.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    (log_dir,) = tmp_path.glob("gemma4-tiny-cpu-*")
    assert iteration_cells(log_dir)["verified_records"] == verified
    return [json.loads(line) for line in (log_dir / "log.jsonl").read_text().splitlines()]


def test_main_job_run8_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 8: the screens, the confirmation that took the budget, and the estimate
    that left iteration 3 unconfirmed, as the verified log records them."""
    records = _main_job_records(tmp_path, 8, 43)
    results = {r["iteration"]: r["payload"] for r in records if r["kind"] == "iteration.result"}
    assert [results[i]["speedup_text"] for i in (1, 2, 3)] == [
        "1.030x [0.837, 1.266]", "1.009x [0.990, 1.028]", "1.307x [1.202, 1.421]"]
    assert round(results[1]["placement"]["seconds"]) == 854 and round(results[2]["placement"]["seconds"]) == 938
    need = "2497 s of the wall budget left, a confirmation and the final comparison need ~3314 s"
    assert need in results[3]["reason"]
    (confirm,) = [r["payload"] for r in records if r["kind"] == "iteration.confirm"]
    assert confirm["screen_speedup"] == "1.026x [0.991, 1.063]"
    (end,) = [r["payload"] for r in records if r["kind"] == "campaign.end"]
    assert end["accepted"] == [] and end["verdict"]["status"] == "no-change"
    text = (RESULTS / "main-job-runs.md").read_text()
    assert "**1.307x [1.202, 1.421]**" in text and "1.009x [0.990, 1.028], 938 s" in text


def test_the_two_stage_kernel_campaign_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-two-stage-h200.md: the log verifies (every gate decision re-decided), the
    kernel table is the final comparison's, the serving table is the serving stage's record and what the client's
    result files give, and the cost figures are campaign_time's."""
    from comparison_runs import summarise as comparison

    from audit.reader import payload_of, read_records

    log_dir = _redecided_log(tmp_path, "vllm-kernel-two-stage-h200-log.tgz", 54)
    records = read_records(log_dir)
    final = payload_of(log_dir, next(r for r in records if r["kind"] == "final.result"))
    serving = payload_of(log_dir, next(r for r in records if r["kind"] == "serving.result"))
    summary = json.loads((RESULTS / "vllm-kernel-two-stage-h200.json").read_text())
    assert summary["serving"] == serving and serving["verdict"]["status"] == "improved" and serving["parity_ok"]
    text = (RESULTS / "vllm-kernel-two-stage-h200.md").read_text().replace("**", "")
    for row in summary["shapes"]:
        assert row["speedup"] == final["shapes"][row["shape"]]["speedup"]["ratio"]
        before, after = f"{row['before_median_us']:,.1f}", f"{row['after_median_us']:,.1f}"
        line = next(line for line in text.splitlines() if f"| {before} | {after} |" in line)
        assert f"{row['speedup']:.3f}x [{row['ci_low']:.3f}, {row['ci_high']:.3f}]" in line, line
    runs = comparison(log_dir / "runs" / "serving")
    saved = json.loads((RESULTS / "vllm-kernel-two-stage-h200-serving.json").read_text())
    assert runs["candidates"] == saved["candidates"] and (runs["runs"], runs["planned_runs"]) == (24, 24)
    for label, cell in saved["candidates"]["B"]["cells"].items():
        logged = serving["cells"][label]
        assert (round(logged["ratio"], 4), round(logged["low"], 4)) == (cell["ratio"], cell["low"])
        line = next(line for line in text.splitlines() if line.startswith(f"| {label} "))
        assert f"| {cell['median_a']:,} | {cell['median_b']:,} | {cell['ratio']:.3f}x [{cell['low']:.3f}, " \
               f"{cell['high']:.3f}] |" in line, line
    overall = serving["overall"]
    assert f"{overall['ratio']:.3f}x [{overall['low']:.3f}, {overall['high']:.3f}]" in text
    timing = summarise(log_dir)
    committed = json.loads((RESULTS / "vllm-kernel-two-stage-h200-time.json").read_text())
    assert {k: v for k, v in timing.items() if k != "log_dir"} == {k: v for k, v in committed.items() if k != "log_dir"}
    assert timing["wall_s"] == 864.5 and timing["vllm_startup_s"] == 311.0 and "864.5 s" in text


def test_main_job_run9_figures_and_what_the_confirmation_chance_says_of_its_screens(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 9: the verified log's verdicts, and the chance of a confirmation its two
    passed screens had (harness.stats.confirm_chance, the screen's se recovered from its 95 % bounds)."""
    import math

    from scipy import stats as scistats

    from harness.config import StatsConfig
    from harness.stats import SpeedupCI, confirm_chance

    records = _main_job_records(tmp_path, 9, 50)
    results = {r["iteration"]: r["payload"] for r in records if r["kind"] == "iteration.result"}
    assert [results[i]["outcome"] for i in (1, 2, 3)] == ["rejected", "rejected", "accepted"]
    assert [results[i]["speedup_text"] for i in (1, 2, 3)] == [
        "0.993x [0.966, 1.021]", "1.010x [0.981, 1.040]", "1.314x [1.273, 1.356]"]
    (end,) = [r["payload"] for r in records if r["kind"] == "campaign.end"]
    assert end["accepted"] == [3] and end["verdict"]["text"].startswith("best vs stock 1.326x [1.299, 1.355]")
    t3 = float(scistats.t.ppf(0.975, 3))
    chances = {}
    for i in (1, 3):
        screen = results[i]["screen"]
        se = math.log(screen["ci_high"] / screen["ci_low"]) / (2 * t3)
        chances[i] = confirm_chance(SpeedupCI(screen["speedup"], screen["ci_low"], screen["ci_high"], 4, se, 3), 8,
                                    StatsConfig())
    assert chances[1] < 0.02 and chances[3] > 0.999           # 1 %: no confirmation now; ~100 %: confirmed
    text = (RESULTS / "main-job-runs.md").read_text()
    assert "**1.326x [1.299, 1.355]**" in text and "0.993x [0.966, 1.021], 862 s" in text


def test_the_screen_chance_calibration_table_is_its_recorded_run() -> None:
    """results/verdict-calibration.md, the screen's confirmation chance: the table is the committed resample's."""
    data = json.loads((RESULTS / "calibration-screen-chance-gemma4-tiny-cpu.json").read_text())
    before, shipped = (next(v for k, v in data["rules"].items() if k.startswith(p)) for p in ("screen at 4", "shipped"))
    assert data["trials"] == 4000 and data["seed"] == 0 and data["stats"]["screen_confirm_chance"] == 0.2
    text = (RESULTS / "verdict-calibration.md").read_text()
    for rule in (before, shipped):
        cells = [f"{rule['accept_rate']['1.00']:.1%}", f"{rule['committed_rate']['1.00']:.2%}",
                 *(f"{rule['committed_rate'][e]:.1%}" for e in ("1.03", "1.05", "1.10"))]
        row = " | ".join(c.replace("%", " %") for c in cells)
        assert row in text.replace("**", ""), row
    assert shipped["committed_rate"]["1.00"] == 0.0 and shipped["accept_rate"]["1.00"] < before["accept_rate"]["1.00"]


def test_the_two_stage_kernel_campaign_replay_figures_come_from_its_recorded_runs(tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-two-stage-h200-replay.md: every check of the replay held (its own summary);
    the kernel tables are what the replay's runner results give, read as the campaign reads an A/B; the serving
    table is what the replayed runs' headline values give, next to the campaign's recorded cells."""
    import re

    from kernel_ab_table import table

    from harness.config import StatsConfig
    from harness.stats import overall_ci, speedup_ci

    saved = json.loads((RESULTS / "vllm-kernel-two-stage-h200-replay.json").read_text())
    text = (RESULTS / "vllm-kernel-two-stage-h200-replay.md").read_text().replace("**", "")
    with tarfile.open(RESULTS / "vllm-kernel-two-stage-h200-replay-runs.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    runs = tmp_path / "replay"
    summary = (runs / "replay-summary.md").read_text()
    assert "exit code: 0 (OK)" in summary and "**FAIL**" not in summary and saved["exit_code"] == 0
    assert len(saved["checks"]) == 16 and all(c["ok"] and f"| {c['name']} | ok |" in summary for c in saved["checks"])
    for run, tags in {"it1": ("A", "B"), "it2": ("A", "B"), "it3": ("A", "B"), "final": ("baseline", "best")}.items():
        got = table(json.loads((runs / run / "result.json").read_text()), *tags)
        assert got == saved["kernel"][run] and got["outcome"] == "accepted"
    for check in saved["checks"]:   # the claims table holds what each replayed check said, recorded and replayed
        if check["name"].startswith("speedup of") and "serving" not in check["name"]:
            replayed, recorded = re.search(r"replayed (\S+x \[[^]]+\]).*recorded (\S+x \[[^]]+\])",
                                           check["detail"]).groups()
            assert f"| {recorded} | {replayed} |" in text, check
    for shape in saved["kernel"]["final"]["shapes"].values():
        line = next(line for line in text.splitlines()
                    if f"| {shape['median_us_a']:,.1f} | {shape['median_us_b']:,.1f} |" in line)
        assert f"{shape['ratio']:.3f}x [{shape['low']:.3f}, {shape['high']:.3f}]" in line, line
    values, cells = saved["serving"]["values"], saved["serving"]["candidates"]["B"]["cells"]
    cfg = StatsConfig(confidence=0.95)
    assert all(len(values[tag][label]) == 6 for tag in "AB" for label in cells)   # 6 pairs of each cell
    for label, cell in cells.items():
        ci = speedup_ci(values["A"][label], values["B"][label], cfg)
        assert (round(ci.ratio, 4), round(ci.low, 4), round(ci.high, 4)) == (cell["ratio"], cell["low"], cell["high"])
        line = next(line for line in text.splitlines() if line.startswith(f"| {label} "))
        assert f"| {cell['median_a']:,} | {cell['median_b']:,} | {ci.ratio:.3f}x [{ci.low:.3f}, {ci.high:.3f}] |" \
            in line, line
    overall = overall_ci(values["A"], values["B"], cfg)
    assert f"| overall | | | {overall.ratio:.3f}x [{overall.low:.3f}, {overall.high:.3f}] |" in text
    assert "speedup of the serving stage" in summary and f"replayed {overall.ratio:.3f}x" in summary


def _two_rejected_then_confirmed(tmp_path: Path, run: int, verified: int) -> tuple[str, dict]:
    """Main job run `run`: two candidates rejected at the screen, the third screened, confirmed once and accepted,
    each row of the page's table as the verified log has it, verdict improved. Returns the page's section of that
    run (up to the next run's heading) and the campaign.end payload."""
    records = _main_job_records(tmp_path, run, verified)
    results = {r["iteration"]: r["payload"] for r in records if r["kind"] == "iteration.result"}
    assert [results[i]["outcome"] for i in (1, 2, 3)] == ["rejected", "rejected", "accepted"]
    assert [r["iteration"] for r in records if r["kind"] == "iteration.confirm"] == [3]   # one confirmation
    text = (RESULTS / "main-job-runs.md").read_text()
    section = text[text.index(f"## Run {run}:"):]
    section = section[: section.find("\n## Run ", 1)] if "\n## Run " in section else section
    for i in (1, 2):
        assert f"| {results[i]['speedup_text']} | — | rejected" in section
    assert f"| {results[3]['screen']['speedup_text']}, passed | **{results[3]['speedup_text']}**" in section
    (end,) = [r["payload"] for r in records if r["kind"] == "campaign.end"]
    assert end["accepted"] == [3] and end["verdict"]["status"] == "improved"
    overall = end["final"]["overall"]
    assert f"**{overall['ratio']:.3f}x [{overall['low']:.3f}, {overall['high']:.3f}]**" in section
    return section, end


def test_main_job_run10_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 10: the verified log's screens, its one confirmation and the final comparison."""
    run10, end = _two_rejected_then_confirmed(tmp_path, 10, 46)
    below = [label for label, ci in end["final"]["cells"].items() if ci["low"] < 1.0]
    assert below == ["in128/out1"] and "in128/out1, at 1.155x [0.924, 1.445]" in run10


def _paged_campaign_summary(tmp_path: Path, tgz: str, records: int, summary_file: str) -> tuple[dict, list[str]]:
    """A paged kernel campaign's committed summary, checked against its verified log (its best is the log's, and
    each shape's speedup is the final comparison's, correct before and after timing on both sides), and the
    iterations' outcomes as logged."""
    from audit.reader import payload_of, read_records

    log_dir = _redecided_log(tmp_path, tgz, records)
    logged = read_records(log_dir)
    outcomes = [payload_of(log_dir, r)["outcome"] for r in logged if r["kind"] == "iteration.result"]
    final = payload_of(log_dir, next(r for r in logged if r["kind"] == "final.result"))
    summary: dict = json.loads((RESULTS / summary_file).read_text())
    assert final["tunables_after"] == summary["tunables_after"]
    for row in summary["shapes"]:
        assert row["speedup"] == final["shapes"][row["shape"]]["speedup"]["ratio"]
        assert all(row[f"{side}_checks"][when]["ok"] for side in ("before", "after") for when in ("pre", "post"))
    return summary, outcomes


def test_the_paged_vllm_kernel_table_comes_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-paged-h200.md: the log verifies with decisions re-decided, the last patch
    was accepted on its own A/B, and every row of the table is the final comparison's."""
    summary, outcomes = _paged_campaign_summary(tmp_path, "vllm-kernel-paged-h200-log.tgz", 53,
                                                "vllm-kernel-paged-h200.json")
    assert outcomes[:4] == ["accepted"] * 4 and summary["tunables_after"]["PAGED_FAST_PATH"] == 1
    text = (RESULTS / "vllm-kernel-paged-h200.md").read_text()
    for row in summary["shapes"]:
        before, after = f"{row['before_median_us']:,.1f}", f"{row['after_median_us']:,.1f}"
        line = next(line for line in text.splitlines() if f"| {row['shape']} | {before} | {after} |" in line)
        line = line.replace("**", "")
        assert f"{row['speedup']:.3f}x [{row['ci_low']:.3f}, {row['ci_high']:.3f}]" in line, line
        assert f"{row['before_pct_hbm']:.1f} → {row['after_pct_hbm']:.1f}" in line, line


def test_the_mixed_batch_kernel_table_and_its_aa_coverage_come_from_the_runner_results() -> None:
    """experiments/results/vllm-kernel-mixed-h200.md: every row of its stock-vs-best table is the committed runner
    result judged as ratchet judges it, and what it says of the A/As (9 of 40 shape intervals exclude 1.000, bounds
    0.981 to 1.012) is counted from the committed A/A results."""
    from vllm_kernel_stock_vs_best import rows

    page = (RESULTS / "vllm-kernel-mixed-h200.md").read_text()
    ab, shape_rows = rows(json.loads((RESULTS / "vllm-kernel-mixed-h200-ab.json").read_text()), "stock", "best")
    assert ab.outcome == "accepted" and f"{ab.overall.ratio:.3f}x [{ab.overall.low:.3f}, {ab.overall.high:.3f}]" \
        in page
    for r in shape_rows:
        assert r["ok"]
        assert (f"| {r['shape']} | {r['a_us']:,.1f} | {r['b_us']:,.1f} | {r['ratio']:.3f}x [{r['low']:.3f}, "
                f"{r['high']:.3f}] | {r['a_pct_hbm']:.1f} → {r['b_pct_hbm']:.1f} |") in page, r["shape"]
    mixed = {r["shape"]: r["ratio"] for r in shape_rows if r["shape"].startswith("mixed")}
    assert [f"{v:.2f}x" for v in mixed.values()] == ["3.18x", "1.60x"] and "**3.18x**" in page

    same: list[tuple[dict, str, str]] = [(json.loads((RESULTS / "vllm-kernel-mixed-h200-aa.json").read_text()),
                                          "stock", "stock-copy")]
    with tarfile.open(RESULTS / "vllm-kernel-mixed-h200-earlier.tgz") as tar:
        for member in tar.getmembers():
            if member.isfile() and ("stock-copy" in member.name or "unpatched" in member.name):
                result = json.load(tar.extractfile(member))  # type: ignore[arg-type]
                builds = list(result["builds"])
                assert len({result["builds"][t]["sha256"] for t in builds}) == 1, member.name   # truly A/A
                same.append((result, builds[0], builds[1]))
    intervals = [(r["low"], r["high"]) for result, a, b in same for r in rows(result, a, b)[1]]
    assert len(intervals) == 40 and sum(not lo <= 1.0 <= hi for lo, hi in intervals) == 9
    assert round(min(lo for lo, _ in intervals), 3) == 0.981 and round(max(hi for _, hi in intervals), 3) == 1.012
    assert "**9 exclude 1.000**" in page and "the lowest bound is 0.981 and the highest 1.012" in page


def test_main_job_run11_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 11: the screens, the one confirmation, and a final comparison with every
    cell's lower bound above 1.0."""
    run11, end = _two_rejected_then_confirmed(tmp_path, 11, 46)
    lowest = min(end["final"]["cells"].items(), key=lambda kv: kv[1]["low"])
    assert lowest[1]["low"] > 1.0 and lowest[0] == "in128/out1"
    assert f"in128/out1, at {lowest[1]['ratio']:.3f}x [{lowest[1]['low']:.3f}, {lowest[1]['high']:.3f}]" in run11


def _analyzed_runs(log_tgz: str, tmp_path: Path) -> dict:
    """A GPU A/B's recorded runs and driver console unpacked into tmp_path, and `gpu-kernel-serving.sh analyze`'s
    table of those runs."""
    import subprocess

    with tarfile.open(RESULTS / log_tgz) as tar:
        tar.extract("runs.jsonl", tmp_path, filter="data")
        tar.extract("driver.log", tmp_path, filter="data")
    out = tmp_path / "table.json"
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu-kernel-serving.sh"), "analyze", str(tmp_path / "runs.jsonl"),
                    str(out)], check=True, capture_output=True, timeout=300, cwd=ROOT)
    return json.loads(out.read_text())


def test_the_h100_kernel_serving_table_and_its_slow_runs_come_from_its_recorded_runs(tmp_path: Path) -> None:
    """vllm-kernel-serving-h100.md: the table is `analyze` on the runs in its log, and in512/out256's per-repeat
    row (slow runs after 128 warm-ups, not only first) is those runs."""
    table = _analyzed_runs("vllm-kernel-serving-h100-log.tgz", tmp_path)
    assert table == json.loads((RESULTS / "vllm-kernel-serving-h100.json").read_text())
    text = (RESULTS / "vllm-kernel-serving-h100.md").read_text().replace("**", "")
    for cell, metric in (("in8192/out1", "prefill_tok_s"), ("in8192/out128", "total_token_throughput"),
                         ("in512/out256", "total_token_throughput")):
        m = table["cells"][cell][metric]
        assert m["n"] == 6
        row = next(line for line in text.splitlines() if line.startswith(f"| {cell} "))
        ci = f"{m['ratio']:.3f}x [{m['low']:.3f}, {m['high']:.3f}]"
        figures = f"| {m['a_median']:,.0f} | {m['b_median']:,.0f} | {ci} |"
        assert figures in row, row
    o = table["overall"]
    assert f"{o['ratio']:.3f}x [{o['low']:.3f}, {o['high']:.3f}]" in text
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    for tag, name in (("A", "stock"), ("B", "patched")):
        per = sorted((r["repeat"], r["metrics"]) for r in runs if r["cell"] == "in512/out256" and r["tag"] == tag)
        row = " | ".join(f"{m['total_token_throughput']:,.0f} ({m['median_tpot_ms']:.2f})" for _, m in per)
        assert f"| {name} tok/s (TPOT ms) | {row} |" in text
    driver = (tmp_path / "driver.log").read_text()
    assert "128 warm-ups" in driver and "MeasurementTampered" in driver and "harness/README.md" in driver


def test_main_job_run12_figures_come_from_its_verified_log(tmp_path: Path) -> None:
    """results/main-job-runs.md, run 12 (a newcomer's fresh clone): the screens, the one confirmation, and a final
    comparison with every cell's lower bound above 1.0."""
    run12, end = _two_rejected_then_confirmed(tmp_path, 12, 46)
    lowest = min(end["final"]["cells"].items(), key=lambda kv: kv[1]["low"])
    assert lowest[1]["low"] > 1.0 and lowest[0] == "in128/out1"
    assert f"in128/out1, at {lowest[1]['ratio']:.3f}x [{lowest[1]['low']:.3f}, {lowest[1]['high']:.3f}]" in run12


def test_the_partial_paged_fast_paths_serving_runs_are_its_recorded_runs(tmp_path: Path) -> None:
    """vllm-kernel-serving-paged-h100-partial.md: the table is `analyze` on its 13 recorded runs (2 whole pairs a
    cell), and each row's runs and median ratio are those runs."""
    table = _analyzed_runs("vllm-kernel-serving-paged-h100-partial-log.tgz", tmp_path)
    assert table == json.loads((RESULTS / "vllm-kernel-serving-paged-h100-partial.json").read_text())
    text = (RESULTS / "vllm-kernel-serving-paged-h100-partial.md").read_text()
    for cell, entry in table["cells"].items():
        m = entry[entry["metric"]]
        assert m["n"] == 2
        runs = " | ".join("; ".join(f"{v:,.0f}" for v in m[k]) for k in ("a", "b"))
        assert f"| {runs} | {m['b_median'] / m['a_median']:.3f}x |" in text, cell
    driver = (tmp_path / "driver.log").read_text()
    assert "paged-fast-paths.patch" in driver and "b0682fd7d880116e" in driver and "6 pairs asked for" in driver


def test_the_paged_campaigns_second_run_and_the_decode_floor_come_from_their_committed_results(
        tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-decode-floor-h200.md: the second paged campaign's log verifies with decisions
    re-decided and every table row is its final comparison's; the variant and floor rows, and the floor the text
    cites, are the committed JSON's."""
    summary, outcomes = _paged_campaign_summary(tmp_path, "vllm-kernel-paged-h200-run2-log.tgz", 50,
                                                "vllm-kernel-paged-h200-run2.json")
    assert outcomes == ["accepted"] * 4   # the fifth patch was never proposed (the wall budget)
    page = (RESULTS / "vllm-kernel-decode-floor-h200.md").read_text()
    for row in summary["shapes"]:
        assert (f"| {row['shape']} | {row['before_median_us']:,.1f} | {row['after_median_us']:,.1f} | "
                f"{row['speedup']:.3f}x [{row['ci_low']:.3f}, {row['ci_high']:.3f}] |") in page, row["shape"]
    variants = json.loads((RESULTS / "vllm-kernel-decode-variants-h200.json").read_text())["rows"]
    for r in variants:
        assert f"| {r['shape']} | {r['build']} | {r['us']} | {r['x_stock']:.3f}x | {r['pct_hbm']} |" in page
    floor = json.loads((RESULTS / "vllm-kernel-paged-read-floor-h200.json").read_text())
    fastest = min((r for r in floor["rows"] if r["build"].startswith("paged")), key=lambda r: r["us"])
    assert f"takes **{fastest['us']:.1f} µs ({fastest['pct_hbm']:.1f} %)**" in page
    half = floor["bytes"] / (floor["copy_GBps"] * 1e9) / 0.5 * 1e6
    assert f"50 % of bandwidth is {half:.1f} µs" in " ".join(page.split())


def test_the_prefill_order_and_lazy_rescale_tables_are_the_committed_rows() -> None:
    """experiments/results/vllm-kernel-prefill-order-lazy-h100.md: every row of both runs is the committed JSON's, and
    the headline ratios it reads off them are those rows'."""
    page = (RESULTS / "vllm-kernel-prefill-order-lazy-h100.md").read_text()
    runs = json.loads((RESULTS / "vllm-kernel-prefill-variants-h100.json").read_text())["runs"]
    for run in runs:
        for r in run["rows"]:
            assert (f"| {r['shape']} | {r['build']} | {r['us']:,.1f} | {r['x_stock']:.3f}x | {r['tflops']} | "
                    f"{r['rel_l2']} |") in page, r
    ratio = {(i, r["shape"], r["build"]): r["x_stock"] for i, run in enumerate(runs) for r in run["rows"]}
    full = "prefill-4096-full-d512"
    headline = (f"{ratio[0, full, 'new']:.2f}x → {ratio[0, full, 'next2']:.2f}x / "
                f"{ratio[1, full, 'next2']:.2f}x stock")
    assert headline in page, headline
    # no neighbour of the default is more than 1 % faster
    assert max(x for (i, shape, _), x in ratio.items() if i == 1 and shape == full) <= 1.01 * ratio[1, full, "next2"]


def _paired_interval(runs: dict, pairs: list[list[str]], field: str) -> str:
    """`ratio [low, high]` of field over the (before, after) pairs: geometric mean of after/before, 95 % Student t
    interval on the log ratios, as the CI-time pages quote it."""
    import numpy as np
    from scipy import stats

    logs = np.log([runs[after][field] / runs[before][field] for before, after in pairs])
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
    ratio, low, high = np.exp(logs.mean()), np.exp(logs.mean() - half), np.exp(logs.mean() + half)
    return f"{ratio:.3f}x [{low:.3f}, {high:.3f}]"


def test_the_in_process_worker_ci_table_and_its_intervals_are_the_recorded_runs() -> None:
    """experiments/results/ci-in-process-worker.md: every row is a recorded run, and the paired intervals it quotes
    are recomputed from those runs (log ratios, Student t over the pairs)."""
    data = json.loads((RESULTS / "ci-in-process-worker.json").read_text())
    page = (RESULTS / "ci-in-process-worker.md").read_text()
    runs = data["runs"]
    for label, r in runs.items():
        assert f"| {label} | " in page and f"| {r['test_wall_s']} | {r['vllm_startup_s']:.0f} |" in page
        assert r["outcomes"] == ["accepted", "invalid"]
    for key, field in (("test_wall", "test_wall_s"), ("startup", "vllm_startup_s"), ("run_mean", "mean_measured_s")):
        assert _paired_interval(runs, data["pairs"], field) in page, key


def test_the_grouped_starts_ci_table_and_its_intervals_are_the_recorded_runs() -> None:
    """experiments/results/ci-redteam-grouped-starts.md: every row is a recorded run, and the paired intervals it
    quotes are recomputed from those runs (log ratios, Student t over the pairs)."""
    data = json.loads((RESULTS / "ci-redteam-grouped-starts.json").read_text())
    page = (RESULTS / "ci-redteam-grouped-starts.md").read_text()
    runs = data["runs"]
    assert [label for pair in data["pairs"] for label in pair] == ["old1", "new1", "old2", "new2", "old3", "new3"]
    for label, r in runs.items():
        assert r["rc"] == 0 and r["result"] == "1 passed"
        assert f"| {label} | " in page and f"| {r['pytest_call_s']:.2f} | {r['process_wall_s']:.1f} |" in page
    for field in ("pytest_call_s", "process_wall_s"):
        assert _paired_interval(runs, data["pairs"], field) in page, field


def test_the_dsplit_prefill_tables_are_the_committed_rows() -> None:
    """experiments/results/vllm-kernel-prefill-dsplit.md: every row of both tables is the committed JSON's (run 2 in
    full), the ratios it reads off them are those rows', and the patch's header quotes run 2."""
    page = (RESULTS / "vllm-kernel-prefill-dsplit.md").read_text()
    runs = json.loads((RESULTS / "vllm-kernel-dsplit-variants-h100.json").read_text())["runs"]

    def line(r: dict) -> str:
        if "error" in r:
            return f"| {r['shape']} | {r['build']} | out of shared memory |"
        return (f"| {r['shape']} | {r['build']} | {r['us']:,.1f} | {r['x_stock']:.3f}x | {r['pct_hbm']} | "
                f"{r['tflops']} | {r['rel_l2']} |")

    run1, run2 = page.split("## Run 1")[1], page.split("## Run 2")[1].split("## Run 1")[0]
    for r in runs[1]["rows"]:
        assert line(r) in run2, r
    known = {line(r) for r in runs[0]["rows"]}
    rows1 = [ln for ln in run1.splitlines() if ln.startswith("| ") and ("x |" in ln or "shared memory" in ln)]
    assert len(rows1) >= 20 and all(any(ln.startswith(k) for k in known) for ln in rows1)
    us = {(r["shape"], r["build"]): r.get("us") for r in runs[1]["rows"]}
    text = " ".join(page.split())
    d512 = ("prefill-4096-full-d512", "prefill-chunk-2048-of-8192-full-d512", "mixed-2048of8192+63x4096-full-d512")
    for shape in d512:
        assert f"{us[(shape, 'next2')] / us[(shape, 'next4')]:.3f}x" in text, shape
        assert us[(shape, "next4")] < us[(shape, "next2")] * 0.9
    patch = (ROOT / "experiments" / "kernels" / "vllm_unified_attention" / "paged-prefill-dsplit.patch").read_text()
    before, after = (us[("prefill-4096-full-d512", b)] for b in ("next2", "next4"))
    assert f"d512 prefill {before:.0f} -> {after:.0f} us" in patch


def test_the_whole_series_campaign_table_comes_from_its_verified_log(tmp_path: Path) -> None:
    """experiments/results/vllm-kernel-campaign-dsplit-h100.md: the log verifies with decisions re-decided, each of
    the six patches was accepted on its own A/B as the page says, and every stock-vs-series row, the overall ratio
    and the targets' figures are the log's final comparison."""
    summary, outcomes = _paged_campaign_summary(tmp_path, "vllm-kernel-campaign-dsplit-h100-log.tgz", 69,
                                                "vllm-kernel-campaign-dsplit-h100.json")
    assert outcomes == ["accepted"] * 6 + ["invalid"]
    assert summary["tunables_after"]["PAGED_PREFILL_D512_DSPLIT"] == 2
    page = (RESULTS / "vllm-kernel-campaign-dsplit-h100.md").read_text()
    for it in summary["iterations"][:6]:
        assert re.search(rf"\| {it['iteration']} \| `[a-z0-9-]+\.patch` \| accepted \| {re.escape(it['speedup'])} \|",
                         page), it
    rows = {row["shape"]: row for row in summary["shapes"]}
    for row in rows.values():
        assert (f"| {row['shape']} | {row['before_median_us']:,.1f} | {row['after_median_us']:,.1f} | "
                f"{row['speedup']:.3f}x [{row['ci_low']:.3f}, {row['ci_high']:.3f}] | "
                f"{row['before_pct_hbm']:.1f} → {row['after_pct_hbm']:.1f} | "
                f"{row['before_tflop_s']:.1f} → {row['after_tflop_s']:.1f} |") in page, row["shape"]
    overall = summary["overall"]
    assert f"**{overall['ratio']:.3f}x [{overall['low']:.3f}, {overall['high']:.3f}]**" in page
    text = " ".join(page.split())
    assert f"d512 **{rows['prefill-4096-full-d512']['speedup']:.2f}x**" in text
    assert f"d256 **{rows['prefill-4096-sliding-d256']['speedup']:.2f}x**" in text
    assert f"{rows['decode-b64-sliding-d256']['after_pct_hbm']:.1f} % here (not met" in text
    below = [r for r in rows.values() if r["ci_low"] <= 1.0]
    assert [r["shape"] for r in below] == ["decode-b256-full-d512"] and "every shape's interval is above 1 but" in text


def test_the_kernel_aa_page_comes_from_its_recorded_runs() -> None:
    """kernel-aa-cpu.md: the resampling table recomputes from the recorded 400 rounds (same draws and seed), and
    every live A/A evaluation is re-judged from its round medians to the outcome and ratio on record."""
    from kernel_aa import _as_result, resample

    from harness.config import StatsConfig
    from harness.kernel.compare import compare

    page = (RESULTS / "kernel-aa-cpu.md").read_text()
    committed = json.loads((RESULTS / "kernel-aa-cpu-resample.json").read_text())
    windows = [int(w) for w in committed["accept_rate"]]
    again = resample(ROOT / committed["recorded"], windows, committed["draws"], committed["seed"])
    assert again["accept_rate"] == committed["accept_rate"]
    def pct(x: float) -> str:
        return "100 %" if x == 1 else f"{100 * x:.1f} %"

    for w, row in committed["accept_rate"].items():
        assert row["1.00"] == 0.0        # no window of one evaluation accepted nothing
        figures = [row[k] for k in ("1.00", "covered 1.00", "1.05", "1.10", "1.25")]
        assert f"| {w} | " + " | ".join(pct(x) for x in figures) + " |" in page

    runs = json.loads((RESULTS / "kernel-aa-cpu-live.json").read_text())["runs"]
    assert len(runs) == 40
    for r in runs:
        ab = compare(_as_result({n: (s["A"], s["A2"]) for n, s in r["round_medians_us"].items()}, 1.0), a="A",
                     b="B", stats=StatsConfig(), expected_sha256={"A": "A", "B": "B"})
        assert ab.overall is not None
        assert (ab.outcome, round(ab.overall.ratio, 9)) == (r["outcome"], round(r["overall"], 9))
    accepted = [i + 1 for i, r in enumerate(runs) if r["outcome"] == "accepted"]
    b_ahead = sum(r["overall"] > 1.0 for r in runs)
    assert (accepted, b_ahead) == ([26], 29)
    assert "**1 of 40 was accepted**: evaluation 26, **1.049x [1.034, 1.064]**" in page
    assert "**29 of 40**" in page


def test_the_roofline_page_comes_from_the_committed_grids_and_its_recorded_ceilings(tmp_path: Path) -> None:
    """experiments/results/roofline.md regenerates byte for byte from the committed grids, the committed H200
    kernel results' ceilings and the CPU ceilings it recorded; and says what the issue asked."""
    from roofline_page import main as roofline_page

    assert roofline_page(["--cpu-ceilings", str(RESULTS / "roofline.json"), "--out-dir", str(tmp_path)]) == 0
    page = (RESULTS / "roofline.md").read_text()
    assert (tmp_path / "roofline.md").read_text() == page
    assert "3.754 GFLOP of weights per token" in page and "IMPOSSIBLE" not in page
    assert "108,000 total tok/s | 133% /" in page     # the seed claim on an A100, as vLLM serves by default
