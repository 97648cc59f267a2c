"""vLLM 0.32 CPU on the held prompts: exact token parity across engine modes and with transformers.

Each engine starts once per session (fixtures in conftest.py); these tests only compare reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemma4_tiny_paths import MODEL_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_margins_are_at_least_one_nat_almost_everywhere(vllm_eager: dict[str, Any]) -> None:
    import vllm_parity

    stats = vllm_parity.gap_stats(vllm_eager["batch_all"])
    assert stats["frac_ge_1nat"] >= 0.99, stats


def test_batch_of_one_matches_batch_of_all(vllm_eager: dict[str, Any]) -> None:
    import vllm_parity

    cmp = vllm_parity.compare(vllm_eager["batch_all"], vllm_eager["batch_one"])
    assert cmp["changed"] == 0, cmp["flips"]


def test_compiled_matches_eager(vllm_eager: dict[str, Any], vllm_compiled: dict[str, Any]) -> None:
    import vllm_parity

    cmp = vllm_parity.compare(vllm_eager["batch_all"], vllm_compiled["batch_all"])
    assert cmp["changed"] == 0, cmp["flips"]


def test_transformers_reference_matches_vllm(hf_greedy: dict[str, Any], vllm_eager: dict[str, Any]) -> None:
    import vllm_parity

    cmp = vllm_parity.compare(hf_greedy, vllm_eager["batch_all"])
    assert cmp["changed"] == 0, cmp["flips"]


def test_planted_vllm_patch_breaks_parity(
    vllm_eager: dict[str, Any], vllm_workdir: Path, held_prompts: list[dict[str, Any]], held_file: Path
) -> None:
    """The sliding-window patch applied to an overlay of the vllm package, first on PYTHONPATH."""
    import vllm_parity

    overlay = vllm_parity.make_overlay(
        MODEL_DIR / "planted" / "sliding-window-halved.patch", vllm_workdir / "overlay-sliding-window-halved"
    )
    buggy = vllm_parity.run_vllm(
        MODEL_DIR, held_file, compiled=False, batch_one=False, workdir=vllm_workdir, overlay=overlay
    )
    assert buggy["gemma4_file"].startswith(str(overlay))  # the patched code is what ran
    cmp = vllm_parity.compare(vllm_eager["batch_all"], buggy["batch_all"])
    assert cmp["changed"] > len(held_prompts) / 2, cmp
