"""The shipped Triton kernel passes the harness's checks in Triton's interpreter (CPU tensors, tiny shapes), and a
copy with a planted off-by-one in the window mask fails them. Through the runner process, as a CPU campaign runs
it: TRITON_INTERPRET must be set before triton is imported, which a fresh process guarantees.

float16, not bf16: the interpreter's bf16 dot is wrong (triton 3.9: errors of 1e9 where fp16 and fp32 are
right), which says nothing about the compiled kernel; the H200 campaign checks bf16.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.proposers.kernel_search import write_tunables
from harness.kernel.evaluate import run_evaluation
from harness.kernel.protocol import EvalRequest
from tests.conftest import ROOT

pytest.importorskip("triton")
SOURCE = ROOT / "experiments" / "kernels" / "gemma4_attention"
MODULE = "gemma4_attention/attention.py"
SHAPES = [{"name": "decode-window", "batch": 2, "q_len": 1, "kv_len": 80, "head_dim": 32, "sliding_window": 24},
          {"name": "decode-softcap", "batch": 1, "q_len": 1, "kv_len": 50, "head_dim": 16, "softcap": 5.0},
          {"name": "prefill-window", "batch": 1, "q_len": 45, "kv_len": 45, "head_dim": 32, "sliding_window": 12},
          {"name": "prefill-gqa4", "batch": 2, "q_len": 33, "kv_len": 33, "head_dim": 16, "num_kv_heads": 2}]


def _tree(root: Path, edit: dict[str, int] | None = None, planted: tuple[str, str] | None = None) -> Path:
    shutil.copytree(SOURCE, root / "gemma4_attention")
    path = root / MODULE
    text = path.read_text()
    if edit:
        text = write_tunables(text, edit)
    if planted:
        assert planted[0] in text
        text = text.replace(*planted)
    path.write_text(text)
    return root


def test_the_triton_kernel_passes_in_the_interpreter_and_a_planted_bug_fails(tmp_path: Path) -> None:
    builds = {"stock": _tree(tmp_path / "stock"),
              "splits3": _tree(tmp_path / "splits3", {"DECODE_D256_SPLITS": 3, "DECODE_D256_BLOCK_N": 16,
                                                         "PREFILL_D256_BLOCK_M": 16}),
              "planted": _tree(tmp_path / "planted", planted=("((pos[:, None] - n[None, :]) < window)",
                                                              "((pos[:, None] - n[None, :]) <= window)"))}
    req = EvalRequest(builds=builds, module=MODULE, entry="attention", shapes=SHAPES, device="cpu", dtype="float16",
                      seed=11, timing={"rounds": 2, "calls_per_round": 1, "warmup_calls": 1, "flush_l2": False})
    result = run_evaluation(req, tmp_path / "run", timeout_s=600, interpret=True)
    assert result["device"]["interpret"] == "1"
    for name, shape in result["shapes"].items():
        for tag in ("stock", "splits3"):
            entry = shape["builds"][tag]
            assert entry["ok"], (name, tag, entry["pre"]["failures"], entry.get("post"))
            assert entry["pre"]["rel_l2"] < 1e-3
    planted = result["shapes"]["prefill-window"]["builds"]["planted"]
    assert not planted["ok"] and "relative L2 error" in " ".join(planted["pre"]["failures"])
    assert result["shapes"]["prefill-gqa4"]["builds"]["planted"]["ok"]    # no window there: the bug cannot show
