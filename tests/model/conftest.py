"""Fixtures for the embedded tiny Gemma 4 model: prompts, the transformers reference, and vLLM runs.

vLLM start-ups are expensive here (~30 s eager, ~100 s compiled on 2 cores), so each engine runs
once per pytest session in a subprocess (experiments/models/gemma4-tiny/vllm_run.py) and the
tests read its JSON report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemma4_tiny_paths import HELD, MODEL_DIR, read_jsonl, use_model_scripts


@pytest.fixture(scope="session", autouse=True)
def _model_scripts_importable() -> None:
    use_model_scripts()


@pytest.fixture(scope="session")
def held_prompts() -> list[dict[str, Any]]:
    """The checkpoint's evaluation set: the 64 held prompts within the training length (the README's
    tables). The prompts at the grid's lengths are checked by long_margins.py and, through vLLM's server,
    by the parity and red-team tests."""
    return [r for r in read_jsonl(HELD) if "-in" not in str(r["id"])]


@pytest.fixture(scope="session")
def held_file(vllm_workdir: Path, held_prompts: list[dict[str, Any]]) -> Path:
    import json

    path = vllm_workdir / "held-64.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in held_prompts))
    return path


@pytest.fixture(scope="session")
def hf_model() -> Any:
    import reference

    return reference.load_model(MODEL_DIR)


@pytest.fixture(scope="session")
def hf_greedy(hf_model: Any, held_prompts: list[dict[str, Any]]) -> dict[str, Any]:
    import reference

    return reference.greedy(hf_model, held_prompts)


@pytest.fixture(scope="session")
def vllm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gemma4-tiny-vllm")


@pytest.fixture(scope="session")
def vllm_eager(vllm_workdir: Path, held_file: Path) -> dict[str, Any]:
    """One eager engine: batch-of-all and batch-of-1 passes over the held prompts."""
    import vllm_parity

    return vllm_parity.run_vllm(MODEL_DIR, held_file, compiled=False, batch_one=True, workdir=vllm_workdir)


@pytest.fixture(scope="session")
def vllm_compiled(vllm_workdir: Path, held_file: Path) -> dict[str, Any]:
    import vllm_parity

    return vllm_parity.run_vllm(MODEL_DIR, held_file, compiled=True, batch_one=False, workdir=vllm_workdir)
