"""The gate: `decide(policy, action, ledger) -> Decision`, pure apart from `ledger.workspace`.

Deny by default; deny rules first, then ask, then allow; any exception becomes a deny.
File actions (read, write, patch) are decided here; commands, servers, network, GPU and budget in
policies/gate_exec.py.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import lru_cache

import pathspec

from policies import gate_exec
from policies.actions import Action, Patch, ReadFile, WriteFile
from policies.base import DEFAULT_DENY, ERROR_RULE, Decision, Ledger
from policies.diffparse import parse_patch
from policies.errors import PatchRejected, PathRejected
from policies.model import Policy
from policies.paths import join, normalize_path

__all__ = ["decide", "decide_path", "first_verdict"]


@lru_cache(maxsize=512)
def _spec(globs: tuple[str, ...], casefold: bool) -> pathspec.GitIgnoreSpec:
    lines = [glob.casefold() for glob in globs] if casefold else list(globs)
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _path_rules(policy: Policy, rel: str, op: str) -> Decision:
    """deny (case-insensitive) > ask > allow > default deny."""
    rules = [rule for rule in policy.paths if op in rule.ops]
    for effect in ("deny", "ask", "allow"):
        for rule in rules:
            if rule.effect != effect:
                continue
            fold = effect != "allow"  # deny and ask match case-insensitively: they must not be dodged
            if _spec(tuple(rule.globs), fold).match_file(rel.casefold() if fold else rel):
                why = rule.reason or f"matches {rule.effect} rule {rule.id}"
                return Decision(rule.effect, rule.id, f"{op} {rel}: {why}")
    return Decision("deny", DEFAULT_DENY, f"no rule allows {op} of {rel}")


def decide_path(policy: Policy, raw: str, op: str, ledger: Ledger) -> Decision:
    """Decide one read or write of one path (normalised, symlink-checked through the ledger)."""
    parts = normalize_path(raw)
    rel = join(parts)
    if ledger.workspace is not None:
        link = ledger.workspace.symlink_in(parts)
        if link is not None:
            return Decision("deny", "builtin-symlink", f"{link} is a symlink; {op} through links is denied")
    return _path_rules(policy, rel, op)


def _content(policy: Policy, lines: Iterable[str], what: str) -> Decision | None:
    compiled = [(rule, re.compile(rule.pattern)) for rule in policy.content]
    for number, raw in enumerate(lines, 1):
        line = unicodedata.normalize("NFKC", raw)  # Python folds identifiers with NFKC: so do we
        for rule, pattern in compiled:
            if pattern.search(line):
                reason = rule.reason or f"matches content rule {rule.id}"
                return Decision("deny", rule.id, f"{what} line {number}: {reason}: {line.strip()[:120]!r}")
    return None


def first_verdict(decisions: list[Decision]) -> Decision:
    """Combine per-item decisions: the first deny, else the first ask, else an allow naming all rules."""
    if not decisions:
        return Decision("deny", DEFAULT_DENY, "nothing to decide")
    for verdict in ("deny", "ask"):
        for decision in decisions:
            if decision.verdict == verdict:
                return decision
    rules = ", ".join(dict.fromkeys(decision.rule for decision in decisions))
    return Decision("allow", decisions[0].rule, f"{len(decisions)} item(s) allowed by {rules}")


def _read(policy: Policy, action: ReadFile, ledger: Ledger) -> Decision:
    return decide_path(policy, action.path, "read", ledger)


def _write(policy: Policy, action: WriteFile, ledger: Ledger) -> Decision:
    decisions = [decide_path(policy, action.path, "write", ledger)]
    if action.content is not None:
        content = _content(policy, action.content.splitlines(), "content")
        if content is not None:
            decisions.insert(0, content)
    return first_verdict(decisions)


def _patch(policy: Policy, action: Patch, ledger: Ledger) -> Decision:
    parsed = parse_patch(action.diff)
    decisions = [decide_path(policy, path, "write", ledger) for path in parsed.paths]
    content = _content(policy, parsed.added_lines, "added")
    if content is not None:
        decisions.insert(0, content)
    return first_verdict(decisions)


_HANDLERS: dict[str, Callable[..., Decision]] = {
    "read_file": _read,
    "write_file": _write,
    "patch": _patch,
    "run_command": gate_exec.decide_command,
    "start_server": gate_exec.decide_server,
    "network": gate_exec.decide_network,
    "use_gpu": gate_exec.decide_gpu,
    "spend": gate_exec.decide_spend,
}


def decide(policy: Policy, action: Action, ledger: Ledger) -> Decision:
    """Decide one action. Deny by default; deny rules first; any error is a deny."""
    try:
        handler = _HANDLERS.get(getattr(action, "kind", ""))
        if handler is None:
            return Decision("deny", DEFAULT_DENY, f"unknown action kind {getattr(action, 'kind', None)!r}")
        decision = handler(policy, action, ledger)
        if not isinstance(decision, Decision) or decision.verdict not in ("allow", "deny", "ask"):
            return Decision("deny", ERROR_RULE, "internal: handler returned no valid decision")
        return decision
    except PathRejected as error:
        return Decision("deny", "builtin-path", str(error))
    except PatchRejected as error:
        return Decision("deny", "builtin-patch", str(error))
    except Exception as error:  # noqa: BLE001 - deny on any error, by contract
        return Decision("deny", ERROR_RULE, f"{type(error).__name__}: {error}")
