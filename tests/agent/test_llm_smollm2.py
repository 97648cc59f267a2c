"""LLMProposer against a real small model: SmolLM2-135M-Instruct on llama.cpp, loopback only.

Runs scripts/setup-llm-demo.sh first (idempotent; the first run builds llama-cpp-python, ~6 min, and caches
the wheel in ~/.cache/ratchet/wheels). Skipped only when that script reports a package it could not
download (exit 3); any other setup failure fails the test.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.base import GiveUp, Proposal
from agent.proposers.llm import LLMConfig, LLMProposer
from experiments.smollm2_demo import DEMO_CONFIG, DEMO_FILES, SetupUnavailable, llama_server, setup
from tests.fakes import FakeTools, make_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        python, model = setup()
    except SetupUnavailable as exc:
        pytest.skip(str(exc))
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with llama_server(python, model, log=log) as url:
        yield url


def test_the_server_answers_the_openai_client_with_tool_calls(base_url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="dummy", timeout=120, max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "give_up",
                "description": "Stop.",
                "parameters": {
                    "type": "object",
                    "properties": {"reason": {"type": "string"}},
                    "required": ["reason"],
                },
            },
        }
    ]
    response = client.chat.completions.create(
        model=DEMO_CONFIG["model"],
        messages=[{"role": "user", "content": "Call give_up with a reason."}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "give_up"}},
        max_tokens=64,
        seed=0,
    )  # type: ignore[call-overload]
    [call] = response.choices[0].message.tool_calls or []
    assert call.function.name == "give_up"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert response.usage is not None and response.usage.total_tokens > 0


def test_whatever_smollm2_proposes_is_survived_charged_and_checked(base_url: str, tmp_path: Path) -> None:
    # ~30 s per turn on 2 busy cores: 2 proposals of at most 4 turns keep this test to a few minutes.
    proposer = LLMProposer(LLMConfig(base_url=base_url, **{**DEMO_CONFIG, "max_turns": 4}))
    rng = random.Random(0)
    outcomes = []
    for iteration in range(1, 3):
        tools = FakeTools(files=dict(DEMO_FILES), budgets={"llm_tokens": 150_000})
        result = proposer.propose(make_state(iteration=iteration), tools, rng=rng)
        assert isinstance(result, Proposal | GiveUp)
        turns = tools.notes_of("llm.turn")
        assert turns, "no LLM turn was recorded"
        assert tools.spent["llm_tokens"] == sum(t["usage"]["total_tokens"] for t in turns)  # type: ignore[index]
        assert tools.notes_of("llm.end")
        if isinstance(result, Proposal):
            assert result.patch in tools.checked, "a proposal came back that did not pass check_patch"
        outcomes.append(type(result).__name__)
    print("smollm2 outcomes:", outcomes)


def test_the_server_process_group_is_gone_after_the_context(tmp_path: Path) -> None:
    try:
        python, model = setup()
    except SetupUnavailable as exc:
        pytest.skip(str(exc))
    with llama_server(python, model, log=tmp_path / "server.log") as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "llama_cpp.server" in cmdline and port in cmdline:
            left.append(proc.pid)
    assert not left, f"llama_cpp.server still running: {left}"
