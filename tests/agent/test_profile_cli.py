"""`ratchet profile --traces`: an earlier profile's traces read again, the step table printed and written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from tests.conftest import ROOT
from tests.harness.step_traces import TraceBuilder, engine_trace

SPEC = ROOT / "experiments" / "gemma4-e2b-gpu.yaml"      # Gemma 4 E2B: 28 sliding (d256) and 7 full (d512) layers


def test_profile_reads_saved_traces_and_splits_e2b_attention_by_layer_kind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "profile-1"
    engine_trace(sliding=28, full=7, vocab=262144).write(folder / "trace-end-to-end" / "rank0.1.pt.trace.json.gz")
    prefill = TraceBuilder()
    prefill.prefill_step(0)
    prefill.write(folder / "trace-prefill" / "rank0.2.pt.trace.json.gz")
    out = tmp_path / "profile.json"
    assert main(["profile", str(SPEC), "--cell", "512/256", "--traces", str(folder), "--out", str(out)]) == 0
    phases = {p["phase"]: p for p in json.loads(out.read_text())}
    assert set(phases) == {"prefill", "end-to-end"} and phases["prefill"]["cell"] == "in512/out1"
    decode = next(t for t in phases["end-to-end"]["steps"]["phases"] if t["phase"] == "decode")
    rows = {r["name"]: r["median_us"] for r in decode["rows"]}
    assert decode["steps"] == 3 and rows["attention sliding (d256)"] == 280 and rows["attention full (d512)"] == 210
    assert rows["lm_head + softcap"] == 130 and rows["GEMM"] == 100
    assert phases["end-to-end"]["ops"], "the top ops stay beside the table"
    printed = capsys.readouterr().out
    assert "decode steps" in printed and "attention full (d512)" in printed and "top ops by self time" in printed


def test_profile_refuses_a_traces_path_that_is_not_a_folder(tmp_path: Path) -> None:
    assert main(["profile", str(SPEC), "--traces", str(tmp_path / "missing")]) == 2
