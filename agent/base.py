"""Records and protocols of the agent room: what a proposer sees, what it returns, what it may do.

    Proposer.propose(state, tools, rng=...) -> Proposal | GiveUp

A proposer looks around only through `Tools`, whose every call passes the policy gate and is written
to the audit log before it runs; it never touches the workspace, the harness or the log itself.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["Proposal", "GiveUp", "HistoryEntry", "CampaignState", "Tools", "Proposer", "Outcome", "cell_lines",
           "MAX_HISTORY_DETAIL", "MAX_HISTORY_PATCH", "SHOWN_BUDGETS"]

# The budgets a proposer is shown and plans with (CampaignState.budget_left), in serving and kernel campaigns.
SHOWN_BUDGETS = ("llm_tokens", "llm_usd", "wall_seconds", "trials")

# What a history entry keeps (the prompt shows less; these bound memory and the log-rebuilt history alike).
MAX_HISTORY_DETAIL = 16_000
MAX_HISTORY_PATCH = 8_000

Outcome = Literal["accepted", "rejected", "parity-broken", "denied", "invalid", "failed", "quarantined",
                  "tampered", "pending"]   # pending: proposed in the current round, not judged yet (never recorded)


@dataclass(frozen=True)
class Proposal:
    hypothesis: str                        # what should move, where, and by how much
    patch: str                             # unified diff (git-style) or SEARCH/REPLACE blocks
    patch_format: Literal["diff", "search_replace"] = "diff"
    predicted_speedup: float | None = None
    target_cells: tuple[str, ...] = ()     # cell labels expected to move, e.g. ("in512/out64",)
    source: str = ""                       # which proposer produced it (and its internal id)


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass(frozen=True)
class HistoryEntry:
    iteration: int
    hypothesis: str
    outcome: Outcome
    speedup: str | None = None             # "1.08x [1.03, 1.12]" when measured
    predicted_speedup: float | None = None
    detail: str = ""                       # gate reason, parity diagnosis, error (a crash: the server log's tail)
    source: str = ""                       # Proposal.source, so stateless proposers know what was tried
    patch: str = ""                        # what was tried, as proposed (bounded: MAX_HISTORY_PATCH)
    cells: tuple[str, ...] = ()            # per-cell result of its deciding A/B, "in512/out32 1.041x [0.97, 1.11]"


def cell_lines(result: Mapping[str, Any]) -> tuple[str, ...]:
    """Per-cell headline results of an iteration.result payload: the deciding A/B's, else the screen's."""
    cells = result.get("cells")
    if isinstance(cells, Mapping) and cells:
        out = []
        for label, per in cells.items():
            h = per.get("headline") if isinstance(per, Mapping) else None
            if isinstance(h, Mapping) and all(isinstance(h.get(k), int | float) for k in ("ratio", "low", "high")):
                out.append(f"{label} {h['ratio']:.3f}x [{h['low']:.3f}, {h['high']:.3f}]")
        return tuple(out)
    screen = result.get("screen")
    if isinstance(screen, Mapping) and isinstance(screen.get("cells"), Mapping):
        return tuple(f"{label} {text}" for label, text in screen["cells"].items())
    return ()


@dataclass(frozen=True)
class CampaignState:
    """Everything a proposer may know at the start of an iteration."""

    iteration: int
    incumbent_ref: str
    serving_config: dict[str, object]            # the incumbent's engine args (serving.yaml)
    incumbent_metrics: tuple[dict[str, object], ...]   # one row per cell (see harness.measure.GridResult.table)
    baseline_metrics: tuple[dict[str, object], ...]
    history: tuple[HistoryEntry, ...] = ()
    profile: str | None = None                   # readable: the median engine step per phase, then top ops
    # the same step table as numbers, phase -> row -> median µs ({"decode": {"wall": ..., "GPU idle": ...}})
    profile_steps: dict[str, dict[str, float]] = field(default_factory=dict)
    budget_left: dict[str, float] = field(default_factory=dict)
    allowed_paths: tuple[str, ...] = ()          # globs the policy allows writing, for the prompt
    baseline_serving_config: dict[str, object] = field(default_factory=dict)   # the stock engine args
    # The incumbent's engine args as vLLM resolves them (harness.engine_defaults.effective_engine_args):
    # explicit keys and the defaults in force; empty when unknown (then only serving_config is known).
    effective_serving_config: dict[str, object] = field(default_factory=dict)
    # What a kernel engineer asks first: versions, hardware, attention backend, the model's shapes
    environment: dict[str, str] = field(default_factory=dict)
    # "serving": a vLLM tree and its serving.yaml (trials: try_patch); "kernel": one kernel file (check_kernel)
    target: Literal["serving", "kernel"] = "serving"


class Tools(Protocol):
    """Gated, audited access for proposers. Denied calls raise agent.errors.ActionDenied."""

    def read_file(self, path: str) -> str: ...
    def list_files(self, directory: str) -> list[str]: ...
    def search(self, pattern: str, directory: str = "vllm") -> list[str]: ...
    def check_patch(self, patch: str, patch_format: str = "diff") -> str: ...   # gate + `git apply --check`
    # check_patch, one of budget.trials, then a small isolated A/B of the patch: text with parity:, hint:
    # and on failure server log:; a hint for the agent, never a verdict (agent/trial.py)
    def try_patch(self, patch: str, patch_format: str = "diff", cells: list[str] | None = None) -> str: ...
    # kernel campaigns: check_patch, one of budget.trials, then the kernel harness's checks and a timing of the
    # patched kernel beside the incumbent on chosen shapes; the load/compile error text when it fails
    def check_kernel(self, patch: str, patch_format: str = "diff", shapes: list[str] | None = None) -> str: ...
    def charge(self, resource: str, amount: float) -> None: ...   # budget; raises BudgetExhausted
    def budget_left(self, resource: str) -> float: ...
    def note(self, kind: str, payload: dict[str, object]) -> None: ...   # an audited agent event


class Proposer(Protocol):
    name: str
    # Whether its proposals read `CampaignState.profile`: a profile costs a server start and a profiled run
    # (about two minutes on CPU), so a campaign takes one only for a proposer that reads it.
    reads_profile: bool

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp: ...
