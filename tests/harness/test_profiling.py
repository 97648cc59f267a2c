from __future__ import annotations

import gzip
import json
from pathlib import Path

from harness.profiling import read_traces, top_ops


def _ev(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_self_time_excludes_nested_ops() -> None:
    events = [_ev("aten::linear", 0, 100), _ev("aten::addmm", 10, 80), _ev("aten::gelu", 200, 50)]
    ops = {o.name: o for o in top_ops(events)}
    assert ops["aten::addmm"].self_ms == 0.08
    assert ops["aten::linear"].self_ms == 0.02
    assert ops["aten::gelu"].self_ms == 0.05
    assert abs(sum(o.share for o in ops.values()) - 1.0) < 1e-9


def test_threads_are_kept_apart_and_other_categories_ignored() -> None:
    events = [_ev("a", 0, 100, tid=1), _ev("b", 10, 50, tid=2), _ev("python", 0, 999, cat="python_function")]
    ops = {o.name: o for o in top_ops(events)}
    assert set(ops) == {"a", "b"} and ops["a"].self_ms == 0.1


def test_gzipped_chrome_traces_are_read(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "x.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": [_ev("k", 0, 5, cat="kernel")]}, f)
    assert [o.name for o in top_ops(read_traces(tmp_path))] == ["k"]
