"""Decisions for commands, servers, network, GPU and budget (called by policies/gate.py)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from policies.actions import NetworkRequest, RunCommand, Spend, StartServer, UseGpu
from policies.base import DEFAULT_DENY, Decision, Ledger
from policies.model import CommandRule, Policy, ServerRule

__all__ = [
    "ENV_DENY",
    "SHELLS",
    "decide_command",
    "decide_gpu",
    "decide_network",
    "decide_server",
    "decide_spend",
]

# Programs that run a shell or another program given as text: never allowed, whatever a policy says.
SHELLS = frozenset(
    {
        "sh",
        "bash",
        "dash",
        "zsh",
        "ksh",
        "mksh",
        "csh",
        "tcsh",
        "fish",
        "ash",
        "busybox",
        "env",
        "sudo",
        "su",
        "doas",
        "xargs",
        "nohup",
        "setsid",
        "script",
        "expect",
        "eval",
        "exec",
        "nice",
        "timeout",
        "stdbuf",
        "chroot",
        "unshare",
        "nsenter",
        "ssh",
        "pwsh",
        "cmd",
        "powershell",
    }
)
_ARGV0_META = re.compile(r"[\s;&|`$<>(){}\[\]*?!~'\"\\#=%^]")
# Variables that change what code a process loads: never allowed, whatever a policy says.
ENV_DENY = frozenset(
    {
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONINSPECT",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONBREAKPOINT",
        "PYTHONPLATLIBDIR",
        "PYTHONSAFEPATH",
        "PYTHONNOUSERSITE",
        "BASH_ENV",
        "ENV",
        "PATH",
        "IFS",
        "SHELLOPTS",
        "BASHOPTS",
        "PROMPT_COMMAND",
        "PS4",
        "CDPATH",
        "GCONV_PATH",
        "PERL5OPT",
        "PERL5LIB",
        "NODE_OPTIONS",
        "RUBYOPT",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_CONFIG",
        "GIT_CONFIG_GLOBAL",
        "GIT_EXEC_PATH",
        "GIT_SSH_COMMAND",
        "VLLM_PLUGINS",
        "TORCHINDUCTOR_CACHE_DIR",
        "HOME",
    }
)
_ENV_DENY_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "GIT_CONFIG_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST = re.compile(r"^[a-z0-9.\-:\[\]]+$")


def _deny(rule: str, reason: str) -> Decision:
    return Decision("deny", rule, reason)


def _argv_problem(argv: Sequence[str]) -> Decision | None:
    if any("\x00" in arg for arg in argv):
        return _deny("builtin-argv", "argv contains NUL")
    argv0 = argv[0]
    if not argv0 or _ARGV0_META.search(argv0):
        return _deny("builtin-shell", f"argv[0] {argv0!r} is empty or has shell metacharacters")
    if argv0.rsplit("/", 1)[-1].casefold() in SHELLS:
        return _deny("builtin-shell", f"{argv0!r} runs a shell or wraps another program; never allowed")
    return None


def _env_problem(policy: Policy, env: dict[str, str]) -> Decision | None:
    extra_deny = {name.upper() for name in policy.env.deny}
    for name, value in env.items():
        upper = name.upper()
        if not _ENV_NAME.match(name) or "\x00" in value:
            return _deny("builtin-env", f"environment variable {name!r} has an invalid name or value")
        if upper in ENV_DENY or upper.startswith(_ENV_DENY_PREFIXES) or upper in extra_deny:
            return _deny("builtin-env", f"environment variable {name} changes what code runs; denied")
        allowed = any(
            name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1]))
            for pattern in policy.env.allow
        )
        if not allowed:
            return _deny("env-not-allowed", f"environment variable {name} is not in the policy's env.allow")
    return None


def _rule_matches(rule: CommandRule, argv: Sequence[str]) -> bool:
    if rule.argv0 != argv[0]:
        return False
    rest = argv[1:]
    if rule.effect != "deny" and any(re.fullmatch(p, arg) for p in rule.forbid_args for arg in rest):
        return False
    if rule.args is None:
        return True
    if len(rest) < len(rule.args) or (len(rest) > len(rule.args) and not rule.allow_extra_args):
        return False
    return all(re.fullmatch(pattern, arg) is not None for pattern, arg in zip(rule.args, rest, strict=False))


def _by_effect(rules: Sequence[CommandRule], argv: Sequence[str], what: str) -> Decision:
    for effect in ("deny", "ask", "allow"):
        for rule in rules:
            if rule.effect == effect and _rule_matches(rule, argv):
                return Decision(effect, rule.id, rule.reason or f"{what} matches {effect} rule {rule.id}")
    return _deny(DEFAULT_DENY, f"no rule allows {what} {list(argv)[:6]!r}")


def decide_command(policy: Policy, action: RunCommand, ledger: Ledger) -> Decision:
    problem = _argv_problem(action.argv) or _env_problem(policy, action.env)
    return problem or _by_effect(policy.commands, action.argv, "command")


def _flag_values(argv: Sequence[str], flag: str) -> list[str]:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(flag + "=")]
    values += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    return values + (["<missing>"] if argv and argv[-1] == flag else [])


def decide_server(policy: Policy, action: StartServer, ledger: Ledger) -> Decision:
    problem = _argv_problem(action.argv) or _env_problem(policy, action.env)
    if problem:
        return problem
    for flag, wanted in (("--host", action.host), ("--port", str(action.port))):
        if any(value != wanted for value in _flag_values(action.argv, flag)):
            return _deny("builtin-server", f"argv sets {flag} to something other than the action's {wanted}")
    rules: list[ServerRule] = [
        rule for rule in policy.servers if rule.host == action.host and action.port in rule.ports
    ]
    # A deny rule on argv applies whatever the host/port; collect those too.
    denies = [rule for rule in policy.servers if rule.effect == "deny"]
    return _by_effect([*denies, *rules], action.argv, f"server on {action.host}:{action.port}")


def decide_network(policy: Policy, action: NetworkRequest, ledger: Ledger) -> Decision:
    host = action.host.casefold().rstrip(".")
    if not _HOST.match(host):
        return _deny("builtin-network", f"host {action.host!r} is malformed")
    for effect in ("deny", "ask", "allow"):
        for rule in policy.network:
            same_host = rule.host.casefold().rstrip(".") == host
            if rule.effect == effect and same_host and action.port in rule.ports:
                return Decision(effect, rule.id, rule.reason or f"{host}:{action.port} matches {rule.id}")
    return _deny(DEFAULT_DENY, f"network is off: no rule allows {host}:{action.port}")


def _finite(*values: float) -> bool:
    return all(math.isfinite(value) and value >= 0 for value in values)


def decide_gpu(policy: Policy, action: UseGpu, ledger: Ledger) -> Decision:
    used = ledger.spent.get("gpu_minutes", 0.0)
    limits = policy.gpu
    if not _finite(action.minutes, used, float(ledger.gpus_in_use)):
        return _deny("gpu-limit", "GPU request or ledger holds a non-finite or negative value")
    if ledger.gpus_in_use + action.devices > limits.max_devices:
        return _deny(
            "gpu-limit",
            f"{action.devices} device(s) requested, {ledger.gpus_in_use} in use, limit {limits.max_devices}",
        )
    if used + action.minutes * action.devices > limits.max_gpu_minutes:
        return _deny(
            "gpu-limit",
            f"{action.minutes * action.devices:g} GPU-minutes requested, {used:g} used, "
            f"limit {limits.max_gpu_minutes:g}",
        )
    reason = f"within {limits.max_devices} device(s) and {limits.max_gpu_minutes:g} GPU-minutes"
    return Decision("allow", "gpu-within-limit", reason)


def decide_spend(policy: Policy, action: Spend, ledger: Ledger) -> Decision:
    limit = policy.budget.get(action.resource)
    if limit is None:
        return _deny(DEFAULT_DENY, f"the policy sets no budget for {action.resource}")
    used = ledger.spent.get(action.resource, 0.0)
    if not _finite(action.amount, used, limit):
        return _deny("budget-limit", f"{action.resource}: non-finite or negative amount in request or ledger")
    if used + action.amount > limit:
        reason = f"{action.resource}: {used:g} spent + {action.amount:g} requested > limit {limit:g}"
        return _deny("budget-limit", reason)
    return Decision(
        "allow", "budget-within-limit", f"{action.resource}: {used + action.amount:g} of {limit:g}"
    )
