"""What the LLM proposer says to its model: the system prompt and the rendering of `CampaignState`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.base import CampaignState, HistoryEntry
from harness.engine_args import ENGINE_ARG_TYPES, SPEC_OWNED

__all__ = ["system_prompt", "render_state", "render_metrics", "render_serving", "NUDGE"]

# Columns shown first when present (harness.measure.GridResult.table rows); others follow up to a cap.
_PREFERRED = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "cv_headline",
)
_MAX_COLUMNS = 7
_MAX_PROFILE_CHARS = 6_000
_MAX_HISTORY = 30

NUDGE = (
    "Reply with a tool call, not plain text: look around (list_files, read_file, search, view_metrics, "
    "view_profile), try_patch if unsure, then propose_patch and submit; or call give_up(reason) if you see "
    "no worthwhile change."
)


_VLLM_KERNEL = """
THE TARGET
This is vLLM's own Triton unified attention, the kernel its TRITON_ATTN backend runs for Gemma 4. The harness
calls `unified_attention` exactly as that backend does: queries flattened to [tokens, heads, head_dim] with
cu_seqlens_q; K and V in one paged cache [blocks, block_size, kv_heads, 2 * head_dim] read through a block
table; sequences up to the backend's 3D threshold take the split-softmax (3D) path; decode is timed as CUDA
graph replays. Keep the function's signature and semantics: vLLM calls it for every model, not only Gemma 4.
The GEMMA4_* constants near the top are its launch parameters for Gemma 4's shapes (0 keeps vLLM's choice).
"""


def _kernel_system_prompt(state: CampaignState, *, max_turns: int, trials: str) -> str:
    kernel = state.allowed_paths[0] if state.allowed_paths else "the kernel file"
    target = _VLLM_KERNEL if state.environment.get("interface") == "vllm-unified-attention" else ""
    return f"""You are a GPU kernel engineer in an automated, audited optimisation campaign.
{target}
MISSION
Make the attention kernel in {kernel} faster on the campaign's shapes while its output stays within the
harness's tolerance of an fp64 reference on every shape, before and after timing. Every patch is verified:
the harness's correctness checks on fresh inputs, then interleaved timing against the incumbent; only a clear
speedup with no shape regressing is kept.

RULES
- You may only change {kernel}; anything else is denied by the policy gate.
- Never touch timers, the harness, or anything that measures or checks; do not special-case the test inputs,
  cache results across calls or skip work the reference does: such kernels fail the checks.
- Every action is checked by a policy gate and written to an audit log; a denied action tells you why.

HOW TO WORK (always answer with a tool call)
1. Read the kernel (read_file, search) and the shapes (the Environment section); the metrics are per shape.
2. check_kernel(patch, format, shapes): the harness's checks and a timing of your patch beside the
   incumbent on the shapes you name; you get 'correctness:' per shape, a 'hint:' ratio (not a verdict) and
   the load or compile error if it fails. Trials are few ({trials} left): check what you are unsure of.
3. propose_patch(hypothesis, patch, format, predicted_speedup), then submit(); or give_up(reason).
   Formats: "diff" (git-style unified diff, paths relative to the workspace root) or "search_replace".
You have at most {max_turns} replies in this iteration."""


def system_prompt(state: CampaignState, *, max_turns: int) -> str:
    left = state.budget_left.get("trials", 0.0)
    trials = "no limit" if left == float("inf") else f"{left:.0f}"
    if state.target == "kernel":
        return _kernel_system_prompt(state, max_turns=max_turns, trials=trials)
    allowed = "\n".join(f"  - {glob}" for glob in state.allowed_paths) or "  - (none listed: ask by proposing)"
    return f"""You are a performance engineer in an automated, audited optimisation campaign.

MISSION
Raise the serving throughput of vLLM's Gemma 4 path on this target machine (the model code
vllm/model_executor/models/gemma4.py and what it calls: attention backends, Triton kernels, per-layer
embeddings (PLE), layers) and of its serving configuration, while the greedy output token ids stay EXACTLY
identical. Every patch is verified: first exact token parity on held-out prompts (one flipped token rejects
it), then an interleaved A/B benchmark against the incumbent; only a clear speedup is kept.

