"""Committed results reproduce from the committed logs they were made from."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"
sys.path.insert(0, str(ROOT / "experiments"))

from campaign_time import summarise  # noqa: E402
from iteration_cells import iteration_cells, to_markdown  # noqa: E402


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
