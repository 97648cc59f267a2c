"""The transformers reference: robust greedy margins, and planted bugs that break parity (no vLLM)."""

from __future__ import annotations

from typing import Any

import pytest
from gemma4_tiny_paths import MODEL_DIR


def test_greedy_margins_are_at_least_one_nat_almost_everywhere(hf_greedy: dict[str, Any]) -> None:
    import vllm_parity

    stats = vllm_parity.gap_stats(hf_greedy)
    assert stats["positions"] == 64 * len(hf_greedy)
    assert stats["frac_ge_1nat"] >= 0.99, stats


def test_greedy_continuations_solve_the_task(
    hf_greedy: dict[str, Any], held_prompts: list[dict[str, Any]]
) -> None:
    wrong = [p["id"] for p in held_prompts if hf_greedy[p["id"]]["token_ids"] != p["expected_token_ids"]]
    assert len(wrong) <= len(held_prompts) // 20, wrong


@pytest.mark.parametrize(
    "bug", ["sliding-window-halved", "ple-scale-changed", "norm-skipped", "full-rope-theta-changed"]
)
def test_planted_bug_changes_most_held_prompts(
    bug: str, hf_greedy: dict[str, Any], held_prompts: list[dict[str, Any]]
) -> None:
    import reference

    changed = reference.changed_prompts(reference.load_buggy(MODEL_DIR, bug), held_prompts, hf_greedy)
    assert len(changed) > len(held_prompts) / 2, f"{bug}: only {len(changed)}/{len(held_prompts)} changed"