RULES
- You may only change files matching these globs (anything else is denied by the policy gate):
{allowed}
- serving.yaml at the workspace root holds the engine arguments (a YAML mapping of vLLM engine args);
  change it with a patch like any other file.
- Never touch timers, benchmarks, tests, the harness, or anything that measures or checks: such patches are
  denied and flagged. Do not trade exactness for speed (lower precision, skipped layers, approximations).
- Every action you take is checked by a policy gate and written to an audit log. A denied action tells you
  why; adapt instead of retrying the same thing.

HOW TO WORK (always answer with a tool call)
1. Measure: view_metrics, view_profile; look at the code with list_files, read_file, search.
2. Hypothesize: what should move, where, and by how much (the predicted speedup, e.g. 1.05).
3. Optimize: propose_patch(hypothesis, patch, format, predicted_speedup, target_cells). Formats:
   - "diff": a git-style unified diff, paths relative to the workspace root (--- a/path, +++ b/path),
     context lines copied exactly from the current file;
   - "search_replace": blocks of the form
       path/to/file.py
       <<<<<<< SEARCH
       exact current lines
       =======
       new lines
       >>>>>>> REPLACE
   The patch is checked at once (policy gate + git apply --check); if it is rejected, fix it and call
   propose_patch again.
   Before proposing, you may try_patch(patch, format, cells): the patch runs on fresh, isolated servers
   next to the incumbent; you get parity on prompts you may see, a rough speed ratio on one or two cells
   ("hint", not a verdict) and, if the server fails, its log with the Python traceback, so you can fix the
   patch and try again. Trials are few ({trials} left) and cost minutes each: try what you are unsure of.
4. submit() hands the last patch that passed the check over for verification. One focused change per
   proposal. If you see nothing worth trying, call give_up(reason).
You have at most {max_turns} replies in this iteration."""


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_metrics(rows: Sequence[Mapping[str, object]], baseline: Sequence[Mapping[str, object]] = ()) -> str:
    """A compact table, one row per cell; `x1.07` after a value is its ratio to the baseline."""
    if not rows:
        return "(no measurements yet)"
    keys = [k for k in _PREFERRED if any(k in r for r in rows)]
    numeric = [
        k for k in rows[0] if k not in keys and k not in ("cell", "repeats") and isinstance(rows[0][k], int | float)
    ]
    keys = (keys + numeric)[:_MAX_COLUMNS]
    base = {str(r.get("cell")): r for r in baseline}
    lines = ["cell | " + " | ".join(keys)]
    for row in rows:
        cells = []
        for key in keys:
            value = row.get(key, "")
            text = _fmt(value)
            ref = base.get(str(row.get("cell")), {}).get(key)
            if isinstance(value, int | float) and isinstance(ref, int | float) and ref and key != "cv_headline":
                text += f" (x{value / ref:.3f} vs baseline)"
            cells.append(text)
        lines.append(f"{row.get('cell', '?')} | " + " | ".join(cells))
    return "\n".join(lines)


def render_serving(config: Mapping[str, object]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in sorted(config.items())) or "(empty: engine defaults)"


def render_in_force(state: CampaignState) -> str:
    """What vLLM runs with for the incumbent's serving.yaml where that differs from what the file says: its
    defaults and its overrides (vLLM CPU forces async_scheduling off). The same knowledge the search proposer
    uses, so neither proposes a value already in force; and the keys a candidate may set at all."""
    effective, written = state.effective_serving_config, state.serving_config
    if not effective:
        return ""
    resolved = [f"{k}: {v}" + (f" (serving.yaml says {written[k]})" if k in written else "")
                for k, v in sorted(effective.items()) if written.get(k) != v]
    settable = ", ".join(sorted(set(ENGINE_ARG_TYPES) - SPEC_OWNED))
    return ("\n\nIn force (vLLM's own resolution of serving.yaml; setting a key to the value it already has changes "
            "nothing, and a serving.yaml-only patch that changes nothing is refused as a no-op):\n"
            + ("\n".join(resolved) or "(exactly what serving.yaml says)")
            + f"\nKeys serving.yaml may set: {settable}")


_FAILED = ("failed", "parity-broken", "invalid", "denied", "tampered", "quarantined")
_PATCHES_SHOWN = 3          # the latest entries whose patch is shown (capped at _PATCH_CHARS each)
_PATCH_CHARS = 2000


def _clip(text: str, limit: int) -> str:
    """Head and tail of a long text: a traceback's cause is at its end."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}\n[... {len(text) - limit:,} characters cut ...]\n{text[-(limit - head):]}"


