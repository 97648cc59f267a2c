"""Each correctness check passes a right kernel and fails the bad kernel it exists for."""

from __future__ import annotations

import pytest
import torch

from harness.kernel.config import CorrectnessConfig, ShapeConfig
from harness.kernel.correctness import check_kernel
from tests.kernel import kernel_fakes as fakes

CPU = torch.device("cpu")
SHAPES = [ShapeConfig(name="decode", batch=2, q_len=1, kv_len=48, head_dim=16, sliding_window=20),
          ShapeConfig(name="prefill", batch=1, q_len=40, kv_len=40, head_dim=32, sliding_window=16, softcap=20.0)]


def _check(fn: fakes.Any, shape: ShapeConfig, seed: int = 1) -> tuple[bool, str]:
    r = check_kernel(fn, shape, CorrectnessConfig(), dtype=torch.bfloat16, device=CPU, seed=seed)
    return r.ok, " | ".join(r.failures)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_a_right_kernel_passes_in_bf16(shape: ShapeConfig) -> None:
    ok, why = _check(fakes.good, shape)
    assert ok, why


@pytest.mark.parametrize(("fn", "expected"), [
    (fakes.mutates_input, "input k was modified"),
    (fakes.constant, "constant output"),
    (fakes.leaves_nan, "unwritten or non-finite"),
    (fakes.ignores_window, "relative L2 error"),
    (fakes.raises, "raised RuntimeError"),
], ids=["mutates-input", "constant", "leaves-nan", "ignores-window", "raises"])
def test_each_bad_kernel_fails_its_check(fn: fakes.Any, expected: str) -> None:
    ok, why = _check(fn, SHAPES[1])
    assert not ok
    assert expected in why


def test_a_nearly_right_kernel_fails_the_element_check_alone() -> None:
    def one_bad_element(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: object) -> None:
        fakes.good(q, k, v, out, **kw)   # type: ignore[arg-type]
        out[0, 0, 0, 0] += 0.1 * out.abs().max()   # L2 over thousands of elements barely moves; the max does
    r = check_kernel(one_bad_element, SHAPES[1], CorrectnessConfig(), dtype=torch.float32, device=CPU, seed=2)
    assert not r.ok and "largest element error" in " ".join(r.failures)
    assert r.rel_l2 is not None and r.rel_l2 < CorrectnessConfig().rel_l2


def test_inputs_are_fresh_for_each_seed() -> None:
    seen = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kw: object) -> None:
        seen.append(q.clone())
        fakes.good(q, k, v, out, **kw)   # type: ignore[arg-type]
    for seed in (1, 2):
        check_kernel(spy, SHAPES[0], CorrectnessConfig(), dtype=torch.bfloat16, device=CPU, seed=seed)
    assert not torch.equal(seen[0], seen[1])
    assert bool((seen[0] != 0).all())          # random normal data, never zeros
