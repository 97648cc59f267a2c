"""LLMProposer against ScriptedOpenAIServer: the real openai client over real HTTP on loopback, FakeTools."""

from __future__ import annotations

import difflib
import random
import time
from pathlib import Path
from typing import Any

import pytest

from agent.base import GiveUp, Proposal
from agent.errors import BudgetExhausted, ProposerError
from agent.proposers.llm import LLMConfig, LLMProposer
from agent.proposers.llm_config import DUMMY_API_KEY
from agent.proposers.llm_tools import TOOL_SCHEMAS
from tests.fakes import (
    Entry,
    FakeProposer,
    FakeTools,
    HTTPError,
    Reply,
    ScriptedOpenAIServer,
    Slow,
    call,
    make_state,
    reply,
    say,
)

GEMMA = "vllm/model_executor/models/gemma4.py"
GEMMA_SRC = """import torch


class Gemma4MLP:
    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        y = self.act(gate) * up
        return self.down_proj(y)
"""
FILES = {
    GEMMA: GEMMA_SRC,
    "vllm/model_executor/models/__init__.py": "",
    "vllm/secret/keys.py": "KEY = 'x'\n",
    "benchmarks/timer.py": "import time\nnow = time.perf_counter\n",
    "serving.yaml": "enforce_eager: true\nmax_num_seqs: 8\n",
}


def gemma_diff(
    old: str = "        up = self.up_proj(x)\n",
    new: str = "        up = self.up_proj(x)  # fused\n",
    path: str = GEMMA,
    source: str = GEMMA_SRC,
) -> str:
    after = source.replace(old, new)
    return "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )


def tools(**kw: Any) -> FakeTools:
    return FakeTools(files=dict(FILES), **kw)


def propose(
    server: ScriptedOpenAIServer,
    fake: FakeTools | None = None,
    *,
    sleeps: list[float] | None = None,
    **config: Any,
) -> Proposal | GiveUp:
    settings: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "scripted",
        "max_retries": 0,
        "retry_rounds": 2,
        "backoff_s": 0.5,
        "request_timeout_s": 10.0,
        **config,
    }
    sleep = sleeps.append if sleeps is not None else (lambda s: None)
    proposer = LLMProposer(LLMConfig(**settings), sleep=sleep)
    return proposer.propose(make_state(), fake if fake is not None else tools(), rng=random.Random(0))


# ----------------------------------------------------------------------------- the happy path


