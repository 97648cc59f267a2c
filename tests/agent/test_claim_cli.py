"""`ratchet claim`: a published claim against the hardware's roofline, and what it refuses to judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from tests.conftest import ROOT

SPEC = ROOT / "experiments" / "gemma4-e2b-gpu.yaml"
E2B = ROOT / "experiments" / "models" / "gemma4-e2b-dummy"


def test_the_seed_claim_is_judged_on_every_cell_of_its_grid(tmp_path: Path) -> None:
    out = tmp_path / "claims.json"
    code = main(["claim", "--spec", str(SPEC), "--hardware", "A100-80GB-SXM", "--tok-s", "37900", "108000",
                 "--out", str(out)])
    claims = json.loads(out.read_text())["claims"]
    assert code == 0 and len(claims) == 2 * 9
    assert {c["verdict"] for c in claims if c["tok_s"] == 37900} == {"possible"}
    assert all(c["verdict"] == "needs" and c["need_served"] > 1 for c in claims if c["tok_s"] == 108000)


def test_an_impossible_claim_exits_1(tmp_path: Path) -> None:
    code = main(["claim", "--model", str(E2B), "--hardware", "L4", "--input-len", "512", "--output-len", "128",
                 "--concurrency", "256", "--tok-s", "108000"])
    assert code == 1


def test_a_claim_without_a_workload_is_refused_with_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["claim", "--model", str(E2B), "--hardware", "A100", "--input-len", "512", "--tok-s", "108000"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--output-len, --concurrency" in err and "--input-len" not in err.split("workload:")[1]
    code = main(["claim", "--model", str(E2B), "--input-len", "512", "--output-len", "1", "--concurrency", "8"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--tok-s" in err and "--hardware" in err


def test_a_claim_on_an_unknown_architecture_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    code = main(["claim", "--model", str(tmp_path), "--hardware", "H100", "--input-len", "512", "--output-len", "1",
                 "--concurrency", "8", "--tok-s", "1000"])
    assert code == 2 and "Qwen3ForCausalLM" in " ".join(capsys.readouterr().err.split())


def test_measured_results_are_checked_cell_by_cell(tmp_path: Path) -> None:
    out = tmp_path / "h200.json"
    code = main(["claim", "--spec", str(SPEC), "--results", str(ROOT / "experiments" / "results" /
                                                                "h200-e2b-stock-grid.json"),
                 "--hardware", "H200", "--out", str(out)])
    claims = json.loads(out.read_text())["claims"]
    assert code == 0 and len(claims) == 9 and {c["verdict"] for c in claims} == {"possible"}
    assert {c["metric"] for c in claims} == {"total", "prefill"}
