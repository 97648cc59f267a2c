"""The roofline as `compare` prints and writes it: each build's cells, and a build faster than physics called out."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from rich.console import Console

from agent.commands import compare
from agent.spec import load_spec
from harness.config import StatsConfig
from harness.measure import ABResult, Build, GridResult, grid_ratios
from tests.fake_campaign import write_target
from tests.fake_measurements import FAKE_CEILINGS, _runs


def test_compare_places_both_builds_on_the_roofline_and_calls_out_an_impossible_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(write_target(tmp_path))
    bench = spec.benchmark
    a = GridResult(build=Build(tag="A", tree=tmp_path, engine_args={}), startup_s=0.1, evidence={},
                   runs=_runs(Build(tag="A", tree=tmp_path, engine_args={}), bench.cells(), bench, tmp_path / "runs"))
    fast = Build(tag="B", tree=tmp_path, engine_args={"max_num_seqs": 8})
    b = GridResult(build=fast, startup_s=0.1, evidence={}, runs=_runs(fast, bench.cells(), bench, tmp_path / "runs"))
    cells, overall = grid_ratios(a, b, bench.cells(), StatsConfig())
    result = ABResult(a=a, b=b, parity=None, cells=cells, overall=overall)
    printed = io.StringIO()
    monkeypatch.setattr(compare, "console", Console(file=printed, width=200))
    out = compare._roofline(spec, result, bench, FAKE_CEILINGS, "")
    assert out["ceilings"]["source"] == "fake" and set(out["A"]) == set(out["B"]) == {c.label for c in bench.cells()}
    assert not any(rf["impossible"] for tag in "AB" for rf in out[tag].values())
    slow = dataclasses.replace(FAKE_CEILINGS, flop_s=1e9, flop_s_best=1e9)   # B (2x stock) now needs > 100 %
    out = compare._roofline(spec, result, bench, slow, "")
    assert any(rf["impossible"] for rf in out["B"].values())
    assert "B: cells" in printed.getvalue() and "impossible" in printed.getvalue()
    none = compare._roofline(spec, result, bench, None, "no CUDA device visible")
    assert none["ceilings"] == {"omitted": "no CUDA device visible"} and "floor_s" not in none["A"]["in8/out4"]
