"""Engine steps cut from hand-written Chrome traces: the split, busy vs idle, categories and medians."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.config import Cell
from harness.errors import TraceUnusable
from harness.profiling import read_profile, render_profiles
from harness.step_profile import (
    BUSY,
    CPU_BETWEEN,
    GRAPHED,
    HOST_EXPOSED,
    HOST_OTHER,
    IDLE,
    LAUNCH_GAPS,
    UNSPLIT,
    WALL,
    ModelHints,
    step_breakdowns,
    step_table,
)
from harness.trace_steps import read_trace_files, split_steps
from tests.harness.step_traces import ARGMAX, ATTENTION, LM_HEAD, SLIDING, TraceBuilder, engine_trace

HINTS = ModelHints(vocab=1000, attention=(("sliding (d256)", 4, 2), ("full (d512)", 1, 1)))


def _split(tmp_path: Path, trace: TraceBuilder, **kw: float):  # type: ignore[no-untyped-def]
    trace.write(tmp_path / "traces" / "rank0.1.pt.trace.json.gz")
    return split_steps(read_trace_files(tmp_path / "traces"), **kw)


def test_steps_run_from_one_step_range_to_the_next_and_take_their_phase_from_its_shape(tmp_path: Path) -> None:
    split = _split(tmp_path, engine_trace())
    assert "execute_context" in split.source
    assert [s.phase for s in split.steps] == ["prefill", "decode", "decode", "decode"]
    assert [(s.start_us, s.end_us) for s in split.steps[:3]] == [(0, 1000), (1000, 2000), (2000, 3000)]
    assert split.steps[3].end_us == 4050          # the last step ends with its last kernel
    assert split.steps[1].generation == (2, 2) and split.steps[0].context == (2, 1024)


def test_a_kernel_belongs_to_the_step_that_launched_it_even_when_it_runs_in_the_next(tmp_path: Path) -> None:
    split = _split(tmp_path, engine_trace())
    late = [e for e in split.device[1] if e["name"] == ARGMAX]
    assert len(late) == 1 and late[0]["ts"] == 1950
    assert not any(e["name"] == ARGMAX and e["ts"] == 1950 for e in split.device[2])
    graph = [e for e in split.device[1] if (e.get("args") or {}).get("graph id")]
    assert len(graph) == 1 + 1 + 4 + 1 + 1       # the graph replay's kernels, each recorded


def test_busy_is_the_union_of_device_intervals_and_idle_splits_into_gaps_and_cpu_time(tmp_path: Path) -> None:
    rows, _ = step_breakdowns(_split(tmp_path, engine_trace()), HINTS)
    s1 = rows[1]
    kernel_sum = 40 + 20 + 80 + 40 + 30 + 10 + 100 + 30 + 100
    assert kernel_sum == 450 and s1[BUSY] == 420      # the copy overlaps the norm by 30 µs: union, not sum
    assert s1[WALL] == 1000 and s1[IDLE] == 580
    assert s1[LAUNCH_GAPS] == 960 - 420               # idle inside the device span (1090 .. 2050)
    assert s1[CPU_BETWEEN] == 40                      # the wall outside it
    assert s1[GRAPHED] == 20 + 80 + 40 + 30 + 10      # the graph replay's kernels, not the copy or eager ones
    # host events not under any device activity: the graph launch (20), aten::mm with its launch (10), the four
    # launches after it (4), aten::copy_ (70); aten::empty runs under the graph and does not count
    assert s1[HOST_EXPOSED] == pytest.approx(104)


def test_kernel_time_goes_to_its_category_with_lm_head_softcap_and_attention_kinds(tmp_path: Path) -> None:
    rows, notes = step_breakdowns(_split(tmp_path, engine_trace()), HINTS)
    s1 = rows[1]
    assert s1["GEMM"] == 80 and s1["lm_head + softcap"] == 100 + 30 and s1["sampling"] == 100
    assert s1["norms"] == 20 and s1["PLE + embedding gather"] == 10 and s1["memcpy / memset"] == 40
    assert s1["attention sliding (d256)"] == 40 and s1["attention full (d512)"] == 30
    assert UNSPLIT not in s1 and s1.get("elementwise / other", 0) == 0
    assert any("N = 1000" in note for note in notes)


def test_lm_head_is_found_through_its_launch_when_the_kernel_names_no_op(tmp_path: Path) -> None:
    trace = engine_trace()
    launches = {e["args"]["correlation"]: e for e in trace.events if e["cat"] == "cuda_runtime"}
    for e in trace.events:
        if e["name"] == LM_HEAD:
            launches[e["args"]["correlation"]]["args"]["External id"] = e["args"].pop("External id")
    _, notes = step_breakdowns(_split(tmp_path, trace), HINTS)
    assert notes["lm_head: the GEMM whose op has N = 1000 in its input dims"] == 3     # each of the 3 decode steps


def test_without_shapes_lm_head_is_the_last_gemm_and_attention_stays_one_row(tmp_path: Path) -> None:
    rows, notes = step_breakdowns(_split(tmp_path, engine_trace()), None)
    assert rows[1]["lm_head + softcap"] == 130 and rows[1][UNSPLIT] == 70
    assert any("last GEMM" in n for n in notes) and any("no model shapes" in n for n in notes)


def test_attention_is_not_split_when_launch_counts_do_not_match_the_layer_ratio(tmp_path: Path) -> None:
    rows, notes = step_breakdowns(_split(tmp_path, engine_trace(sliding=3, full=2)), HINTS)
    assert rows[1][UNSPLIT] == 3 * 10 + 2 * 30
    assert any("launch counts 3:2" in n for n in notes)


def test_the_table_holds_medians_per_phase_and_shares_of_the_median_wall(tmp_path: Path) -> None:
    table = step_table(_split(tmp_path, engine_trace()), HINTS)
    decode, prefill = table.phases
    assert (decode.phase, decode.steps, prefill.phase, prefill.steps) == ("decode", 3, "prefill", 1)
    rows = {r.name: r for r in decode.rows}
    assert rows["GEMM"].median_us == 100                      # of 80, 120, 100
    assert rows[WALL].median_us == 1000 and rows[WALL].share == 1.0   # of 1000, 1000, 1050
    assert rows["GEMM"].share == pytest.approx(0.1)
    assert decode.requests == (2, 2, 2)
    names = [r.name for r in decode.rows]
    assert names[:4] == [WALL, BUSY, IDLE, GRAPHED] and names.index("attention full (d512)") < names.index("GEMM")
    assert names.index(LAUNCH_GAPS) > names.index("sampling")


def _write(path: Path, events: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_a_trace_without_step_ranges_is_cut_at_device_gaps_and_says_so(tmp_path: Path) -> None:
    trace = TraceBuilder()
    for t0, attention in ((0, "kernel_unified_attention_3d"), (1000, ATTENTION), (2000, None)):
        corr = trace.launch(t0)
        trace.device("nvjet_tst_64x8_64x16_1x4_h_bz_TNT", t0 + 10, 50, corr)
        if attention:
            trace.device(attention, t0 + 65, 20, corr, **SLIDING, **{"graph id": 3 if t0 == 1000 else 0})
    split = _split(tmp_path, trace, gap_us=200)
    assert "gaps" in split.source and len(split.steps) == 3
    assert [s.phase for s in split.steps] == ["decode", "decode", "unknown"]
    assert split.steps[0].start_us == 10 and split.steps[0].end_us == 1010
    table = step_table(split)
    assert {p.phase for p in table.phases} == {"decode", "unknown"}


def test_an_empty_folder_or_a_trace_with_nothing_to_cut_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TraceUnusable, match="no readable Chrome trace"):
        split_steps(read_trace_files(tmp_path))
    (tmp_path / "odd.json").write_text("[1, 2, 3]")                 # not a trace object: skipped
    with pytest.raises(TraceUnusable, match="no readable Chrome trace"):
        split_steps(read_trace_files(tmp_path))
    _write(tmp_path / "cpu.json.gz", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                        "ts": 0, "dur": 5}])
    with pytest.raises(TraceUnusable, match="no engine step ranges .* and no device activity"):
        split_steps(read_trace_files(tmp_path))
    idle = TraceBuilder()
    idle.step(0, 50, (0, 0), (0, 0))
    idle.write(tmp_path / "idle" / "rank0.pt.trace.json.gz")
    with pytest.raises(TraceUnusable, match="all have nothing scheduled"):
        split_steps(read_trace_files(tmp_path / "idle"))


def test_a_trace_without_steps_keeps_its_top_ops_and_says_why_there_is_no_table(tmp_path: Path) -> None:
    _write(tmp_path / "cpu.json.gz", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                        "ts": 0, "dur": 5}])
    prof = read_profile("end-to-end", Cell(input_len=8, output_len=4), tmp_path, None)
    assert prof.steps is None and "no engine step ranges" in prof.steps_note
    assert [op.name for op in prof.ops] == ["aten::mm"]
    assert "no step table" in render_profiles([prof])


def test_on_a_cpu_host_rows_are_op_self_time_and_the_rest_is_host_time(tmp_path: Path) -> None:
    trace = TraceBuilder()
    trace.step(700, 50, (0, 0), (0, 0))                # nothing scheduled: folded into the step before it
    trace.step(2800, 50, (0, 0), (0, 0))               # after the last step: left out
    for t0 in (0, 1000, 2000):
        trace.step(t0, 600, (0, 0), (1, 1))
        trace.host("aten::linear", t0 + 100, 100)
        trace.host("_C::onednn_mm", t0 + 110, 80)                 # nested: linear keeps 20 µs of self time
        trace.host("_C::cpu_attention_with_kv_cache", t0 + 250, 50)
        trace.host("_C::onednn_mm", t0 + 400, 30, **{"External id": t0, "Input Dims": [[1, 64], [64, 1000]]})
        trace.host("aten::tanh", t0 + 440, 5)
        trace.host("_C::greedy_argmax", t0 + 460, 10)
    table = step_table(_split(tmp_path, trace), HINTS)
    assert table.device.startswith("CPU")
    rows = {r.name: r.median_us for r in table.phases[0].rows}
    assert rows["GEMM"] == 80 and rows["lm_head + softcap"] == 35 and rows["attention"] == 50
    assert rows["sampling"] == 10 and rows["elementwise / other"] == 20
    assert rows[HOST_OTHER] == 1000 - (80 + 35 + 50 + 10 + 20)
    assert table.phases[0].steps == 3 and any("2 step ranges with nothing scheduled" in n for n in table.notes)
    walls = [r[WALL] for r in step_breakdowns(_split(tmp_path, trace), HINTS)[0]]
    assert walls == [1000, 1000, 600]                 # the last one ends with its own range


def test_render_puts_the_step_tables_before_the_top_ops(tmp_path: Path) -> None:
    engine_trace().write(tmp_path / "t" / "rank0.pt.trace.json.gz")
    text = render_profiles([read_profile("end-to-end", Cell(input_len=8, output_len=4), tmp_path / "t", HINTS)])
    assert text.index("per engine step") < text.index("top ops by self time")
    assert "decode: 3 steps" in text and "attention full (d512)" in text


def test_trace_files_with_another_time_base_are_moved_onto_the_first(tmp_path: Path) -> None:
    for name, base, ts in (("a.json", 1_000_000_000, 50.0), ("b.json", 1_002_000_000, 50.0)):
        (tmp_path / name).write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1},
            {"ph": "i", "name": "instant", "pid": 1, "tid": 1, "ts": ts}]}))
    first, second = read_trace_files(tmp_path)
    assert [e["ts"] for e in first.events] == [50.0]
    assert [e["ts"] for e in second.events] == [2050.0]          # 2 ms later on the first file's clock

