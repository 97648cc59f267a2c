"""Timing order, the quarantine of implausible speedups, and the work counted from a shape."""

from __future__ import annotations

from typing import Any

import torch

from harness.config import StatsConfig
from harness.kernel.compare import compare
from harness.kernel.config import ShapeConfig
from harness.kernel.roofline import attainment
from harness.kernel.shapes import flops, keys_read, min_bytes, visible_pairs
from harness.kernel.timing import Timer, evict, interleave


class _Recorder(Timer):
    def __init__(self) -> None:
        self.order: list[str] = []

    def time_calls(self, fn: Any, calls: int, **hooks: Any) -> list[float]:
        self.order.append(fn())
        return [1.0] * calls


def test_builds_alternate_order_every_round_after_a_warm_up() -> None:
    timer = _Recorder()
    t = interleave({"A": lambda: "A", "B": lambda: "B"}, timer, rounds=4, calls_per_round=3, warmup_calls=2)
    assert timer.order == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]
    assert len(t.round_medians["A"]) == 4 and len(t.calls["B"]) == 12


def _result(a_us: dict[str, float], b_us: dict[str, float]) -> dict[str, Any]:
    def entry(us: float, i: int) -> dict[str, Any]:
        samples = [us * (1 + 0.01 * ((i + r) % 3)) for r in range(10)]
        return {"ok": True, "pre": {"ok": True, "failures": []}, "post": {"ok": True, "failures": []},
                "round_medians_us": samples, "median_us": us}
    return {"builds": {"A": {"loaded": True, "sha256": "a"}, "B": {"loaded": True, "sha256": "b"}},
            "shapes": {n: {"builds": {"A": entry(a_us[n], 0), "B": entry(b_us[n], 1)}} for n in a_us}}


SHA = {"A": "a", "B": "b"}


def test_one_shape_over_ten_times_faster_is_quarantined_even_when_the_mean_is_not() -> None:
    ab = compare(_result({"x": 100.0, "y": 100.0, "z": 100.0}, {"x": 8.0, "y": 100.0, "z": 100.0}), a="A", b="B",
                 stats=StatsConfig(), expected_sha256=SHA)
    assert ab.overall is not None and ab.overall.ratio < 10
    assert ab.outcome == "quarantined" and "x" in ab.reason


def test_a_speedup_on_one_shape_with_a_regression_on_another_is_rejected() -> None:
    ab = compare(_result({"x": 100.0, "y": 100.0}, {"x": 50.0, "y": 120.0}), a="A", b="B", stats=StatsConfig(),
                 expected_sha256=SHA)
    assert ab.outcome == "rejected" and "regressed" in ab.reason


def test_a_clear_speedup_is_accepted() -> None:
    ab = compare(_result({"x": 100.0, "y": 100.0}, {"x": 70.0, "y": 99.0}), a="A", b="B", stats=StatsConfig(),
                 expected_sha256=SHA)
    assert ab.outcome == "accepted", ab.reason
    assert ab.shapes["x"].ratio > 1.3


def test_work_is_counted_from_the_shape_with_the_window() -> None:
    decode = ShapeConfig(name="d", batch=2, q_len=1, kv_len=1000, head_dim=256, sliding_window=512)
    assert visible_pairs(decode) == 2 * 512 and keys_read(decode) == 2 * 512     # over both sequences
    full = decode.model_copy(update={"sliding_window": None})
    assert visible_pairs(full) == 2 * 1000 and keys_read(full) == 2 * 1000
    prefill = ShapeConfig(name="p", batch=1, q_len=6, kv_len=6, head_dim=16, sliding_window=3)
    assert visible_pairs(prefill) == 1 + 2 + 3 + 3 + 3 + 3 and keys_read(prefill) == 6
    # bf16: q and out 2 x 2 x 8 x 256, k and v 2 x 2 x 512 x 256, two bytes each
    assert min_bytes(decode, 2) == (2 * 2 * 8 * 256 + 2 * 2 * 512 * 256) * 2
    assert flops(decode) == 4 * 256 * 512 * 2 * 8
    # a mixed batch counts its chunk and its decodes (4 of them over 10 keys, each seeing the window's 3)
    mixed = prefill.model_copy(update={"decodes": 4, "decode_kv_len": 10})
    assert mixed.mode == "mixed" and mixed.tokens == 6 + 4 and mixed.num_seqs == 5 and mixed.max_kv_len == 10
    assert visible_pairs(mixed) == 15 + 4 * 3 and keys_read(mixed) == 6 + 4 * 3
    assert min_bytes(mixed, 2) == (2 * 10 * 8 * 16 + 2 * 18 * 16) * 2 and flops(mixed) == 4 * 16 * 27 * 8


def test_attainment_is_against_the_measured_ceilings() -> None:
    shape = ShapeConfig(name="d", batch=64, q_len=1, kv_len=4096, head_dim=512)
    roof = {"hbm_gb_s": 4000.0, "bf16_tflop_s": 800.0}
    floor_us = min_bytes(shape, 2) / 4000.0 / 1e3
    att = attainment(shape, 2 * floor_us, roof, itemsize=2)
    assert abs(att["pct_hbm"] - 50.0) < 1e-6 and abs(att["pct_of_roofline"] - 50.0) < 1e-6


def test_the_l2_flush_reads_its_buffer_and_writes_nothing_back() -> None:
    # A zeroing flush left the L2 dirty, and a kernel reading less than the L2 paid for the write-back.
    buf = torch.randint(0, 256, (1 << 12,), dtype=torch.uint8)
    before = buf.clone()
    total = evict(buf)
    assert torch.equal(buf, before)
    assert int(total) == int(buf.view(torch.int32).sum(dtype=torch.int64))
