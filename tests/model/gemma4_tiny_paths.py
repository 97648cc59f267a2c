"""Paths of the embedded tiny Gemma 4 model and its prompt sets, shared by tests/model/."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "experiments" / "models" / "gemma4-tiny"
HELD = ROOT / "experiments" / "prompts" / "gemma4-tiny-parity.jsonl"
VISIBLE = ROOT / "experiments" / "prompts" / "gemma4-tiny-visible.jsonl"


def use_model_scripts() -> None:
    """The model folder holds scripts, not a package (its name has a dash): put it on sys.path so
    its modules (task, reference, vllm_parity) import by name. Called by fixtures, not at import."""
    if str(MODEL_DIR) not in sys.path:
        sys.path.insert(0, str(MODEL_DIR))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
