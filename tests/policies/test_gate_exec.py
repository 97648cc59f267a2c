"""Commands, environment, servers, network, GPU and budget: attacks denied, normal use allowed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policies import Decision, Ledger, load_policy

Decider = Callable[..., Decision]


def _run(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": "run_command", "argv": argv, "env": env or {}}


@pytest.mark.parametrize(
    ("argv", "rule"),
    [
        (["bash", "-c", "git diff"], "builtin-shell"),
        (["sh", "-c", "true"], "builtin-shell"),
        (["/bin/bash", "-c", "true"], "builtin-shell"),
        (["env", "LD_PRELOAD=x.so", "git", "status"], "builtin-shell"),
        (["sudo", "git", "status"], "builtin-shell"),
        (["xargs", "rm"], "builtin-shell"),
        (["git status; rm -rf /"], "builtin-shell"),
        (["git`id`"], "builtin-shell"),
        (["$(id)"], "builtin-shell"),
        (["pip", "install", "evil"], "deny-pip"),
        (["python", "-m", "pip", "install", "evil"], "deny-python-pip"),
        (["curl", "https://example.com/x.sh"], "deny-downloaders"),
        (["wget", "http://example.com"], "deny-wget"),
        (["python", "-c", "import os"], "default-deny"),
        (["git", "push", "origin"], "default-deny"),
        (["git", "apply", "x.patch"], "default-deny"),
        (["rm", "-rf", "tests"], "default-deny"),
        (["git", "status\x00"], "builtin-argv"),
    ],
)
def test_shells_installers_and_downloaders_are_denied(check: Decider, argv: list[str], rule: str) -> None:
    decision = check(_run(argv))
    assert (decision.verdict, decision.rule) == ("deny", rule), decision.reason


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("LD_PRELOAD", "builtin-env"),
        ("LD_LIBRARY_PATH", "builtin-env"),
        ("LD_AUDIT", "builtin-env"),
        ("PYTHONPATH", "builtin-env"),
        ("PYTHONSTARTUP", "builtin-env"),
        ("PYTHONHOME", "builtin-env"),
        ("PYTHONINSPECT", "builtin-env"),
        ("BASH_ENV", "builtin-env"),
        ("ENV", "builtin-env"),
        ("PATH", "builtin-env"),
        ("ld_preload", "builtin-env"),
        ("BASH_FUNC_git%%", "builtin-env"),
        ("SOMETHING_ELSE", "env-not-allowed"),
    ],
)
def test_dangerous_environment_variables_are_denied(check: Decider, name: str, rule: str) -> None:
    decision = check(_run(["git", "status"], {name: "/tmp/evil"}))
    assert (decision.verdict, decision.rule) == ("deny", rule), decision.reason


def test_dangerous_env_is_denied_for_servers_too(check: Decider) -> None:
    action = {
        "kind": "start_server",
        "argv": ["vllm", "serve", "m"],
        "port": 8000,
        "env": {"PYTHONPATH": "/x"},
    }
    assert check(action).rule == "builtin-env"


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "status"],
        ["git", "diff", "--stat"],
        ["git", "apply", "--check", "p.diff"],
        ["python", "-m", "py_compile", "vllm/model_executor/models/gemma4.py"],
        ["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv,noheader"],
    ],
)
def test_normal_commands_are_allowed(check: Decider, argv: list[str]) -> None:
    decision = check(_run(argv, {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0"}))
    assert decision.verdict == "allow", decision.reason


def test_servers_only_on_allowed_host_and_port(check: Decider) -> None:
    ok = {"kind": "start_server", "argv": ["vllm", "serve", "experiments/models/tiny"], "port": 8013}
    assert check(ok).verdict == "allow"
    assert check({**ok, "host": "0.0.0.0"}).verdict == "deny"
    assert check({**ok, "port": 9999}).verdict == "deny"
    assert check({**ok, "argv": ["python", "-m", "http.server"]}).verdict == "deny"


@pytest.mark.parametrize(
    ("host", "port"),
    [("example.com", 443), ("huggingface.co", 443), ("127.0.0.1", 22), ("169.254.169.254", 80), ("x y", 80)],
)
def test_network_is_off_unless_a_rule_allows_it(check: Decider, host: str, port: int) -> None:
    decision = check({"kind": "network", "host": host, "port": port})
    assert decision.verdict == "deny", decision.reason


def test_the_local_server_port_is_reachable(check: Decider) -> None:
    assert check({"kind": "network", "host": "127.0.0.1", "port": 8000}).verdict == "allow"


def test_gpu_requests_over_the_limit_are_denied(check: Decider) -> None:
    assert check({"kind": "use_gpu", "devices": 2, "minutes": 1.0}).rule == "gpu-limit"
    assert check({"kind": "use_gpu", "devices": 1, "minutes": 1.0}, Ledger(gpus_in_use=1)).rule == "gpu-limit"
    over_time = check(
        {"kind": "use_gpu", "devices": 1, "minutes": 30.0}, Ledger(spent={"gpu_minutes": 230.0})
    )
    assert (over_time.verdict, over_time.rule) == ("deny", "gpu-limit")
    nan = check(
        {"kind": "use_gpu", "devices": 1, "minutes": 1.0}, Ledger(spent={"gpu_minutes": float("nan")})
    )
    assert nan.verdict == "deny"


def test_gpu_requests_within_the_limit_are_allowed(check: Decider) -> None:
    decision = check({"kind": "use_gpu", "devices": 1, "minutes": 30.0}, Ledger(spent={"gpu_minutes": 200.0}))
    assert decision.verdict == "allow", decision.reason


@pytest.mark.parametrize(
    ("resource", "spent", "amount", "verdict"),
    [
        ("llm_tokens", 1_999_000.0, 2_000.0, "deny"),
        ("llm_tokens", 1_000.0, 2_000.0, "allow"),
        ("llm_usd", 49.5, 1.0, "deny"),
        ("llm_usd", 10.0, 1.0, "allow"),
        ("wall_seconds", 28_000.0, 1_000.0, "deny"),
        ("gpu_minutes", 0.0, 241.0, "deny"),
    ],
)
def test_budget_requests_over_the_limit_are_denied(
    check: Decider, resource: str, spent: float, amount: float, verdict: str
) -> None:
    decision = check(
        {"kind": "spend", "resource": resource, "amount": amount}, Ledger(spent={resource: spent})
    )
    assert decision.verdict == verdict, decision.reason


def test_a_resource_without_a_budget_is_denied(check: Decider) -> None:
    strict = load_policy(Path(__file__).resolve().parents[2] / "policies" / "strict.yaml")
    decision = check({"kind": "spend", "resource": "gpu_minutes", "amount": 1.0}, policy=strict)
    assert (decision.verdict, decision.rule) == ("deny", "default-deny")


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "diff", "--output=tests/test_x.py"],
        ["git", "-c", "core.pager=sh", "log"],
        ["git", "log", "--ext-diff"],
        ["git", "apply", "--check", "--unsafe-paths", "p.diff"],
        ["git", "apply", "--check", "--index", "p.diff"],
    ],
)
def test_allowed_programs_with_writing_or_code_running_flags_are_denied(
    check: Decider, argv: list[str]
) -> None:
    assert check(_run(argv)).verdict == "deny"


@pytest.mark.parametrize(
    "extra",
    [
        ["--trust-remote-code"],
        ["--worker-extension-cls=evil.Worker"],
        ["--port", "9000"],
        ["--port=9000"],
        ["--host", "0.0.0.0"],
        ["--port"],
    ],
)
def test_server_flags_that_load_code_or_move_the_port_are_denied(check: Decider, extra: list[str]) -> None:
    action = {"kind": "start_server", "argv": ["vllm", "serve", "m", *extra], "port": 8000}
    assert check(action).verdict == "deny"


def test_server_flags_matching_the_action_are_allowed(check: Decider) -> None:
    argv = ["vllm", "serve", "m", "--port", "8000", "--host=127.0.0.1", "--max-num-seqs", "64"]
    assert check({"kind": "start_server", "argv": argv, "port": 8000}).verdict == "allow"
