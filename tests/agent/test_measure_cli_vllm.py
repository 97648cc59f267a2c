"""The measurement commands end to end: a real `ratchet` process, a real vLLM CPU server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, processes_under, write_prompts, write_spec


def ratchet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.vllm
def test_measure_prints_the_grid_and_writes_one_object_per_cell(random_model: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, model=random_model, workspace=tmp_path / "ws", prompts=write_prompts(tmp_path / "p.jsonl")
    )
    proc = ratchet("measure", str(spec), "--out", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "in64/out8" in proc.stdout and "prefill" in proc.stdout
    out = json.loads((tmp_path / "m.json").read_text())
    cells = {c["cell"]: c for c in out["cells"]}
    assert set(cells) == {"in64/out8", "in64/out1"}
    assert cells["in64/out8"]["repeats"] == 2 and cells["in64/out8"]["total_token_throughput"] > 0
    assert cells["in64/out1"]["prefill_tok_s"] > 0
    assert out["evidence"]["vllm_file"].startswith(str(tmp_path / "ws"))
    assert not processes_under(tmp_path / "ws.runs")


@pytest.mark.vllm
def test_compare_a_build_with_itself_holds_parity_and_writes_cis(random_model: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, model=random_model, workspace=tmp_path / "ws", prompts=write_prompts(tmp_path / "p.jsonl")
    )
    proc = ratchet(
        "compare", str(spec), "--baseline", "HEAD", "--candidate", "HEAD", "--out", str(tmp_path / "c.json")
    )
    out = json.loads((tmp_path / "c.json").read_text())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["parity"]["ok"] is True
    for label in ("in64/out8", "in64/out1"):
        ci = out["cells"][label]["headline"]
        assert ci["n"] == 2 and ci["low"] <= ci["ratio"] <= ci["high"]
    assert out["a"]["engine_args"] == out["b"]["engine_args"]
    assert "overall (geo-mean)" in proc.stdout


def test_a_bad_spec_exits_2_with_the_field_path(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("schema_version: 1\nname: x\nserver: {model: m, bogus: 1}\n")
    proc = ratchet("measure", str(spec), timeout=120)
    assert proc.returncode == 2
    assert "server.bogus: unknown key" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.vllm
def test_profile_ranks_ops_by_self_time_for_prefill_and_decode(random_model: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, model=random_model, workspace=tmp_path / "ws",
                      prompts=write_prompts(tmp_path / "p.jsonl"))
    proc = ratchet("profile", str(spec), "--cell", "64/8", "--out", str(tmp_path / "prof.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases = {p["phase"]: p for p in json.loads((tmp_path / "prof.json").read_text())}
    assert set(phases) == {"prefill", "decode"}
    for prof in phases.values():
        assert prof["ops"] and prof["ops"][0]["self_ms"] > 0
        assert sum(op["share"] for op in prof["ops"]) <= 1.0 + 1e-9
    assert "top ops by self time" in proc.stdout
