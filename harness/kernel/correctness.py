"""One correctness check of a kernel on one shape: KernelBench's checks, and the holes they left closed.

Each check draws fresh random inputs from its own seed (a kernel cannot memorise an answer), pre-fills the
output with NaN (an element the kernel never writes stays NaN and fails), compares the inputs after the call
with copies taken before (a kernel must not write its inputs: a later call would see other data), refuses a
constant output (the all-zeros pass), and compares with a float64 reference by relative L2 error and largest
element error. The campaign runs it before and again after timing (a kernel that goes wrong once warmed up,
or after N calls, fails the second one). Every failure is a value with a reason, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness.kernel.config import CorrectnessConfig, ShapeConfig
from harness.kernel.interfaces import Interface, VllmBackendConstants, bind
from harness.kernel.reference import reference_attention

__all__ = ["CheckResult", "KernelFn", "make_inputs", "check_kernel", "OutputGuard"]

KernelFn = Callable[..., Any]   # called as its interface says (harness/kernel/interfaces.py)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    seed: int
    failures: tuple[str, ...]
    rel_l2: float | None = None          # ||out - ref|| / ||ref||
    max_rel: float | None = None         # max |out - ref| / max |ref|
    unwritten: int | None = None         # output elements still NaN (or otherwise non-finite) after the call

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["failures"] = list(self.failures)
        for key in ("rel_l2", "max_rel"):   # canonical JSON has no NaN/inf: a broken number is a string
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


def make_inputs(shape: ShapeConfig, *, dtype: torch.dtype, device: torch.device,
                seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ~ N(0, 1) from their own generator on the device (fast at GB sizes, no shared global state).
    A mixed batch's q is flat, [tokens, heads, head_dim] in call order, and its k and v hold max_kv_len keys per
    sequence, of which a sequence uses its own count (the rest is real data a kernel must not read)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    if shape.decodes:
        q = randn(shape.tokens, shape.num_q_heads, shape.head_dim)
    else:
        q = randn(shape.batch, shape.q_len, shape.num_q_heads, shape.head_dim)
    k = randn(shape.num_seqs, shape.max_kv_len, shape.num_kv_heads, shape.head_dim)
    v = randn(shape.num_seqs, shape.max_kv_len, shape.num_kv_heads, shape.head_dim)
    return q, k, v


def _compare(out: torch.Tensor, ref: torch.Tensor, cfg: CorrectnessConfig) -> tuple[list[str], float, float]:
    failures = []
    diff = out.to(ref.dtype) - ref
    rel_l2 = float(diff.norm() / ref.norm())
    max_rel = float(diff.abs().max() / ref.abs().max())
    if float(ref.std()) == 0.0:
        failures.append("reference output is constant: these inputs cannot tell a right kernel from a wrong one")
    if float(out.float().std()) == 0.0:
        failures.append(f"constant output (every element {float(out.flatten()[0]):.4g})")
    if not rel_l2 <= cfg.rel_l2:         # written so that NaN fails too
        failures.append(f"relative L2 error {rel_l2:.3e} above {cfg.rel_l2:.1e}")
    if not max_rel <= cfg.max_rel:
        failures.append(f"largest element error {max_rel:.3e} of max |ref| above {cfg.max_rel:.1e}")
    return failures, rel_l2, max_rel


def check_kernel(fn: KernelFn, shape: ShapeConfig, cfg: CorrectnessConfig, *, dtype: torch.dtype,
                 device: torch.device, seed: int, interface: Interface = "contiguous",
                 backend: VllmBackendConstants | None = None) -> CheckResult:
    """`interface`: how `fn` is called (harness/kernel/interfaces.py); the reference is computed from the same
    q, k, v whatever the layout the kernel reads them in."""
    q, k, v = make_inputs(shape, dtype=dtype, device=device, seed=seed)
    before = (q.clone(), k.clone(), v.clone())
    out = torch.full_like(q, float("nan"))
    call = bind(interface, fn, q, k, v, out, shape, seed=seed, backend=backend)
    taken = {id(q): before[0], id(k): before[1], id(v): before[2]}     # q, k, v are not copied twice
    inputs_before = {name: taken[id(t)] if id(t) in taken else t.clone() for name, t in call.inputs.items()}
    try:
        call.run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)    # a launch error surfaces here, inside the try
    except Exception as exc:  # a kernel that does not compile or raises is a failed check, not a crash
        return CheckResult(ok=False, seed=seed, failures=(f"raised {type(exc).__name__}: {str(exc)[:600]}",))
    failures = [f"input {name} was modified by the call" for name, was in inputs_before.items()
                if not torch.equal(call.inputs[name], was)]
    unwritten = int((~torch.isfinite(out)).sum())
    if unwritten:
        failures.append(f"{unwritten} of {out.numel()} output elements unwritten or non-finite (output pre-filled "
                        f"with NaN)")
    ref = reference_attention(*before, shape, dtype=getattr(torch, cfg.reference_dtype))
    more, rel_l2, max_rel = _compare(out, ref, cfg)
    failures += more
    return CheckResult(ok=not failures, seed=seed, failures=tuple(failures), rel_l2=rel_l2, max_rel=max_rel,
                       unwritten=unwritten)


class OutputGuard:
    """The timed calls' own outputs are checked too: before every timed call the output is re-poisoned with
    NaN, and after one call per round, chosen at random (a kernel cannot count its way around it), a copy
    is kept; `verify` compares every copy with the reference. A kernel that computes only when it is
    checked, or stops writing once warmed up, fails here even if both checks around the timing pass."""

    def __init__(self, out: torch.Tensor, rng: Any) -> None:
        self.out, self.rng = out, rng
        self.pick = 0
        self.copies: list[torch.Tensor] = []

    def arm(self, calls: int) -> None:
        self.pick = self.rng.randrange(calls)

    def before(self, i: int) -> None:
        self.out.fill_(float("nan"))

    def after(self, i: int) -> None:
        if i == self.pick:
            self.copies.append(self.out.clone())

    def verify(self, ref: torch.Tensor, cfg: CorrectnessConfig) -> list[str]:
        failures: list[str] = []
        for index, copy in enumerate(self.copies):
            unwritten = int((~torch.isfinite(copy)).sum())
            problems = [f"{unwritten} of {copy.numel()} elements unwritten"] if unwritten else []
            problems += _compare(copy, ref, cfg)[0]
            if problems:
                failures.append(f"timed call of round {index + 1}: {'; '.join(problems)}")
        return failures