def _history_entry(entry: HistoryEntry, *, detail_chars: int, show_patch: bool) -> str:
    parts = [f"#{entry.iteration} {entry.outcome}"]
    if entry.speedup:
        parts.append(f"measured {entry.speedup}")
    if entry.predicted_speedup is not None:
        parts.append(f"predicted {entry.predicted_speedup:g}x")
    lines = [", ".join(parts) + f": {entry.hypothesis.strip()[:300]}"]
    if entry.detail:
        lines.append(f"  why: {_clip(entry.detail, detail_chars)}")
    if entry.cells:
        lines.append("  per cell: " + "; ".join(entry.cells))
    if show_patch and entry.patch:
        lines.append("  patch:\n" + _clip(entry.patch, _PATCH_CHARS))
    return "\n".join(lines)


def render_history(history: Sequence[HistoryEntry], *, failure_chars: int = 6000) -> str:
    """Each entry's outcome, measured speedup, per-cell results and reason; the latest patches; the latest
    failure's text in full (up to `failure_chars`), so a traceback reaches the model."""
    latest_failure = max((h.iteration for h in history if h.outcome in _FAILED), default=None)
    recent = {h.iteration for h in history[-_PATCHES_SHOWN:]}
    return "\n".join(
        _history_entry(h, detail_chars=failure_chars if h.iteration == latest_failure else 300,
                       show_patch=h.iteration in recent)
        for h in history)


def _serving_changes(state: CampaignState) -> str:
    """What the incumbent changed in the engine args relative to the stock (baseline) ones."""
    base: dict[str, object] = dict(getattr(state, "baseline_serving_config", None) or {})
    if not base:
        return ""
    now = state.serving_config
    changed = [
        f"{k}: {base.get(k, '(unset)')} -> {now.get(k, '(unset)')}"
        for k in sorted(set(base) | set(now))
        if base.get(k) != now.get(k)
    ]
    return "\nchanged from the baseline: " + ("; ".join(changed) if changed else "nothing yet")


def render_state(state: CampaignState, *, failure_chars: int = 6000) -> str:
    history = state.history[-_MAX_HISTORY:]
    older = len(state.history) - len(history)
    hist = render_history(history, failure_chars=failure_chars) or "(none yet: this is the first proposal)"
    if older:
        hist = f"({older} older entries omitted)\n" + hist
    profile = state.profile or "(no profile taken; view_profile will say the same)"
    if len(profile) > _MAX_PROFILE_CHARS:
        profile = profile[:_MAX_PROFILE_CHARS] + "\n[profile truncated; view_profile shows all of it]"
    budget = ", ".join(f"{k}: {_fmt(v)}" for k, v in sorted(state.budget_left.items())) or "(not reported)"
    environment = "\n".join(f"{k}: {v}" for k, v in state.environment.items()) or "(not reported)"
    if state.target == "kernel":
        return f"""Iteration {state.iteration}; incumbent commit {state.incumbent_ref}.

## Environment (the kernel, its device and dtype, the shapes it is measured on)
{environment}

## Incumbent timing per shape (median microseconds)
{render_metrics(state.incumbent_metrics, state.baseline_metrics)}

## Tunables (module constants of the kernel file)
{render_serving(state.serving_config)}

## History of hypotheses and outcomes
{hist}

## Budget left
{budget}

Read the kernel first, check a patch with check_kernel, then propose one patch and submit it."""
    return f"""Iteration {state.iteration}; incumbent commit {state.incumbent_ref}.

## Environment (versions, hardware, attention backend, the served model's shapes)
{environment}

## Incumbent metrics per cell
{render_metrics(state.incumbent_metrics, state.baseline_metrics)}

## Serving config (serving.yaml)
{render_serving(state.serving_config)}{_serving_changes(state)}{render_in_force(state)}

## Profile
{profile}

## History of hypotheses and outcomes
{hist}

## Budget left
{budget}

Look around first (list_files, read_file, search), then propose one patch and submit it."""