def test_list_read_propose_submit_returns_the_checked_proposal() -> None:
    diff = gemma_diff()
    fake = tools()
    script: list[Entry] = [
        reply(call("list_files", directory="vllm/model_executor/models")),
        reply(call("read_file", path=GEMMA), content="Reading the MLP."),
        reply(
            call(
                "propose_patch",
                hypothesis="fuse gate/up: -1 matmul per layer, +10% decode",
                patch=diff,
                format="diff",
                predicted_speedup=1.1,
                target_cells=["in64/out8"],
            )
        ),
        reply(call("submit")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert isinstance(result, Proposal)
    assert result.hypothesis == "fuse gate/up: -1 matmul per layer, +10% decode"
    assert result.predicted_speedup == 1.1
    assert result.target_cells == ("in64/out8",)
    assert result.patch == diff and result.patch_format == "diff"
    assert result.source.startswith("llm:scripted:")
    assert fake.checked == [diff]
    assert len(server.requests) == 4
    first = server.requests[0]
    offered = [t["function"]["name"] for t in first["tools"]]
    assert offered == [t["function"]["name"] for t in TOOL_SCHEMAS if t["function"]["name"] != "check_kernel"]
    assert "try_patch" in offered          # a serving campaign's inner loop; check_kernel is a kernel campaign's
    system, user = first["messages"][0]["content"], first["messages"][1]["content"]
    assert "vllm/**" in system and "serving.yaml" in system and "token" in system
    assert "in64/out8" in user and "x1.095" in user and "max_num_seqs: 8" in user
    assert "changed from the baseline: max_num_seqs: 4 -> 8" in user
    assert GEMMA in server.tool_results(1)[0]
    assert "class Gemma4MLP" in server.tool_results(2)[-1]
    assert "OK: the patch passed" in server.tool_results(3)[-1]


def test_a_search_replace_patch_comes_back_as_the_checked_unified_diff() -> None:
    blocks = (
        f"{GEMMA}\n<<<<<<< SEARCH\n        y = self.act(gate) * up\n=======\n"
        f"        y = up * self.act(gate)\n>>>>>>> REPLACE\n"
    )
    fake = tools()
    script: list[Entry] = [
        reply(call("propose_patch", hypothesis="h", patch=blocks, format="search_replace")),
        reply(call("submit")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert isinstance(result, Proposal) and result.patch_format == "diff"
    assert result.patch.startswith(f"--- a/{GEMMA}") and "+        y = up * self.act(gate)" in result.patch
    assert fake.checked == [result.patch]


# ----------------------------------------------------------------------------- denials and bad patches


def test_a_denied_read_reaches_the_model_as_a_tool_result() -> None:
    fake = tools(deny={"vllm/secret/*": "secrets are off limits"})
    script: list[Entry] = [
        reply(call("read_file", path="vllm/secret/keys.py")),
        reply(call("give_up", reason="denied")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert isinstance(result, GiveUp) and "denied" in result.reason
    [message] = server.tool_results(1)
    assert message.startswith("DENIED by policy rule fake-deny:vllm/secret/*") and "secrets are off limits" in message
    assert fake.notes_of("llm.tool_error")[0]["tool"] == "read_file"


def test_a_denied_patch_cannot_be_submitted() -> None:
    diff = gemma_diff(
        "now = time.perf_counter\n",
        "now = lambda: 0.0\n",
        "benchmarks/timer.py",
        FILES["benchmarks/timer.py"],
    )
    fake = tools()
    script: list[Entry] = [
        reply(call("propose_patch", hypothesis="faster clock", patch=diff)),
        reply(call("submit")),
        reply(call("give_up", reason="nothing allowed")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert isinstance(result, GiveUp)
    assert server.tool_results(1)[0].startswith("DENIED by policy rule fake-writable")
    assert server.tool_results(2)[-1].startswith("ERROR: nothing to submit")
    assert fake.checked == []


def test_a_patch_that_does_not_apply_goes_back_to_the_model_to_fix() -> None:
    bad = gemma_diff().replace(" gate = self.gate_proj(x)", " gate = self.gate_projection(x)")
    good = gemma_diff()
    fake = tools()
    script: list[Entry] = [
        reply(call("propose_patch", hypothesis="h1", patch=bad, predicted_speedup=1.2)),
        reply(call("propose_patch", hypothesis="h2", patch=good, predicted_speedup=1.05)),
        reply(call("submit")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert server.tool_results(1)[0].startswith("PATCH REJECTED: git apply --check failed")
    assert isinstance(result, Proposal) and result.hypothesis == "h2" and result.patch == good
    end = fake.notes_of("llm.end")[0]
    assert [a["outcome"] for a in end["attempts"]][1] == "checked"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- malformed replies


def test_malformed_tool_calls_get_error_results_and_the_conversation_goes_on() -> None:
    script: list[Entry] = [
        reply(
            call("read_file", '{"path": "vllm/x.py"'),  # invalid JSON
            call("rm_rf", directory="/"),  # unknown tool
            call("read_file", {}),  # missing required argument
            call("read_file", path=GEMMA, start_line="abc"),  # wrong type
            call("read_file", "[1, 2]"),  # not an object
            call("functions.list_files", directory="vllm"),
        ),  # tolerated prefix
        reply(call("give_up", reason="done")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server)
    assert isinstance(result, GiveUp) and result.reason == "model gave up: done"
    results = server.tool_results(1)
    assert len(results) == 6
    assert "not valid JSON" in results[0]
    assert "unknown tool 'rm_rf'" in results[1]
    assert "path: Field required" in results[2]
    assert "start_line" in results[3] and results[3].startswith("ERROR: bad arguments")
    assert "must be a JSON object" in results[4]
    assert results[5] == "vllm/model_executor/\nvllm/secret/"
    answered = {m["tool_call_id"] for m in server.requests[1]["messages"] if m["role"] == "tool"}
    asked = {c["id"] for c in server.requests[1]["messages"][2]["tool_calls"]}
    assert answered == asked


def test_raw_newlines_inside_argument_strings_are_tolerated() -> None:
    with ScriptedOpenAIServer([reply(call("give_up", '{"reason": "line one\nline two"}'))]) as server:
        result = propose(server)
    assert result == GiveUp("model gave up: line one\nline two")


def test_plain_text_and_refusals_get_nudges_then_give_up() -> None:
    script: list[Entry] = [
        say("I think we should optimise attention."),
        say("I'm sorry, I can't help with that."),
        say("Still no tool."),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, max_idle_replies=3)
    assert isinstance(result, GiveUp) and "no tool call in 3 replies" in result.reason
    assert len(server.requests) == 3
    assert server.requests[1]["messages"][-1]["role"] == "user"
    assert "Reply with a tool call" in server.requests[1]["messages"][-1]["content"]


def test_tool_calls_left_in_the_reply_text_are_taken_as_calls() -> None:
    script: list[Entry] = [
        say('Let me look.\n<tool_call>{"name": "list_files", "arguments": {"directory": "vllm"}}</tool_call>'),
        say('```json\n{"name": "give_up", "arguments": {"reason": "text call"}}\n```'),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server)
    assert result == GiveUp("model gave up: text call")
    assert server.requests[1]["messages"][2]["tool_calls"][0]["function"]["name"] == "list_files"
    assert server.tool_results(1) == ["vllm/model_executor/\nvllm/secret/"]


def test_a_fenced_call_followed_by_more_text_is_still_a_call() -> None:
    """What Qwen2.5-Coder-1.5B wrote on the real workspace: a fenced call, then a half-written second one."""
    from agent.proposers.llm_tools import calls_in_text

    text = ('```json\n{\n  "name": "read_file",\n  "arguments": {"path": "vllm/a.py", "start_line": 361}\n}\n```'
            '\n\n\n{"name": "read_file", "arguments": "{\\"path')
    assert calls_in_text(text) == [("read_file", '{"path": "vllm/a.py", "start_line": 361}')]
    assert calls_in_text("```python\nprint(1)\n```") == []                   # code is not a call


def test_a_call_that_does_not_parse_is_answered_with_why() -> None:
    """Qwen2.5-Coder-1.5B on the real workspace: a try_patch whose patch is a Python triple-quoted string, cut
    at max_tokens. The model hears what was wrong with it, not the generic nudge."""
    broken = '```json\n{"name": "try_patch", "arguments": {"patch": """\ndiff --git a/x b/x\n'
    script: list[Entry] = [Reply(content=broken), reply(call("give_up", reason="r"))]
    with ScriptedOpenAIServer(script) as server:
        propose(server)
        nudge = server.requests[1]["messages"][-1]["content"]
    assert nudge.startswith("Your reply looks like a call to try_patch but it is not a valid JSON tool call")
    assert "no triple quotes" in nudge


def test_a_model_that_ignores_repeated_answers_ends_its_iteration() -> None:
    """Qwen2.5-Coder-1.5B read a file that does not exist 12 times in a row, each answered REPEATED."""
    script: list[Entry] = [reply(call("read_file", path="vllm/nope.py")) for _ in range(10)]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, max_repeated_calls=2)
        asked = len(server.requests)
    assert isinstance(result, GiveUp) and result.reason.startswith("2 identical calls answered REPEATED")
    assert asked == 4          # two answered, two refused, then the end (not the other six turns)


def test_tool_calls_without_ids_still_get_answered() -> None:
    script: list[Entry] = [
        reply(call("view_metrics", id="")),
        reply(call("view_profile")),
        reply(call("give_up", reason="r")),
    ]
    with ScriptedOpenAIServer(script) as server:
        propose(server)
    tool_msg = [m for m in server.requests[1]["messages"] if m["role"] == "tool"][0]
    assert tool_msg["tool_call_id"] and "in64/out8" in tool_msg["content"]
    assert server.tool_results(2)[-1] == "No profile was taken for the incumbent."


def test_tool_results_can_go_back_as_one_user_message_for_lenient_templates() -> None:
    script: list[Entry] = [
        reply(call("view_metrics"), call("read_file", path="nope.py")),
        reply(call("give_up", reason="r")),
    ]
    with ScriptedOpenAIServer(script) as server:
        propose(server, tool_results_as="user")
    messages = server.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"].startswith("Result of functions.view_metrics:")
    assert "Result of functions.read_file:\nERROR: read_file failed: FileNotFoundError" in messages[-1]["content"]


def test_long_files_are_read_in_pages_with_a_note() -> None:
    fake = FakeTools(files={"vllm/big.py": "".join(f"x{i} = {i}\n" for i in range(1, 1001))})
    script: list[Entry] = [
        reply(call("read_file", path="vllm/big.py")),
        reply(call("read_file", path="vllm/big.py", start_line=995)),
        reply(call("give_up", reason="r")),
    ]
    with ScriptedOpenAIServer(script) as server:
        propose(server, fake, read_max_lines=100)
    first = server.tool_results(1)[0]
    assert first.startswith("vllm/big.py (lines 1-100 of 1000)") and "start_line=101" in first
    assert "x100 = 100" in first and "x101 = 101" not in first
    last = server.tool_results(2)[-1]
    assert "lines 995-1000 of 1000" in last and "truncated" not in last


# ----------------------------------------------------------------------------- transport failures


def test_a_rate_limit_then_success_is_retried() -> None:
    script: list[Entry] = [HTTPError(429, "slow down"), reply(call("give_up", reason="ok"))]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, max_retries=2)
    assert isinstance(result, GiveUp) and len(server.requests) == 2


def test_server_errors_are_retried_in_our_own_rounds_with_backoff() -> None:
    fake = tools()
    sleeps: list[float] = []
    script: list[Entry] = [HTTPError(500), HTTPError(503), reply(call("give_up", reason="ok"))]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake, sleeps=sleeps, retry_rounds=3, backoff_s=1.0)
    assert isinstance(result, GiveUp) and len(server.requests) == 3
    assert len(sleeps) == 2 and 1.0 <= sleeps[0] <= 1.25 and 2.0 <= sleeps[1] <= 2.5
    assert [n["attempt"] for n in fake.notes_of("llm.retry")] == [1, 2]


def test_a_timeout_gets_bounded_retries_then_a_proposer_error() -> None:
    script: list[Entry] = [Slow(5.0), Slow(5.0), reply(call("give_up", reason="never reached"))]
    started = time.monotonic()
    with (
        ScriptedOpenAIServer(script) as server,
        pytest.raises(ProposerError, match="no answer after 2 rounds"),
    ):
        propose(server, request_timeout_s=0.3, retry_rounds=2)
    assert len(server.requests) == 2 and time.monotonic() - started < 4


def test_an_unauthorised_answer_is_a_proposer_error_at_once() -> None:
    with (
        ScriptedOpenAIServer([HTTPError(401, "bad key")]) as server,
        pytest.raises(ProposerError, match="HTTP 401"),
    ):
        propose(server, retry_rounds=3)
    assert len(server.requests) == 1


def test_a_context_length_error_shrinks_the_conversation_and_retries() -> None:
    fake = tools()
    script: list[Entry] = [
        reply(call("read_file", path=GEMMA)),
        HTTPError(400, "This model's maximum context length is 4096 tokens"),
        reply(call("give_up", reason="ok")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake)
    assert isinstance(result, GiveUp) and len(server.requests) == 3
    assert fake.notes_of("llm.context_shrunk")


# ----------------------------------------------------------------------------- budget, context, turns


def test_every_turn_is_charged_and_noted() -> None:
    fake = tools()
    script: list[Entry] = [
        reply(call("view_metrics"), prompt_tokens=1000, completion_tokens=50),
        Reply(content="thinking", prompt_tokens=2000, completion_tokens=100),
        reply(call("give_up", reason="ok"), prompt_tokens=3000, completion_tokens=10, content="bye"),
    ]
    with ScriptedOpenAIServer(script) as server:
        propose(server, fake, price_input_per_mtok=2.0, price_output_per_mtok=10.0)
    assert fake.spent["llm_tokens"] == 6160
    assert fake.spent["llm_usd"] == pytest.approx((6000 * 2.0 + 160 * 10.0) / 1e6)
    turns = fake.notes_of("llm.turn")
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert turns[1]["content"] == "thinking" and turns[2]["tool_calls"][0]["name"] == "give_up"  # type: ignore[index]
    assert turns[0]["usage"] == {
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "total_tokens": 1050,
        "estimated": False,
    }
    assert fake.notes_of("llm.end")[0]["result"] == "give_up"


def test_missing_usage_is_estimated_and_still_charged() -> None:
    fake = tools()
    with ScriptedOpenAIServer([Reply(tool_calls=(call("give_up", reason="ok"),), with_usage=False)]) as server:
        propose(server, fake)
    assert fake.spent["llm_tokens"] > 0 and fake.notes_of("llm.turn")[0]["usage"]["estimated"]  # type: ignore[index]


def test_budget_runs_out_mid_conversation() -> None:
    fake = tools(budgets={"llm_tokens": 250})
    script: list[Entry] = [reply(call("view_metrics"), prompt_tokens=80, completion_tokens=20)] * 5
    with ScriptedOpenAIServer(script) as server, pytest.raises(BudgetExhausted, match="llm_tokens"):
        propose(server, fake)
    assert len(server.requests) == 3 and fake.spent["llm_tokens"] == 300


def test_no_request_is_sent_without_budget() -> None:
    fake = tools(budgets={"llm_usd": 0.0})
    with (
        ScriptedOpenAIServer([reply(call("give_up", reason="x"))]) as server,
        pytest.raises(BudgetExhausted, match="llm_usd"),
    ):
        propose(server, fake)
    assert server.requests == []


def test_long_conversations_are_summarised_under_max_context_chars() -> None:
    fake = FakeTools(files={f"vllm/f{i}.py": f"# file {i}\n" + "y = 1\n" * 600 for i in range(6)})
    script: list[Entry] = [reply(call("read_file", path=f"vllm/f{i}.py")) for i in range(6)]
    script.append(reply(call("give_up", reason="ok")))
    with ScriptedOpenAIServer(script) as server:
        result = propose(server, fake, max_context_chars=12_000, keep_recent_messages=4)
    assert isinstance(result, GiveUp)
    last = server.requests[-1]["messages"]
    text = [str(m.get("content") or "") for m in last]
    assert any("summarised to save context" in t for t in text)
    assert sum(len(t) for t in text) <= 12_000 + 4 * 4_000
    assert "# file 5" in text[-1]  # the newest result is intact
    assert any(t["summarised"] for t in fake.notes_of("llm.turn"))


def test_max_turns_gives_up() -> None:
    fake = tools()
    with ScriptedOpenAIServer([reply(call("list_files", directory="vllm"))] * 5) as server:
        result = propose(server, fake, max_turns=3)
    assert isinstance(result, GiveUp) and "max_turns=3" in result.reason and len(server.requests) == 3


# ----------------------------------------------------------------------------- config and fakes


def test_api_key_dummy_on_loopback_and_a_clear_error_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATCHET_TEST_KEY", raising=False)
    assert (
        LLMConfig(model="m", base_url="http://localhost:9/v1", api_key_env="RATCHET_TEST_KEY").api_key()
        == DUMMY_API_KEY
    )
    with pytest.raises(ValueError, match="RATCHET_TEST_KEY"):
        LLMConfig(model="m", base_url="https://api.example.com/v1", api_key_env="RATCHET_TEST_KEY").api_key()
    monkeypatch.setenv("RATCHET_TEST_KEY", "sk-real")
    assert (
        LLMConfig(model="m", base_url="https://api.example.com/v1", api_key_env="RATCHET_TEST_KEY").api_key()
        == "sk-real"
    )


def test_fake_proposer_replays_its_script() -> None:
    proposal = Proposal(hypothesis="h", patch="p")
    fake = FakeProposer([proposal, ProposerError("boom"), lambda state, tools: GiveUp(f"it {state.iteration}")])
    rng = random.Random(0)
    assert fake.propose(make_state(), tools(), rng=rng) is proposal
    with pytest.raises(ProposerError):
        fake.propose(make_state(), tools(), rng=rng)
    assert fake.propose(make_state(iteration=7), tools(), rng=rng) == GiveUp("it 7")
    assert isinstance(fake.propose(make_state(), tools(), rng=rng), GiveUp)
    assert len(fake.seen) == 4


def test_the_prompt_shows_the_latest_failure_whole_the_latest_patches_and_per_cell_results() -> None:
    from agent.base import HistoryEntry
    from agent.proposers.llm_prompt import render_history

    crash = "Traceback (most recent call last):\n" + "  File x, line 1\n" * 200 + "RuntimeError: CUDA error: bad shape"
    history = [HistoryEntry(iteration=1, hypothesis="old", outcome="failed", detail="old crash\n" + "z" * 5000),
               HistoryEntry(iteration=2, hypothesis="knob", outcome="rejected", speedup="0.99x [0.95, 1.03]",
                            cells=("in8/out4 0.990x [0.950, 1.030]",), patch="--- a/serving.yaml\n+max_num_seqs: 8\n"),
               HistoryEntry(iteration=3, hypothesis="kernel", outcome="failed", detail=crash, patch="+fused()\n")]
    text = render_history(history, failure_chars=6000)
    assert "RuntimeError: CUDA error: bad shape" in text and text.count("  File x, line 1") > 100
    assert "characters cut" in text.split("#2")[0]  # the older failure is clipped
    assert "per cell: in8/out4 0.990x [0.950, 1.030]" in text
    assert "+max_num_seqs: 8" in text and "+fused()" in text
    tight = render_history(history, failure_chars=500)
    assert "RuntimeError: CUDA error: bad shape" in tight and len(tight) < len(text)


def test_the_prompt_names_versions_hardware_backend_and_the_models_shapes() -> None:
    from agent.base import CampaignState
    from agent.environment import proposer_context
    from agent.proposers.llm_prompt import render_state

    root = Path(__file__).resolve().parents[2]
    context = proposer_context(root / "experiments" / "models" / "gemma4-e2b-shaped",
                               {"dtype": "bfloat16", "attention_backend": "TRITON_ATTN"},
                               environment={"vllm": "0.26.0", "torch": "2.11.0", "gpu": "NVIDIA H200", "cpus": 16})
    text = render_state(CampaignState(iteration=1, incumbent_ref="abc", serving_config={}, incumbent_metrics=(),
                                      baseline_metrics=(), environment=context))
    for line in ("vllm: 0.26.0", "gpu: NVIDIA H200", "attention_backend: TRITON_ATTN", "dtype: bfloat16",
                 "model.head_dim: 256", "model.global_head_dim: 512", "model.sliding_window: 512",
                 "model.layer_types: 8 sliding, 2 full"):
        assert line in text, line


def test_the_allowed_paths_shown_to_the_model_come_from_the_loaded_policy() -> None:
    from agent.serving_campaign import allowed_write_globs
    from policies import load_policy

    root = Path(__file__).resolve().parents[2]
    globs = allowed_write_globs(load_policy(root / "policies" / "default.yaml"))
    assert globs == ("vllm/model_executor/models/gemma4*.py", "vllm/model_executor/layers/**", "vllm/v1/attention/**",
                     "serving.yaml")


def test_the_prompt_shows_what_vllm_runs_with_where_serving_yaml_does_not_say_it() -> None:
    from agent.base import CampaignState
    from agent.proposers.llm_prompt import render_state

    state = CampaignState(iteration=2, incumbent_ref="abc", incumbent_metrics=(), baseline_metrics=(),
                          serving_config={"enforce_eager": True, "async_scheduling": True},
                          effective_serving_config={"enforce_eager": True, "async_scheduling": False,
                                                    "max_num_seqs": 128, "max_num_batched_tokens": 2048})
    text = render_state(state)
    block = text.split("In force (vLLM's own resolution")[1].split("## Profile")[0]
    assert "async_scheduling: False (serving.yaml says True)" in block       # vLLM's override
    assert "max_num_seqs: 128" in block and "max_num_batched_tokens: 2048" in block   # its defaults
    assert "enforce_eager" not in block.split("Keys serving.yaml may set")[0]   # as written: shown once, above
    settable = block.split("Keys serving.yaml may set: ")[1].split("\n")[0].split(", ")
    assert "max_num_seqs" in settable and "dtype" not in settable and "load_format" not in settable
    # unknown (the resolution failed): nothing is claimed
    assert "In force" not in render_state(CampaignState(iteration=2, incumbent_ref="abc", incumbent_metrics=(),
                                                        baseline_metrics=(), serving_config={"enforce_eager": True}))
