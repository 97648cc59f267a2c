"""The measurement commands end to end: a real `ratchet` process, a real vLLM CPU server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, processes_under, write_prompts, write_spec

# These tests are about the CLI and the evidence of the host paths the server imported; they name the
# unisolated backend (the shipped default, auto, runs in the campaign, red-team and docker tests).
UNISOLATED = "sandbox: {backend: unisolated}\n"

TINY = ROOT / "experiments" / "models" / "gemma4-tiny"
PARITY_PROMPTS = ROOT / "experiments" / "prompts" / "gemma4-tiny-parity.jsonl"


def ratchet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.vllm
def test_measure_prints_the_grid_and_writes_one_object_per_cell(random_model: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, model=random_model, workspace=tmp_path / "ws", prompts=write_prompts(tmp_path / "p.jsonl"),
        extra=UNISOLATED,
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
def test_compare_measures_dummy_weights_and_checks_parity_on_the_real_checkpoint(random_model: Path,
                                                                                tmp_path: Path) -> None:
    """The GPU spec's shape: speed on dummy weights (every logprob equal: their tokens prove nothing), parity
    on a separate server of each build that serves the trained tiny Gemma 4 with its real weights."""
    spec = write_spec(tmp_path, model=random_model, workspace=tmp_path / "ws", prompts=PARITY_PROMPTS,
                      extra=UNISOLATED)
    spec.write_text(spec.read_text()
                    .replace("max_model_len: 2048}", "max_model_len: 2048, load_format: dummy}")
                    .replace("  max_tokens: 8\n",
                             f"  max_tokens: 8\n  model: {TINY}\n  engine_args: {{load_format: auto}}\n"))
    proc = ratchet("compare", str(spec), "--baseline", "HEAD", "--candidate", "HEAD", "--repeats", "4",
                   "--engine-args", '{"max_num_seqs": 4}', "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "c.json").read_text())
    assert out["parity"]["ok"] is True
    for label in ("in64/out8", "in64/out1"):
        ci = out["cells"][label]["headline"]
        assert ci["n"] == 4 and ci["low"] <= ci["ratio"] <= ci["high"] and ci["df"] == 3
    assert out["b"]["engine_args"] == {**out["a"]["engine_args"], "max_num_seqs": 4}
    assert "overall (geo-mean)" in proc.stdout
    run = next((tmp_path / "ws.runs").glob("compare-*"))
    for tag in ("A", "B"):     # the parity servers served the real checkpoint, the speed servers dummy weights
        parity_log = (run / f"server-{tag}-parity.log").read_text()
        speed_log = (run / f"server-{tag}.log").read_text()
        assert f"model='{TINY}'" in parity_log and "load_format=auto" in parity_log
        assert f"model='{random_model}'" in speed_log and "load_format=dummy" in speed_log
    # the candidate's engine args reach its parity server too (that is what parity must vouch for)
    assert "'max_num_seqs': 4" in (run / "server-B-parity.log").read_text()
    assert "'max_num_seqs': 4" not in (run / "server-A-parity.log").read_text()


def test_a_bad_spec_exits_2_with_the_field_path(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("schema_version: 1\nname: x\nserver: {model: m, bogus: 1}\n")
    proc = ratchet("measure", str(spec), timeout=120)
    assert proc.returncode == 2
    assert "server.bogus: unknown key" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.vllm
def test_profile_ranks_ops_by_self_time_for_prefill_and_end_to_end_at_the_cells_shape(
        random_model: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, model=random_model, workspace=tmp_path / "ws",
                      prompts=write_prompts(tmp_path / "p.jsonl"), extra=UNISOLATED)
    proc = ratchet("profile", str(spec), "--cell", "64/8", "--out", str(tmp_path / "prof.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases = {p["phase"]: p for p in json.loads((tmp_path / "prof.json").read_text())}
    assert set(phases) == {"prefill", "end-to-end"}
    assert phases["prefill"]["cell"] == "in64/out1"
    assert phases["end-to-end"]["cell"] == "in64/out8"    # the grid's shape itself
    for prof in phases.values():
        assert prof["ops"] and prof["ops"][0]["self_ms"] > 0
        assert sum(op["share"] for op in prof["ops"]) <= 1.0 + 1e-9
    assert "top ops by self time" in proc.stdout
