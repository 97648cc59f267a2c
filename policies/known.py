"""Every policy ratchet has shipped: what a log's decisions are re-decided against. A log names its policy
by hash; a hash that matches none of these is refused (a forged or unknown policy). When a shipped policy
changes, its old text moves to history/, so logs made under it still verify and replay."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from policies.model import Policy, load_policy

__all__ = ["POLICY_DIR", "known_policies"]

POLICY_DIR = Path(__file__).resolve().parent


def known_policies(extra: Iterable[Path] = ()) -> list[Policy]:
    files = [*sorted(POLICY_DIR.glob("*.yaml")), *sorted((POLICY_DIR / "history").glob("*.yaml")), *extra]
    return [load_policy(path) for path in files]
