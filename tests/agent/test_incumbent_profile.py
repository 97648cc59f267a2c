"""The incumbent's profile as the proposers get it: the step table's medians as numbers."""

from __future__ import annotations

from pathlib import Path

from agent.incumbent_profile import step_medians
from harness.config import Cell
from harness.profiling import read_profile
from tests.harness.step_traces import TraceBuilder, engine_trace
from tests.harness.test_step_profile import HINTS


def test_the_proposers_numbers_take_prefill_from_the_prefill_run(tmp_path: Path) -> None:
    engine_trace().write(tmp_path / "e2e" / "rank0.pt.trace.json.gz")
    prefill = TraceBuilder()
    prefill.prefill_step(0)
    prefill.prefill_step(1000)
    prefill.write(tmp_path / "pre" / "rank0.pt.trace.json.gz")
    e2e = read_profile("end-to-end", Cell(input_len=8, output_len=4), tmp_path / "e2e", HINTS)
    pre = read_profile("prefill", Cell(input_len=8, output_len=1), tmp_path / "pre", HINTS)
    steps = step_medians([pre, e2e])
    assert set(steps) == {"decode", "prefill"} and steps["decode"]["GEMM"] == 100
    # the prefill run's two steps (1000 and, the last, 800 µs), not the end-to-end run's one (1000 µs)
    assert steps["prefill"]["wall"] == 900
